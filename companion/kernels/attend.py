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
- "tiled": ``companion.kernels.flash.tiled_attention``, exact attention block by block with an online
  softmax and a recomputing backward (memory linear in T; K/V heads are read in groups, not copied).
- "triton": ``companion.kernels.triton_flash``, a fused FlashAttention kernel; CUDA tensors only.
- "auto": "sdpa" unless a requested feature needs another backend.

All backends compute the same function; tests/test_backends.py holds them to each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.attention import causal_mask, scaled_dot_product_attention, sliding_window_mask, to_additive_mask

__all__ = ["attend", "BACKENDS", "expand_kv", "build_mask"]

BACKENDS = ("auto", "reference", "sdpa", "tiled", "triton")


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


def _attend_with_logit_terms(q, k, v, full_mask, bias, sinks, scale, backend):
    """Attention with an additive score bias (ALiBi) and/or attention sinks (gpt-oss), any backend.

    A sink is a learned per-head logit s_h that joins the softmax denominator but reads no value:
    a_ij = exp(z_ij) / (exp(s_h) + sum_j' exp(z_ij')), so a head may put weight "nowhere". It is
    realised exactly as one extra key whose score is s_h (through the additive mask) and whose
    value is zero; every backend that takes an additive mask then computes it.
    """
    B, h, T, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    additive = q.new_zeros(1, 1, T, S)
    if full_mask is not None:
        additive = additive + to_additive_mask(full_mask, q.dtype)
    if bias is not None:
        additive = additive + bias.to(q.dtype)  # broadcastable to (B, h, T, S)
    additive = additive.expand(B, h, T, S)
    if sinks is not None:
        if sinks.shape != (h,):
            raise ValueError(f"sinks must hold one logit per query head, shape ({h},); got {tuple(sinks.shape)}")
        sink_col = sinks.to(q.dtype).view(1, h, 1, 1).expand(B, h, T, 1)
        additive = torch.cat((additive, sink_col), dim=-1)
        k = torch.cat((k, k.new_zeros(B, h, 1, k.shape[-1])), dim=2)
        v = torch.cat((v, v.new_zeros(B, h, 1, v.shape[-1])), dim=2)
    if backend == "reference":
        return scaled_dot_product_attention(q, k, v, additive, scale=scale)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=scale)
    empty = torch.isneginf(additive).all(dim=-1, keepdim=True)
    return out.masked_fill(empty, 0.0) if bool(empty.any()) else out


def _attend_blockwise(q, k, v, causal, window, mask, scale, backend, bias, sinks):
    """The "tiled" and "triton" backends. They take the causal / window flags and the un-expanded
    K/V heads, and build masks block by block, so no (T, S) mask and no copy of K/V is made."""
    if bias is not None or sinks is not None:
        raise ValueError(f"bias and sinks are not supported by backend={backend!r}; use 'reference', 'sdpa' or 'auto'")
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"attend takes boolean masks (True = may read); got dtype {mask.dtype}")
    if backend == "triton":
        from companion.kernels.triton_flash import triton_attention  # imports triton only now, and only if present

        if mask is not None:
            raise ValueError("mask is not supported by backend='triton' (only causal and window); use 'tiled' or 'sdpa'")
        return triton_attention(q, k, v, causal=causal, window=window, scale=scale)
    from companion.kernels.flash import tiled_attention

    return tiled_attention(q, k, v, causal=causal, mask=mask, window=window, scale=scale)[0]


def _attend_one_row(q: Tensor, k: Tensor, v: Tensor, scale: float | None) -> Tensor:
    """One query row per head (a decode step) that may read every key: no mask to build, and no copy
    of K/V per query head: the h / g query heads of a group become h / g query rows of its key/value
    head, (B, g, h / g, d), which is the same arithmetic as ``expand_kv`` followed by attention."""
    B, h, _, d = q.shape
    g = k.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(B, g, h // g, d), k, v, scale=scale)  # (B, g, h/g, d_v)
    return out.reshape(B, h, 1, v.shape[-1])


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
    bias: Tensor | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """Attention for q (B, h, T, d_k), k (B, g, S, d_k), v (B, g, S, d_v) -> (B, h, T, d_v).

    ``causal`` and ``window`` place the T query rows at the end of the S keys (positions S-T..S-1),
    which is what a KV cache needs. ``mask`` is an extra boolean mask broadcastable to (B, h, T, S),
    e.g. ``companion.attention.padding_mask``. A query row that may read nothing returns zeros.
    ``bias`` is an additive score term broadcastable to (B, h, T, S) (ALiBi); ``sinks`` (h,) are
    per-head sink logits in the softmax denominator (see ``_attend_with_logit_terms``).
    Mismatched shapes (B, S or d_k differing, h not a multiple of g) raise ValueError here, before
    any backend runs.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attend expects 4-D (B, heads, T, d) tensors; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    # Shapes are checked here, once, for every backend: torch's CPU SDPA, for one, returns a tensor
    # for k and v of different lengths instead of failing.
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads; got {k.shape[1]} and {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same length S (one value per key); got {k.shape[2]} and {v.shape[2]}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"q, k and v must have the same batch size B; got {q.shape[0]}, {k.shape[0]} and {v.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head size d_k; got {q.shape[3]} and {k.shape[3]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"the query heads ({q.shape[1]}) must be a multiple of the key/value heads ({k.shape[1]})")
    h, T, S = q.shape[1], q.shape[2], k.shape[2]
    if backend in ("tiled", "triton"):
        return _attend_blockwise(q, k, v, causal, window, mask, scale, backend, bias, sinks)
    if backend in ("auto", "sdpa") and T == 1 and mask is None and bias is None and sinks is None and (
        causal or window is None) and (window is None or window >= S):
        return _attend_one_row(q, k, v, scale)
    if backend in ("auto", "sdpa") and mask is None and window is None and bias is None and sinks is None and (
        not causal or T == S):
        # Nothing to mask but the causal triangle: SDPA reads each key/value head for its h/g query
        # heads itself (enable_gqa), so neither K/V nor, in the backward, their gradients are copied
        # per query head and summed back (what made this path ~2% slower than transformers' Llama).
        # Heads sliced from a fused QKV product are strided views; SDPA's CPU kernels, forward and
        # backward, run ~3% faster on contiguous heads, copy included.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != h)
    k, v = expand_kv(k, h), expand_kv(v, h)
    full_mask = build_mask(T, S, causal=causal, window=window, mask=mask, device=q.device)
    if bias is not None or sinks is not None:  # ALiBi bias / gpt-oss sinks: additive-mask route
        return _attend_with_logit_terms(q, k, v, full_mask, bias, sinks, scale, backend)

    if backend == "reference":
        return scaled_dot_product_attention(q, k, v, full_mask, scale=scale)

    # sdpa / auto. Depending on the torch version and device kernel, a row with nothing to read
    # comes back as NaN or as zeros; zero such rows explicitly so every backend agrees everywhere.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=full_mask, scale=scale)
    empty = ~full_mask.any(dim=-1, keepdim=True)
    if bool(empty.any()):
        out = out.masked_fill(empty.expand(*out.shape[:-1], 1), 0.0)
    return out
