"""One entry point for every attention computation in the models: ``attend``.

What this module provides
- ``attend(q, k, v, ...)``: multi-head attention over (B, h, T, d) queries and (B, g, S, d) keys and
  values, with g dividing h (MHA when g = h, GQA when 1 < g < h, MQA when g = 1), a causal flag, a
  sliding window, an extra mask, and a choice of backend.
- ``BACKENDS``: the names ``attend`` accepts.

Backends
- "reference": ``companion.attention.scaled_dot_product_attention``, the readable dense version.
- "sdpa": ``torch.nn.functional.scaled_dot_product_attention``, which dispatches to fused (flash /
  memory-efficient) kernels on GPUs.
- "auto": "sdpa" unless a requested feature needs another backend.

All backends compute the same function; tests/test_backends.py holds them to each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import causal_mask, scaled_dot_product_attention, sliding_window_mask

__all__ = ["attend", "BACKENDS", "expand_kv", "build_mask"]

BACKENDS = ("auto", "reference", "sdpa")


def expand_kv(x: Tensor, n_heads: int) -> Tensor:
    """Repeat each of the g key/value heads of x (B, g, S, d) for its h/g query heads -> (B, h, S, d)."""
    g = x.shape[-3]
    if n_heads % g != 0:
        raise ValueError(f"the number of query heads ({n_heads}) must be a multiple of the key/value heads ({g})")
    return x if g == n_heads else x.repeat_interleave(n_heads // g, dim=-3)


def build_mask(
    T: int,
    S: int,
    *,
    causal: bool = False,
    window: int | None = None,
    mask: Tensor | None = None,
    device: torch.device | str | None = None,
) -> Tensor | None:
    """Combine the causal flag, a sliding window and an explicit boolean mask into one (.., T, S) mask.

    Query row i is taken to sit at absolute position S - T + i (see ``companion.attention``).
    Returns None when nothing is masked.
    """
    if window is not None:
        if not causal:
            raise ValueError("window requires causal=True: a sliding window here looks back only")
        built = sliding_window_mask(T, window, S, device=device)
    elif causal:
        built = causal_mask(T, S, device=device)
    else:
        built = None
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"attend takes boolean masks (True = may read); got dtype {mask.dtype}")
        built = mask if built is None else (built & mask)
    return built


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    window: int | None = None,
    mask: Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> Tensor:
    """Attention for q (B, h, T, d_k), k (B, g, S, d_k), v (B, g, S, d_v) -> (B, h, T, d_v).

    ``causal`` and ``window`` place the T query rows at the end of the S keys (positions S-T..S-1),
    which is what a KV cache needs. ``mask`` is an extra boolean mask broadcastable to (B, h, T, S),
    e.g. ``companion.attention.padding_mask``. A query row that may read nothing returns zeros.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attend expects 4-D (B, heads, T, d) tensors; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads; got {k.shape[1]} and {v.shape[1]}")
    h, T, S = q.shape[1], q.shape[2], k.shape[2]
    k, v = expand_kv(k, h), expand_kv(v, h)
    full_mask = build_mask(T, S, causal=causal, window=window, mask=mask, device=q.device)

    if backend == "reference":
        return scaled_dot_product_attention(q, k, v, full_mask, scale=scale)

    # sdpa / auto. torch's kernels return NaN for rows with nothing to read, where ours return 0;
    # detect such rows and zero them so that every backend computes the same function.
    if full_mask is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    if causal and window is None and mask is None and T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=full_mask, scale=scale)
    empty = ~full_mask.any(dim=-1, keepdim=True)
    if bool(empty.any()):
        out = out.masked_fill(empty.expand(*out.shape[:-1], 1), 0.0)
    return out
