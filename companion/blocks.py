"""Residual blocks: attention (+ cross-attention) + feed-forward, pre- or post-norm (chapters 3, 4 and 6).

- post-norm (2017, GPT-1): x <- Norm(x + Sublayer(x)). The norm sits on the residual path, so every
  layer rescales the stream; deep stacks need learning-rate warm-up to train.
- pre-norm (GPT-2 onwards): x <- x + Sublayer(Norm(x)). The residual path is an identity from input
  to output, gradients reach early layers undiminished; the model needs one final norm.
- sandwich (Gemma 2 and 3): x <- x + PostNorm(Sublayer(PreNorm(x))). Pre-norm plus a second norm on
  each sublayer's output before it joins the stream, which bounds what one layer can add.

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

PLACEMENTS = ("pre", "post", "sandwich")


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
        norm_offset: bool = False,
    ):
        """norm_offset: RMSNorms with the gain 1 + w (Gemma), see ``companion.norms.RMSNorm``."""
        super().__init__()
        if placement not in PLACEMENTS:
            raise ValueError(f"norm placement must be one of {PLACEMENTS}; got {placement!r}")
        self.placement = placement
        self.attn, self.ffn, self.cross_attn = attn, ffn, cross_attn
        def new_norm() -> nn.Module:
            return make_norm(norm, d, norm_eps, norm_bias, offset=norm_offset)

        self.attn_norm = new_norm()
        self.cross_norm = new_norm() if cross_attn is not None else None
        self.ffn_norm = new_norm()
        if placement == "sandwich":  # the output norms; created only here, so other blocks' state is unchanged
            if cross_attn is not None:
                raise ValueError("placement='sandwich' is for decoder-only blocks (no cross_attn)")
            self.attn_post_norm, self.ffn_post_norm = new_norm(), new_norm()
        self.dropout = nn.Dropout(dropout)

    def _residual(self, x: Tensor, norm: nn.Module, f: Callable[[Tensor], Tensor], post: nn.Module | None = None) -> Tensor:
        if self.placement == "pre":
            return x + self._dropout(f(norm(x)))
        if self.placement == "sandwich":
            return x + self._dropout(post(f(norm(x))))
        return norm(x + self._dropout(f(x)))

    def _dropout(self, x: Tensor) -> Tensor:
        """Dropout where it acts (training, p > 0); otherwise x itself, without a module call."""
        return self.dropout(x) if self.training and self.dropout.p else x

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
        sandwich = self.placement == "sandwich"
        x = self._residual(x, self.attn_norm, lambda h: self.attn(h, positions, cache, mask=mask),
                           self.attn_post_norm if sandwich else None)
        if self.cross_attn is not None:
            x = self._residual(x, self.cross_norm, lambda h: self.cross_attn(h, memory=memory, mask=memory_mask))
        return self._residual(x, self.ffn_norm, self.ffn, self.ffn_post_norm if sandwich else None)
