"""The online softmax: partial statistics of attention over a set of keys, and their merge (the
FlashAttention chapter, equation 11.3).

For one query row with scores s_j and values v_j over a set A of keys, the state is

    m_A = max_{j in A} s_j,   l_A = sum_{j in A} exp(s_j - m_A),   u_A = sum_{j in A} exp(s_j - m_A) v_j,

and two disjoint sets combine exactly (``merge``):

    m = max(m_A, m_B),   l = e^{m_A - m} l_A + e^{m_B - m} l_B,   u = e^{m_A - m} u_A + e^{m_B - m} u_B.

The attention output is u / l (``finalize``) and log sum_j e^{s_j} = m + log l (``logsumexp``). A tiled
kernel (``companion.kernels.flash.tiled_attention``) visits the keys block by block and merges; this
module is the algebra it rests on, independent of how the blocks are chosen.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["SoftmaxState", "empty_state", "block_state", "merge", "finalize", "logsumexp", "NEG_INF"]

NEG_INF = float("-inf")



# ----------------------------------------------------------------------------------------------
# The state and its merge
# ----------------------------------------------------------------------------------------------


class SoftmaxState(NamedTuple):
    """Partial softmax statistics of each query row over one set A of keys.

    m: (..., T)      the largest score m_A (``-inf`` if A is empty or every key in it is masked)
    l: (..., T)      l_A = sum_j exp(s_j - m_A), the softmax denominator relative to m_A
    u: (..., T, d_v) u_A = sum_j exp(s_j - m_A) v_j, the un-normalised output relative to m_A

    Keeping l and u *relative to m_A* is what makes the state safe to hold in finite precision:
    every exponent is <= 0, so nothing overflows, however large the scores are.
    """

    m: Tensor
    l: Tensor
    u: Tensor


def _finite_or_zero(m: Tensor) -> Tensor:
    """m where finite, 0 where m = -inf. Used as the shift of an exponent so that an empty set
    (m = -inf) never computes (-inf) - (-inf) = NaN."""
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _check_state(state: SoftmaxState, name: str) -> None:
    if not isinstance(state, SoftmaxState):
        raise ValueError(f"{name} must be a SoftmaxState; got {type(state).__name__}")
    m, l, u = state
    if m.shape != l.shape or u.shape[:-1] != m.shape:
        raise ValueError(
            f"{name} must have m and l of shape (..., T) and u of shape (..., T, d_v); "
            f"got m {tuple(m.shape)}, l {tuple(l.shape)}, u {tuple(u.shape)}"
        )


def empty_state(rows_shape: tuple[int, ...] | torch.Size, d_v: int, *, dtype=torch.float32, device=None) -> SoftmaxState:
    """The state of the empty set of keys: m = -inf, l = 0, u = 0.

    It is the identity of ``merge`` (merge(empty, s) == s), so a loop can start from it.
    """
    if d_v < 0 or any(int(n) < 0 for n in rows_shape):
        raise ValueError(f"rows_shape and d_v must be non-negative; got {tuple(rows_shape)} and {d_v}")
    rows_shape = tuple(int(n) for n in rows_shape)
    return SoftmaxState(
        m=torch.full(rows_shape, NEG_INF, dtype=dtype, device=device),
        l=torch.zeros(rows_shape, dtype=dtype, device=device),
        u=torch.zeros((*rows_shape, d_v), dtype=dtype, device=device),
    )


def block_state(scores: Tensor, v: Tensor) -> SoftmaxState:
    """The state (m, l, u) of one block of keys.

    Args:
        scores: (..., T, S_b) scaled scores of the block, ``-inf`` where a key is masked.
        v: (..., S_b, d_v) the block's values (leading dims broadcast against ``scores``).

    A row whose keys in this block are all masked gets m = -inf, l = 0, u = 0: the state of the
    empty set, which ``merge`` then ignores. The shift by m is replaced by 0 for such rows, since
    exp(-inf - (-inf)) would be NaN.
    """
    if scores.dim() < 2 or v.dim() < 2:
        raise ValueError(f"scores and v must have shapes (..., T, S_b) and (..., S_b, d_v); got {tuple(scores.shape)}, {tuple(v.shape)}")
    if scores.shape[-1] != v.shape[-2]:
        raise ValueError(f"scores' last dim (S_b={scores.shape[-1]}) must equal v's rows (dim -2, {v.shape[-2]})")
    if torch.isposinf(scores).any():
        raise ValueError("scores must be finite or -inf (masked); got +inf")
    return _block_state(scores, v)


def _block_state(scores: Tensor, v: Tensor) -> SoftmaxState:
    """``block_state`` without the argument checks, for the inner loop of ``tiled_attention``."""
    if scores.shape[-1] == 0:
        m = torch.full(scores.shape[:-1], NEG_INF, dtype=scores.dtype, device=scores.device)
    else:
        m = scores.amax(dim=-1)
    p = torch.exp(scores - _finite_or_zero(m).unsqueeze(-1))  # masked entries: exp(-inf) = 0
    return SoftmaxState(m=m, l=p.sum(dim=-1), u=p @ v.to(p.dtype))


def merge(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """The state of the disjoint union A + B (the online-softmax update):

        m = max(m_A, m_B),   l = e^{m_A - m} l_A + e^{m_B - m} l_B,   u = e^{m_A - m} u_A + e^{m_B - m} u_B.

    Each side's sums were taken relative to its own maximum; multiplying by e^{m_X - m} <= 1
    re-expresses them relative to the common maximum, after which they simply add. If both sides
    are empty (m = -inf) the result is empty too, without NaN; if one side is empty its factor is
    e^{-inf} = 0 and the other side passes through unchanged.
    """
    _check_state(a, "a")
    _check_state(b, "b")
    m = torch.maximum(a.m, b.m)
    shift = _finite_or_zero(m)  # only -inf when both sides are empty; then both factors are 0
    alpha = torch.exp(a.m - shift)
    beta = torch.exp(b.m - shift)
    return SoftmaxState(
        m=m,
        l=alpha * a.l + beta * b.l,
        u=alpha.unsqueeze(-1) * a.u + beta.unsqueeze(-1) * b.u,
    )


def finalize(state: SoftmaxState) -> Tensor:
    """o = u / l, the attention output of each row. A row that read no key (l = 0) gets zeros,
    the same convention as ``companion.attention.scaled_dot_product_attention``."""
    _check_state(state, "state")
    l = state.l.unsqueeze(-1)
    return state.u / torch.where(l > 0, l, torch.ones_like(l))


def logsumexp(state: SoftmaxState) -> Tensor:
    """log sum_j e^{s_j} = m + log l for each row; -inf for a row that read no key.

    This one number per row is all the backward pass needs to rebuild any probability:
    P_ij = exp(s_ij - logsumexp_i).
    """
    _check_state(state, "state")
    has_keys = state.l > 0
    safe_l = torch.where(has_keys, state.l, torch.ones_like(state.l))
    return torch.where(has_keys, state.m + torch.log(safe_l), torch.full_like(state.m, NEG_INF))
