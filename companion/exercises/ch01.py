"""Checkers for chapter 1's exercises (attention).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch01.masked_softmax``: ``fn(scores (..., T, S), keep (bool, broadcastable)) -> weights``, the
  softmax of equation (1.5) over the keys a query may read; a row with no readable key is all
  zeros.
- ``ch01.attention``: ``fn(q (..., T, d_k), k (..., S, d_k), v (..., S, d_v), keep=None) -> O
  (..., T, d_v)``, equation (1.2) with a boolean mask (True = may read).
- ``ch01.attention_backward``: ``fn(q, k, v, grad_out) -> (grad_q, grad_k, grad_v)``, the
  gradients of equation (1.2) written by hand through the softmax Jacobian (1.4).
- ``ch01.score_matrix_bytes``: ``fn(T, heads, bytes_per_value) -> int``, the memory of one layer's
  materialised score matrices.

Each checker draws fresh inputs from the generator it is given, runs the learner's function and
the reference (``companion.attention``, or autograd for the backward pass) and, on a mismatch,
says which case failed and, where it recognises a typical mistake, which one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from companion.attention import (
    causal_mask,
    scaled_dot_product_attention,
    stable_softmax,
)
from companion.exercises import ExerciseFailed, call, diagnose, register


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


def _random_keep(gen: torch.Generator, *shape: int) -> Tensor:
    """A random boolean mask with every row keeping at least one key."""
    keep = torch.rand(*shape, generator=gen) < 0.6
    first = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    return keep.scatter(-1, first.unsqueeze(-1), True)


# --- ch01.masked_softmax -----------------------------------------------------------------------


def _masked_softmax_cases(gen: torch.Generator):
    """(description, scores, keep) for each case, easiest first."""
    yield "2-D scores (4, 6), random mask", _randn(gen, 4, 6), _random_keep(gen, 4, 6)
    keep = _random_keep(gen, 2, 1, 1, 7).expand(2, 3, 5, 7)
    yield "batched scores (2, 3, 5, 7), padding mask", _randn(gen, 2, 3, 5, 7), keep
    big = 1000.0 + _randn(gen, 3, 5, scale=5.0)
    yield "scores near 1000 (overflow if not max-subtracted)", big, _random_keep(gen, 3, 5)
    keep = _random_keep(gen, 4, 5)
    keep[2] = False
    yield "row 2 has every key masked", _randn(gen, 4, 5), keep


@register("ch01.masked_softmax")
def check_masked_softmax(fn, gen, report) -> None:
    for case, scores, keep in _masked_softmax_cases(gen):
        expected = stable_softmax(scores.masked_fill(~keep, float("-inf")))
        got = call(case, fn, scores.clone(), keep.clone())
        if isinstance(got, Tensor) and got.shape == expected.shape:
            empty = ~keep.expand(expected.shape).any(-1)  # (..., T) rows with nothing to read
            if empty.any() and not torch.isfinite(got[empty]).all():
                raise ExerciseFailed(f"{case}: a row whose keys are all masked must be all zeros "
                                     f"(nothing to read), got NaN/inf")
        mistakes = {
            "a plain softmax that ignores the mask": torch.softmax(scores, -1),
            "zeroing masked weights after the softmax (rows no longer sum to 1)":
                torch.softmax(scores, -1) * keep,
        }
        diagnose(case, got, expected, mistakes, zero_where=~keep.expand(expected.shape),
                  zero_what="masked entries (keys the query may not read)")
        report.cases.append(case)


# --- ch01.attention ----------------------------------------------------------------------------


@register("ch01.attention")
def check_attention(fn, gen, report) -> None:
    T, S = 4, 6
    with_empty_row = _random_keep(gen, T, S)
    with_empty_row[1] = False  # query 1 may read nothing: its output must be the zero vector
    cases = [
        ("one query (1, 8) against 6 keys, d_v = 3",
         _randn(gen, 1, 8), _randn(gen, S, 8), _randn(gen, S, 3), None),
        ("T = 4 queries, S = 6 keys, d_k = 5, d_v = 2",
         _randn(gen, T, 5), _randn(gen, S, 5), _randn(gen, S, 2), None),
        ("batched (2, 3, 5, 4) with a causal mask",
         _randn(gen, 2, 3, 5, 4), _randn(gen, 2, 3, 5, 4), _randn(gen, 2, 3, 5, 4),
         causal_mask(5)),
        ("random mask with one fully masked row (expect a zero output row)",
         _randn(gen, T, 8), _randn(gen, S, 8), _randn(gen, S, 3), with_empty_row),
    ]
    for case, q, k, v, keep in cases:
        expected = scaled_dot_product_attention(q, k, v, keep)
        args = (q.clone(), k.clone(), v.clone()) + (() if keep is None else (keep.clone(),))
        got = call(case, fn, *args)
        scores = q @ k.transpose(-2, -1)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        mistakes = {
            "attention without the 1/sqrt(d_k) scale": stable_softmax(scores) @ v,
            "a softmax over the queries (dim=-2) instead of the keys (dim=-1)":
                torch.softmax(scores / math.sqrt(q.shape[-1]), -2).nan_to_num(0.0) @ v,
        }
        if isinstance(got, Tensor) and tuple(got.shape) == tuple(scores.shape):
            raise ExerciseFailed(f"{case}: wrong shape: expected {tuple(expected.shape)} = "
                                 f"(..., T, d_v), got {tuple(got.shape)} = (..., T, S): return the "
                                 f"weighted sum of the values, not the weights")
        diagnose(case, got, expected, mistakes)
        report.cases.append(case)


# --- ch01.attention_backward -------------------------------------------------------------------


def _attention_grads(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = scaled_dot_product_attention(q, k, v)
    return torch.autograd.grad(out, (q, k, v), grad_out)


@register("ch01.attention_backward")
def check_attention_backward(fn, gen, report) -> None:
    shapes = [("T = 3, S = 5, d_k = 4, d_v = 2", (3, 5, 4, 2)),
              ("T = S = 6, d_k = d_v = 8", (6, 6, 8, 8)),
              ("batched (2, 3) heads, T = 4, S = 7", (4, 7, 5, 3))]
    for i, (case, (T, S, dk, dv)) in enumerate(shapes):
        lead = (2, 3) if i == 2 else ()
        q, k = _randn(gen, *lead, T, dk), _randn(gen, *lead, S, dk)
        v, grad_out = _randn(gen, *lead, S, dv), _randn(gen, *lead, T, dv)
        expected = _attention_grads(q, k, v, grad_out)
        got = call(case, fn, q.clone(), k.clone(), v.clone(), grad_out.clone())
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise ExerciseFailed(f"{case}: return the three gradients (grad_q, grad_k, grad_v); "
                                 f"got {type(got).__name__}")
        # Two typical slips: forgetting the 1/sqrt(d_k) of the scores in grad_q and grad_k, and
        # passing grad_A straight through the softmax as if its Jacobian (1.4) were the identity.
        unscaled = [g * math.sqrt(dk) for g in expected[:2]]
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dk), -1)
        grad_a = grad_out @ v.transpose(-2, -1)
        no_jacobian = [grad_a @ k / math.sqrt(dk), grad_a.transpose(-2, -1) @ q / math.sqrt(dk)]
        for name, g, e, wrong, skipped in zip(("grad_q", "grad_k"), got[:2], expected[:2],
                                              unscaled, no_jacobian):
            diagnose(f"{case}, {name}", g, e,
                      {"the gradient without the 1/sqrt(d_k) factor of the scores": wrong,
                       "skipping the softmax Jacobian (1.4) (grad_S = grad_A)": skipped})
        diagnose(f"{case}, grad_v", got[2], expected[2],
                  {"A @ grad_out (it must be A^T @ grad_out)": weights @ grad_out
                   if T == S else torch.empty(0)})
        report.cases.append(case)


# --- ch01.score_matrix_bytes -------------------------------------------------------------------


@register("ch01.score_matrix_bytes")
def check_score_matrix_bytes(fn, gen, report) -> None:
    draws = torch.randint(1, 64, (3, 3), generator=gen).tolist()
    cases = [(4096, 32, 2), *((16 * t, h, [1, 2, 4][b % 3]) for t, h, b in draws)]
    for T, heads, nbytes in cases:
        case = f"T = {T}, {heads} heads, {nbytes} bytes per value"
        got = call(case, fn, T, heads, nbytes)
        expected = T * T * heads * nbytes
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise ExerciseFailed(f"{case}: expected a number of bytes, got {type(got).__name__}")
        if got != expected:
            mistakes = {T * heads * nbytes: "T entries per head instead of T * T",
                        T * T * nbytes: "one head instead of all of them",
                        T * T * heads: "a count of values, not of bytes"}
            hint = mistakes.get(got)
            raise ExerciseFailed(f"{case}: expected {expected:,} bytes, got {got:,}"
                                 + (f" -- that is {hint}" if hint else ""))
        report.cases.append(case)
