"""Paged attention with torch's flex_attention: one block mask over the whole page pool (chapter 12).

The pool's slots, laid end to end (slot = page * p + offset), form one long key sequence. A query row
of sequence b at position t may read slot s when s's page is logical page k of b's own block table
and k * p + offset <= t (and, with a sliding window, within it). ``paged_flex_mask_mod`` writes that
rule as flex_attention's ``mask_mod``; ``flex_logical_pages`` inverts the block tables for it;
``flex_block_mask`` builds the BlockMask (which pool blocks each query block may skip) from the dense
mask in one vectorised call. On CUDA flex_attention is compiled into one fused kernel that reads only
the blocks some query needs; on a CPU the unfused (dense) form runs: a check, not a fast path.

What this module provides
- ``flex_available()``: whether this torch has flex_attention.
- ``flex_attention(compiled)``: the function (torch.compile'd once for CUDA, or eager).
- ``flex_block_mask``, ``flex_logical_pages``, ``paged_flex_mask_mod``.
Used by ``companion.inference.batch.PagedBatch`` (``attention_kernel="flex"``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["flex_available", "flex_attention", "flex_block_mask", "flex_logical_pages", "paged_flex_mask_mod"]

_flex_compiled = None


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def flex_attention(compiled: bool = False):
    """torch's flex_attention (compiled: torch.compile'd once, for CUDA); None when this torch has none."""
    global _flex_compiled
    try:
        from torch.nn.attention import flex_attention as fa
    except ImportError:
        return None
    if not compiled:
        return _flex_eager
    if _flex_compiled is None:
        # default (automatic) dynamic shapes. Not used on a CPU: there, in torch 2.13, the compiled flex
        # kernel works for static shapes but its C++ template fails to build once shapes turn dynamic
        # (CppCompileError, "cur_kvSplitSize7 was not declared"), and the query count changes every step
        _flex_compiled = torch.compile(fa.flex_attention)
    return _flex_compiled


def _flex_eager(*args, **kwargs):
    """flex_attention uncompiled (dense scores: the CPU check path), without its once-per-process
    advice to compile it."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(*args, **kwargs)


def flex_block_mask(mask_mod, n_q: int, n_kv: int, device, block: int = 128):
    """A flex_attention BlockMask for ``mask_mod`` over n_q query rows and n_kv keys, built from the
    dense (n_q, n_kv) mask that ``mask_mod`` gives on broadcast index tensors (one vectorised call;
    ``create_block_mask`` evaluates it under nested vmaps, far slower in eager mode): blocks of
    ``block`` x ``block`` with some readable entry are partial, those with only readable entries full."""
    from torch.nn.attention.flex_attention import BlockMask

    dense = mask_mod(None, None, torch.arange(n_q, device=device)[:, None], torch.arange(n_kv, device=device)[None, :])
    nq, nk = -(-n_q // block), -(-n_kv // block)
    padded = torch.zeros(nq * block, nk * block, dtype=torch.bool, device=device)
    padded[:n_q, :n_kv] = dense
    blocks = padded.view(nq, block, nk, block)
    any_, full = blocks.any(3).any(1), blocks.all(3).all(1)  # (nq, nk)
    partial = any_ & ~full

    def as_kv_blocks(which):  # per query block: how many, and which kv blocks (listed first)
        order = torch.argsort((~which).to(torch.int8), dim=-1, stable=True)
        return which.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    return BlockMask.from_kv_blocks(*as_kv_blocks(partial), *as_kv_blocks(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(n_q, n_kv))


def flex_logical_pages(tables: Sequence[Sequence[int]], n_pages: int) -> Tensor:
    """(B, n_pages) long: entry [b, page] = k when physical ``page`` is logical page k of sequence b
    (tables[b][k] == page), else -1. The inverse of the block tables, per sequence (a page shared by
    several sequences has an entry in each of their rows)."""
    logical = torch.full((len(tables), n_pages), -1, dtype=torch.long)
    for b, table in enumerate(tables):
        if table:
            logical[b, torch.tensor(table, dtype=torch.long)] = torch.arange(len(table))
    return logical


def paged_flex_mask_mod(q_seq: Tensor, q_pos: Tensor, logical_pages: Tensor, page_size: int, window: int | None = None):
    """The flex_attention ``mask_mod(b, h, q_idx, kv_idx)`` of paged attention over a whole pool whose
    slots are laid end to end (kv_idx = page * p + offset): query row q_idx (sequence q_seq[q_idx], at
    position q_pos[q_idx]) may read slot kv_idx when that slot's page is logical page k of its own
    sequence (``flex_logical_pages``), i.e. the slot holds position j = k * p + offset, and
    j <= q_pos (causal; this also hides every slot past the sequence's end) and, with a window,
    q_pos - j < window. Tensor ops only: it runs under flex's vmap and on plain broadcast index
    tensors alike (the tests build the dense (N, S) mask with it)."""

    def mask_mod(b, h, q_idx, kv_idx):
        k = logical_pages[q_seq[q_idx], kv_idx // page_size]
        j = k * page_size + kv_idx % page_size
        allowed = (k >= 0) & (j <= q_pos[q_idx])
        if window is not None:
            allowed = allowed & (q_pos[q_idx] - j < window)
        return allowed

    return mask_mod
