"""GPT-1 / GPT-2: the decoder-only language model of chapter 4.

p(x) = prod_t p(x_t | x_<t), computed for all t at once with a causal mask (teacher forcing).
- token embedding + learned absolute position embedding;
- N blocks of masked multi-head self-attention and a GELU MLP (4d hidden), all with biases;
- GPT-1: post-LN blocks, no final norm, exact GELU; GPT-2: pre-LN blocks + a final LayerNorm,
  tanh-approximated GELU;
- the output projection is the transposed token embedding (weight tying).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from companion.kernels.attend import BACKENDS
from companion.blocks import Block
from companion.cache import ModelCache
from companion.feedforward import MLP
from companion.mha import MultiHeadAttention, check_heads
from companion.models.common import check_inputs, from_family_preset, init_normal, register_family
from companion.norms import LayerNorm
from companion.positions import LearnedPositions

__all__ = ["GPTConfig", "GPT", "GPT_PRESETS", "gpt_from_preset"]


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    block_size: int = 1024  # the context length: number of learned positions
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    variant: str = "gpt2"  # "gpt1" (post-LN) or "gpt2" (pre-LN + final LN)
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    backend: str = "auto"
    name: str = "custom"
    attention: ClassVar[str] = "mha"  # as DecoderConfig.attention: GPT's heads are plain multi-head

    def __post_init__(self) -> None:
        for f in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1; got {getattr(self, f)}")
        if self.variant not in ("gpt1", "gpt2"):
            raise ValueError(f"variant must be 'gpt1' or 'gpt2'; got {self.variant!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {self.backend!r}")
        check_heads(self.n_embd, self.n_head, self.n_head, None)

    # the names every config of the book answers to (companion.models), read-only
    @property
    def n_layers(self) -> int:
        return self.n_layer

    @property
    def d_model(self) -> int:
        return self.n_embd

    @property
    def n_heads(self) -> int:
        return self.n_head

    @property
    def context_length(self) -> int:
        """The longest sequence the model can read: its number of learned positions."""
        return self.block_size

    @property
    def kv_heads(self) -> int:
        """Key/value heads (as DecoderConfig.kv_heads): GPT has one per query head."""
        return self.n_head

    @property
    def attn_head_dim(self) -> int:
        return self.n_embd // self.n_head


GPT_PRESETS: dict[str, dict] = {
    "gpt1": dict(vocab_size=40478, block_size=512, variant="gpt1"),
    "gpt2": dict(),  # GPT-2 small, 124M
    "gpt2-tiny": dict(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64),
}


def gpt_from_preset(name: str, **overrides) -> "GPT":
    """``companion.models.from_preset`` limited to the GPT presets (``companion.training.cli`` calls it)."""
    return from_family_preset("gpt", name, **overrides)


class GPT(nn.Module):
    """Token ids (B, T) -> logits (B, T, V)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        gpt2 = c.variant == "gpt2"
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = LearnedPositions(c.n_embd, c.block_size)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            Block(
                c.n_embd,
                MultiHeadAttention(c.n_embd, c.n_head, bias=True, backend=c.backend, dropout=c.dropout),
                MLP(c.n_embd, 4 * c.n_embd, activation="gelu_tanh" if gpt2 else "gelu", dropout=c.dropout),
                norm="layer", placement="pre" if gpt2 else "post", norm_eps=c.layer_norm_eps, dropout=0.0,
            )
            for _ in range(c.n_layer)
        )
        self.ln_f = LayerNorm(c.n_embd, c.layer_norm_eps) if gpt2 else nn.Identity()
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.apply(init_normal)
        # GPT-2: residual projections scaled by 1/sqrt(2N) so the stream's variance does not grow with depth.
        for block in self.blocks:
            for proj in (block.attn.out, block.ffn.down):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / (2 * c.n_layer) ** 0.5)
        self.lm_head.weight = self.wte.weight  # weight tying

    def new_cache(self) -> ModelCache:
        return ModelCache(self.config.n_layer)

    def forward(self, idx: Tensor, cache: ModelCache | None = None, positions: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        c = self.config
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T); got {tuple(idx.shape)}")
        if idx.shape[1] == 0:
            raise ValueError(f"idx must hold at least one token per sequence (T >= 1); got shape {tuple(idx.shape)}")
        start = cache.length if cache is not None else 0
        T = idx.shape[1]
        # ids and positions checked by reading them on a CPU, by a device-side assert on a GPU (no sync)
        check_inputs(idx, positions, start, c.vocab_size, c.block_size, "block_size")
        if positions is None:
            positions = torch.arange(start, start + T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for i, block in enumerate(self.blocks):
            x = block(x, positions, cache.layer(i) if cache is not None else None, mask=mask)
        return self.lm_head(self.ln_f(x))

    def num_parameters(self, active: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters, the tied embedding counted once. ``active`` is accepted for a uniform API (dense: same)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n

    def __repr__(self) -> str:
        c = self.config
        return (
            f"GPT[{c.name}]({c.variant}: vocab={c.vocab_size}, ctx={c.block_size}, layers={c.n_layer}, heads={c.n_head}, "
            f"d={c.n_embd}, {'pre-LN + final LN' if c.variant == 'gpt2' else 'post-LN'}, learned positions, "
            f"GELU MLP 4d, tied embeddings, params={self.num_parameters():,})"
        )


register_family("gpt", GPT_PRESETS, GPTConfig, GPT)
