"""Checkers for chapter 10's exercises (the KV cache).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch10.decode_step``: ``fn(q, k, v, cache_k, cache_v) -> (out, cache_k, cache_v)``: one decode step of
  one attention layer; q, k, v (B, h, 1, d) are the new row's, cache_k and cache_v (B, h, S0, d) the
  stored rows (S0 may be 0). Append k and v along dim -2, then attend the new query over all S0 + 1
  rows: out = softmax(q K^T / sqrt(d)) V, (B, h, 1, d), equation (10.2).
- ``ch10.chunk_mask``: ``fn(cache_length, T, window) -> (positions (T,), mask (T, S))``: T new rows after
  ``cache_length`` stored ones, S = cache_length + T keys, all kept: positions cache_length + i and the
  boolean mask "key j readable by query i" (causal, and p_i - j < window when ``window`` is an int).
- ``ch10.cache_bytes``: ``fn(config, tokens, batch, bytes_per_value) -> int``: the bytes a contiguous
  cache of ``batch`` sequences holds after ``tokens`` positions of a ``DecoderConfig``: per layer,
  2 g d_h b (GQA / MQA) or (d_c + d_R) b (MLA) per stored row, and a sliding-window layer stores only
  the rows a future query can still read (the last w - 1, plus ``keep`` initial ones).

Each checker draws fresh inputs, compares with an independent reference (``companion.attention``,
``companion.mha.position_mask``, ``companion.accounting.kv_bytes_per_token``) and names the typical
mistake a wrong answer reproduces.
"""

from __future__ import annotations

import numbers

import torch

from companion.accounting import kv_bytes_per_token
from companion.attention import scaled_dot_product_attention
from companion.exercises import ExerciseFailed, call, compare, diagnose, register
from companion.mha import position_mask
from companion.models import preset_config


def _pair(case: str, got, n: int = 2) -> tuple:
    if not (isinstance(got, (tuple, list)) and len(got) == n):
        raise ExerciseFailed(f"{case}: expected a tuple of {n} values, got {type(got).__name__}")
    return tuple(got)


# --- ch10.decode_step ----------------------------------------------------------------------------


@register("ch10.decode_step")
def check_decode_step(fn, gen, report) -> None:
    cases = [("an empty cache: the first token, (1, 2, 0, 8)", 1, 2, 0, 8),
             ("one sequence, 4 heads, 9 cached rows", 1, 4, 9, 16),
             ("a batch of 3, 2 heads, 5 cached rows", 3, 2, 5, 8)]
    for case, B, h, S0, d in cases:
        q, k, v = (torch.randn(B, h, 1, d, generator=gen, dtype=torch.float64) for _ in range(3))
        ck, cv = (torch.randn(B, h, S0, d, generator=gen, dtype=torch.float64) for _ in range(2))
        K, V = torch.cat((ck, k), dim=-2), torch.cat((cv, v), dim=-2)
        expected = scaled_dot_product_attention(q, K, V)
        got = _pair(case, call(case, fn, q.clone(), k.clone(), v.clone(), ck.clone(), cv.clone()), 3)
        out, got_k, got_v = got
        mistakes = {
            "attention without the 1 / sqrt(d) scale": scaled_dot_product_attention(q, K, V, scale=1.0),
            "a softmax over the query axis (every weight 1): the softmax runs over the keys":
                (q @ K.transpose(-1, -2) / d**0.5).softmax(-2) @ V,
        }
        if S0:  # attending before appending: the new query misses its own key and value
            mistakes["attending over the old rows only: append k and v first, the new row reads itself"] = (
                scaled_dot_product_attention(q, ck, cv))
        diagnose(case + ", output", out, expected, mistakes, atol=1e-9, rtol=1e-9)
        diagnose(case + ", returned keys", got_k, K, {
            "the new key put first: append it at the end (dim -2), in position order": torch.cat((k, ck), -2),
        }, atol=0, rtol=0)
        compare(case + ", returned values", got_v, V, atol=0, rtol=0)
        report.cases.append(case)


# --- ch10.chunk_mask -----------------------------------------------------------------------------


@register("ch10.chunk_mask")
def check_chunk_mask(fn, gen, report) -> None:
    cases = [("a prefill: empty cache, T = 5", 0, 5, None), ("one decode row after 7 cached", 7, 1, None),
             ("a chunk of 3 after 4 cached", 4, 3, None), ("a chunk of 4 after 6, window 3", 6, 4, 3)]
    for case, L, T, window in cases:
        S = L + T
        positions = torch.arange(L, L + T)
        keys = torch.arange(S)
        expected = position_mask(positions, keys, window=window)
        got_pos, got_mask = _pair(case, call(case, fn, L, T, window))
        diagnose(case + ", positions", got_pos, positions, {
            "positions counted from 0: the new rows sit after the cache, at cache_length + i": torch.arange(T),
        }, atol=0, rtol=0)
        if not isinstance(got_mask, torch.Tensor) or got_mask.dtype != torch.bool:
            raise ExerciseFailed(f"{case}, mask: expected a boolean tensor, got "
                                 f"{getattr(got_mask, 'dtype', type(got_mask).__name__)}")
        if tuple(got_mask.shape) == (T, T) and L:
            raise ExerciseFailed(f"{case}, mask: a square (T, T) = {(T, T)} mask; the new queries read the "
                                 f"cached keys too: the mask is (T, S) = {(T, S)}")
        mistakes = {"a strict mask (key j < p_i): a query reads its own key":
                    position_mask(positions, keys, window=window) & (keys[None] != positions[:, None])}
        if window:
            mistakes[f"a window one too wide (p_i - j <= {window}): the window counts the query itself"] = (
                position_mask(positions, keys, window=window + 1))
        diagnose(case + ", mask", got_mask.long(), expected.long(),
                 {k: m.long() for k, m in mistakes.items()}, atol=0, rtol=0)
        report.cases.append(case)


# --- ch10.cache_bytes ----------------------------------------------------------------------------


def stored_rows(window: int | None, keep: int, tokens: int) -> int:
    """Rows a contiguous layer cache holds after ``tokens`` positions: all of them on a global layer;
    on a sliding-window layer those a future query (position >= tokens) can read: p >= tokens - w + 1
    or p < keep. Counted position by position (the reference does not use a closed form)."""
    if window is None:
        return tokens
    return sum(1 for p in range(tokens) if p >= tokens - window + 1 or p < keep)


def reference_cache_bytes(config, tokens: int, batch: int = 1, bytes_per_value: int = 2) -> int:
    per_token = kv_bytes_per_token(config, bytes_per_value)
    windows = [None] * config.n_layers if config.attention == "mla" else config.layer_windows()
    return batch * sum(per * stored_rows(w, config.keep, tokens) for per, w in zip(per_token, windows))


@register("ch10.cache_bytes")
def check_cache_bytes(fn, gen, report) -> None:
    cases = [("llama-like (GQA, 2 of 4 heads)", "llama-like", {}, 40, 2, 4),
             ("qwen3-like (head_dim 32 = d_model / 2)", "qwen3-like", {}, 33, 1, 2),
             ("gemma3-like (5 local layers of window 8 : 1 global, MQA)", "gemma3-like", {}, 50, 3, 2),
             ("mistral-like with window 6 and 2 kept tokens", "mistral-like", {"window": 6, "keep": 2}, 30, 1, 2),
             ("deepseek-like (MLA: a latent and a RoPE key)", "deepseek-like", {}, 21, 2, 4)]
    extra = int(torch.randint(0, 7, (), generator=gen))  # a fresh token count every call
    for case, name, overrides, tokens, batch, b in cases:
        c = preset_config(name, **overrides)
        tokens += extra
        expected = reference_cache_bytes(c, tokens, batch, b)
        got = call(case, fn, c, tokens, batch, b)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, numbers.Real):
            raise ExerciseFailed(f"{case}: expected a number of bytes, got {type(got).__name__}")
        if got != expected:
            hints = {"the cache of every layer holding all tokens (a windowed layer keeps only w - 1 rows "
                     "plus the kept ones)": batch * sum(kv_bytes_per_token(c, b)) * tokens}
            if c.attention == "mha":
                g, dh = c.kv_heads, c.attn_head_dim
                rows = sum(stored_rows(w, c.keep, tokens) for w in c.layer_windows())
                hints["n_heads key/value heads: a GQA / MQA cache stores n_kv_heads"] = (
                    2 * batch * rows * c.n_heads * dh * b)
                hints["keys only (the factor 2 counts keys and values)"] = batch * rows * g * dh * b
                hints["head_dim = d_model / n_heads (this config sets head_dim)"] = (
                    2 * batch * rows * g * (c.d_model // c.n_heads) * b)
            else:
                hints["MLA taken as per-head keys and values (it caches one latent and one RoPE key per "
                      "token)"] = 2 * batch * tokens * c.n_layers * c.n_heads * (c.mla_head_dim + c.rope_dim) * b
            hint = next((h for h, x in hints.items() if x == got), None)
            more = f" -- your result equals {hint}" if hint else ""
            raise ExerciseFailed(f"{case}: expected {expected} bytes after {tokens} tokens, got {got}{more}")
        report.cases.append(case)
