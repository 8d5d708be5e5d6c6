"""Scaled dot-product attention, written to be read (chapter 1).

What this module provides
- ``scaled_dot_product_attention``: equation (1.2), softmax(Q K^T / sqrt(d_k) + M) V, for any
  leading batch/head dimensions, with boolean or additive masks and fully masked rows handled.
- ``stable_softmax``: the max-subtracted softmax of equation (1.5) that returns zeros, not NaN,
  for a row in which every position is masked.
- Mask builders: ``causal_mask``, ``padding_mask``, ``sliding_window_mask`` and the
  conversion ``to_additive_mask``.
- ``resolve_scale(scale, d)``: the score scale, 1 / sqrt(d) by default; the one check every
  attention entry point of the package uses.

Conventions used everywhere in ``companion``
- Shapes are written (..., T, d): T query rows, S key rows, leading dimensions are batch and heads.
- A boolean mask is True where a query MAY read a key (the same convention as
  ``torch.nn.functional.scaled_dot_product_attention``). An additive mask is added to the scores;
  use ``-inf`` for "may not read".
- Query row i of a block of T new rows sits at absolute position ``S - T + i`` when it attends
  over S keys (the cached prefix plus itself). This is what makes the causal mask non-square
  when a KV cache is in use (chapter 10).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "scaled_dot_product_attention",
    "stable_softmax",
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "to_additive_mask",
    "resolve_scale",
]


def resolve_scale(scale: float | None, d: int) -> float:
    """The factor the scores Q K^T are multiplied by: ``scale``, or 1 / sqrt(d) (equation 1.2) when it is
    None (1.0 for d = 0, where there is nothing to scale). Any other value must be a positive finite
    int or float (not a bool)."""
    if scale is None:
        return 1.0 / math.sqrt(d) if d > 0 else 1.0
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number; got {scale!r}")
    return float(scale)


def _check_mask(mask: Tensor, batch_shape: torch.Size, T: int, S: int) -> None:
    if mask.dim() < 2:
        raise ValueError(f"mask must have at least 2 dimensions (..., T, S); got shape {tuple(mask.shape)}")
    try:
        torch.broadcast_shapes(mask.shape, (*batch_shape, T, S))
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
            f"{(*batch_shape, T, S)} = (..., T, S)"
        ) from None
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise ValueError(f"mask must be bool (True = may read) or floating (additive); got dtype {mask.dtype}")


def stable_softmax(scores: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim`` computed as exp(s - max s) / sum exp(s - max s) (equation 1.5).

    Subtracting the row maximum changes nothing mathematically (it cancels between numerator and
    denominator) but keeps every exponent <= 0, so nothing overflows. A row whose entries are all
    ``-inf`` (every key masked) has no defined softmax; we return zeros for it, so that the
    attention output of that row is the zero vector instead of NaN.
    """
    row_max = scores.amax(dim=dim, keepdim=True)
    # A fully masked row has max = -inf and (-inf) - (-inf) = NaN; shift such rows by 0 instead.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - row_max)
    total = exp.sum(dim=dim, keepdim=True)
    return exp / torch.where(total > 0, total, torch.ones_like(total))


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attn(Q, K, V; M) = softmax(Q K^T * scale + M) V, equation (1.2), with scale = 1/sqrt(d_k).

    Args:
        q: queries, shape (..., T, d_k).
        k: keys, shape (..., S, d_k).
        v: values, shape (..., S, d_v).
        mask: optional, broadcastable to (..., T, S). Boolean: True where the query may read the
            key. Floating: added to the scaled scores (use -inf to forbid).
        scale: multiplier of the scores; defaults to 1/sqrt(d_k) (section 1.3 explains why).
        return_weights: also return the attention weights A, shape (..., T, S).

    Returns:
        O with shape (..., T, d_v), and A if ``return_weights``. A query row whose keys are all
        masked gets the zero vector as output and a row of zero weights.
    """
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(
            f"q, k and v must have shape (..., T, d); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the key width d_k (last dim); got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of rows S (dim -2); got {k.shape[-2]} and {v.shape[-2]}")
    try:
        batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the leading (batch, head) dims of q {tuple(q.shape[:-2])}, k {tuple(k.shape[:-2])} and "
            f"v {tuple(v.shape[:-2])} do not broadcast"
        ) from None
    scale = resolve_scale(scale, q.shape[-1])

    T, S = q.shape[-2], k.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S): step 1 score, step 2 scale
    if mask is not None:
        _check_mask(mask, batch_shape, T, S)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(scores.dtype)
    weights = stable_softmax(scores, dim=-1)  # step 3 normalise
    out = weights @ v  # step 4 aggregate
    return (out, weights) if return_weights else out


def causal_mask(T: int, S: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Boolean (T, S) mask letting query row i read keys j <= S - T + i.

    With S = T this is the lower-triangular matrix of a decoder. With S > T the T rows are the
    newest positions of a longer sequence (the rest of the keys come from a cache), so every row
    also sees the whole prefix.
    """
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"causal_mask needs 0 <= T <= S; got T={T}, S={S}")
    rows = torch.arange(T, device=device).unsqueeze(1) + (S - T)
    cols = torch.arange(S, device=device).unsqueeze(0)
    return cols <= rows


def sliding_window_mask(T: int, window: int, S: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Causal mask restricted to the last ``window`` positions: row at position p reads keys p-window+1..p."""
    if window < 1:
        raise ValueError(f"window must be >= 1 (a query always sees itself); got {window}")
    S = T if S is None else S
    causal = causal_mask(T, S, device=device)
    rows = torch.arange(T, device=device).unsqueeze(1) + (S - T)
    cols = torch.arange(S, device=device).unsqueeze(0)
    return causal & (rows - cols < window)


def padding_mask(lengths: Tensor | list[int], S: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Boolean key mask of shape (B, 1, 1, S): True for the first ``lengths[b]`` keys of sequence b.

    The two singleton dimensions broadcast over heads and query rows, so the result can be passed
    straight to ``scaled_dot_product_attention`` for inputs of shape (B, h, T, d), or combined with
    a causal mask by ``&``.
    """
    lengths = torch.as_tensor(lengths, device=device)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be one-dimensional (B,); got shape {tuple(lengths.shape)}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError("lengths must be non-negative")
    S = int(lengths.max()) if S is None else S
    if lengths.numel() and int(lengths.max()) > S:
        raise ValueError(f"every length must be <= S={S}; got max length {int(lengths.max())}")
    keep = torch.arange(S, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
    return keep[:, None, None, :]


def to_additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Turn a boolean keep-mask into an additive one: 0 where True, -inf where False."""
    if mask.dtype != torch.bool:
        raise ValueError(f"to_additive_mask expects a boolean mask; got dtype {mask.dtype}")
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))
