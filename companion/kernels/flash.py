"""FlashAttention from the online softmax up, in plain PyTorch (the FlashAttention chapter).

What this module provides (the first five live in ``companion.kernels.online_softmax``, the last
three in ``companion.kernels.traffic``; all are importable from here)
- ``SoftmaxState``: the partial statistics (m, l, u) of one query row over a *set* of keys:
      m_A = max_{j in A} s_j,   l_A = sum_{j in A} exp(s_j - m_A),   u_A = sum_{j in A} exp(s_j - m_A) v_j.
- ``empty_state``: the state of the empty set (m = -inf, l = 0, u = 0), the identity of ``merge``.
- ``block_state(scores, v)``: the state of one block of keys from its (masked) scores.
- ``merge(a, b)``: the state of a disjoint union A + B,
      m = max(m_A, m_B),   l = e^{m_A - m} l_A + e^{m_B - m} l_B,   u = e^{m_A - m} u_A + e^{m_B - m} u_B.
- ``finalize(state)``: the attention output o = u / l (zeros for a row that read no key), and
  ``logsumexp(state)``: log sum_j e^{s_j} = m + log l (-inf for such a row).
- ``tiled_attention(q, k, v, ...)``: exact attention computed block by block with the merge above,
  returning (O, logsumexp). It skips key blocks that a causal or sliding-window mask excludes
  entirely, reads grouped K/V heads without copying them (GQA / MQA), and is differentiable through
  ``FlashAttentionFunction``, whose forward saves only Q, K, V, O and the logsumexp and whose
  backward recomputes each block of probabilities (the FlashAttention-2 backward).
- ``dense_traffic_bytes`` and ``tiled_traffic_bytes``: the bytes a dense and a tiled kernel move
  between the GPU's main memory (HBM) and its chips, in the simple model of the FlashAttention
  chapter (the dense kernel writes and reads the T x S scores and probabilities; the tiled one reads
  K and V once per query block, or once if they stay in cache, and writes only O and the logsumexp).
- ``TensorBytes``: a context manager that counts the bytes of tensor storage the operations inside
  it allocate, and the peak, exactly and deterministically (no allocator or OS statistics).

Conventions are those of ``companion.attention``: shapes (..., heads, T, d); boolean masks are True
where a query may read a key; the T query rows sit at absolute positions S - T .. S - 1 of the S
keys, so a causal mask with T < S is what a KV cache needs.

This is a teaching implementation: the Python loops over blocks stand for the loops a GPU kernel
runs in on-chip memory (``companion.kernels.triton_flash`` holds such a kernel). On a CPU it is slower than
the dense reference, but its extra memory grows linearly in T rather than quadratically
(benchmarks/flash_memory.py measures both).
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion.attention import resolve_scale
from companion.kernels.online_softmax import (
    NEG_INF, SoftmaxState, _block_state, _finite_or_zero, block_state, empty_state, finalize, logsumexp, merge,
)
from companion.kernels.traffic import TensorBytes, dense_traffic_bytes, tiled_traffic_bytes

# The online-softmax algebra (``companion.kernels.online_softmax``) and the traffic model
# (``companion.kernels.traffic``) are their own modules; they are re-exported here because the
# chapter imports the whole story from this one name.
__all__ = [
    "SoftmaxState",
    "empty_state",
    "block_state",
    "merge",
    "finalize",
    "logsumexp",
    "tiled_attention",
    "FlashAttentionFunction",
    "key_block_range",
    "dense_traffic_bytes",
    "tiled_traffic_bytes",
    "TensorBytes",
]


# ----------------------------------------------------------------------------------------------
# 1. Which key blocks a query block needs
# ----------------------------------------------------------------------------------------------


def key_block_range(q_start: int, q_end: int, T: int, S: int, block_k: int, *, causal: bool, window: int | None) -> range:
    """Indices of the key blocks that query rows [q_start, q_end) may read at all.

    Row i sits at position p = S - T + i and reads keys j with j <= p (causal) and j > p - window
    (sliding window). Over the rows of the block, the readable keys therefore lie in
    [p_first - window + 1, p_last]; key blocks outside that interval are skipped without computing
    a single score. This is where causal attention saves about half of the work, and a sliding
    window all but O(T * window) of it.
    """
    n_blocks = -(-S // block_k)
    if not causal:
        return range(n_blocks)
    p_first, p_last = S - T + q_start, S - T + q_end - 1
    hi = min(n_blocks, p_last // block_k + 1)  # the block holding key p_last is the last one needed
    lo = 0 if window is None else max(0, (p_first - window + 1) // block_k)
    return range(lo, max(lo, hi))


def _position_mask(q_start: int, q_end: int, k_start: int, k_end: int, T: int, S: int, window: int | None, device) -> Tensor:
    """The (q_end - q_start, k_end - k_start) causal / sliding-window mask of one block, from indices."""
    rows = torch.arange(q_start, q_end, device=device).unsqueeze(1) + (S - T)
    cols = torch.arange(k_start, k_end, device=device).unsqueeze(0)
    keep = cols <= rows
    if window is not None:
        keep &= rows - cols < window
    return keep


def _block_needs_position_mask(q_start: int, q_end: int, k_start: int, k_end: int, T: int, S: int, window: int | None) -> bool:
    """False when every (row, key) pair of the block is allowed, so no mask needs building.

    The block is fully visible if its last key is at or before the first row's position, and (with a
    window) its first key is still inside the last row's window.
    """
    p_first, p_last = S - T + q_start, S - T + q_end - 1
    inside_causal = k_end - 1 <= p_first
    inside_window = window is None or p_last - k_start < window
    return not (inside_causal and inside_window)


# ----------------------------------------------------------------------------------------------
# 2. Validation shared by the forward and backward
# ----------------------------------------------------------------------------------------------


def check_causal_window(T: int, S: int, causal: bool, window: int | None) -> None:
    """The rules every attention kernel here shares for its T query rows placed at the end of S keys."""
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool; got {causal!r}")
    if causal and S < T:
        raise ValueError(f"causal attention needs S >= T (the queries are the last T of the S positions); got T={T}, S={S}")
    if window is not None:
        if not causal:
            raise ValueError("window requires causal=True: a sliding window here looks back only")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window must be an int >= 1 (a query always sees itself); got {window!r}")


def _validate(q, k, v, causal, mask, window, block_q, block_k, scale):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.dim() < 3:
            raise ValueError(f"{name} must have shape (..., heads, rows, d) with at least 3 dims; got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor; got dtype {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-3] != v.shape[:-3]:
        raise ValueError(
            f"q, k and v must share their leading (batch) dims; got {tuple(q.shape[:-3])}, {tuple(k.shape[:-3])}, {tuple(v.shape[:-3])}"
        )
    h, g = q.shape[-3], k.shape[-3]
    if v.shape[-3] != g:
        raise ValueError(f"k and v must have the same number of heads (dim -3); got {g} and {v.shape[-3]}")
    if g == 0 or h % g != 0:
        raise ValueError(f"the query heads ({h}) must be a positive multiple of the key/value heads ({g})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the key width d_k (last dim); got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of rows S (dim -2); got {k.shape[-2]} and {v.shape[-2]}")
    T, S = q.shape[-2], k.shape[-2]
    check_causal_window(T, S, causal, window)
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"{name} must be an int >= 1; got {b!r}")
    scale = resolve_scale(scale, q.shape[-1])
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dim() < 2:
            raise ValueError("mask must be a tensor broadcastable to (..., heads, T, S)")
        if not (mask.dtype == torch.bool or mask.is_floating_point()):
            raise ValueError(f"mask must be bool (True = may read) or floating (additive); got dtype {mask.dtype}")
        if mask.is_floating_point() and (torch.isposinf(mask).any() or torch.isnan(mask).any()):
            raise ValueError("an additive mask must be finite or -inf; got +inf or NaN")
        try:
            torch.broadcast_shapes(mask.shape, (*q.shape[:-2], T, S))
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to {(*q.shape[:-2], T, S)} = (..., heads, T, S)") from None
        if mask.requires_grad:
            raise ValueError("mask must not require grad: tiled_attention does not differentiate through the mask")
    return float(scale)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are accumulated in float32 (as GPU kernels do); float32/64 stay as they are."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _Layout:
    """Grouped views of q, k, v (and the mask) that let query heads share K/V heads without copies.

    With h query heads and g key/value heads, query head i reads K/V head i // (h/g) (the same
    assignment as ``repeat_interleave``). Viewing q as (..., g, h/g, T, d) and k, v as
    (..., g, 1, S, d) makes a plain batched matmul broadcast each K/V head over its group.
    """

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None):
        self.h, self.g = q.shape[-3], k.shape[-3]
        self.r = self.h // self.g
        self.T, self.S = q.shape[-2], k.shape[-2]
        self.lead = q.shape[:-3]
        self.q = q.unflatten(-3, (self.g, self.r))
        self.k = k.unsqueeze(-3)
        self.v = v.unsqueeze(-3)
        self.mask = None
        if mask is not None:
            # broadcast_to and unflatten are views: the user's mask is never copied per head
            full = mask.broadcast_to((*self.lead, self.h, self.T, self.S))
            self.mask = full.unflatten(-3, (self.g, self.r))

    def grouped(self, x: Tensor) -> Tensor:
        """(..., h, T, *) -> (..., g, r, T, *)."""
        return x.unflatten(len(self.lead), (self.g, self.r))


def _block_scores(lay: _Layout, qs, qe, ks, ke, q_blk, scale, causal, window, compute_dtype) -> Tensor:
    """Scaled, masked scores of query rows [qs, qe) against keys [ks, ke): shape (..., g, r, bq, bk)."""
    k_blk = lay.k[..., ks:ke, :].to(compute_dtype)
    s = (q_blk @ k_blk.transpose(-2, -1)) * scale
    if causal and _block_needs_position_mask(qs, qe, ks, ke, lay.T, lay.S, window):
        s = s.masked_fill(~_position_mask(qs, qe, ks, ke, lay.T, lay.S, window, s.device), NEG_INF)
    if lay.mask is not None:
        m_blk = lay.mask[..., qs:qe, ks:ke]
        if m_blk.dtype == torch.bool:
            s = s.masked_fill(~m_blk, NEG_INF)
        else:
            s = s + m_blk.to(compute_dtype)
    return s


# ----------------------------------------------------------------------------------------------
# 3. Forward: loop over query blocks, and for each over the key blocks it may read
# ----------------------------------------------------------------------------------------------


def _tiled_forward(q, k, v, causal, mask, window, block_q, block_k, scale):
    """Returns O (input dtype) and the logsumexp (compute dtype), both computed without a T x S tensor."""
    cd = _compute_dtype(q.dtype)
    lay = _Layout(q, k, v, mask)
    T, S, d_v = lay.T, lay.S, v.shape[-1]
    out = torch.empty((*lay.lead, lay.g, lay.r, T, d_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((*lay.lead, lay.g, lay.r, T), dtype=cd, device=q.device)
    for qs in range(0, T, block_q):
        qe = min(T, qs + block_q)
        q_blk = lay.q[..., qs:qe, :].to(cd)
        # The running state of these rows, over the key blocks seen so far (starts empty).
        state = empty_state((*q_blk.shape[:-1],), d_v, dtype=cd, device=q.device)
        for kb in key_block_range(qs, qe, T, S, block_k, causal=causal, window=window):
            ks, ke = kb * block_k, min(S, (kb + 1) * block_k)
            s = _block_scores(lay, qs, qe, ks, ke, q_blk, scale, causal, window, cd)
            state = merge(state, _block_state(s, lay.v[..., ks:ke, :].to(cd)))
        # Normalise once per row, at the end: o = u / l. Rows with nothing to read stay zero.
        out[..., qs:qe, :] = finalize(state).to(q.dtype)
        lse[..., qs:qe] = logsumexp(state)
    return out.flatten(-4, -3), lse.flatten(-3, -2)


# ----------------------------------------------------------------------------------------------
# 4. Backward: recompute each block's probabilities from the saved logsumexp
# ----------------------------------------------------------------------------------------------


def _tiled_backward(q, k, v, out, lse, d_out, d_lse, causal, mask, window, block_q, block_k, scale):
    """Gradients of (O, logsumexp) with respect to q, k, v, one block at a time (FlashAttention-2).

    With S = scale * Q K^T (+ mask), P = softmax(S) and O = P V, and per row L = logsumexp(S):
        P_ij = exp(S_ij - L_i)                         recomputed from the saved L, never stored
        dV   = P^T dO
        dP   = dO V^T
        D_i  = sum_j P_ij dP_ij = rowsum(dO * O)_i     (because O = P V), computed once, O(T d)
        dS   = P * (dP - D + dL)                       softmax's Jacobian; dL is the gradient of L
        dQ   = scale * dS K,   dK = scale * dS^T Q.
    The loop runs over key blocks outside and query blocks inside, so each dK_j, dV_j is summed in
    one place (in a GPU kernel: in registers) while dQ_i is accumulated across the outer loop.
    """
    cd = _compute_dtype(q.dtype)
    lay = _Layout(q, k, v, mask)
    T, S = lay.T, lay.S
    d_out = lay.grouped(d_out.to(cd))
    o = lay.grouped(out.to(cd))
    lse = lay.grouped(lse.to(cd))
    d_lse = torch.zeros_like(lse) if d_lse is None else lay.grouped(d_lse.to(cd))
    # A row that read no key has L = -inf and every score -inf; shifting by 0 instead keeps P = 0.
    lse_shift = _finite_or_zero(lse)
    delta = (d_out * o).sum(dim=-1)  # D = rowsum(dO * O)

    dq = torch.zeros(lay.q.shape, dtype=cd, device=q.device)
    dk = torch.zeros(k.shape, dtype=cd, device=q.device)
    dv = torch.zeros(v.shape, dtype=cd, device=q.device)
    # Inverse of key_block_range: the query blocks that read key block kb.
    n_q = -(-T // block_q)
    for kb in range(-(-S // block_k)):
        ks, ke = kb * block_k, min(S, (kb + 1) * block_k)
        k_blk = lay.k[..., ks:ke, :].to(cd)
        v_blk = lay.v[..., ks:ke, :].to(cd)
        dk_blk = torch.zeros((*lay.q.shape[:-2], ke - ks, k.shape[-1]), dtype=cd, device=q.device)
        dv_blk = torch.zeros((*lay.q.shape[:-2], ke - ks, v.shape[-1]), dtype=cd, device=q.device)
        for qb in range(n_q):
            qs, qe = qb * block_q, min(T, (qb + 1) * block_q)
            if kb not in key_block_range(qs, qe, T, S, block_k, causal=causal, window=window):
                continue
            q_blk = lay.q[..., qs:qe, :].to(cd)
            s = _block_scores(lay, qs, qe, ks, ke, q_blk, scale, causal, window, cd)
            p = torch.exp(s - lse_shift[..., qs:qe].unsqueeze(-1))
            do_blk = d_out[..., qs:qe, :]
            dv_blk += p.transpose(-2, -1) @ do_blk
            dp = do_blk @ v_blk.transpose(-2, -1)
            ds = p * (dp - delta[..., qs:qe].unsqueeze(-1) + d_lse[..., qs:qe].unsqueeze(-1))
            dq[..., qs:qe, :] += scale * (ds @ k_blk)
            dk_blk += scale * (ds.transpose(-2, -1) @ q_blk)
        # The r query heads of a group all read the same K/V head: their contributions add up.
        dk[..., ks:ke, :] = dk_blk.sum(dim=-3)
        dv[..., ks:ke, :] = dv_blk.sum(dim=-3)
    return dq.flatten(-4, -3).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashAttentionFunction(torch.autograd.Function):
    """Tiled attention as one autograd node: saves Q, K, V, O and logsumexp, recomputes the rest.

    Autograd through the dense formula would keep the T x S probability matrix alive until the
    backward pass; this node keeps O(T d) numbers per head instead, and pays with a second pass of
    QK^T in the backward (compute is cheap, memory traffic is not; see the chapter). Call it through
    ``tiled_attention``, which validates the arguments.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, window, block_q, block_k, scale):
        out, lse = _tiled_forward(q, k, v, causal, mask, window, block_q, block_k, scale)
        # Only these five tensors (plus the user's own mask, if one was passed) survive to the backward.
        # save_for_backward takes tensors only: an absent mask is remembered as a flag, not as None.
        ctx.has_mask = mask is not None
        ctx.save_for_backward(q, k, v, out, lse, *((mask,) if ctx.has_mask else ()))
        ctx.config = (causal, window, block_q, block_k, scale)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse, *rest = ctx.saved_tensors
        mask = rest[0] if ctx.has_mask else None
        causal, window, block_q, block_k, scale = ctx.config
        if d_out is None:
            d_out = torch.zeros_like(out)
        dq, dk, dv = _tiled_backward(q, k, v, out, lse, d_out, d_lse, causal, mask, window, block_q, block_k, scale)
        return dq, dk, dv, None, None, None, None, None, None


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = False,
    mask: Tensor | None = None,
    window: int | None = None,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Exact attention softmax(scale * Q K^T + M) V, evaluated in (block_q x block_k) tiles.

    Args:
        q: (..., h, T, d_k) queries.
        k: (..., g, S, d_k) keys, with g dividing h (g = h: MHA, 1 < g < h: GQA, g = 1: MQA).
        v: (..., g, S, d_v) values.
        causal: row i (at position S - T + i) reads keys j <= S - T + i.
        mask: optional extra mask broadcastable to (..., h, T, S): boolean (True = may read) or
            additive (added to the scores, -inf forbids). It is sliced block by block, never copied.
        window: with ``causal``, row at position p reads only keys p - window + 1 .. p.
        block_q, block_k: tile sizes; need not divide T or S.
        scale: score multiplier, default 1 / sqrt(d_k).

    Returns:
        O of shape (..., h, T, d_v) in the input dtype, and the logsumexp of each row's scaled,
        masked scores, shape (..., h, T), in float32 for half inputs. A row with nothing to read
        has O = 0 and logsumexp = -inf.

    Gradients (for q, k, v) flow through ``FlashAttentionFunction``: its backward recomputes the
    blocks, so no T x S tensor is kept between forward and backward.
    """
    scale = _validate(q, k, v, causal, mask, window, block_q, block_k, scale)
    return FlashAttentionFunction.apply(q, k, v, mask, causal, window, block_q, block_k, scale)
