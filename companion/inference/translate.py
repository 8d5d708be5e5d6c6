"""Decoding a ``Seq2SeqTransformer``: greedy and beam search, and corpus BLEU / chrF (translation chapters).

What this module provides
- ``greedy_decode(model, src, bos_id, eos_id, max_len) -> list[Hypothesis]``: at every step the most
  probable next token, for a batch of sources (B, S) at once, with the decoder's KV cache.
- ``beam_search_one(model, src, bos_id, eos_id, beam_size, alpha, max_len) -> list[Hypothesis]``: every
  finished hypothesis of one source, best first (the readable version); ``beam_search`` runs the same
  search for a batch of sources at once and returns the best hypothesis of each.
- ``Hypothesis``: ``tokens`` (without BOS, without EOS), ``log_prob`` (sum of log p of the tokens and
  of EOS if it ended), ``score`` (log_prob / length penalty), ``finished`` (EOS reached).
- ``sequence_log_prob(model, src, tokens, bos_id, eos_id)``: teacher-forced log p(tokens + EOS | src),
  to check what a search reports.
- ``translate(model, sentences, src_tokenizer, tgt_tokenizer, ...)``: strings in, strings out.
- ``corpus_bleu(hypotheses, references)`` and ``corpus_chrf(...)``: sacrebleu's corpus scores (0-100).

Beam search (the shrinking beam). Keep the k best partial hypotheses by summed log-probability. At
each step extend every live hypothesis by every token and keep the best ``width`` extensions overall,
``width`` = k minus the number already finished: an extension ending in EOS is finished (and the beam
narrows by one), the others stay live. Stop when no hypothesis is live or after ``max_len`` tokens
(live ones then join the list, unfinished). Return the hypothesis with the best
    score = log p(y | x) / lp(y),   lp(y) = ((5 + |y|) / 6) ** alpha        (Wu et al. 2016, GNMT)
where |y| counts the tokens including EOS; alpha = 0 ranks by raw log-probability, larger alpha
favours longer outputs (raw log-probability always prefers short ones). With k = 1 the one extension
kept each step is the argmax and the search ends at the first EOS: beam_size=1 is greedy decoding exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import torch
from torch import Tensor, nn

__all__ = ["Hypothesis", "greedy_decode", "beam_search", "beam_search_one", "sequence_log_prob", "length_penalty",
           "translate", "corpus_bleu", "corpus_chrf"]


@dataclass
class Hypothesis:
    tokens: list[int]
    log_prob: float
    score: float
    finished: bool


def length_penalty(length: int, alpha: float) -> float:
    """lp = ((5 + length) / 6) ** alpha (GNMT); 1 when alpha = 0."""
    return ((5.0 + length) / 6.0) ** alpha


def _check(model: nn.Module, src: Tensor, max_len: int) -> None:
    if src.dim() != 2 or src.shape[0] < 1 or src.shape[1] < 1:
        raise ValueError(f"src must have shape (B, S) with B, S >= 1; got {tuple(src.shape)}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1; got {max_len}")
    if max_len > model.config.max_len:
        raise ValueError(f"max_len must be <= the model's max_len={model.config.max_len}; got {max_len}")


def _reorder(cache, index: Tensor) -> None:
    """Select batch rows ``index`` of every layer's cached keys and values (beams that survive)."""
    for layer in cache.layers:
        if layer.rows is not None:
            layer.rows = tuple(r.index_select(0, index) for r in layer.rows)


def _next_log_probs(logits: Tensor, banned: Sequence[int]) -> Tensor:
    """log_softmax over the vocabulary with ``banned`` ids removed (probability renormalised over the rest).

    Banning the unknown-word token is the usual use: a small word-level model otherwise learns that
    "<unk>" is a safe guess for any rare word, and emits it where a real word would score.
    """
    logits = logits.double()
    if banned:
        logits[:, list(banned)] = float("-inf")
    return torch.log_softmax(logits, dim=-1)


@torch.no_grad()
def greedy_decode(model: nn.Module, src: Tensor, bos_id: int, eos_id: int, max_len: int = 64,
                  banned: Sequence[int] = ()) -> list[Hypothesis]:
    """src (B, S) -> B hypotheses, each the argmax token at every step until EOS or ``max_len`` tokens."""
    _check(model, src, max_len)
    if eos_id in banned:
        raise ValueError("banned must not contain eos_id: decoding could never stop")
    model.eval()
    B = src.shape[0]
    src_mask = model.source_mask(src)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    token = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    log_prob = torch.zeros(B, dtype=torch.float64, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    out: list[list[int]] = [[] for _ in range(B)]
    for _ in range(max_len):
        logp = _next_log_probs(model.decode(token, memory, src_mask, cache=cache)[:, -1], banned)  # (B, V)
        best = logp.argmax(dim=-1)
        log_prob += torch.where(done, torch.zeros_like(log_prob), logp.gather(1, best[:, None]).squeeze(1))
        for b in range(B):
            if not done[b] and int(best[b]) != eos_id:
                out[b].append(int(best[b]))
        done |= best == eos_id
        if bool(done.all()):
            break
        token = best[:, None]
    return [Hypothesis(out[b], float(log_prob[b]), float(log_prob[b]), bool(done[b])) for b in range(B)]


@torch.no_grad()
def beam_search_one(model: nn.Module, src: Tensor, bos_id: int, eos_id: int, beam_size: int = 4,
                    alpha: float = 0.6, max_len: int = 64, banned: Sequence[int] = ()) -> list[Hypothesis]:
    """Beam search for one source src (1, S); every finished hypothesis, best score first."""
    _check(model, src, max_len)
    if eos_id in banned:
        raise ValueError("banned must not contain eos_id: decoding could never stop")
    if src.shape[0] != 1:
        raise ValueError(f"src must hold one sentence, shape (1, S); got {tuple(src.shape)}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1; got {beam_size}")
    if alpha < 0:
        raise ValueError(f"alpha (the length penalty exponent) must be >= 0; got {alpha}")
    model.eval()
    src_mask = model.source_mask(src)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    beams: list[list[int]] = [[]]
    scores = torch.zeros(1, dtype=torch.float64, device=src.device)  # summed log-prob of each live beam
    token = torch.full((1, 1), bos_id, dtype=torch.long, device=src.device)
    finished: list[Hypothesis] = []
    for step in range(max_len):
        n = len(beams)
        logp = _next_log_probs(
            model.decode(token, memory.expand(n, -1, -1), src_mask.expand(n, -1, -1, -1), cache=cache)[:, -1], banned
        )  # (n, V)
        V = logp.shape[-1]
        total = (scores[:, None] + logp).flatten()  # (n V,): every one-token extension of every live beam
        width = beam_size - len(finished)  # the beam narrows by one for each finished hypothesis
        top_scores, top_index = total.topk(min(width, total.numel()))
        keep_rows, keep_tokens, keep_scores, new_beams = [], [], [], []
        for s, i in zip(top_scores.tolist(), top_index.tolist()):
            row, tok = divmod(i, V)
            if tok == eos_id:
                length = len(beams[row]) + 1
                finished.append(Hypothesis(list(beams[row]), s, s / length_penalty(length, alpha), True))
            else:
                keep_rows.append(row)
                keep_tokens.append(tok)
                keep_scores.append(s)
                new_beams.append(beams[row] + [tok])
        if not new_beams:
            break
        if step == max_len - 1:  # out of room: the live beams join the list unfinished
            finished.extend(Hypothesis(b, s, s / length_penalty(len(b), alpha), False) for b, s in zip(new_beams, keep_scores))
            break
        index = torch.tensor(keep_rows, device=src.device)
        _reorder(cache, index)
        beams, scores = new_beams, torch.tensor(keep_scores, dtype=torch.float64, device=src.device)
        token = torch.tensor(keep_tokens, device=src.device)[:, None]
    finished.sort(key=lambda h: h.score, reverse=True)
    return finished


@torch.no_grad()
def beam_search(model: nn.Module, src: Tensor, bos_id: int, eos_id: int, beam_size: int = 4, alpha: float = 0.6,
                max_len: int = 64, pad_id: int | None = None, banned: Sequence[int] = ()) -> list[Hypothesis]:
    """src (B, S) -> the best-scoring hypothesis of each row, all rows searched together.

    The search of every row is exactly ``beam_search_one``'s (same shrinking beam, same ranking); only
    the decoder calls are shared: the live beams of all sources form one batch of rows, each reading
    its own source's memory, so B sentences cost about as many decoder calls as the longest one.
    Padding (``pad_id``, default the model's) is masked in the encoder and in cross-attention.
    """
    pad_id = model.config.pad_id if pad_id is None else pad_id
    _check(model, src, max_len)
    if eos_id in banned:
        raise ValueError("banned must not contain eos_id: decoding could never stop")
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1; got {beam_size}")
    if alpha < 0:
        raise ValueError(f"alpha (the length penalty exponent) must be >= 0; got {alpha}")
    model.eval()
    B = src.shape[0]
    src_mask = (src != pad_id)[:, None, None, :]
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    owner = list(range(B))  # the source of each live row; a source's rows stay contiguous
    beams: list[list[int]] = [[] for _ in range(B)]
    scores = torch.zeros(B, dtype=torch.float64, device=src.device)
    token = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    for step in range(max_len):
        rows = torch.tensor(owner, device=src.device)
        logp = _next_log_probs(model.decode(token, memory[rows], src_mask[rows], cache=cache)[:, -1], banned)
        V = logp.shape[-1]
        total = scores[:, None] + logp  # (n, V)
        keep_rows, keep_tokens, keep_scores, new_beams, new_owner = [], [], [], [], []
        for b, rows in groupby(range(len(owner)), key=owner.__getitem__):  # one source at a time
            rows = list(rows)
            first, last = rows[0], rows[-1] + 1
            candidates = total[first:last].flatten()
            width = beam_size - len(finished[b])
            top_scores, top_index = candidates.topk(min(width, candidates.numel()))
            for s, i in zip(top_scores.tolist(), top_index.tolist()):
                row, tok = first + i // V, i % V
                if tok == eos_id:
                    length = len(beams[row]) + 1
                    finished[b].append(Hypothesis(list(beams[row]), s, s / length_penalty(length, alpha), True))
                else:
                    keep_rows.append(row)
                    keep_tokens.append(tok)
                    keep_scores.append(s)
                    new_beams.append(beams[row] + [tok])
                    new_owner.append(b)
        if not new_beams:
            break
        if step == max_len - 1:  # out of room: the live beams join their lists unfinished
            for b, beam, s in zip(new_owner, new_beams, keep_scores):
                finished[b].append(Hypothesis(beam, s, s / length_penalty(len(beam), alpha), False))
            break
        _reorder(cache, torch.tensor(keep_rows, device=src.device))
        beams, owner = new_beams, new_owner
        scores = torch.tensor(keep_scores, dtype=torch.float64, device=src.device)
        token = torch.tensor(keep_tokens, device=src.device)[:, None]
    return [max(hyps, key=lambda h: h.score) for hyps in finished]


@torch.no_grad()
def sequence_log_prob(model: nn.Module, src: Tensor, tokens: Sequence[int], bos_id: int, eos_id: int | None) -> float:
    """log p(tokens [+ EOS] | src) by teacher forcing; src (1, S). ``eos_id=None``: no EOS term."""
    model.eval()
    target = list(tokens) + ([eos_id] if eos_id is not None else [])
    tgt_in = torch.tensor([[bos_id, *target[:-1]]], device=src.device) if target else None
    if tgt_in is None:
        return 0.0
    logp = torch.log_softmax(model(src, tgt_in)[0].double(), dim=-1)
    return float(logp.gather(1, torch.tensor(target, device=src.device)[:, None]).sum())


def translate(model: nn.Module, sentences: Sequence[str], src_tokenizer, tgt_tokenizer, *, beam_size: int = 4,
              alpha: float = 0.6, max_len: int | None = None, bos: str = "<bos>", eos: str = "<eos>",
              banned_tokens: Sequence[str] = (), batch_size: int = 64) -> list[str]:
    """Encode each sentence, decode, return target strings.

    ``beam_size == 1`` is greedy decoding, otherwise beam search; either runs ``batch_size`` padded
    sentences at a time. ``banned_tokens`` (e.g. ``["<unk>"]``) can never be produced.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    bos_id, eos_id = tgt_tokenizer.special_tokens[bos], tgt_tokenizer.special_tokens[eos]
    vocab = {**tgt_tokenizer.special_tokens}
    banned = []
    for token in banned_tokens:
        ids = [vocab[token]] if token in vocab else tgt_tokenizer.encode(token)
        if len(ids) != 1:
            raise ValueError(f"banned_tokens must each be a single target token; {token!r} is {len(ids)} tokens")
        banned.append(ids[0])
    max_len = model.config.max_len if max_len is None else max_len
    device = next(model.parameters()).device
    encoded = []
    for sentence in sentences:
        ids = src_tokenizer.encode(sentence)
        if not ids:
            raise ValueError("sentences must not contain empty strings (nothing to translate)")
        encoded.append(ids[: model.config.max_len])
    out: list[str] = []
    if beam_size == 1:
        for start in range(0, len(encoded), batch_size):
            src = _pad(encoded[start : start + batch_size], model.config.pad_id, device)
            out.extend(tgt_tokenizer.decode(h.tokens) for h in greedy_decode(model, src, bos_id, eos_id, max_len, banned))
        return out
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        hyps = beam_search(model, _pad(chunk, model.config.pad_id, device), bos_id, eos_id, beam_size, alpha, max_len, banned=banned)
        out.extend(tgt_tokenizer.decode(h.tokens) for h in hyps)
    return out


def _pad(rows: Sequence[Sequence[int]], pad: int, device) -> Tensor:
    width = max(len(ids) for ids in rows)
    return torch.tensor([list(ids) + [pad] * (width - len(ids)) for ids in rows], device=device)


def _check_corpus(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses and references must have the same length; got {len(hypotheses)} and {len(references)}")
    if not hypotheses:
        raise ValueError("hypotheses must not be empty")


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], *, pretokenized: bool = False) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenisation, exponential brevity penalty), 0-100, one reference each.

    ``pretokenized=True`` says that both sides were split into words on purpose (as a word-level
    tokenizer's ``decode``/``normalize`` do), which silences sacrebleu's warning about it; the score is
    then BLEU on tokenised text, not comparable with published scores on detokenised text.
    """
    import sacrebleu

    _check_corpus(hypotheses, references)
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], force=pretokenized).score)


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF (character 6-grams, beta = 2; sacrebleu), 0-100, one reference each."""
    import sacrebleu

    _check_corpus(hypotheses, references)
    return float(sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score)
