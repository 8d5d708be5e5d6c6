"""The modern decoder-only Transformer, every design choice a config field (chapters 6 to 9, 13).

One model class, ``Decoder``, and one dataclass, ``DecoderConfig``. A preset fixes the choices of a
well-known family at toy size, so that a reader can switch one field at a time and measure the effect:

    model = from_preset("mistral-like", window=32)

Presets (shapes, not weights, of the families they are named after):
- llama-like:   pre-RMSNorm, RoPE, GQA, SwiGLU, no biases, untied embeddings.
- mistral-like: llama-like + a sliding window on every layer.
- gemma3-like:  5 local (windowed, RoPE base 10k) : 1 global (RoPE base 1M) layers, MQA, tied and
                sqrt(d)-scaled embeddings. (Gemma's GeGLU, QK-norm and sandwich norms are not modelled.)
- gpt-oss-like: attention sinks, alternating windowed/global layers, attention biases, MoE (top 2 of 4
                here), YaRN-scaled RoPE.
- mixtral-like: llama-like + MoE with 8 experts, top 2, softmax router.
- deepseek-like: MLA (latent KV, decoupled RoPE, query compression) + MoE with a shared expert,
                sigmoid router, bias balancing, first layer dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from companion.kernels.attend import BACKENDS
from companion.blocks import PLACEMENTS, Block
from companion.cache import ModelCache
from companion.feedforward import FFNS, make_ffn, swiglu_hidden
from companion.mha import MultiHeadAttention, check_heads
from companion.mla import MultiHeadLatentAttention
from companion.moe import ROUTERS, MoE
from companion.norms import NORMS, make_norm
from companion.positions import ROPE_SCALINGS, LearnedPositions, RotaryEmbedding, SinusoidalPositions, compiling, embed_scale
from companion.models.common import init_normal, register_family

__all__ = ["DecoderConfig", "Decoder", "PRESETS", "POSITIONS", "ATTENTIONS"]

POSITIONS = ("rope", "alibi", "learned", "sinusoidal", "none")
ATTENTIONS = ("mha", "mla")


@dataclass
class DecoderConfig:
    # sizes
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (MHA); 1 = MQA
    head_dim: int | None = None  # None = d_model / n_heads
    d_ff: int | None = None  # None = 4d (MLP) or 8d/3 rounded to 64 (SwiGLU)
    max_seq_len: int = 256
    # norms
    norm: str = "rms"
    norm_placement: str = "pre"
    norm_eps: float = 1e-6
    # positions
    position: str = "rope"
    rope_base: float = 10000.0
    rope_base_global: float | None = None  # RoPE base on global layers when it differs (gemma3)
    rope_scaling: str | None = None
    rope_factor: float = 1.0
    rope_original_max_len: int = 2048
    # feed-forward
    ffn: str = "swiglu"
    ffn_bias: bool = False
    # attention
    attention: str = "mha"
    attn_bias: bool = False
    window: int | None = None  # sliding window of w tokens on local layers
    global_every: int | None = None  # every k-th layer (k-1, 2k-1, ...) is global; None: all windowed
    keep: int = 0  # StreamingLLM kept initial tokens on windowed layers
    sinks: bool = False
    backend: str = "auto"
    # MLA (attention="mla")
    kv_rank: int = 32
    q_rank: int | None = None
    mla_head_dim: int = 16
    rope_dim: int = 8
    v_head_dim: int | None = None
    mla_absorbed: bool = False
    # mixture of experts (n_experts = 0: dense)
    n_experts: int = 0
    top_k: int = 2
    n_shared_experts: int = 0
    moe_d_ff: int | None = None
    first_dense_layers: int = 0
    router: str = "softmax"
    bias_balancing: bool = False
    aux_loss_coef: float = 0.01
    # embeddings
    tie_embeddings: bool = False
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d) (2017, Gemma)
    dropout: float = 0.0
    name: str = "custom"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
            need(getattr(self, f) >= 1, f"{f} must be >= 1; got {getattr(self, f)}")
        need(self.norm in NORMS, f"norm must be one of {NORMS}; got {self.norm!r}")
        need(self.norm_placement in PLACEMENTS, f"norm_placement must be one of {PLACEMENTS}; got {self.norm_placement!r}")
        need(self.position in POSITIONS, f"position must be one of {POSITIONS}; got {self.position!r}")
        need(self.rope_scaling in ROPE_SCALINGS, f"rope_scaling must be one of {ROPE_SCALINGS}; got {self.rope_scaling!r}")
        need(self.ffn in FFNS, f"ffn must be one of {FFNS}; got {self.ffn!r}")
        need(self.attention in ATTENTIONS, f"attention must be one of {ATTENTIONS}; got {self.attention!r}")
        need(self.backend in BACKENDS, f"backend must be one of {BACKENDS}; got {self.backend!r}")
        need(self.window is None or self.window >= 1, f"window must be >= 1 or None; got {self.window}")
        need(self.global_every is None or self.global_every >= 1, f"global_every must be >= 1 or None; got {self.global_every}")
        need(self.keep >= 0, f"keep must be >= 0; got {self.keep}")
        if self.attention == "mha":
            n_kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
            hd = check_heads(self.d_model, self.n_heads, n_kv, self.head_dim)
            need(self.position != "rope" or hd % 2 == 0, f"head_dim must be even with RoPE (channels rotate in pairs); got {hd}")
        else:
            need(self.position == "rope", f"attention='mla' carries position on its decoupled RoPE key; position must be 'rope', got {self.position!r}")
            need(self.rope_dim % 2 == 0, f"rope_dim must be even for RoPE; got {self.rope_dim}")
            need(self.window is None and not self.sinks, "attention='mla' here supports neither window nor sinks")
        if self.n_experts:
            need(1 <= self.top_k <= self.n_experts, f"top_k must satisfy 1 <= top_k <= n_experts ({self.n_experts}); got {self.top_k}")
            need(self.router in ROUTERS, f"router must be one of {ROUTERS}; got {self.router!r}")
            need(0 <= self.first_dense_layers <= self.n_layers, f"first_dense_layers must be in [0, n_layers]; got {self.first_dense_layers}")
        need(self.n_experts >= 0, f"n_experts must be >= 0; got {self.n_experts}")

    # derived quantities -------------------------------------------------------------------------
    @property
    def context_length(self) -> int:
        """The longest sequence the model is built for (the shared name of ``max_seq_len``)."""
        return self.max_seq_len

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def ffn_hidden(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        return swiglu_hidden(self.d_model) if self.ffn == "swiglu" else 4 * self.d_model

    def is_global(self, layer: int) -> bool:
        if self.window is None:
            return True
        return self.global_every is not None and (layer + 1) % self.global_every == 0

    def layer_windows(self) -> list[int | None]:
        """Window of each layer (None = global); e.g. gemma3-like: [w, w, w, w, w, None]."""
        return [None if self.is_global(i) else self.window for i in range(self.n_layers)]

    def is_moe(self, layer: int) -> bool:
        return self.n_experts > 0 and layer >= self.first_dense_layers


PRESETS: dict[str, dict] = {
    "llama-like": dict(n_kv_heads=2),
    "mistral-like": dict(n_kv_heads=2, window=16),
    "gemma3-like": dict(
        n_layers=6, n_kv_heads=1, window=8, global_every=6, rope_base=10000.0, rope_base_global=1_000_000.0,
        tie_embeddings=True, scale_embeddings=True,
    ),
    "gpt-oss-like": dict(
        n_layers=4, n_kv_heads=2, window=8, global_every=2, sinks=True, attn_bias=True, n_experts=4, top_k=2,
        moe_d_ff=64, rope_scaling="yarn", rope_factor=4.0, rope_original_max_len=64,
    ),
    "mixtral-like": dict(n_kv_heads=2, n_experts=8, top_k=2, moe_d_ff=64),
    "deepseek-like": dict(
        n_layers=3, attention="mla", kv_rank=32, q_rank=48, mla_head_dim=16, rope_dim=8, n_experts=8, top_k=2,
        n_shared_experts=1, moe_d_ff=32, first_dense_layers=1, router="sigmoid", bias_balancing=True,
    ),
}


class Decoder(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V), with an optional KV cache (``new_cache()``)."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        config.validate()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.positions: nn.Module | None = None
        if c.position == "learned":
            self.positions = LearnedPositions(c.d_model, c.max_seq_len)
        elif c.position == "sinusoidal":
            self.positions = SinusoidalPositions(c.d_model, c.max_seq_len)
        self.layers = nn.ModuleList(self._block(i) for i in range(c.n_layers))
        self.final_norm = make_norm(c.norm, c.d_model, c.norm_eps) if c.norm_placement == "pre" else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(init_normal)
        if c.tie_embeddings:  # one matrix for reading tokens in and scoring them out (Press and Wolf 2017)
            self.lm_head.weight = self.embed.weight

    def _rope(self, layer: int) -> RotaryEmbedding:
        c = self.config
        base = c.rope_base_global if (c.rope_base_global is not None and c.is_global(layer)) else c.rope_base
        dim = c.rope_dim if c.attention == "mla" else c.attn_head_dim
        return RotaryEmbedding(dim, base, c.rope_scaling, c.rope_factor, c.rope_original_max_len)

    def _block(self, i: int) -> Block:
        c = self.config
        if c.attention == "mla":
            attn = MultiHeadLatentAttention(
                c.d_model, c.n_heads, kv_rank=c.kv_rank, q_rank=c.q_rank, head_dim=c.mla_head_dim,
                rope_dim=c.rope_dim, v_head_dim=c.v_head_dim, rope=self._rope(i), absorbed=c.mla_absorbed,
                backend=c.backend, norm_eps=c.norm_eps,
            )
        else:
            window = c.layer_windows()[i]
            attn = MultiHeadAttention(
                c.d_model, c.n_heads, c.kv_heads, c.head_dim, bias=c.attn_bias, window=window,
                keep=c.keep if window is not None else 0, sinks=c.sinks,
                rope=self._rope(i) if c.position == "rope" else None, alibi=c.position == "alibi",
                backend=c.backend, dropout=c.dropout,
            )
        if c.is_moe(i):
            ffn = MoE(
                c.d_model, c.moe_d_ff or c.ffn_hidden, c.n_experts, c.top_k, n_shared=c.n_shared_experts,
                router=c.router, bias_balancing=c.bias_balancing, aux_loss_coef=c.aux_loss_coef,
            )
        else:
            ffn = make_ffn(c.ffn, c.d_model, c.ffn_hidden, bias=c.ffn_bias, dropout=c.dropout)
        return Block(c.d_model, attn, ffn, norm=c.norm, placement=c.norm_placement, norm_eps=c.norm_eps, dropout=c.dropout)

    # the cache contract ---------------------------------------------------------------------------
    def new_cache(self) -> ModelCache:
        """An empty contiguous cache; windowed layers keep only the rows they can still read."""
        c = self.config
        windows = [None] * c.n_layers if c.attention == "mla" else c.layer_windows()
        return ModelCache(c.n_layers, windows, keep=c.keep)

    def forward(self, idx: Tensor, cache: ModelCache | None = None, positions: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """idx (B, T) token ids -> logits (B, T, V).

        positions: (T,) absolute positions; default cache.length + arange(T) (0..T-1 without a cache).
        cache: from ``new_cache()``; updated in place with the new rows' state.
        mask: extra boolean key mask broadcastable to (B, h, T, S), e.g. padding.
        """
        c = self.config
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T); got {tuple(idx.shape)}")
        checks = not compiling()  # torch.compile: no host reads of tensor values (the engine checked its inputs)
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(start, start + T, device=idx.device)
        if checks and T and B:
            # one host read (one device sync on a GPU) for every value check of the forward; the layers
            # read no values (``RotaryEmbedding.cos_sin``)
            lo, hi = torch.aminmax(idx.detach().long())
            p_lo, p_hi = torch.aminmax(positions.detach().long().to(idx.device))
            lo, hi, p_lo, p_hi = torch.stack([lo, hi, p_lo, p_hi]).tolist()
            if lo < 0 or hi >= c.vocab_size:
                raise ValueError(f"token ids must be in [0, vocab_size={c.vocab_size}); got range [{lo}, {hi}]")
            if p_lo < 0:
                raise ValueError(f"positions must be >= 0; got {p_lo}")
            if p_hi >= c.max_seq_len:
                raise ValueError(f"sequence longer than the configured context: position {p_hi} >= max_seq_len={c.max_seq_len}")
        x = self.embed(idx)
        if c.scale_embeddings:
            x = x * embed_scale(c.d_model)
        if self.positions is not None:
            x = x + self.positions(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, cache.layer(i) if cache is not None else None, mask=mask)
        return self.lm_head(self.final_norm(x))

    # reporting --------------------------------------------------------------------------------------
    def aux_loss(self) -> Tensor:
        """Sum of the MoE load-balancing losses of the last forward (0 for a dense model)."""
        losses = [layer.ffn.aux_loss for layer in self.layers if isinstance(layer.ffn, MoE)]
        return torch.stack(losses).sum() if losses else torch.zeros(())

    def expert_load(self) -> dict[int, Tensor]:
        """Tokens routed to each expert in the last forward, per MoE layer."""
        return {i: layer.ffn.last_load.clone() for i, layer in enumerate(self.layers) if isinstance(layer.ffn, MoE)}

    def update_expert_bias(self) -> None:
        """DeepSeek-V3 bias balancing step for every MoE layer (call once per optimizer step)."""
        for layer in self.layers:
            if isinstance(layer.ffn, MoE) and layer.ffn.bias_balancing:
                layer.ffn.update_bias()

    def num_parameters(self, active: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters (tied matrices counted once). active=True counts only the top_k routed experts
        each token uses, plus everything dense: the per-token compute-relevant size of an MoE model."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.embed.weight.numel() + (self.positions.weight.numel() if isinstance(self.positions, LearnedPositions) else 0)
        if active:
            for layer in self.layers:
                if isinstance(layer.ffn, MoE):
                    per_expert = sum(p.numel() for p in layer.ffn.experts[0].parameters())
                    n -= (layer.ffn.n_experts - layer.ffn.top_k) * per_expert
        return n

    def __repr__(self) -> str:
        c = self.config
        attn = (
            f"MLA(h={c.n_heads}, d_c={c.kv_rank}, d_R={c.rope_dim})" if c.attention == "mla"
            else f"{'MHA' if c.kv_heads == c.n_heads else ('MQA' if c.kv_heads == 1 else 'GQA')}(h={c.n_heads}, g={c.kv_heads}, d_h={c.attn_head_dim})"
        )
        lines = [
            f"Decoder[{c.name}](vocab={c.vocab_size}, d={c.d_model}, layers={c.n_layers}, ctx={c.max_seq_len}, "
            f"params={self.num_parameters():,}" + (f", active={self.num_parameters(active=True):,})" if c.n_experts else ")"),
            f"  {c.norm_placement}-{c.norm}norm, positions={c.position}"
            + (f" (base {c.rope_base:g}" + (f", global {c.rope_base_global:g}" if c.rope_base_global else "")
               + (f", {c.rope_scaling} x{c.rope_factor:g}" if c.rope_scaling else "") + ")" if c.position == "rope" else "")
            + f", attention={attn}{', sinks' if c.sinks else ''}{', biases' if c.attn_bias else ''}, tied={c.tie_embeddings}",
        ]
        for i in range(c.n_layers):
            w = c.layer_windows()[i] if c.attention == "mha" else None
            ffn = (
                f"MoE({c.n_experts} experts, top {c.top_k}, {c.n_shared_experts} shared, {c.router})" if c.is_moe(i)
                else f"{c.ffn}(d_ff={c.ffn_hidden})"
            )
            lines.append(f"  layer {i}: {'local w=' + str(w) if w else 'global'}, {ffn}")
        return "\n".join(lines)


register_family("decoder", PRESETS, DecoderConfig, Decoder)
