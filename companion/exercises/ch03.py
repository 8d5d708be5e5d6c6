"""Checkers for chapter 3's exercises (the 2017 encoder-decoder).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch03.layer_norm``: ``fn(x (..., d), gamma (d,), beta (d,), eps) -> (..., d)``, equation (3.3):
  each token's d coordinates centred by their mean, divided by sqrt(variance + eps) (the biased
  variance, divide by d), then scaled by gamma and shifted by beta.
- ``ch03.shift_targets``: ``fn(targets, bos_id, eos_id, pad_id) -> (decoder_input, labels)``, both
  (B, T + 1) integer tensors: the decoder reads BOS + target, padded with ``pad_id``; it is graded
  on target + EOS, padded with -100 (the label the loss ignores).
- ``ch03.label_smoothing_loss``: ``fn(logits (N, K), targets (N,), eps) -> ()``, equation (3.5):
  the mean over the targets that are not -100 of -sum_k q(k) log p(k), with q = (1 - eps) one-hot
  + eps / K.
- ``ch03.chrf``: ``fn(hypotheses, references) -> float``, corpus chrF (0-100), equation (3.7):
  character 1- to 6-grams with spaces removed, clipped matches summed over the corpus, precision
  and recall averaged over the orders that occur, then the F-score with beta = 2.

Each checker draws fresh inputs from the generator it is given, runs the learner's function and an
independent reference (``torch.nn.functional``, ``companion.data.collate_pairs``, sacreBLEU) and,
on a mismatch, names the case and, where it recognises a typical mistake, which one.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.data import collate_pairs
from companion.exercises import ExerciseFailed, call, diagnose, register

IGNORE = -100


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


# --- ch03.layer_norm ---------------------------------------------------------------------------


def _layer_norm_cases(gen: torch.Generator):
    """(description, x, gamma, beta, eps), easiest first."""
    yield "x (4, 8), gamma = 1, beta = 0", _randn(gen, 4, 8), torch.ones(8).double(), \
        torch.zeros(8).double(), 1e-5
    yield "x (2, 5, 16), random gamma and beta", _randn(gen, 2, 5, 16, scale=3.0) + 2.0, \
        _randn(gen, 16), _randn(gen, 16), 1e-5
    x = _randn(gen, 3, 6)
    x[1] = 4.0  # a constant token: variance 0, only eps keeps the division finite
    yield "x (3, 6) whose token 1 is constant (variance 0)", x, _randn(gen, 6), _randn(gen, 6), 1e-5
    yield "x (2, 3, 4) with a large eps = 0.5", _randn(gen, 2, 3, 4), _randn(gen, 4), \
        _randn(gen, 4), 0.5


@register("ch03.layer_norm")
def check_layer_norm(fn, gen, report) -> None:
    for case, x, gamma, beta, eps in _layer_norm_cases(gen):
        d = x.shape[-1]
        expected = F.layer_norm(x, (d,), gamma, beta, eps)
        got = call(case, fn, x.clone(), gamma.clone(), beta.clone(), eps)
        mu = x.mean(-1, keepdim=True)
        mistakes = {
            "the unbiased variance (divide by d - 1); LayerNorm divides by d":
                (x - mu) / (x.var(-1, keepdim=True) + eps).sqrt() * gamma + beta,
            "statistics over the tokens (dim=-2) instead of each token's d coordinates":
                F.layer_norm(x.transpose(-1, -2), (x.shape[-2],), None, None, eps)
                .transpose(-1, -2) * gamma + beta,
            "eps added outside the square root (divide by sigma + eps)":
                (x - mu) / (x.var(-1, unbiased=False, keepdim=True).sqrt() + eps) * gamma + beta,
            "the normalised x without gamma and beta":
                F.layer_norm(x, (d,), None, None, eps),
        }
        diagnose(case, got, expected, mistakes)
        report.cases.append(case)


# --- ch03.shift_targets ------------------------------------------------------------------------


def _target_cases(gen: torch.Generator):
    """(description, list of target id lists); ids start at 4, above the special tokens."""
    def sentence(n: int) -> list[int]:
        return torch.randint(4, 40, (n,), generator=gen).tolist()

    yield "one target of 5 ids", [sentence(5)]
    yield "three targets of equal length 4", [sentence(4) for _ in range(3)]
    lengths = torch.randint(1, 9, (4,), generator=gen).tolist()
    lengths[0], lengths[1] = 1, 9  # the shortest and the longest
    yield f"four targets of lengths {lengths} (padding needed)", [sentence(n) for n in lengths]


@register("ch03.shift_targets")
def check_shift_targets(fn, gen, report) -> None:
    bos, eos, pad = 1, 2, 0
    for case, targets in _target_cases(gen):
        # collate_pairs needs sources; give each target a one-token source
        batch = collate_pairs([([5], t) for t in targets], pad_id=pad, bos_id=bos, eos_id=eos)
        got = call(case, fn, [list(t) for t in targets], bos, eos, pad)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise ExerciseFailed(f"{case}: expected a pair (decoder_input, labels), got "
                                 f"{type(got).__name__}")
        tgt_in, labels = got
        plain = [t + [eos] for t in targets]
        width = max(map(len, plain))
        labels_pad = torch.tensor([t + [pad] * (width - len(t)) for t in plain])
        diagnose(f"{case}, decoder_input", tgt_in, batch.tgt_in, {
            "target + EOS: the decoder input must start with BOS and end before EOS":
                labels_pad,
        })
        diagnose(f"{case}, labels", labels, batch.labels, {
            "the decoder input: labels are the targets one position ahead (target + EOS)":
                batch.tgt_in,
            "labels padded with pad_id; padding must be labelled -100 so the loss ignores it":
                labels_pad,
        })
        report.cases.append(case)


# --- ch03.label_smoothing_loss -----------------------------------------------------------------


def _smoothing_cases(gen: torch.Generator):
    """(description, logits, targets, eps)."""
    yield "logits (4, 6), eps = 0.1", _randn(gen, 4, 6), torch.randint(0, 6, (4,), generator=gen), 0.1
    yield "logits (5, 50), eps = 0 (plain cross-entropy)", _randn(gen, 5, 50, scale=2.0), \
        torch.randint(0, 50, (5,), generator=gen), 0.0
    targets = torch.randint(0, 30, (8,), generator=gen)
    targets[[2, 5]] = IGNORE
    yield "logits (8, 30), eps = 0.2, targets 2 and 5 are -100 (padding)", \
        _randn(gen, 8, 30, scale=2.0), targets, 0.2


def _smoothed(logits: Tensor, targets: Tensor, eps: float, *, others: bool = False,
              keep_peak: bool = False, reduce: str = "mean") -> Tensor:
    """Variants of the smoothed loss, for the diagnosis (the reference is F.cross_entropy)."""
    keep = targets != IGNORE
    logp, y = torch.log_softmax(logits[keep], -1), targets[keep]
    K = logits.shape[-1]
    one_hot = F.one_hot(y, K).double()
    if others:  # eps spread over the K - 1 wrong words only
        q = (1 - eps) * one_hot + eps / (K - 1) * (1 - one_hot)
    elif keep_peak:  # 1 - eps on the right word, eps / K on the others: sums to 1 - eps / K
        q = (1 - eps) * one_hot + eps / K * (1 - one_hot)
    else:
        q = (1 - eps) * one_hot + eps / K
    loss = -(q * logp).sum(-1)
    return loss.sum() if reduce == "sum" else loss.mean()


@register("ch03.label_smoothing_loss")
def check_label_smoothing_loss(fn, gen, report) -> None:
    for case, logits, targets, eps in _smoothing_cases(gen):
        expected = F.cross_entropy(logits, targets, label_smoothing=eps, ignore_index=IGNORE)
        got = call(case, fn, logits.clone(), targets.clone(), eps)
        if isinstance(got, Tensor) and got.dim() == 1 and got.shape[0] == logits.shape[0]:
            raise ExerciseFailed(f"{case}: wrong shape: expected a scalar (the mean over the "
                                 f"graded targets), got one loss per row {tuple(got.shape)}")
        mistakes = {
            "eps spread over the K - 1 wrong words (the 2017 recipe spreads eps / K over all K)":
                _smoothed(logits, targets, eps, others=True),
            "q(y) = 1 - eps without the eps / K every word gets (q no longer sums to 1)":
                _smoothed(logits, targets, eps, keep_peak=True),
            "the sum over targets; the loss is their mean":
                _smoothed(logits, targets, eps, reduce="sum"),
            "the mean over all rows, -100 targets included (they must be left out)":
                _smoothed(logits, targets, eps) * (targets != IGNORE).sum() / targets.numel(),
        }
        diagnose(case, got, expected, mistakes, atol=1e-6, rtol=1e-6)
        report.cases.append(case)


# --- ch03.chrf ---------------------------------------------------------------------------------

_WORDS = ("le", "la", "les", "de", "roi", "dieu", "terre", "maison", "fils", "peuple", "dit",
          "et", "il", "à", "sa", "son", "qui", "jour", "homme", "ville", "parole", "nom")


def _chrf_cases(gen: torch.Generator):
    """(description, hypotheses, references)."""
    def line(n: int) -> str:
        return " ".join(_WORDS[int(i)] for i in torch.randint(0, len(_WORDS), (n,), generator=gen))

    refs = [line(int(n)) for n in torch.randint(4, 10, (3,), generator=gen)]
    yield "one exact copy of its reference", refs[:1], refs[:1]
    hyps = [line(int(n)) for n in torch.randint(3, 9, (3,), generator=gen)]
    yield "three random outputs against three references", hyps, refs
    yield "a corpus with an empty output", ["", hyps[1], refs[2]], refs
    yield "one short pair ('le', 'les': no 3- to 6-grams in the output)", ["le"], ["les"]


def _ngrams(text: str, n: int) -> Counter:
    s = "".join(text.split())
    return Counter(s[i:i + n] for i in range(len(s) - n + 1))


def _stats(hyps, refs) -> list[tuple[int, int, int]]:
    """(output n-grams, reference n-grams, clipped matches) per order 1..6, summed over the corpus."""
    out = []
    for n in range(1, 7):
        h = r = m = 0
        for hyp, ref in zip(hyps, refs):
            a, b = _ngrams(hyp, n), _ngrams(ref, n)
            h, r, m = h + sum(a.values()), r + sum(b.values()), m + sum((a & b).values())
        out.append((h, r, m))
    return out


def _f(p: float, r: float, beta: float) -> float:
    return 0.0 if p + r == 0 else (1 + beta**2) * p * r / (beta**2 * p + r)


def _chrf_variant(hyps, refs, *, beta: float = 2.0, per_order: bool = False,
                  divide_by_six: bool = False) -> float:
    stats = _stats(hyps, refs)
    if per_order:  # an F-score per order, then their mean
        return 100 * sum(_f(m / h if h else 0.0, m / r if r else 0.0, beta)
                         for h, r, m in stats) / 6
    used = [(m / h, m / r) for h, r, m in stats if h and r]
    k = 6 if divide_by_six else len(used)
    if not used:
        return 0.0
    return 100 * _f(sum(p for p, _ in used) / k, sum(r for _, r in used) / k, beta)


@register("ch03.chrf")
def check_chrf(fn, gen, report) -> None:
    import sacrebleu

    for case, hyps, refs in _chrf_cases(gen):
        expected = sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score
        got = call(case, fn, list(hyps), list(refs))
        if isinstance(got, Tensor) and got.numel() == 1:
            got = float(got)
        if not isinstance(got, (int, float)):
            raise ExerciseFailed(f"{case}: expected a number (chrF on the 0-100 scale), got "
                                 f"{type(got).__name__}")
        if abs(got - expected) <= 1e-6 * 100:
            report.cases.append(case)
            continue
        mistakes = {
            "a score on the 0-1 scale; chrF is reported as 0-100": expected / 100,
            "beta = 1 (F1); chrF weights recall twice as much as precision, beta = 2":
                _chrf_variant(hyps, refs, beta=1.0),
            "the mean of one F-score per order; chrF averages precision and recall first":
                _chrf_variant(hyps, refs, per_order=True),
            "dividing by 6 even when an order has no n-grams (average over the orders "
            "that occur)": _chrf_variant(hyps, refs, divide_by_six=True),
            "n-grams that cross the spaces kept as ' ' characters; chrF removes whitespace":
                _chrf_with_spaces(hyps, refs),
        }
        message = f"{case}: expected chrF {expected:.4f}, got {got:.4f}"
        for hint, wrong in mistakes.items():
            if abs(got - wrong) <= 1e-6 * 100:
                raise ExerciseFailed(f"{message} -- your result equals {hint}")
        raise ExerciseFailed(message)


def _chrf_with_spaces(hyps, refs) -> float:
    stats = []
    for n in range(1, 7):
        h = r = m = 0
        for hyp, ref in zip(hyps, refs):
            a = Counter(hyp[i:i + n] for i in range(len(hyp) - n + 1))
            b = Counter(ref[i:i + n] for i in range(len(ref) - n + 1))
            h, r, m = h + sum(a.values()), r + sum(b.values()), m + sum((a & b).values())
        stats.append((h, r, m))
    used = [(m / h, m / r) for h, r, m in stats if h and r]
    if not used:
        return 0.0
    k = len(used)
    return 100 * _f(sum(p for p, _ in used) / k, sum(r for _, r in used) / k, 2.0)
