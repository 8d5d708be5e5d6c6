"""The 2017 Transformer: encoder-decoder for translation (Vaswani et al. 2017; chapter 3).

- Embeddings scaled by sqrt(d) plus the sinusoidal table (section 3.4-3.5); with a shared source and
  target vocabulary one matrix serves the encoder input, the decoder input and the output projection.
- Encoder: N x [self-attention, ReLU FFN], post-LN: x <- LayerNorm(x + Sublayer(x)).
- Decoder: N x [masked self-attention, cross-attention over the encoder output, ReLU FFN], post-LN.
- Padding masks: source pads are never read (encoder self-attention and cross-attention).
- Presets: "base" (d=512, h=8, d_ff=2048, N=6, shared 37000-token vocabulary: about 63M parameters
  against the paper's quoted 65M) and "tiny" (for a CPU).

The decoder's self-attention follows the cache contract (``companion.cache``), so greedy or beam
decoding can run one token at a time; cross-attention recomputes its keys from the fixed memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from companion.kernels.attend import BACKENDS
from companion.blocks import Block
from companion.cache import ModelCache
from companion.feedforward import MLP
from companion.mha import AttentionVariant, MultiHeadAttention, check_heads
from companion.models.common import check_inputs, from_family_preset, register_family
from companion.positions import SinusoidalPositions, embed_scale

__all__ = ["Seq2SeqConfig", "Seq2SeqTransformer", "SEQ2SEQ_PRESETS", "seq2seq_from_preset"]


@dataclass
class Seq2SeqConfig:
    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    max_len: int = 512
    dropout: float = 0.1
    share_embeddings: bool = True  # one matrix for source, target and output (needs one vocabulary)
    pad_id: int = 0
    backend: str = "auto"
    name: str = "custom"

    def __post_init__(self) -> None:
        for f in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers", "max_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1; got {getattr(self, f)}")
        check_heads(self.d_model, self.n_heads, self.n_heads, None)
        if self.d_model % 2:
            raise ValueError(f"d_model must be even for the sinusoidal table; got {self.d_model}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size (one shared vocabulary)")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {self.backend!r}")

    @property
    def context_length(self) -> int:
        """The longest source or target sequence (the shared name of ``max_len``)."""
        return self.max_len


SEQ2SEQ_PRESETS: dict[str, dict] = {
    "base": dict(),
    "tiny": dict(src_vocab_size=64, tgt_vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, max_len=64, dropout=0.0),
}


def seq2seq_from_preset(name: str, **overrides) -> "Seq2SeqTransformer":
    """``companion.models.from_preset`` limited to the encoder-decoder presets (chapter 3 imports it)."""
    return from_family_preset("seq2seq", name, **overrides)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = c = config
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = self.src_embed if c.share_embeddings else nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.positions = SinusoidalPositions(c.d_model, c.max_len)
        self.drop = nn.Dropout(c.dropout)

        def attn(**kw) -> MultiHeadAttention:
            return MultiHeadAttention(c.d_model, c.n_heads, bias=True, backend=c.backend, **kw)

        def ffn() -> MLP:
            return MLP(c.d_model, c.d_ff, activation="relu", dropout=0.0)

        self.encoder = nn.ModuleList(
            Block(c.d_model, attn(causal=False), ffn(), norm="layer", placement="post", dropout=c.dropout)
            for _ in range(c.n_encoder_layers)
        )
        self.decoder = nn.ModuleList(
            Block(c.d_model, attn(causal=True), ffn(), norm="layer", placement="post", dropout=c.dropout, cross_attn=attn(variant=AttentionVariant(cross=True)))
            for _ in range(c.n_decoder_layers)
        )
        self.out = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        # Embedding rows ~ N(0, 1/d): times sqrt(d) they are O(1), the size of the sinusoidal table.
        nn.init.normal_(self.src_embed.weight, std=c.d_model**-0.5)
        if not c.share_embeddings:
            nn.init.normal_(self.tgt_embed.weight, std=c.d_model**-0.5)
        self.out.weight = self.tgt_embed.weight  # section 3.4: shared pre-softmax projection

    def _check_ids(self, ids: Tensor, vocab: int, what: str, positions: Tensor | None = None, start: int = 0) -> None:
        """Shape here; values and positions by ``check_inputs`` (read on a CPU, asserted on a GPU without a sync)."""
        if ids.dim() != 2:
            raise ValueError(f"{what} must have shape (B, T); got {tuple(ids.shape)}")
        check_inputs(ids, positions, start, vocab, self.config.max_len, "max_len", ids_name=f"{what} token ids",
                     vocab_name=f"{what}_vocab_size")

    def _embed(self, emb: nn.Embedding, ids: Tensor, positions: Tensor) -> Tensor:
        return self.drop(emb(ids) * embed_scale(self.config.d_model) + self.positions(positions))

    def source_mask(self, src: Tensor) -> Tensor:
        """(B, S) -> boolean key mask (B, 1, 1, S): True where the source token is not padding."""
        return (src != self.config.pad_id)[:, None, None, :]

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src (B, S) -> memory (B, S, d)."""
        self._check_ids(src, self.config.src_vocab_size, "src")
        src_mask = self.source_mask(src) if src_mask is None else src_mask
        positions = torch.arange(src.shape[1], device=src.device)
        x = self._embed(self.src_embed, src, positions)
        for block in self.encoder:
            x = block(x, positions, mask=src_mask)
        return x

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None, cache: ModelCache | None = None, positions: Tensor | None = None
    ) -> Tensor:
        """tgt (B, T) shifted-right target ids, memory (B, S, d) -> logits (B, T, V_tgt)."""
        start = cache.length if cache is not None else 0
        self._check_ids(tgt, self.config.tgt_vocab_size, "tgt", positions, start)
        if positions is None:
            positions = torch.arange(start, start + tgt.shape[1], device=tgt.device)
        x = self._embed(self.tgt_embed, tgt, positions)
        for i, block in enumerate(self.decoder):
            x = block(x, positions, cache.layer(i) if cache is not None else None, memory=memory, memory_mask=src_mask)
        return self.out(x)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_mask = self.source_mask(src)
        return self.decode(tgt, self.encode(src, src_mask), src_mask)

    def new_cache(self) -> ModelCache:
        return ModelCache(self.config.n_decoder_layers)

    def num_parameters(self, active: bool = False, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= sum(p.numel() for p in {id(e.weight): e.weight for e in (self.src_embed, self.tgt_embed)}.values())
        return n

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Seq2SeqTransformer[{c.name}](d={c.d_model}, h={c.n_heads}, d_ff={c.d_ff}, N_enc={c.n_encoder_layers}, "
            f"N_dec={c.n_decoder_layers}, vocab={c.src_vocab_size}/{c.tgt_vocab_size}, shared={c.share_embeddings}, "
            f"post-LN, sinusoidal positions, ReLU FFN, params={self.num_parameters():,})"
        )


register_family("seq2seq", SEQ2SEQ_PRESETS, Seq2SeqConfig, Seq2SeqTransformer)
