"""Checkers for chapter 8's exercises (sharing keys and values: MHA, GQA, MQA and MLA).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch08.head_map``: ``fn(n_heads, n_kv_heads) -> (h,)`` integer tensor, equation (8.1) counted
  from 0: query head r reads key/value head floor(r / (h / g)).
- ``ch08.kv_cache_bytes``: ``fn(batch, layers, tokens, n_heads, n_kv_heads, head_dim,
  bytes_per_value) -> int``, equation (8.3): 2 B L T g d_h b (the query heads do not appear).
- ``ch08.gqa_attention``: ``fn(q (B, h, T, d), k (B, g, T, d), v (B, g, T, d)) -> (B, h, T, d)``,
  causal grouped-query attention, equation (8.2): head r attends with K and V of head pi(r).
- ``ch08.mla_absorbed``: ``fn(q_c (B, h, T, d_h), q_r (B, h, T, d_R), c (B, S, d_c),
  k_r (B, S, d_R), u_k (h, d_c, d_h), u_v (h, d_c, d_v)) -> (B, h, T, d_v)``: MLA attention
  computed from the cached latents, equations (8.5) to (8.7); the T queries sit at the last T of the S
  positions (a decode step when T = 1) and read positions up to their own.

Each checker draws fresh inputs from the generator it is given, computes the reference with
``companion.kernels.attend`` / ``companion.accounting`` / ``companion.mha`` (never the learner's
route), and on a mismatch names the case and, where it recognises a typical mistake, which one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from companion.accounting import kv_cache_bytes
from companion.exercises import ExerciseFailed, call, diagnose, register
from companion.kernels.attend import attend
from companion.mha import head_map


def _randn(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _int(gen: torch.Generator, low: int, high: int) -> int:
    return int(torch.randint(low, high + 1, (), generator=gen))


def _layouts(gen: torch.Generator) -> list[tuple[int, int]]:
    """(h, g) pairs: MHA, MQA, GQA, and random GQA layouts."""
    fixed = [(4, 4), (4, 1), (8, 2), (6, 3)]
    for _ in range(2):
        g = _int(gen, 2, 4)
        fixed.append((g * _int(gen, 2, 4), g))
    return fixed


# --- ch08.head_map ------------------------------------------------------------------------------


@register("ch08.head_map")
def _check_head_map(fn, gen: torch.Generator, report) -> None:
    for h, g in _layouts(gen):
        case = f"h={h}, g={g}"
        got = call(case, fn, h, g)
        if not isinstance(got, Tensor):
            try:
                got = torch.as_tensor(got)
            except (TypeError, ValueError, RuntimeError):  # None, a string: a wrong answer, not a crash
                raise ExerciseFailed(f"{case}: expected a tensor of head indices, got {type(got).__name__}") from None
        expected = head_map(h, g)
        if got.dtype.is_floating_point:
            raise ExerciseFailed(f"{case}: return integer head indices (got dtype {got.dtype})")
        mistakes = {
            "r mod g: neighbouring query heads read different key/value heads (the order of "
            "`repeat`, not of `repeat_interleave`)": torch.arange(h) % g,
            "r // g: the group size is h / g, not g": torch.arange(h) // g,
            "pi counted from 1; the book (and every index tensor) numbers heads from 0":
                expected + 1,
        }
        diagnose(case, got, expected, mistakes, atol=0, rtol=0)
        report.cases.append(case)


# --- ch08.kv_cache_bytes -------------------------------------------------------------------------


@register("ch08.kv_cache_bytes")
def _check_kv_cache_bytes(fn, gen: torch.Generator, report) -> None:
    cases = [(1, 32, 8192, 32, 32, 128, 2), (1, 32, 8192, 32, 8, 128, 2), (1, 32, 8192, 32, 1, 128, 2)]
    for _ in range(3):
        g = 2 ** _int(gen, 0, 3)
        cases.append((_int(gen, 1, 8), _int(gen, 1, 80), _int(gen, 1, 10**5), g * 2 ** _int(gen, 0, 3), g,
                      64 * _int(gen, 1, 4), (1, 2, 4)[_int(gen, 0, 2)]))
    for B, L, T, h, g, d_h, b in cases:
        case = f"B={B}, L={L}, T={T}, h={h}, g={g}, d_h={d_h}, b={b}"
        got = call(case, fn, B, L, T, h, g, d_h, b)
        expected = kv_cache_bytes(L, g, d_h, tokens=T, batch=B, bytes_per_value=b)
        if isinstance(got, Tensor):
            if got.numel() != 1:  # .item() of a (3, 3) tensor raises: fail the answer instead
                raise ExerciseFailed(f"{case}: expected a number of bytes, got a tensor of shape {tuple(got.shape)}")
            got = got.item()
        if not isinstance(got, (int, float)) or got != expected:
            hints = {
                2 * B * L * T * h * d_h * b: "you counted the query heads h; the cache holds g key/value heads",
                B * L * T * g * d_h * b: "the factor 2 is missing: keys AND values are cached",
                2 * B * L * T * g * d_h * b * 8: "that is bits; b is bytes per stored number",
                2 * L * T * g * d_h * b: "the batch B is missing: every sequence has its own cache",
            }
            hint = hints.get(got, "compare with 2 B L T g d_h b")
            raise ExerciseFailed(f"{case}: expected {expected:,} bytes, got {got!r}: {hint}")
        report.cases.append(case)


# --- ch08.gqa_attention --------------------------------------------------------------------------


@register("ch08.gqa_attention")
def _check_gqa_attention(fn, gen: torch.Generator, report) -> None:
    for h, g in _layouts(gen):
        B, T, d = _int(gen, 1, 2), _int(gen, 2, 7), 2 * _int(gen, 2, 8)
        q, k, v = _randn(gen, B, h, T, d), _randn(gen, B, g, T, d), _randn(gen, B, g, T, d)
        case = f"h={h}, g={g}, B={B}, T={T}, d={d}"
        got = call(case, fn, q.clone(), k.clone(), v.clone())
        expected = attend(q, k, v, causal=True, backend="reference")
        mistakes = {
            "attention without the causal mask": attend(q, k, v, causal=False, backend="reference"),
            "scores not divided by sqrt(d)": attend(q, k, v, causal=True, scale=1.0, backend="reference"),
        }
        if 1 < g < h:  # only GQA tells tiling (head r reads r mod g) from interleaving apart
            tiled_k, tiled_v = k.repeat(1, h // g, 1, 1), v.repeat(1, h // g, 1, 1)
            mistakes["the keys and values tiled with `repeat` (head r reads r mod g) instead of "
                     "`repeat_interleave` (head r reads r // (h/g))"] = attend(
                q, tiled_k, tiled_v, causal=True, backend="reference")
        diagnose(case, got, expected, mistakes, atol=1e-6, rtol=1e-5)
        report.cases.append(case)


# --- ch08.mla_absorbed ---------------------------------------------------------------------------


def _mla_expanded(q_c, q_r, c, k_r, u_k, u_v, scale, rope=True, causal=True):
    """Reference: rebuild every head's key [c U_K^r, k^R] and value c U_V^r, then plain attention."""
    h = q_c.shape[1]
    k_c = torch.einsum("bsc,hcd->bhsd", c, u_k)
    v = torch.einsum("bsc,hcv->bhsv", c, u_v)
    B, S = c.shape[:2]
    if rope:
        q = torch.cat((q_c, q_r), -1)
        k = torch.cat((k_c, k_r[:, None].expand(B, h, S, k_r.shape[-1])), -1)
    else:
        q, k = q_c, k_c
    return attend(q, k, v, causal=causal, scale=scale, backend="reference")


@register("ch08.mla_absorbed")
def _check_mla_absorbed(fn, gen: torch.Generator, report) -> None:
    shapes = [(1, 2, 1, 6, 8, 4, 2, 4), (2, 4, 3, 9, 12, 8, 4, 6), (1, 3, 1, 1, 5, 4, 2, 4)]
    for _ in range(2):
        shapes.append((_int(gen, 1, 2), _int(gen, 1, 4), _int(gen, 1, 3), _int(gen, 4, 10), _int(gen, 4, 16),
                       2 * _int(gen, 1, 4), 2 * _int(gen, 1, 3), 2 * _int(gen, 1, 4)))
    for B, h, T, S, d_c, d_h, d_r, d_v in shapes:
        S = max(S, T)
        case = f"B={B}, h={h}, T={T}, S={S}, d_c={d_c}, d_h={d_h}, d_R={d_r}, d_v={d_v}"
        q_c, q_r = _randn(gen, B, h, T, d_h), _randn(gen, B, h, T, d_r)
        c, k_r = _randn(gen, B, S, d_c), _randn(gen, B, S, d_r)
        u_k, u_v = _randn(gen, h, d_c, d_h) / math.sqrt(d_c), _randn(gen, h, d_c, d_v) / math.sqrt(d_c)
        got = call(case, fn, q_c.clone(), q_r.clone(), c.clone(), k_r.clone(), u_k.clone(), u_v.clone())
        args = (q_c, q_r, c, k_r, u_k, u_v)
        expected = _mla_expanded(*args, scale=(d_h + d_r) ** -0.5)
        mistakes = {
            "scores divided by sqrt(d_h): the score has d_h + d_R terms, divide by sqrt(d_h + d_R)":
                _mla_expanded(*args, scale=d_h ** -0.5),
            "the RoPE term q^R . k^R is missing from the score": _mla_expanded(*args, scale=(d_h + d_r) ** -0.5,
                                                                              rope=False),
            "no causal mask: the T queries are the last T positions and read positions <= their own":
                _mla_expanded(*args, scale=(d_h + d_r) ** -0.5, causal=False),
            "U_K used where U_V belongs: the values are c_j U_V^r":
                _mla_expanded(q_c, q_r, c, k_r, u_k, u_k, scale=(d_h + d_r) ** -0.5) if d_v == d_h else None,
        }
        diagnose(case, got, expected, {k: w for k, w in mistakes.items() if w is not None}, atol=1e-6,
                 rtol=1e-5)
        report.cases.append(case)
