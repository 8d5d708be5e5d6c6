"""Paged attention in plain PyTorch, and the argument rules every paged kernel shares (chapter 12).

A sequence's token j lives at slot ``table[j // p] * p + j % p`` of the flattened page pool
(p tokens a page): ``page_slots`` is that formula, and every paged code path of the package calls it
(the Triton kernel computes it inside its body, where it cannot call Python, and says so). ``paged_attention_reference`` gathers each sequence's keys and values through its
block table and then attends; the Triton kernel (``companion.kernels.triton_paged``) reads the
same pages without the gather and is checked against it.

What this module provides
- ``page_slots(tables, page_size)``: the flat pool slot of every position a block table covers.
- ``paged_attention_reference(q, k_pages, v_pages, block_tables, seq_lens, q_seq, q_pos, ...)``.
- ``check_paged_attention_args``: the argument rules of both entry points; returns the scale.
- ``ATTN_DTYPES``: the floating-point types paged attention accepts.
"""

from __future__ import annotations


import torch
from torch import Tensor

from companion.attention import resolve_scale

__all__ = ["page_slots", "paged_attention_reference", "check_paged_attention_args", "ATTN_DTYPES"]

ATTN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def page_slots(tables: Tensor, page_size: int) -> Tensor:
    """The slot formula of a paged cache: logical position j of a sequence whose block table is
    ``table`` sits at flat slot ``table[j // p] * p + j % p`` of the pool viewed as (n_pages * p, ...).

    tables (..., n) integer page ids -> (..., n * p): entry j is the slot of position j, for every
    position the n pages cover. Callers slice the positions they need (``[:length]``,
    ``[positions]``). Tensor ops only (it runs inside the compiled decode step too)."""
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1; got {page_size!r}")
    offsets = torch.arange(page_size, dtype=tables.dtype, device=tables.device)  # j % p
    return (tables[..., :, None] * page_size + offsets).flatten(-2)  # table[j // p] * p + j % p


def check_paged_attention_args(
    q, k_pages, v_pages, block_tables, seq_lens, q_seq, q_pos, *, scale=None, window=None, check_values: bool = True
) -> float:
    """Validate the arguments of paged attention (see ``paged_attention_reference``); returns the scale.

    ``check_values=False`` skips the checks that read index values (they copy the indices to the CPU,
    a device sync on a GPU). Both public entry points keep them on for now."""
    if not isinstance(q, Tensor) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor (N rows, h heads, d); got {getattr(q, 'shape', type(q).__name__)}")
    if q.dtype not in ATTN_DTYPES:
        raise ValueError(f"q must be float16, bfloat16 or float32; got {q.dtype}")
    for name, x in (("k_pages", k_pages), ("v_pages", v_pages)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (n_pages, page_size, g heads, d); got {getattr(x, 'shape', type(x).__name__)}")
        if x.dtype != q.dtype:
            raise ValueError(f"{name} must have q's dtype {q.dtype} (a quantised pool is not read by paged attention); got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}; got {x.device}")
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages and v_pages must have the same shape; got {tuple(k_pages.shape)} and {tuple(v_pages.shape)}")
    N, h, d = q.shape
    n_pages, p, g, dk = k_pages.shape
    if dk != d:
        raise ValueError(f"q and the pages must share the head dim (last dim); got {d} and {dk}")
    if g == 0 or h % g != 0:
        raise ValueError(f"the query heads ({h}) must be a positive multiple of the key/value heads ({g})")
    integer = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
    if not isinstance(block_tables, Tensor) or block_tables.dim() != 2 or block_tables.dtype not in integer:
        raise ValueError(f"block_tables must be a 2-D integer tensor (B, max_pages); got {getattr(block_tables, 'shape', block_tables)!r}")
    B = block_tables.shape[0]
    for name, x, n in (("seq_lens", seq_lens, B), ("q_seq", q_seq, N), ("q_pos", q_pos, N)):
        if not isinstance(x, Tensor) or x.dim() != 1 or x.dtype not in integer or x.shape[0] != n:
            raise ValueError(f"{name} must be a 1-D integer tensor of length {n}; got {getattr(x, 'shape', x)!r}")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be None or an int >= 1; got {window!r}")
    scale = resolve_scale(scale, d)
    if check_values and B:
        lens = seq_lens.detach().cpu().long()
        if (lens < 0).any() or (lens > block_tables.shape[1] * p).any():
            raise ValueError(f"seq_lens must be in [0, max_pages * page_size = {block_tables.shape[1] * p}]; got {lens.tolist()}")
        used = torch.arange(block_tables.shape[1])[None, :] < (lens[:, None] + p - 1) // p
        pages = block_tables.detach().cpu().long()[used]
        if pages.numel() and (pages.min() < 0 or pages.max() >= n_pages):
            raise ValueError(f"block_tables entries in use must be page ids in [0, n_pages={n_pages}); got {sorted(set(pages.tolist()))}")
    if check_values and N:
        qs, qp = q_seq.detach().cpu().long(), q_pos.detach().cpu().long()
        if qs.min() < 0 or qs.max() >= B:
            raise ValueError(f"q_seq must index the B={B} sequences of block_tables; got {qs.tolist()}")
        if qp.min() < 0 or (qp >= seq_lens.detach().cpu().long()[qs]).any():
            raise ValueError("q_pos must satisfy 0 <= q_pos < seq_lens[q_seq] (a row's own key is stored before it is read)")
    return float(scale)


def paged_attention_reference(
    q: Tensor, k_pages: Tensor, v_pages: Tensor, block_tables: Tensor, seq_lens: Tensor, q_seq: Tensor, q_pos: Tensor,
    *, scale: float | None = None, window: int | None = None,
) -> Tensor:
    """Paged attention in PyTorch: gather each sequence's keys through its block table, then attend.

    Row n (sequence b = q_seq[n], absolute position t = q_pos[n]), query head i computes
        softmax_j(scale * q[n, i] . K_b[j]) V_b[j] over stored keys j < seq_lens[b] with j <= t
        (and t - j < window), K_b[j] = k_pages[block_tables[b, j // p], j % p, i // (h / g)],
    in float32, returned in q's dtype. Shapes: q (N, h, d); k_pages, v_pages (n_pages, p, g, d);
    block_tables (B, max_pages); seq_lens (B,); q_seq, q_pos (N,). See ``check_paged_attention_args``.
    """
    scale = check_paged_attention_args(q, k_pages, v_pages, block_tables, seq_lens, q_seq, q_pos, scale=scale, window=window)
    N, h, d = q.shape
    p, g = k_pages.shape[1], k_pages.shape[2]
    dev = q.device
    lens = seq_lens.detach().cpu().long().tolist()
    tables = block_tables.detach().cpu().long()
    slots, key_pos, key_seq = [], [], []
    for b, n in enumerate(lens):  # one flat slot index per stored token: the gather
        j = torch.arange(n)
        slots.append(page_slots(tables[b], p)[:n])
        key_pos.append(j)
        key_seq.append(torch.full((n,), b))
    slots, key_pos, key_seq = (torch.cat(x).to(dev) for x in (slots, key_pos, key_seq))
    k = k_pages.flatten(0, 1)[slots].float().repeat_interleave(h // g, dim=1)  # (S, h, d)
    v = v_pages.flatten(0, 1)[slots].float().repeat_interleave(h // g, dim=1)
    qs, qp = q_seq.to(dev).long(), q_pos.to(dev).long()
    allowed = (qs[:, None] == key_seq[None, :]) & (key_pos[None, :] <= qp[:, None])  # (N, S)
    if window is not None:
        allowed &= qp[:, None] - key_pos[None, :] < window
    scores = torch.einsum("nhd,shd->hns", q.float(), k) * scale
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("hns,shd->nhd", weights, v).to(q.dtype)
