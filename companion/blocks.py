"""Residual blocks: attention (+ cross-attention) + feed-forward, pre- or post-norm (chapters 3, 4 and 6).

- post-norm (2017, GPT-1): x <- Norm(x + Sublayer(x)). The norm sits on the residual path, so every
  layer rescales the stream; deep stacks need learning-rate warm-up to train.
- pre-norm (GPT-2 onwards): x <- x + Sublayer(Norm(x)). The residual path is an identity from input
  to output, gradients reach early layers undiminished; the model needs one final norm.

A ``Block`` wires any attention module that follows the cache contract (``MultiHeadAttention``,
``MultiHeadLatentAttention``), an optional cross-attention, and any feed-forward module (MLP,
SwiGLU, MoE).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from companion.cache import LayerCache
from companion.norms import make_norm

__all__ = ["Block", "PLACEMENTS"]

PLACEMENTS = ("pre", "post")


class Block(nn.Module):
    def __init__(
        self,
        d: int,
        attn: nn.Module,
        ffn: nn.Module,
        *,
        norm: str = "layer",
        placement: str = "pre",
        norm_eps: float | None = None,
        norm_bias: bool = True,
        cross_attn: nn.Module | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        if placement not in PLACEMENTS:
            raise ValueError(f"norm placement must be one of {PLACEMENTS}; got {placement!r}")
        self.placement = placement
        self.attn, self.ffn, self.cross_attn = attn, ffn, cross_attn
        self.attn_norm = make_norm(norm, d, norm_eps, norm_bias)
        self.cross_norm = make_norm(norm, d, norm_eps, norm_bias) if cross_attn is not None else None
        self.ffn_norm = make_norm(norm, d, norm_eps, norm_bias)
        self.dropout = nn.Dropout(dropout)

    def _residual(self, x: Tensor, norm: nn.Module, f: Callable[[Tensor], Tensor]) -> Tensor:
        if self.placement == "pre":
            return x + self.dropout(f(norm(x)))
        return norm(x + self.dropout(f(x)))

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        cache: LayerCache | None = None,
        *,
        mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
    ) -> Tensor:  # (B, T, d) -> (B, T, d)
        x = self._residual(x, self.attn_norm, lambda h: self.attn(h, positions, cache, mask=mask))
        if self.cross_attn is not None:
            x = self._residual(x, self.cross_norm, lambda h: self.cross_attn(h, memory=memory, mask=memory_mask))
        return self._residual(x, self.ffn_norm, self.ffn)
