"""A paged-attention kernel in Triton: attention that reads K and V straight from the page pool (chapter 12).

The paged cache (``companion.inference.paged``) keeps token j of sequence b at (table_b[floor(j / p)], j mod p)
in a pool of pages. Its reference attention read gathers every page of a sequence back into one
contiguous (S, g, d) tensor and then runs ordinary attention: one extra copy of the whole prefix,
per layer, per step. This kernel does the same computation without the copy: each program looks up
the physical page of every key it needs in the block table and loads that key (and value) from the
pool directly, folding the blocks of keys into a running softmax as FlashAttention does.

What it computes, for every packed query row n (sequence b = q_seq[n], absolute position
t = q_pos[n]) and query head i (reading K/V head i // (h / g): GQA / MQA / MHA):

    o[n, i] = sum_j softmax_j(scale * q[n, i] . K_b[j]) V_b[j]
    over the stored keys j of sequence b with j <= t (causal by absolute position) and, with a
    sliding window w, t - j < w; where K_b[j] = k_pages[table_b[j // p], j % p, i // (h / g)].

Float16, bfloat16 or float32 inputs; scores, softmax and the weighted sum accumulate in float32
(float32 matmuls in IEEE precision, not TF32); the output has the inputs' dtype.

Grid: one program per (query row, K/V head). The program handles all h / g query heads of its
group at once, as the rows of one tile (padded to 16, the smallest tl.dot tile), so a key block
loaded from the pool serves the whole group: that is where GQA saves memory traffic. Decode (one
row per sequence) is the case this layout is made for; prefill rows are correct too, but each row
streams its own prefix (a prefill of T rows reads the prefix T times; the FlashAttention kernel in
``companion.kernels.triton_flash`` tiles query rows and is the better choice for long prompts).

What this module provides
- ``paged_attention(q, k_pages, v_pages, block_tables, seq_lens, q_seq, q_pos, *, scale, window)``:
  the kernel launch; same arguments and result as ``companion.kernels.paged_reference.paged_attention_reference``.
- ``triton_available()`` and ``INTERPRET``: whether the kernel can run here.

Status: written for, but not yet run on, a GPU. On a CPU it runs under Triton's interpreter
(TRITON_INTERPRET=1 set before this module is imported), which is how tests/test_triton_paged.py
checks it against the reference when no GPU is present. Block sizes are fixed choices, not tuned.

Triton is optional (``pip install 'companion[triton]'``): without it this module still imports and
``paged_attention`` raises an ImportError that says what to install.
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion.kernels import _triton
from companion.kernels._triton import INTERPRET, LOG2E, loop_bounds, tl, triton  # noqa: F401  (triton, tl: see _triton)
from companion.kernels.paged_reference import check_paged_attention_args

__all__ = ["paged_attention", "triton_available", "INTERPRET"]


def triton_available() -> bool:
    """True when triton is importable and the kernel can run: on CUDA, or under the interpreter."""
    return _triton.runnable(INTERPRET)  # this module's INTERPRET, which a test may set


if triton is not None:

    @loop_bounds
    @triton.jit
    def _row_keys(pos, length, WINDOW, HAS_WINDOW: tl.constexpr):
        """[lo, hi): the keys a row at position ``pos`` may read (causal by absolute position, optional window)."""
        hi = tl.minimum(length, pos + 1)
        lo = pos * 0
        if HAS_WINDOW:
            lo = tl.maximum(lo, pos - WINDOW + 1)
        return lo, hi

    @triton.jit
    def _paged_attention_kernel(
        Q, K, V, O, TABLES, LENS, QSEQ, QPOS,
        sq_n, sq_h, sq_d, sk_page, sk_slot, sk_head, sk_d, sv_page, sv_slot, sv_head, sv_d,
        so_n, so_h, so_d, st_b,
        GROUP, HEAD_D, PAGE, WINDOW, scale_log2e,
        HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        """o[n, heads of group kvh] for one query row n and one K/V head kvh (see the module docstring)."""
        n = tl.program_id(0)
        kvh = tl.program_id(1)
        b = tl.load(QSEQ + n)
        pos = tl.load(QPOS + n)
        length = tl.load(LENS + b)

        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        h_ok = offs_h < GROUP
        d_ok = offs_d < HEAD_D
        heads = kvh * GROUP + offs_h  # the query heads that read K/V head kvh
        q = tl.load(Q + n * sq_n + heads[:, None] * sq_h + offs_d[None, :] * sq_d, mask=h_ok[:, None] & d_ok[None, :], other=0.0)

        lo, hi = _row_keys(pos, length, WINDOW, HAS_WINDOW)

        m_i = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        table = TABLES + b * st_b
        for start in range(lo, hi, BLOCK_N):
            cols = start + offs_n  # logical key positions
            ok = cols < hi
            # the block table: logical page cols // p -> physical page, slot cols % p; this mirrors
            # companion.kernels.paged_reference.page_slots (a kernel body cannot call Python)
            page = tl.load(table + cols // PAGE, mask=ok, other=0).to(tl.int64)
            slot = (cols % PAGE).to(tl.int64)
            k_row = page * sk_page + slot * sk_slot + kvh * sk_head
            v_row = page * sv_page + slot * sv_slot + kvh * sv_head
            kT = tl.load(K + k_row[None, :] + offs_d[:, None] * sk_d, mask=ok[None, :] & d_ok[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, kT, input_precision="ieee")
            else:
                s = tl.dot(q, kT)  # fp16/bf16 inputs, fp32 accumulation
            s = tl.where(ok[None, :], s * scale_log2e, float("-inf"))
            # online softmax in base 2: new max, rescale the old sums, add this block
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_shift)
            p = tl.math.exp2(s - m_shift[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + v_row[:, None] + offs_d[None, :] * sv_d, mask=ok[:, None] & d_ok[None, :], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[:, None]
        tl.store(O + n * so_n + heads[:, None] * so_h + offs_d[None, :] * so_d, o.to(O.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :])


def _require_runtime(q: Tensor) -> None:
    _triton.require_runtime(q, INTERPRET, what="kernel='triton'", cpu_choice="kernel='reference' (gather through "
                            "the block table, then attention, in PyTorch)", module="companion.kernels.triton_paged")


def _pow2_at_least(x: int, floor: int) -> int:
    return max(floor, 1 << max(0, x - 1).bit_length())


def paged_attention(
    q: Tensor, k_pages: Tensor, v_pages: Tensor, block_tables: Tensor, seq_lens: Tensor, q_seq: Tensor, q_pos: Tensor,
    *, scale: float | None = None, window: int | None = None, block_n: int | None = None,
) -> Tensor:
    """Causal attention of packed query rows over paged K/V, read from the pages in one kernel launch.

    Args:
        q: (N, h, d) query rows of several sequences, packed in any order.
        k_pages, v_pages: (n_pages, p, g, d) the pool of one layer (``PagePool.data[layer][0 / 1]``), g dividing h.
        block_tables: (B, max_pages) integer; row b lists sequence b's physical pages in logical order
            (entries past its last page are never read).
        seq_lens: (B,) keys stored for sequence b (positions 0 .. seq_lens[b] - 1).
        q_seq, q_pos: (N,) the sequence and absolute position of each query row; q_pos < seq_lens[q_seq].
        scale: score scale, default 1 / sqrt(d). window: optional sliding window w (reads t - w < j <= t).
        block_n: keys per loop iteration (a power of two >= 16); default 16 interpreted, 64 compiled.
    Returns:
        (N, h, d) in q's dtype; equal (up to rounding) to ``companion.kernels.paged_reference.paged_attention_reference``.
    """
    if isinstance(q, Tensor):
        _require_runtime(q)  # the clearest message first: wrong device / no triton
    scale = check_paged_attention_args(q, k_pages, v_pages, block_tables, seq_lens, q_seq, q_pos, scale=scale, window=window)
    if block_n is None:
        block_n = 16 if INTERPRET else 64
    if not isinstance(block_n, int) or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16; got {block_n!r}")
    N, h, d = q.shape
    g, p = k_pages.shape[2], k_pages.shape[1]
    out = torch.empty_like(q)
    if N == 0:
        return out
    dev = q.device
    tables = block_tables.to(device=dev, dtype=torch.int32).contiguous()
    lens = seq_lens.to(device=dev, dtype=torch.int32).contiguous()
    qs = q_seq.to(device=dev, dtype=torch.int32).contiguous()
    qp = q_pos.to(device=dev, dtype=torch.int32).contiguous()
    _paged_attention_kernel[(N, g)](
        q, k_pages, v_pages, out, tables, lens, qs, qp,
        q.stride(0), q.stride(1), q.stride(2),
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2), k_pages.stride(3),
        v_pages.stride(0), v_pages.stride(1), v_pages.stride(2), v_pages.stride(3),
        out.stride(0), out.stride(1), out.stride(2), tables.stride(0),
        h // g, d, p, window or 0, scale * LOG2E,
        HAS_WINDOW=window is not None, IEEE=q.dtype == torch.float32,
        BLOCK_H=_pow2_at_least(h // g, 16), BLOCK_N=block_n, BLOCK_D=_pow2_at_least(d, 16),
        num_warps=1 if INTERPRET else 4, num_stages=1 if INTERPRET else 2,
    )
    return out
