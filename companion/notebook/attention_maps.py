"""Read the attention weights a model actually used (chapter 3's cross-attention maps, and later ones).

What this module provides
- ``record_cross_attention(model)``: a context manager. During the forward passes inside it, every
  cross-attention layer (``MultiHeadAttention(cross=True)``) reports its weights
  A = softmax(Q K^T / sqrt(d_h) + M) (equation 1.2) with shape (B, h, T, S), one entry per layer
  in call order.

How: a forward hook receives the layer's inputs (the decoder states and the encoder memory), and
the weights are recomputed from the layer's own projections with the readable
``companion.attention.scaled_dot_product_attention``. The model's forward itself is untouched, so
the fast attention backends keep running; recording costs one extra score matrix per layer.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from companion.attention import scaled_dot_product_attention
from companion.mha import MultiHeadAttention

__all__ = ["record_cross_attention"]


@contextmanager
def record_cross_attention(model: nn.Module) -> Iterator[list[Tensor]]:
    """Yield a list that fills with one (B, h, T, S) weight tensor per cross-attention call."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention) and m.cross]
    if not layers:
        raise ValueError("model has no cross-attention layer (MultiHeadAttention with cross=True) to record")
    recorded: list[Tensor] = []

    def hook(module: MultiHeadAttention, args: tuple, kwargs: dict, output: Tensor) -> None:
        x, memory, mask = args[0], kwargs.get("memory"), kwargs.get("mask")
        with torch.no_grad():
            q, k, v = module.project_qkv(x, memory)
            group = module.n_heads // module.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            _, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
        recorded.append(weights.detach())

    handles = [layer.register_forward_hook(hook, with_kwargs=True) for layer in layers]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()
