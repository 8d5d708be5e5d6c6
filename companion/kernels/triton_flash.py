"""A FlashAttention-2 kernel in Triton, forward and backward, for CUDA GPUs.

What this module provides
- ``triton_attention(q, k, v, causal=False, window=None, scale=None)``: differentiable attention for
  CUDA tensors (B, h, T, d) and (B, g, S, d) with g dividing h (MHA / GQA / MQA), fp16 or bf16
  inputs, head dim 16, 32, 64 or 128 (64 and 128 are the targets), accumulated in float32. It is what
  ``companion.kernels.attend.attend(..., backend="triton")`` calls.
- ``flash_forward(q, k, v, ...)`` -> (O, logsumexp) and ``flash_backward(...)`` -> (dQ, dK, dV): the
  two halves, exposed for benchmarks/flash_gpu.py and the tests.
- ``triton_available()`` and ``INTERPRET``: whether the kernels can run here.

The algorithm is the one of ``companion.kernels.flash`` (read that module first), with each Python loop over
blocks turned into a program instance on the GPU:
- forward: one program per (query block, batch x head). It keeps the block's running state
  (m, l, acc) in registers, streams K/V blocks from HBM, and writes O and the logsumexp once.
- backward, keys side: one program per (key block, batch x K/V head) accumulates dK, dV over every
  query head of its group and every query block that can see it; no atomics are needed.
- backward, queries side: one program per (query block, batch x head) accumulates dQ.
  D = rowsum(dO * O) is a cheap O(T d) reduction done in PyTorch before the two kernels.
Scores are handled in base 2 (exp2 of s * scale * log2 e), which is what the hardware's fast
exponential computes; the logsumexp is stored in natural log, as ``companion.kernels.flash`` returns it.

Status: written for, but not yet run on, a GPU. On a CPU the same kernels run under Triton's
interpreter (TRITON_INTERPRET=1 set before this module is imported), which is how
tests/test_triton_flash.py checks them when no GPU is present. Block sizes are fixed choices, not
autotuned; benchmarks/flash_gpu.py times a few alternatives.

Triton is optional (``pip install 'companion[triton]'``): without it this module still imports and
every entry point raises an error that says what to install.
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion.attention import resolve_scale
from companion.kernels import _triton
from companion.kernels._triton import INTERPRET, LOG2E, loop_bounds, tl, triton  # noqa: F401  (triton, tl: see _triton)
from companion.kernels.flash import check_causal_window

__all__ = ["triton_attention", "flash_forward", "flash_backward", "triton_available", "INTERPRET", "HEAD_DIMS"]

HEAD_DIMS = (16, 32, 64, 128)  # tl.dot needs every dimension >= 16; the register tile needs a power of two
DTYPES = (torch.float16, torch.bfloat16)


def triton_available() -> bool:
    """True when triton is importable and the kernels can run: on CUDA, or under the interpreter."""
    return _triton.runnable(INTERPRET)  # this module's INTERPRET, which a test may set


# ----------------------------------------------------------------------------------------------
# Kernels (defined only when triton is installed)
# ----------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _mask_block(offs_m, offs_n, T, S, OFFSET, WINDOW, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
        """(M, N) boolean: row offs_m (at position offs_m + OFFSET) may read key offs_n."""
        keep = (offs_m[:, None] < T) & (offs_n[None, :] < S)
        if CAUSAL:
            pos = offs_m[:, None] + OFFSET
            keep = keep & (offs_n[None, :] <= pos)
            if HAS_WINDOW:
                keep = keep & (pos - offs_n[None, :] < WINDOW)
        return keep

    @loop_bounds
    @triton.jit
    def _key_range(start_m, S, OFFSET, WINDOW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_WINDOW: tl.constexpr):
        """[lo, hi): the keys the query rows start_m .. start_m + BLOCK_M - 1 may read, lo rounded down to a
        key block (companion.kernels.flash.key_block_range); the forward and the dQ pass both loop over it."""
        lo = 0
        hi = S
        if CAUSAL:
            hi = tl.minimum(S, start_m + BLOCK_M + OFFSET)
            if HAS_WINDOW:
                lo = tl.maximum(0, start_m + OFFSET - WINDOW + 1)
                lo = (lo // BLOCK_N) * BLOCK_N
        return lo, hi

    @loop_bounds
    @triton.jit
    def _query_range(start_n, T, OFFSET, WINDOW, GROUP, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
        """[lo, hi): the query rows that can see the keys start_n .. start_n + BLOCK_N - 1 (positions >=
        start_n when causal, < start_n + BLOCK_N - 1 + WINDOW with a window), lo rounded down to a query
        block; and the GROUP query heads that share the K/V head. The dK/dV pass loops over both."""
        lo = 0
        hi = T
        if CAUSAL:
            lo = tl.maximum(0, start_n - OFFSET)
            lo = (lo // BLOCK_M) * BLOCK_M
            if HAS_WINDOW:
                hi = tl.minimum(T, start_n + BLOCK_N - 1 + WINDOW - OFFSET)
        return lo, hi, GROUP

    @triton.jit
    def _fwd_kernel(
        Q, K, V, O, LSE,
        sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h, so_t, sl_b, sl_h,
        H, GROUP, T, S, OFFSET, WINDOW, scale_log2e,
        CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        kvh = h // GROUP  # GQA: query head h reads K/V head h // (h/g), as repeat_interleave would
        start_m = pid_m * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)

        q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=offs_m[:, None] < T, other=0.0)
        k_base = K + b * sk_b + kvh * sk_h
        v_base = V + b * sv_b + kvh * sv_h

        # The running state of the block's rows: m (max, base-2 units), l (denominator), acc (u).
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        # Key blocks that no row of this block may read are never loaded.
        lo, hi = _key_range(start_m, S, OFFSET, WINDOW, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for start_n in range(lo, hi, BLOCK_N):
            cols = start_n + offs_n
            kT = tl.load(k_base + cols[None, :] * sk_t + offs_d[:, None], mask=cols[None, :] < S, other=0.0)
            v = tl.load(v_base + cols[:, None] * sv_t + offs_d[None, :], mask=cols[:, None] < S, other=0.0)
            s = tl.dot(q, kT) * scale_log2e  # fp16/bf16 inputs, fp32 accumulation
            s = tl.where(_mask_block(offs_m, cols, T, S, OFFSET, WINDOW, CAUSAL, HAS_WINDOW), s, float("-inf"))
            # merge(state, block): new max, rescale the old sums by 2^(m_old - m_new), add the block
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing read yet: no NaN
            alpha = tl.math.exp2(m_i - m_shift)
            p = tl.math.exp2(s - m_shift[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

        # finalize: o = u / l; logsumexp = (m + log2 l) * ln 2 in natural-log units
        has_keys = l_i > 0.0
        l_safe = tl.where(has_keys, l_i, 1.0)
        o = acc / l_safe[:, None]
        lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :], o.to(O.dtype.element_ty), mask=offs_m[:, None] < T)
        tl.store(LSE + b * sl_b + h * sl_h + offs_m, lse, mask=offs_m < T)

    @triton.jit
    def _bwd_dkdv_kernel(
        Q, K, V, DO, LSE, DELTA, DK, DV,
        sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sl_b, sl_h,
        G, GROUP, T, S, OFFSET, WINDOW, scale, scale_log2e,
        CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """dV = sum P^T dO and dK = scale * sum dS^T Q over the group's query heads and query blocks.

        Works on transposed tiles (keys x queries) so that dK, dV come out as (N, d) directly.
        dO, and D have the layout of Q and LSE; dK, dV have the layout of K, V.
        """
        pid_n = tl.program_id(0)
        pid_bg = tl.program_id(1)
        b = pid_bg // G
        kvh = pid_bg % G
        start_n = pid_n * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_m0 = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        k = tl.load(K + b * sk_b + kvh * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0)
        v = tl.load(V + b * sv_b + kvh * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], mask=offs_n[:, None] < S, other=0.0)
        dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

        lo, hi, group = _query_range(start_n, T, OFFSET, WINDOW, GROUP, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for j in range(0, group):
            h = kvh * GROUP + j
            q_base = Q + b * sq_b + h * sq_h
            do_base = DO + b * sq_b + h * sq_h
            for start_m in range(lo, hi, BLOCK_M):
                offs_m = start_m + offs_m0
                row_ok = offs_m < T
                q = tl.load(q_base + offs_m[:, None] * sq_t + offs_d[None, :], mask=row_ok[:, None], other=0.0)
                do = tl.load(do_base + offs_m[:, None] * sq_t + offs_d[None, :], mask=row_ok[:, None], other=0.0)
                lse = tl.load(LSE + b * sl_b + h * sl_h + offs_m, mask=row_ok, other=0.0)
                delta = tl.load(DELTA + b * sl_b + h * sl_h + offs_m, mask=row_ok, other=0.0)
                # P^T recomputed from the saved logsumexp: P_ij = 2^(s_ij log2e - L_i log2e)
                sT = tl.dot(k, tl.trans(q)) * scale_log2e
                keep = tl.trans(_mask_block(offs_m, offs_n, T, S, OFFSET, WINDOW, CAUSAL, HAS_WINDOW))
                pT = tl.where(keep, tl.math.exp2(sT - lse[None, :] * 1.4426950408889634), 0.0)
                dv += tl.dot(pT.to(do.dtype), do)
                dpT = tl.dot(v, tl.trans(do))
                dsT = pT * (dpT - delta[None, :])  # dS = P * (dP - D), transposed
                dk += tl.dot(dsT.to(q.dtype), q)
        dk = dk * scale
        tl.store(DK + b * sk_b + kvh * sk_h + offs_n[:, None] * sk_t + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=offs_n[:, None] < S)
        tl.store(DV + b * sv_b + kvh * sv_h + offs_n[:, None] * sv_t + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < S)

    @triton.jit
    def _bwd_dq_kernel(
        Q, K, V, DO, LSE, DELTA, DQ,
        sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sl_b, sl_h,
        H, GROUP, T, S, OFFSET, WINDOW, scale, scale_log2e,
        CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """dQ = scale * sum_j dS_ij K_j over the key blocks this query block may read."""
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        kvh = h // GROUP
        start_m = pid_m * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_n0 = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m < T
        q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        do = tl.load(DO + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        lse = tl.load(LSE + b * sl_b + h * sl_h + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + b * sl_b + h * sl_h + offs_m, mask=row_ok, other=0.0)
        k_base = K + b * sk_b + kvh * sk_h
        v_base = V + b * sv_b + kvh * sv_h
        dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        lo, hi = _key_range(start_m, S, OFFSET, WINDOW, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for start_n in range(lo, hi, BLOCK_N):
            cols = start_n + offs_n0
            kT = tl.load(k_base + cols[None, :] * sk_t + offs_d[:, None], mask=cols[None, :] < S, other=0.0)
            vT = tl.load(v_base + cols[None, :] * sv_t + offs_d[:, None], mask=cols[None, :] < S, other=0.0)
            s = tl.dot(q, kT) * scale_log2e
            keep = _mask_block(offs_m, cols, T, S, OFFSET, WINDOW, CAUSAL, HAS_WINDOW)
            p = tl.where(keep, tl.math.exp2(s - lse[:, None] * 1.4426950408889634), 0.0)
            dp = tl.dot(do, vT)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(kT.dtype), tl.trans(kT))
        dq = dq * scale
        tl.store(DQ + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------------------------
# Python side: checks, launches, autograd
# ----------------------------------------------------------------------------------------------


def _require_runtime(q: Tensor) -> None:
    _triton.require_runtime(q, INTERPRET, what="backend='triton'", cpu_choice="backend='tiled' (same algorithm in "
                            "PyTorch) or 'sdpa'", module="companion.kernels.triton_flash")


def _validate(q, k, v, causal, window, scale) -> float:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, rows, d); got {getattr(x, 'shape', type(x).__name__)}")
        if x.dtype not in DTYPES:
            raise ValueError(f"{name} must be float16 or bfloat16 for the Triton kernel; got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    B, h, T, d = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"q, k and v must share the batch size (dim 0); got {B}, {k.shape[0]}, {v.shape[0]}")
    g, S = k.shape[1], k.shape[2]
    if v.shape[1] != g or v.shape[2] != S:
        raise ValueError(f"k and v must have the same heads and rows; got {tuple(k.shape)} and {tuple(v.shape)}")
    if g == 0 or h % g != 0:
        raise ValueError(f"the query heads ({h}) must be a positive multiple of the key/value heads ({g})")
    if k.shape[3] != d or v.shape[3] != d:
        raise ValueError(f"q, k and v must share the head dim (last dim); got {d}, {k.shape[3]}, {v.shape[3]}")
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim must be one of {HEAD_DIMS} for the Triton kernel; got {d}")
    if T < 1 or S < 1:
        raise ValueError(f"q and k need at least one row each; got T={T}, S={S}")
    check_causal_window(T, S, causal, window)
    return resolve_scale(scale, d)


def _default_config(d: int, which: str) -> dict:
    """Block sizes and launch settings. Interpreter: small tiles (it runs numpy per tile). GPU:
    conservative FlashAttention-2-like tiles that fit shared memory for d = 128 on A100/H100."""
    if INTERPRET:
        return {"block_m": 16, "block_n": 16, "num_warps": 1, "num_stages": 1}
    if which == "fwd":
        return {"block_m": 128, "block_n": 64, "num_warps": 8 if d >= 128 else 4, "num_stages": 2 if d >= 128 else 3}
    if which == "dkdv":
        return {"block_m": 32, "block_n": 64, "num_warps": 4, "num_stages": 2}
    return {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}  # dq


def _flags(T, S, causal, window):
    return {"OFFSET": S - T, "WINDOW": window or 0, "CAUSAL": causal, "HAS_WINDOW": window is not None}


def flash_forward(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, window: int | None = None, scale: float | None = None, config: dict | None = None
) -> tuple[Tensor, Tensor]:
    """O (B, h, T, d) in the input dtype and the logsumexp (B, h, T) in float32, in one kernel launch."""
    scale = _validate(q, k, v, causal, window, scale)
    _require_runtime(q)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, h, T, d = q.shape
    g, S = k.shape[1], k.shape[2]
    cfg = {**_default_config(d, "fwd"), **(config or {})}
    o = torch.empty_like(q)
    lse = torch.empty((B, h, T), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(T, cfg["block_m"]), B * h)
    f = _flags(T, S, causal, window)
    _fwd_kernel[grid](
        q, k, v, o, lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1),
        h, h // g, T, S, f["OFFSET"], f["WINDOW"], scale * LOG2E,
        CAUSAL=f["CAUSAL"], HAS_WINDOW=f["HAS_WINDOW"], HEAD_DIM=d, BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return o, lse


def flash_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, d_out: Tensor, *,
    causal: bool = False, window: int | None = None, scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from the saved Q, K, V, O, logsumexp and the incoming dO (two kernel launches)."""
    scale = _validate(q, k, v, causal, window, scale)
    _require_runtime(q)
    if o.shape != q.shape or d_out.shape != q.shape:
        raise ValueError(f"o and d_out must have q's shape {tuple(q.shape)}; got {tuple(o.shape)} and {tuple(d_out.shape)}")
    if lse.shape != q.shape[:3]:
        raise ValueError(f"lse must have shape (B, h, T) = {tuple(q.shape[:3])}; got {tuple(lse.shape)}")
    q, k, v, o = q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous()
    d_out = d_out.to(q.dtype).contiguous()
    lse = lse.float().contiguous()
    B, h, T, d = q.shape
    g, S = k.shape[1], k.shape[2]
    delta = (d_out.float() * o.float()).sum(-1).contiguous()  # D = rowsum(dO * O), O(T d)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    f = _flags(T, S, causal, window)
    strides = (
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), lse.stride(0), lse.stride(1),
    )
    c1 = _default_config(d, "dkdv")
    _bwd_dkdv_kernel[(triton.cdiv(S, c1["block_n"]), B * g)](
        q, k, v, d_out, lse, delta, dk, dv, *strides,
        g, h // g, T, S, f["OFFSET"], f["WINDOW"], scale, scale * LOG2E,
        CAUSAL=f["CAUSAL"], HAS_WINDOW=f["HAS_WINDOW"], HEAD_DIM=d, BLOCK_M=c1["block_m"], BLOCK_N=c1["block_n"],
        num_warps=c1["num_warps"], num_stages=c1["num_stages"],
    )
    c2 = _default_config(d, "dq")
    _bwd_dq_kernel[(triton.cdiv(T, c2["block_m"]), B * h)](
        q, k, v, d_out, lse, delta, dq, *strides,
        h, h // g, T, S, f["OFFSET"], f["WINDOW"], scale, scale * LOG2E,
        CAUSAL=f["CAUSAL"], HAS_WINDOW=f["HAS_WINDOW"], HEAD_DIM=d, BLOCK_M=c2["block_m"], BLOCK_N=c2["block_n"],
        num_warps=c2["num_warps"], num_stages=c2["num_stages"],
    )
    return dq, dk, dv


class _TritonFlashFunction(torch.autograd.Function):
    """Saves Q, K, V, O and the logsumexp, like companion.kernels.flash.FlashAttentionFunction."""

    @staticmethod
    def forward(ctx, q, k, v, causal, window, scale):
        o, lse = flash_forward(q, k, v, causal=causal, window=window, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.config = (causal, window, scale)
        return o

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, o, lse = ctx.saved_tensors
        causal, window, scale = ctx.config
        dq, dk, dv = flash_backward(q, k, v, o, lse, d_out, causal=causal, window=window, scale=scale)
        return dq, dk, dv, None, None, None


def triton_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, window: int | None = None, scale: float | None = None) -> Tensor:
    """softmax(scale * Q K^T + causal/window mask) V with the Triton kernels; differentiable.

    q (B, h, T, d), k and v (B, g, S, d) with g dividing h; fp16/bf16; d in HEAD_DIMS; CUDA tensors
    (or any device under TRITON_INTERPRET=1). The T query rows sit at positions S - T .. S - 1.
    """
    if isinstance(q, Tensor):
        _require_runtime(q)  # the clearest message first: wrong device / no triton
    scale = _validate(q, k, v, causal, window, scale)
    return _TritonFlashFunction.apply(q, k, v, causal, window, scale)
