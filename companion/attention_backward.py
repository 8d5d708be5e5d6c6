"""The backward pass of scaled dot-product attention, written out by hand (chapter 5).

What this module provides
- ``softmax_backward(a, da)``: the row-wise softmax Jacobian applied to an upstream gradient,
  dS_ij = A_ij (dA_ij - sum_u A_iu dA_iu), equation (5.4).
- ``attention_backward(q, k, v, dout, mask=None, scale=None)``: dQ, dK, dV of
  O = softmax(Q K^T * scale + M) V given dO = dL/dO, equations (5.2)-(5.5).
- ``cross_entropy_grad(logits, targets)``: dl/dz = p - y of the mean softmax cross-entropy,
  equation (5.1), divided by the number of rows.

The forward pass (chapter 1, equation 1.2), for one batch/head slice, with c = ``scale``
(1 / sqrt(d_k) by default):
    S = c Q K^T + M                (T, S)
    A = softmax(S) row by row      (T, S)
    O = A V                        (T, d_v)
Given dO = dL/dO (T, d_v), the chain rule, one matrix product at a time:
    dV = A^T dO                                   (S, d_v)    (5.2)
    dA = dO V^T                                   (T, S)      (5.3)
    dS_ij = A_ij (dA_ij - sum_u A_iu dA_iu)       (T, S)      (5.4)
    dQ = c dS K,     dK = c dS^T Q                (T, d_k), (S, d_k)   (5.5)
A masked entry has A_ij = 0, so (5.4) gives it dS_ij = 0: no gradient flows through a score the
mask removed, and a fully masked row (all weights 0, output 0) passes no gradient at all. The mask
itself (a constant) receives none. Attention dropout is not modelled (with it, A in (5.2)-(5.3)
becomes the dropped-and-rescaled weights and (5.3) gains the dropout mask's factor).
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion.attention import resolve_scale, stable_softmax

__all__ = ["softmax_backward", "attention_backward", "cross_entropy_grad"]


def softmax_backward(a: Tensor, da: Tensor) -> Tensor:
    """dS = A * (dA - rowsum(A * dA)), equation (5.4): the Jacobian of a row-wise softmax, applied.

    Args:
        a: (..., T, S) softmax outputs (each row sums to 1, or is all zeros for a fully masked row).
        da: (..., T, S) the gradient of the loss with respect to ``a``.

    Returns:
        (..., T, S) the gradient with respect to the scores. The full Jacobian of one row,
        diag(a) - a a^T, is never formed: applying it to a vector costs O(S), not O(S^2).
    """
    if a.shape != da.shape:
        raise ValueError(f"a and da must have the same shape (..., T, S); got {tuple(a.shape)} "
                         f"and {tuple(da.shape)}")
    return a * (da - (a * da).sum(dim=-1, keepdim=True))


def attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dQ, dK, dV) of O = softmax(Q K^T * scale + M) V, equations (5.2)-(5.5).

    Args:
        q: (..., T, d_k); k: (..., S, d_k); v: (..., S, d_v); dout: (..., T, d_v), dL/dO.
        mask: optional boolean, broadcastable to (..., T, S), True where a query may read a key
            (the convention of ``companion.attention``).
        scale: the score multiplier c; 1 / sqrt(d_k) when None.

    Returns:
        dq (..., T, d_k), dk (..., S, d_k), dv (..., S, d_v): what autograd returns for
        ``scaled_dot_product_attention(q, k, v, mask, scale=scale)``.
    """
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2 or dout.dim() < 2:
        raise ValueError(f"q, k, v and dout must have shape (..., rows, d); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(dout.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_k (last dim); got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same rows S; got {k.shape[-2]} and {v.shape[-2]}")
    if dout.shape[-2:] != (q.shape[-2], v.shape[-1]):
        raise ValueError(f"dout must have shape (..., T, d_v) = (..., {q.shape[-2]}, {v.shape[-1]}); "
                         f"got {tuple(dout.shape)}")
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = may read); got dtype {mask.dtype}")
    c = resolve_scale(scale, q.shape[-1])
    # the forward pass again: the backward needs A (real kernels store or recompute it)
    scores = (q @ k.transpose(-2, -1)) * c                       # (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    a = stable_softmax(scores, dim=-1)                           # (..., T, S)
    dv = a.transpose(-2, -1) @ dout                              # (5.2)  (..., S, d_v)
    da = dout @ v.transpose(-2, -1)                              # (5.3)  (..., T, S)
    ds = softmax_backward(a, da)                                 # (5.4)  zero where masked
    dq = c * (ds @ k)                                            # (5.5)  (..., T, d_k)
    dk = c * (ds.transpose(-2, -1) @ q)                          # (5.5)  (..., S, d_k)
    # broadcast leading dims (a k shared by several heads) fold back onto the input's shape
    return _unbroadcast(dq, q.shape), _unbroadcast(dk, k.shape), _unbroadcast(dv, v.shape)


def _unbroadcast(grad: Tensor, shape: torch.Size) -> Tensor:
    """Sum ``grad`` over the leading dims that broadcasting added or expanded from size 1."""
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and grad.shape[i] != 1:
            grad = grad.sum(i, keepdim=True)
    return grad


def cross_entropy_grad(logits: Tensor, targets: Tensor) -> Tensor:
    """dl/dz = (softmax(z) - onehot(y)) / N for l = mean over N rows of -log p_y, equation (5.1).

    Args:
        logits: (N, V) scores z; targets: (N,) class ids in [0, V).

    Returns:
        (N, V) the gradient of ``torch.nn.functional.cross_entropy(logits, targets)`` (mean).
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits must be (N, V) and targets (N,); got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    V = logits.shape[-1]
    if bool(((targets < 0) | (targets >= V)).any()):
        raise ValueError(f"targets must be class ids in [0, {V})")
    p = torch.softmax(logits, dim=-1)
    y = torch.nn.functional.one_hot(targets, V).to(p.dtype)
    return (p - y) / logits.shape[0]
