"""Checkers for chapter 11's exercises (FlashAttention).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch11.merge``: ``fn(a, b) -> (m, l, u)`` for two softmax states a = (m_A, l_A, u_A) and
  b = (m_B, l_B, u_B) of shapes (T,), (T,), (T, d_v): the state of the union of the two key sets,
  equation (11.3). Checked against ``companion.kernels.flash.merge``, empty sets and huge scores
  included.
- ``ch11.tiles_visited``: ``fn(T, block, causal) -> int``, the number of (query block, key block)
  tiles a tiled kernel computes for T queries over T keys, skipping the tiles a causal mask
  excludes entirely (``companion.kernels.flash.key_block_range``).
- ``ch11.tiled_attention``: ``fn(q (T, d), k (S, d), v (S, d_v), block, causal) -> O (T, d_v)``,
  attention by blocks with the online softmax, which must never hold a T x S tensor (checked by
  counting the bytes it allocates with ``companion.kernels.flash.TensorBytes``).
- ``ch11.backward_from_lse``: ``fn(q, k, v, o, lse, d_out) -> (dq, dk, dv)`` for one head (T, d)
  with scale 1/sqrt(d) and no mask: the gradients rebuilt from the saved logsumexp, equation (11.6),
  checked against autograd through the dense formula.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from companion.attention import causal_mask, scaled_dot_product_attention
from companion.exercises import ExerciseFailed, call, compare, diagnose, register
from companion.kernels.flash import SoftmaxState, TensorBytes, block_state, key_block_range, merge

NEG_INF = float("-inf")


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


def _as_state(case: str, got, what: str = "your function") -> tuple[Tensor, Tensor, Tensor]:
    if not (isinstance(got, tuple) and len(got) == 3 and all(isinstance(x, Tensor) for x in got)):
        raise ExerciseFailed(f"{case}: {what} must return a tuple (m, l, u) of three tensors; got "
                             f"{type(got).__name__}")
    return got


# --- ch11.merge --------------------------------------------------------------------------------


def _merge_cases(gen: torch.Generator):
    """(description, scores, values, split) with split a boolean (T, S): True = the key is in A."""
    T, S, dv = 5, 9, 3
    yield "a random split of 9 keys", _randn(gen, T, S), _randn(gen, S, dv), torch.rand(T, S, generator=gen) < 0.5
    big = 1000.0 + _randn(gen, T, S, scale=5.0)
    yield "scores near 1000 (overflow without the max)", big, _randn(gen, S, dv), torch.rand(T, S, generator=gen) < 0.5
    split = torch.rand(T, S, generator=gen) < 0.5
    split[1], split[3] = True, False  # row 1: B is empty; row 3: A is empty
    yield "row 1 has B empty, row 3 has A empty", _randn(gen, T, S), _randn(gen, S, dv), split
    scores = _randn(gen, T, S)
    scores[2] = NEG_INF  # every key of row 2 masked: both sides empty
    yield "row 2 has every key masked (both sides empty)", scores, _randn(gen, S, dv), torch.rand(T, S, generator=gen) < 0.5


@register("ch11.merge")
def check_merge(fn, gen, report) -> None:
    for case, scores, v, in_a in _merge_cases(gen):
        a = block_state(scores.masked_fill(~in_a, NEG_INF), v)
        b = block_state(scores.masked_fill(in_a, NEG_INF), v)
        expected = merge(a, b)
        got = _as_state(case, call(case, fn, SoftmaxState(*(x.clone() for x in a)),
                                   SoftmaxState(*(x.clone() for x in b))))
        m = torch.maximum(a.m, b.m)
        shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        alpha, beta = torch.exp(a.m - shift), torch.exp(b.m - shift)
        mistakes = {
            "u added without rescaling (only l was rescaled)": a.u + b.u,
            "each side rescaled by exp(m_X) instead of exp(m_X - m) (no max subtracted)":
                torch.exp(a.m).unsqueeze(-1) * a.u + torch.exp(b.m).unsqueeze(-1) * b.u,
            "the factors swapped between the sides": beta.unsqueeze(-1) * a.u + alpha.unsqueeze(-1) * b.u,
        }
        compare(f"{case}, m", got[0], expected.m)
        diagnose(f"{case}, l", got[1], expected.l, {
            "l added without rescaling": a.l + b.l, "the factors swapped between the sides": beta * a.l + alpha * b.l})
        diagnose(f"{case}, u", got[2], expected.u, mistakes)
        report.cases.append(case)


# --- ch11.tiles_visited ------------------------------------------------------------------------


def tiles_visited_reference(T: int, block: int, causal: bool) -> int:
    """Tiles (query block, key block) a tiled kernel computes for T queries over T keys."""
    return sum(len(key_block_range(qs, min(T, qs + block), T, T, block, causal=causal, window=None))
               for qs in range(0, T, block))


@register("ch11.tiles_visited")
def check_tiles_visited(fn, gen, report) -> None:
    draws = torch.randint(1, 200, (4,), generator=gen).tolist()
    cases = [(256, 64, False), (256, 64, True), (100, 32, True), (1, 16, True),
             *((t, [8, 16, 32, 64][t % 4], bool(t % 2)) for t in draws)]
    for T, block, causal in cases:
        case = f"T = {T}, block = {block}, causal = {causal}"
        got = call(case, fn, T, block, causal)
        expected = tiles_visited_reference(T, block, causal)
        if isinstance(got, bool) or not isinstance(got, int):
            raise ExerciseFailed(f"{case}: expected an int (a number of tiles), got {type(got).__name__}")
        if got != expected:
            n = -(-T // block)
            hint = ""
            if T % block and got in ((T // block) ** 2, (T // block) * (T // block + 1) // 2):
                hint = " -- a last, partial block still counts: use ceil(T / block) blocks"
            elif causal and got == n * (n - 1) // 2:
                hint = " -- you left out the diagonal tiles, which are partly visible"
            elif causal and got == n * n:
                hint = " -- with causal=True the tiles above the diagonal are skipped"
            raise ExerciseFailed(f"{case}: expected {expected} tiles, got {got}{hint}")
        report.cases.append(case)


# --- ch11.tiled_attention ----------------------------------------------------------------------


@register("ch11.tiled_attention")
def check_tiled_attention(fn, gen, report) -> None:
    # The first two cases are large enough for a T x S matrix to dwarf everything else a blockwise
    # answer holds (its output, one tile, the running state): there the bytes are checked too.
    cases = [("T = S = 128, block 16, no mask", 128, 128, 16, False),
             ("T = S = 128, block 16, causal", 128, 128, 16, True),
             ("T = 37, S = 50, block 16, causal (queries are the last 37 positions)", 37, 50, 16, True),
             ("T = 20, S = 70, block 32, no mask (blocks need not divide T or S)", 20, 70, 32, False)]
    for n, (case, T, S, block, causal) in enumerate(cases):
        q, k, v = _randn(gen, T, 8), _randn(gen, S, 8), _randn(gen, S, 4)
        args = (q.clone(), k.clone(), v.clone(), block, causal)
        with TensorBytes() as meter:
            got = call(case, fn, *args)
        expected = scaled_dot_product_attention(q, k, v, causal_mask(T, S) if causal else None)
        diagnose(case, got, expected, {
            "attention without the causal mask": scaled_dot_product_attention(q, k, v),
            "a causal mask aligned at the first key (row i reads keys <= i) instead of the last":
                scaled_dot_product_attention(q, k, v, torch.ones(T, S, dtype=torch.bool).tril()),
            "scores not scaled by 1/sqrt(d)": scaled_dot_product_attention(q, k, v, causal_mask(T, S) if causal else None,
                                                                           scale=1.0),
        }, atol=1e-8, rtol=1e-6)
        full = T * S * q.element_size()
        if n < 2 and meter.peak >= full:
            raise ExerciseFailed(f"{case}: your function held {meter.peak} bytes of tensors at once, as much as a "
                                 f"whole T x S matrix ({full} bytes): compute one block of scores at a time")
        report.cases.append(case)


# --- ch11.backward_from_lse --------------------------------------------------------------------


@register("ch11.backward_from_lse")
def check_backward_from_lse(fn, gen, report) -> None:
    for case, T, d in [("T = 6, d = 4", 6, 4), ("T = 17, d = 8", 17, 8), ("T = 1, d = 3", 1, 3)]:
        leaves = [_randn(gen, T, d).requires_grad_() for _ in range(3)]
        d_out = _randn(gen, T, d)
        scores = leaves[0] @ leaves[1].T / math.sqrt(d)
        o = torch.softmax(scores, -1) @ leaves[2]
        grads = torch.autograd.grad(o, leaves, d_out)
        lse = torch.logsumexp(scores, -1).detach()
        q, k, v = (x.detach() for x in leaves)
        got = call(case, fn, q.clone(), k.clone(), v.clone(), o.detach().clone(), lse.clone(), d_out.clone())
        if not (isinstance(got, tuple) and len(got) == 3):
            raise ExerciseFailed(f"{case}: return a tuple (dq, dk, dv); got {type(got).__name__}")
        p = torch.exp(q @ k.T / math.sqrt(d) - lse[:, None])
        dp = d_out @ v.T
        no_delta = p * dp
        compare(f"{case}, dv", got[2], grads[2])
        diagnose(f"{case}, dq", got[0], grads[0], {
            "dS without the - D term (D = rowsum(dO * O))": no_delta @ k / math.sqrt(d),
            "dq without the 1/sqrt(d) scale": p * (dp - (d_out * o.detach()).sum(-1, keepdim=True)) @ k,
        })
        diagnose(f"{case}, dk", got[1], grads[1], {
            "dS without the - D term (D = rowsum(dO * O))": no_delta.T @ q / math.sqrt(d),
        })
        report.cases.append(case)
