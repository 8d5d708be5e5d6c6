"""Sampling and autoregressive generation for every decoder model (chapters 10 and 12).

Generation repeats x_{t+1} ~ p(. | x_<=t) = softmax(z_t / tau) after filtering z_t (the last row's
logits):
- greedy (tau = 0): x_{t+1} = argmax_v z_t[v];
- temperature tau > 0: divide the logits by tau (tau < 1 sharpens, tau > 1 flattens);
- top-k: keep the k largest logits, set the rest to -inf;
- top-p (nucleus, Holtzman et al. 2020): keep the smallest set of most likely tokens whose
  probability sums to at least p.

Three interchangeable cache modes, one loop:
- "none": every step recomputes the whole prefix, O(t) rows per step and O(t^2) attention per step;
  batched prompts are right-padded (causality makes padding after a token invisible to it).
- "contiguous": per-sequence ``ModelCache``: prefill the prompt once, then one row per step.
- "paged": per-sequence block tables over one page pool (``companion.inference.paged``), optionally int8/int4.
With a cache, sequences of different lengths are batched without padding: their new rows are laid
end to end in one (1, N) row with per-token absolute positions (``packed_forward``).

What this module provides
- ``SamplingParams`` (validated), ``filter_logits``, ``sample`` (``NonFiniteLogits``, a ValueError, for NaN or +inf logits).
- ``context_length(model)``, ``check_prompts``, ``check_decoder`` (an encoder-decoder is refused).
- ``packed_forward(model, caches, chunks)``: one forward over several sequences' new tokens.
- ``finish_reason``: when a sequence stops (here and in the engine); ``is_int``.
- ``stream(...)``: an iterator of per-step new tokens; ``generate(...)`` -> ``GenerationResult``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from companion.cache import PackedBatchCache
from companion.inference.batch import PagedBatch, StepBuffers
from companion.inference.kvquant import BITS as KV_BITS
from companion.inference.paged import PagedKVCache

__all__ = [
    "SamplingParams", "filter_logits", "sample", "NonFiniteLogits", "check_finite_logits", "sample_rows", "context_length", "check_prompts", "packed_forward",
    "stream", "generate", "GenerationResult", "CACHE_MODES", "MIN_TEMPERATURE", "check_decoder", "is_int", "finish_reason",
]

CACHE_MODES = ("none", "contiguous", "paged")
# The smallest positive temperature: logits / 1e-6 stay finite in float32 for any |logit| < 3e32, and
# such a temperature already picks the argmax unless two logits agree to 1e-5.
MIN_TEMPERATURE = 1e-6


def is_int(x) -> bool:
    """A Python or NumPy integer (bool excluded: True is not a token count)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def finish_reason(token: int, params: "SamplingParams", n_generated: int, n_tokens: int, context: int) -> str | None:
    """Why a sequence stops once ``token`` is appended (its ``n_generated``-th new token, ``n_tokens``
    in all), or None: "stop" (a stop token), "length" (max_new_tokens reached) or "context" (the
    model's context is full). The one rule, for ``generate`` and ``companion.engine.Engine``."""
    if token in params.stop_tokens:
        return "stop"
    if n_generated >= params.max_new_tokens:
        return "length"
    if n_tokens >= context:
        return "context"
    return None


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


MAX_STOP_TOKENS = 1 << 21  # the vocabulary cap of companion.training.modelspec.FIELD_LIMITS
MAX_NEW_TOKENS = 1 << 20  # the context cap of companion.training.modelspec.FIELD_LIMITS: 10**12 never ends


@dataclass
class SamplingParams:
    """How to pick each new token. temperature 0 = greedy; top_k None = no top-k; top_p 1 = no nucleus.
    seed: an int seeds one ``torch.Generator`` per sequence (so a sequence samples the same tokens
    alone or in any batch); a ``torch.Generator`` is used as given (shared by a batch).

    Every field is checked at construction (and again by ``validate``, which the engine and
    ``generate`` call): counts and ids must be integers (2.5 is refused, never rounded), real numbers
    finite, each within its range; a bad field raises ValueError naming it. ``stop_tokens`` is a
    sequence of ids (a single int is refused: write ``(5,)``)."""

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    stop_tokens: tuple[int, ...] = ()
    seed: int | torch.Generator | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0 and an integer; got {self.max_new_tokens!r}")
        if self.max_new_tokens > MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be at most {MAX_NEW_TOKENS:,} (the longest context a checkpoint "
                             f"may have); got {self.max_new_tokens!r}")
        self.max_new_tokens = int(self.max_new_tokens)
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy) and finite; got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}; got {self.temperature!r}: "
                             "dividing the logits by it overflows them to inf (and the probabilities to NaN). "
                             "Use 0 for greedy decoding, which is what such a temperature means")
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be >= 1 (an integer) or None; got {self.top_k!r}")
        self.top_k = None if self.top_k is None else int(self.top_k)
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:  # NaN fails both comparisons
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p!r}")
        stops = self.stop_tokens
        if isinstance(stops, (str, bytes, Tensor)) or not isinstance(stops, (tuple, list, set, frozenset, range)):
            raise ValueError(f"stop_tokens must be a sequence of token ids, e.g. (5,); got {stops!r}")
        if len(stops) > MAX_STOP_TOKENS:  # checked before the ids are read: range(10**9) would take minutes
            raise ValueError(f"stop_tokens must hold at most {MAX_STOP_TOKENS:,} ids (the largest vocabulary a "
                             f"checkpoint may have); got {len(stops):,}")
        if not all(is_int(t) and t >= 0 for t in stops):
            raise ValueError(f"stop_tokens must hold integer token ids >= 0; got {tuple(stops)!r}")
        self.stop_tokens = tuple(int(t) for t in stops)
        if not (self.seed is None or isinstance(self.seed, torch.Generator) or is_int(self.seed)):
            raise ValueError(f"seed must be an integer, a torch.Generator or None; got {self.seed!r}")

    def generator(self) -> torch.Generator | None:
        if isinstance(self.seed, torch.Generator):
            return self.seed
        return None if self.seed is None else torch.Generator().manual_seed(int(self.seed))


def filter_logits(logits: Tensor, temperature: float, top_k: int | None = None, top_p: float = 1.0) -> Tensor:
    """logits (..., V) -> tempered logits with everything outside top-k / the top-p nucleus at -inf."""
    z = logits.float() / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        # keep token r while the mass BEFORE it is < p: the smallest prefix reaching p, never empty
        # (a top_p below the smallest float32 probability, 1e-300, would drop even the first token)
        drop_sorted = ((probs.cumsum(-1) - probs) >= top_p) & (torch.arange(z.shape[-1], device=z.device) > 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


class NonFiniteLogits(ValueError):
    """The model gave NaN (or +inf) logits: no token can be drawn from them."""


def check_finite_logits(logits: Tensor) -> None:
    """NonFiniteLogits when ``logits`` hold a NaN or +inf (-inf is a masked token, allowed): a model with
    NaN weights otherwise fails inside torch.multinomial, or greedy decoding silently picks the NaN."""
    if bool((torch.isnan(logits) | (logits == float("inf"))).any()):
        raise NonFiniteLogits(
            "the model's logits are not finite (NaN or +inf), so no token can be sampled: its weights hold "
            "non-finite values (a run whose loss diverged, a damaged checkpoint) or its input overflowed")


def check_finite_weights(model: nn.Module) -> None:
    """NonFiniteLogits naming the first parameter that holds NaN or inf: one NaN in an attention weight
    need not reach the logits (a short input's CPU attention can return finite values), so the logits'
    check alone would let such a model print other text. One pass over the weights, before the first step."""
    for name, param in model.named_parameters():
        if param.is_floating_point() and not bool(torch.isfinite(param).all()):
            raise NonFiniteLogits(f"the model's weights are not finite (NaN or +inf) in {name}, so its tokens would "
                                  "be noise: a run whose loss diverged, or a damaged checkpoint")


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """One token id from logits (V,); NonFiniteLogits (a ValueError) when they hold NaN or +inf."""
    check_finite_logits(logits)
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(filter_logits(logits, params.temperature, params.top_k, params.top_p), dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def sample_rows(logits: Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]) -> list[int]:
    """One token per row of logits (B, V), row b drawn with params[b] and generators[b]: the greedy
    rows take one argmax over all of them (one kernel, one copy to Python, instead of one per row);
    the others go through ``sample`` one by one (each may carry its own filters and generator)."""
    check_finite_logits(logits)
    greedy = [b for b, p in enumerate(params) if p.temperature == 0]
    out = [0] * len(params)
    if greedy:
        rows = logits if len(greedy) == len(params) else logits[torch.tensor(greedy, device=logits.device)]
        for b, tok in zip(greedy, rows.argmax(dim=-1).tolist()):
            out[b] = tok
    for b, p in enumerate(params):
        if p.temperature != 0:
            out[b] = sample(logits[b], p, generators[b])
    return out


def check_decoder(model: nn.Module, who: str = "generate") -> None:
    """ValueError unless ``model`` is a decoder-only model (Decoder, GPT), the kind that continues a
    prompt; an encoder-decoder (``Seq2SeqTransformer``) translates instead."""
    config = getattr(model, "config", None)
    if config is None or hasattr(config, "src_vocab_size") or not hasattr(config, "vocab_size"):
        raise ValueError(
            f"{who} needs a decoder-only model (Decoder or GPT), which continues a prompt; got "
            f"{type(model).__name__}, an encoder-decoder that translates: use companion.inference.translate "
            "(greedy_decode, beam_search_one) or python -m companion sample --checkpoint RUN_DIR --prompt TEXT")


def context_length(model: nn.Module) -> int:
    """The longest sequence ``model`` reads (``config.context_length``, every config's name for it)."""
    return model.config.context_length


def check_prompts(model: nn.Module, prompts) -> list[list[int]]:
    """Prompts as lists of ints: one list, a list of lists, or an integer tensor (T,) or (B, T).
    Token ids must be integers (Python, NumPy or integer-dtype tensors): 2.0 or a float tensor is
    refused, never rounded. Empty, too long, non-integer or out-of-vocabulary prompts raise
    ValueError naming ``prompts``."""
    if isinstance(prompts, Tensor):
        if prompts.dtype.is_floating_point or prompts.dtype.is_complex or prompts.dtype == torch.bool:
            raise ValueError(f"prompts must hold integer token ids; got a tensor of dtype {prompts.dtype}")
        if prompts.dim() not in (1, 2):
            raise ValueError(f"a prompts tensor must be (T,) or (B, T); got shape {tuple(prompts.shape)}")
        prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
    if isinstance(prompts, (str, bytes)):
        raise ValueError("prompts must be token ids (a list of ints, a list of lists or a tensor); got a string")
    if not hasattr(prompts, "__iter__"):
        raise ValueError(f"prompts must be token ids (a list of ints, a list of lists or a tensor); got "
                         f"{type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts must hold at least one prompt; got none")
    if all(is_int(t) for t in prompts):
        prompts = [prompts]
    ctx, vocab = context_length(model), model.config.vocab_size
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, Tensor):
            if p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool or p.dim() != 1:
                raise ValueError(f"prompts[{i}] must be a 1-D tensor of integer token ids; got dtype {p.dtype}, shape {tuple(p.shape)}")
            p = p.tolist()
        if isinstance(p, (str, bytes)) or not hasattr(p, "__iter__"):
            raise ValueError(f"prompts[{i}] must be a list of token ids; got {type(p).__name__}")
        p = list(p)
        bad = next((t for t in p if not is_int(t)), None)
        if bad is not None:
            raise ValueError(f"prompts[{i}] holds {bad!r}, which is not an integer token id")
        p = [int(t) for t in p]
        if not p:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token")
        if len(p) > ctx:
            raise ValueError(f"prompts[{i}] has {len(p)} tokens, longer than the model's context ({ctx})")
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompts[{i}] has token ids outside [0, vocab_size={vocab})")
        out.append(p)
    return out


def _padded_forward(model: nn.Module, seqs: Sequence[Sequence[int]]) -> Tensor:
    """No cache: the whole of every sequence, right-padded; (B, V) logits at each last real token."""
    device = next(model.parameters()).device
    L = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long, device=device)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, device=device)
    logits = model(ids)  # (B, L, V); row b's padding sits after its tokens, so causality hides it
    return logits[torch.arange(len(seqs), device=device), torch.tensor([len(s) - 1 for s in seqs], device=device)]


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # generated ids per prompt (a stop token, when hit, is included)
    finish_reasons: list[str]  # "stop", "length" (max_new_tokens) or "context" (model context full)
    logits: list[Tensor] | None = None  # per prompt (n_generated, V) raw logits, only with keep_logits=True
    kv_bytes: int = 0  # KV storage held at the end of prefill+decode (contiguous/paged)
    extra: dict = field(default_factory=dict)


def packed_forward(model: nn.Module, caches: Sequence, chunks: Sequence[Sequence[int]]) -> Tensor:
    """Feed chunks[b] (new tokens of sequence b, at positions caches[b].length ...) through the model
    in ONE forward; returns the logits of each chunk's last token, (B, V). Caches are updated. The
    sequences of one page pool go as a ``PagedBatch`` (the engine's step, with buffers of this batch's
    size); any other caches as a ``PackedBatchCache``, one view per sequence."""
    device = next(model.parameters()).device
    lengths = [len(c) for c in chunks]
    owner = getattr(caches[0], "owner", None)
    if owner is not None and all(getattr(c, "owner", None) is owner for c in caches):
        context = StepBuffers(max(1, sum(lengths)), len(caches), max(len(c.table) for c in caches) + max(lengths),
                              owner.pool.device).fill(owner, caches, lengths, chunks)
        logits = model(context.input_ids[None].to(device), cache=PagedBatch(owner, context), positions=context.positions.to(device))[0]
        return context.last_rows(logits)
    ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long, device=device)[None]  # (1, N)
    positions = torch.tensor([j for c, ch in zip(caches, chunks) for j in range(c.length, c.length + len(ch))], dtype=torch.long, device=device)
    logits = model(ids, cache=PackedBatchCache(caches, lengths), positions=positions)[0]  # (N, V)
    if len(lengths) == ids.shape[1]:  # one token each (decoding): every row is a last row
        return logits
    last = torch.tensor(lengths).cumsum(0) - 1
    return logits[last.to(device)]


def stream(
    model: nn.Module,
    prompts,
    params: SamplingParams | None = None,
    *,
    cache: str = "contiguous",
    page_size: int = 16,
    kv_bits: int | None = None,
    keep_logits: bool = False,
    _result: GenerationResult | None = None,
) -> Iterator[list[tuple[int, int]]]:
    """An iterator that yields, at every step, the (prompt index, new token) pairs of that step.
    Arguments are checked here, before the first step (ValueError naming the argument).
    ``keep_logits``: copy every step's logits to the host for ``GenerationResult.logits`` (a device
    sync and a (B, V) copy per step, so off unless asked for)."""
    params = params or SamplingParams()
    params.validate()
    if cache not in CACHE_MODES:
        raise ValueError(f"cache must be one of {CACHE_MODES}; got {cache!r}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1; got {page_size}")
    if kv_bits is not None and cache != "paged":  # only the page pool stores quantised K/V
        raise ValueError(f"kv_bits applies only to cache='paged' (quantised pages); got kv_bits={kv_bits!r} with "
                         f"cache={cache!r}: drop kv_bits or use cache='paged'")
    if kv_bits is not None and kv_bits not in KV_BITS:
        raise ValueError(f"kv_bits must be None or one of {KV_BITS}; got {kv_bits!r}")
    if not isinstance(keep_logits, bool):
        raise ValueError(f"keep_logits must be True or False; got {keep_logits!r}")
    check_decoder(model, "generate")
    prompts = check_prompts(model, prompts)
    check_finite_weights(model)
    vocab = model.config.vocab_size
    if params.stop_tokens and max(params.stop_tokens) >= vocab:  # an id the model never produces stops nothing
        raise ValueError(f"stop_tokens must be ids in [0, vocab_size={vocab}); got {max(params.stop_tokens)}")
    return _steps(model, prompts, params, cache, page_size, kv_bits, keep_logits, _result)


def _steps(model, prompts, params, cache, page_size, kv_bits, keep_logits, _result) -> Iterator[list[tuple[int, int]]]:
    B, ctx = len(prompts), context_length(model)
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in range(B)]
    logit_rows: list[list[Tensor]] = [[] for _ in range(B)]
    reasons = ["length" if params.max_new_tokens == 0 else "" for _ in range(B)]
    shared = params.seed if isinstance(params.seed, torch.Generator) else None
    gens = [shared or params.generator() for _ in range(B)]
    caches: list = []
    pool = None
    if cache == "contiguous":
        caches = [model.new_cache() for _ in range(B)]
    elif cache == "paged":
        n_pages = sum(-(-min(len(p) + params.max_new_tokens, ctx) // page_size) for p in prompts)
        weight = next(model.parameters())
        pool = PagedKVCache(model, n_pages, page_size, bits=kv_bits, dtype=weight.dtype, device=weight.device, prefix_sharing=False)
        caches = [pool.new_sequence() for _ in range(B)]
    pending = [list(p) for p in prompts]  # tokens not yet fed to the model
    try:
        with torch.no_grad():
            while True:
                active = [i for i in range(B) if not reasons[i]]
                if not active:
                    break
                if cache == "none":
                    logits = _padded_forward(model, [seqs[i] for i in active])
                else:
                    logits = packed_forward(model, [caches[i] for i in active], [pending[i] for i in active])
                events = []
                toks = sample_rows(logits, [params] * len(active), [gens[i] for i in active])
                for row, (i, tok) in enumerate(zip(active, toks)):
                    outs[i].append(tok)
                    seqs[i].append(tok)
                    pending[i] = [tok]
                    if keep_logits:
                        logit_rows[i].append(logits[row].float().cpu())
                    events.append((i, tok))
                    reasons[i] = finish_reason(tok, params, len(outs[i]), len(seqs[i]), ctx) or ""
                if _result is not None and cache != "none":
                    _result.kv_bytes = max(_result.kv_bytes, _held_bytes(caches, pool))
                yield events
    finally:
        if pool is not None:
            for c in caches:
                c.free()
        if _result is not None:
            _result.tokens, _result.finish_reasons = outs, reasons
            if keep_logits:
                _result.logits = [torch.stack(r) if r else torch.zeros(0, model.config.vocab_size) for r in logit_rows]
            if pool is not None:
                _result.extra["free_pages_after"] = pool.n_free
                _result.extra["n_pages"] = pool.n_pages


def _held_bytes(caches, pool) -> int:
    if pool is not None:
        return sum(c.nbytes_held() for c in caches)
    return sum(c.nbytes() for c in caches)


def generate(
    model: nn.Module,
    prompts,
    params: SamplingParams | None = None,
    *,
    cache: str = "contiguous",
    page_size: int = 16,
    kv_bits: int | None = None,
    stream_tokens: bool = False,
    keep_logits: bool = False,
    **sampling,
) -> GenerationResult | Iterator[list[tuple[int, int]]]:
    """Generate continuations of ``prompts`` (one list of ids, a list of them, or a (B, T) tensor).

    Sampling settings come as ``params`` or as keywords (max_new_tokens, temperature, top_k, top_p,
    stop_tokens, seed). ``cache`` in ``CACHE_MODES``; ``page_size`` and ``kv_bits`` (None, 8, 4) apply
    to "paged" (``kv_bits`` with another cache is a ValueError, not silently ignored). ``stream_tokens=True`` returns the step iterator of ``stream`` instead.
    ``keep_logits=True`` also returns each step's raw logits (``GenerationResult.logits``, on the CPU);
    by default they are not copied and ``logits`` is None.
    """
    if params is None:
        params = SamplingParams(**sampling)
    elif sampling:
        raise ValueError(f"pass sampling settings either as params or as keywords, not both; got {sorted(sampling)}")
    if stream_tokens:
        return stream(model, prompts, params, cache=cache, page_size=page_size, kv_bits=kv_bits, keep_logits=keep_logits)
    result = GenerationResult([], [])
    for _ in stream(model, prompts, params, cache=cache, page_size=page_size, kv_bits=kv_bits, keep_logits=keep_logits,
                    _result=result):
        pass
    return result
