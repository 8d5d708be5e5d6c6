"""The modern decoder-only Transformer, every design choice a config field (chapters 6 to 9, 13).

One model class, ``Decoder``, and one dataclass, ``DecoderConfig``. A preset fixes the choices of a
well-known family at toy size, so that a reader can switch one field at a time and measure the effect:

    model = from_preset("mistral-like", window=32)

Presets (shapes, not weights, of the families they are named after):
- llama-like:   pre-RMSNorm, RoPE, GQA, SwiGLU, no biases, untied embeddings.
- llama3-like:  llama-like with Llama 3.1's RoPE: base 500k, piecewise frequency rescale ("llama3",
                factor 8, low/high frequency factors 1 and 4) over an original context of 64 here.
- mistral-like: llama-like + a sliding window on every layer.
- qwen3-like:   llama-like + QK-norm (RMSNorm on each head of q and k, before RoPE), RoPE base 1M,
                heads wider than d / h (head_dim 32 with d = 64, h = 4), tied embeddings.
- gemma3-like:  Gemma 3's block: 5 local (window 8, RoPE base 10k) : 1 global (RoPE base 1M) layers,
                MQA, GeGLU, QK-norm, sandwich norms (pre and post each sublayer), RMSNorm gains 1 + w,
                tied and sqrt(d)-scaled embeddings.
- gemma2-like:  Gemma 2's block: alternating local / global layers, GeGLU, sandwich norms, gains 1 + w,
                attention logit soft-cap 50 and final logit soft-cap 30, sqrt(d)-scaled embeddings.
- gpt-oss-like: gpt-oss's block: attention sinks, alternating 128-window / full layers, q, k, v and
                W_O biases, YaRN RoPE as gpt-oss computes it ("yarn_hf", base 150k, factor 4 over
                an original 64 here), MoE (top 2 of 4) with a router bias and clamped SwiGLU experts.
- mixtral-like: llama-like + MoE with 8 experts, top 2, softmax router.
- deepseek-like: DeepSeek-V3's block: MLA (latent KV, decoupled RoPE, query compression) + MoE with a
                shared expert, sigmoid router, bias balancing (selection only), group-limited routing
                (4 groups, the best 2), routed_scaling_factor 2.5, first layer dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from companion.kernels.attend import BACKENDS
from companion.blocks import PLACEMENTS, Block
from companion.cache import ModelCache
from companion.feedforward import FFNS, GATED_FFNS, make_ffn, swiglu_hidden
from companion.mha import AttentionVariant, MultiHeadAttention, check_heads
from companion.mla import MultiHeadLatentAttention
from companion.moe import ROUTERS, MoE
from companion.norms import NORMS, make_norm
from companion.positions import (
    ROPE_SCALINGS, LearnedPositions, RotaryEmbedding, SinusoidalPositions, embed_scale, yarn_temperature,
)
from companion.models.common import check_inputs, init_normal, register_family

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
    norm_offset: bool = False  # RMSNorm gain stored as 1 + w (Gemma)
    # positions
    position: str = "rope"
    rope_base: float = 10000.0
    rope_base_global: float | None = None  # RoPE base on global layers when it differs (gemma3)
    rope_scaling: str | None = None
    rope_factor: float = 1.0
    rope_original_max_len: int = 2048
    rope_scaling_layers: str = "all"  # "global": scaled RoPE on global layers only (Gemma 3)
    rope_beta_fast: float = 32.0  # YaRN ramp ends, in turns over the original context
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True  # "yarn_hf": round the ramp's channel bounds (gpt-oss: False)
    rope_attention_factor: float | None = None  # "yarn_hf": temperature override (None: 0.1 ln s + 1)
    rope_mscale: float = 0.0  # "yarn_hf", DeepSeek's form: temperature m(mscale) / m(mscale_all_dim) ...
    rope_mscale_all_dim: float = 0.0  # ... and MLA's softmax scale times m(mscale_all_dim)^2 (any scaling), m(k) = 0.1 k ln s + 1
    rope_low_freq_factor: float = 1.0  # "llama3": wavelengths above L / low are interpolated ...
    rope_high_freq_factor: float = 4.0  # ... below L / high kept, in between blended
    # feed-forward
    ffn: str = "swiglu"
    ffn_bias: bool = False
    # attention
    attention: str = "mha"
    attn_bias: bool = False
    attn_out_bias: bool | None = None  # None: as attn_bias; Qwen2 has q, k, v biases and no W_O bias
    qk_norm: bool = False  # RMSNorm on each head of q and k before RoPE (Qwen3, Gemma 3)
    query_pre_attn_scalar: float | None = None  # scores scaled by s^(-1/2) instead of d_h^(-1/2) (Gemma)
    attn_softcap: float | None = None  # c tanh(score / c) before the softmax (Gemma 2)
    final_softcap: float | None = None  # c tanh(logit / c) on the output logits (Gemma 2)
    window: int | None = None  # sliding window of w tokens on local layers
    global_every: int | None = None  # every k-th layer (k-1, 2k-1, ...) is global; None: all windowed
    layer_pattern: tuple[int | None, ...] | None = None  # per layer: its window, None = global (replaces window / global_every)
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
    mla_norm_eps: float = 1e-6  # eps of the latent RMSNorms (DeepSeek-V3: 1e-6 whatever norm_eps says)
    # mixture of experts (n_experts = 0: dense)
    n_experts: int = 0
    top_k: int = 2
    n_shared_experts: int = 0
    moe_d_ff: int | None = None
    first_dense_layers: int = 0
    moe_layers: tuple[bool, ...] | None = None  # per layer: MoE (True) or dense (replaces first_dense_layers)
    router: str = "softmax"
    bias_balancing: bool = False
    aux_loss_coef: float = 0.01
    expert_groups: int = 1  # DeepSeek-V3 group-limited routing: experts in this many groups ...
    topk_groups: int | None = None  # ... of which a token reads the best topk_groups (None: all)
    norm_topk_prob: bool = True  # renormalise the top-k gates to sum 1
    routed_scaling_factor: float = 1.0  # gates times this (DeepSeek-V3: 2.5)
    router_bias: bool = False  # a learned bias on the router logits (gpt-oss)
    moe_expert: str = "swiglu"  # or "clamped_swiglu" (gpt-oss's experts, with biases)
    swiglu_alpha: float = 1.702  # "clamped_swiglu": the gate's sigmoid(alpha g) ...
    swiglu_limit: float = 7.0  # ... and the clamp of gate and up
    # embeddings
    tie_embeddings: bool = False
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d) (2017, Gemma)
    dropout: float = 0.0
    name: str = "custom"

    def __post_init__(self) -> None:
        for f in ("layer_pattern", "moe_layers"):  # lists (e.g. from a JSON checkpoint) become tuples
            if getattr(self, f) is not None:
                setattr(self, f, tuple(getattr(self, f)))
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
        if self.layer_pattern is not None:
            need(self.window is None and self.global_every is None,
                 "layer_pattern replaces window and global_every: set either the list or the two fields")
            need(len(self.layer_pattern) == self.n_layers and all(w is None or w >= 1 for w in self.layer_pattern),
                 f"layer_pattern must hold one window (>= 1) or None per layer ({self.n_layers}); got {self.layer_pattern}")
        if self.moe_layers is not None:
            need(self.first_dense_layers == 0, "moe_layers replaces first_dense_layers: set either the list or the field")
            need(len(self.moe_layers) == self.n_layers, f"moe_layers must hold one flag per layer ({self.n_layers}); got {self.moe_layers}")
        need(self.rope_scaling_layers in ("all", "global"), f"rope_scaling_layers must be 'all' or 'global'; got {self.rope_scaling_layers!r}")
        for f in ("query_pre_attn_scalar", "attn_softcap", "final_softcap"):
            need(getattr(self, f) is None or getattr(self, f) > 0, f"{f} must be > 0 or None; got {getattr(self, f)}")
        need(not self.norm_offset or self.norm == "rms", "norm_offset=True is an RMSNorm parameterisation: needs norm='rms'")
        need(self.attention == "mha" or not (self.qk_norm or self.attn_softcap or self.query_pre_attn_scalar),
             "qk_norm, attn_softcap and query_pre_attn_scalar apply to attention='mha' only")
        if self.attention == "mha":
            n_kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
            hd = check_heads(self.d_model, self.n_heads, n_kv, self.head_dim)
            need(self.position != "rope" or hd % 2 == 0, f"head_dim must be even with RoPE (channels rotate in pairs); got {hd}")
        else:
            need(self.position == "rope", f"attention='mla' carries position on its decoupled RoPE key; position must be 'rope', got {self.position!r}")
            need(self.rope_dim % 2 == 0, f"rope_dim must be even for RoPE; got {self.rope_dim}")
            need(self.window is None and not self.sinks and not any(self.layer_pattern or ()),
                 "attention='mla' here supports neither window nor sinks")
            need(self.mla_norm_eps > 0, f"mla_norm_eps must be > 0; got {self.mla_norm_eps}")
        if self.n_experts:
            need(1 <= self.top_k <= self.n_experts, f"top_k must satisfy 1 <= top_k <= n_experts ({self.n_experts}); got {self.top_k}")
            need(self.router in ROUTERS, f"router must be one of {ROUTERS}; got {self.router!r}")
            need(0 <= self.first_dense_layers <= self.n_layers, f"first_dense_layers must be in [0, n_layers]; got {self.first_dense_layers}")
        need(self.n_experts >= 0, f"n_experts must be >= 0; got {self.n_experts}")
        need(self.swiglu_limit > 0, f"swiglu_limit must be > 0; got {self.swiglu_limit}")

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
        return swiglu_hidden(self.d_model) if self.ffn in GATED_FFNS else 4 * self.d_model

    def is_global(self, layer: int) -> bool:
        if self.layer_pattern is not None:
            return self.layer_pattern[layer] is None
        if self.window is None:
            return True
        return self.global_every is not None and (layer + 1) % self.global_every == 0

    def layer_windows(self) -> list[int | None]:
        """Window of each layer (None = global); e.g. gemma3-like: [w, w, w, w, w, None]. ``layer_pattern``
        is this list given directly; ``window`` with ``global_every`` builds it."""
        if self.layer_pattern is not None:
            return list(self.layer_pattern)
        return [None if self.is_global(i) else self.window for i in range(self.n_layers)]

    def is_moe(self, layer: int) -> bool:
        if self.moe_layers is not None:
            return self.n_experts > 0 and bool(self.moe_layers[layer])
        return self.n_experts > 0 and layer >= self.first_dense_layers


PRESETS: dict[str, dict] = {
    "llama-like": dict(n_kv_heads=2),
    "mistral-like": dict(n_kv_heads=2, window=16),
    "llama3-like": dict(
        n_kv_heads=2, rope_base=500_000.0, rope_scaling="llama3", rope_factor=8.0, rope_original_max_len=64,
        rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
    ),
    "qwen3-like": dict(n_kv_heads=2, head_dim=32, qk_norm=True, rope_base=1_000_000.0, tie_embeddings=True),
    "gemma3-like": dict(
        n_layers=6, n_kv_heads=1, window=8, global_every=6, rope_base=10000.0, rope_base_global=1_000_000.0,
        tie_embeddings=True, scale_embeddings=True, ffn="geglu", qk_norm=True, norm_placement="sandwich",
        norm_offset=True,
    ),
    "gemma2-like": dict(
        n_layers=4, n_kv_heads=2, window=8, global_every=2, tie_embeddings=True, scale_embeddings=True,
        ffn="geglu", norm_placement="sandwich", norm_offset=True, attn_softcap=50.0, final_softcap=30.0,
    ),
    "gpt-oss-like": dict(
        n_layers=4, n_kv_heads=2, window=128, global_every=2, sinks=True, attn_bias=True, n_experts=4, top_k=2,
        moe_d_ff=64, router_bias=True, moe_expert="clamped_swiglu", rope_base=150_000.0, rope_scaling="yarn_hf",
        rope_factor=4.0, rope_original_max_len=64, rope_truncate=False, norm_eps=1e-5,
    ),
    "mixtral-like": dict(n_kv_heads=2, n_experts=8, top_k=2, moe_d_ff=64),
    "deepseek-like": dict(
        n_layers=3, attention="mla", kv_rank=32, q_rank=48, mla_head_dim=16, rope_dim=8, n_experts=8, top_k=2,
        n_shared_experts=1, moe_d_ff=32, first_dense_layers=1, router="sigmoid", bias_balancing=True,
        expert_groups=4, topk_groups=2, routed_scaling_factor=2.5,
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
        self._ropes: dict[tuple, RotaryEmbedding] = {}  # one RoPE module per distinct setting (see _rope)
        self.layers = nn.ModuleList(self._block(i) for i in range(c.n_layers))
        del self._ropes
        pre = c.norm_placement in ("pre", "sandwich")  # the stream itself is never normalised: one final norm
        self.final_norm = make_norm(c.norm, c.d_model, c.norm_eps, offset=c.norm_offset) if pre else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(init_normal)
        if c.tie_embeddings:  # one matrix for reading tokens in and scoring them out (Press and Wolf 2017)
            self.lm_head.weight = self.embed.weight

    def _rope(self, layer: int) -> RotaryEmbedding:
        """Each layer kind has its own RoPE: the base of global layers may differ (Gemma 3: 1M against
        10k), and ``rope_scaling_layers="global"`` scales the global layers' RoPE only. Layers with the
        same setting share one module (it holds no parameters, only the frequencies), so a forward
        looks their cos / sin up once (``RotaryEmbedding.lookup``), not once per layer."""
        c = self.config
        glob = c.is_global(layer)
        base = c.rope_base_global if (c.rope_base_global is not None and glob) else c.rope_base
        dim = c.rope_dim if c.attention == "mla" else c.attn_head_dim
        scaling = c.rope_scaling if (c.rope_scaling_layers == "all" or glob) else None
        options = {}
        if scaling in ("yarn", "yarn_hf"):
            options = dict(beta_fast=c.rope_beta_fast, beta_slow=c.rope_beta_slow)
        if scaling == "yarn_hf":
            options.update(truncate=c.rope_truncate, attention_factor=c.rope_attention_factor, mscale=c.rope_mscale,
                           mscale_all_dim=c.rope_mscale_all_dim)
        if scaling == "llama3":
            options = dict(low_freq_factor=c.rope_low_freq_factor, high_freq_factor=c.rope_high_freq_factor)
        key = (dim, base, scaling, tuple(sorted(options.items())))
        if key not in self._ropes:
            self._ropes[key] = RotaryEmbedding(dim, base, scaling, c.rope_factor, c.rope_original_max_len, **options)
        return self._ropes[key]

    def _mla_scale(self) -> float | None:
        """DeepSeek's scaled RoPE sharpens MLA's softmax: 1 / sqrt(d_h + d_R) times (0.1 mscale_all_dim ln s + 1)^2,
        for every scaling that carries mscale_all_dim (as DeepSeek-V3's code does for every rope type but the default)."""
        c = self.config
        if c.rope_scaling is None or not c.rope_mscale_all_dim or c.rope_factor <= 1:
            return None
        m = yarn_temperature(c.rope_factor, c.rope_mscale_all_dim)
        return (c.mla_head_dim + c.rope_dim) ** -0.5 * m * m

    def _block(self, i: int) -> Block:
        c = self.config
        if c.attention == "mla":
            attn = MultiHeadLatentAttention(
                c.d_model, c.n_heads, kv_rank=c.kv_rank, q_rank=c.q_rank, head_dim=c.mla_head_dim,
                rope_dim=c.rope_dim, v_head_dim=c.v_head_dim, rope=self._rope(i), absorbed=c.mla_absorbed,
                backend=c.backend, norm_eps=c.mla_norm_eps, scale=self._mla_scale(),
            )
        else:
            window = c.layer_windows()[i]
            variant = AttentionVariant(
                window=window, keep=c.keep if window is not None else 0, sinks=c.sinks, alibi=c.position == "alibi",
                qk_norm=c.qk_norm, qk_norm_eps=c.norm_eps, qk_norm_offset=c.norm_offset,
                scale=c.query_pre_attn_scalar ** -0.5 if c.query_pre_attn_scalar else None, softcap=c.attn_softcap,
            )
            attn = MultiHeadAttention(
                c.d_model, c.n_heads, c.kv_heads, c.head_dim, bias=c.attn_bias, out_bias=c.attn_out_bias,
                rope=self._rope(i) if c.position == "rope" else None, backend=c.backend, dropout=c.dropout,
                variant=variant,
            )
        if c.is_moe(i):
            ffn = MoE(
                c.d_model, c.moe_d_ff or c.ffn_hidden, c.n_experts, c.top_k, n_shared=c.n_shared_experts,
                router=c.router, bias_balancing=c.bias_balancing, aux_loss_coef=c.aux_loss_coef,
                n_groups=c.expert_groups, topk_groups=c.topk_groups, norm_topk_prob=c.norm_topk_prob,
                routed_scaling_factor=c.routed_scaling_factor, router_bias=c.router_bias, expert=c.moe_expert,
            )
            if c.moe_expert == "clamped_swiglu":
                for expert in ffn.experts:
                    expert.alpha, expert.limit = c.swiglu_alpha, c.swiglu_limit
        else:
            ffn = make_ffn(c.ffn, c.d_model, c.ffn_hidden, bias=c.ffn_bias, dropout=c.dropout)
        return Block(
            c.d_model, attn, ffn, norm=c.norm, placement=c.norm_placement, norm_eps=c.norm_eps, dropout=c.dropout,
            norm_offset=c.norm_offset,
        )

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
        if idx.shape[1] == 0:
            raise ValueError(f"idx must hold at least one token per sequence (T >= 1); got shape {tuple(idx.shape)}")
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        # one host read of the ids on a CPU, a device-side assert on a GPU (no sync); the layers read
        # no values on a GPU (``RotaryEmbedding.lookup``)
        check_inputs(idx, positions, start, c.vocab_size, c.max_seq_len, "max_seq_len")
        if positions is None:
            positions = torch.arange(start, start + T, device=idx.device)
        x = self.embed(idx)
        if c.scale_embeddings:
            x = x * embed_scale(c.d_model)
        if self.positions is not None:
            x = x + self.positions(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, cache.layer(i) if cache is not None else None, mask=mask)
        logits = self.lm_head(self.final_norm(x))
        if c.final_softcap is not None:  # Gemma 2: a smooth clamp of the logits to (-c, c)
            logits = c.final_softcap * torch.tanh(logits / c.final_softcap)
        return logits

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
            + f", attention={attn}{', sinks' if c.sinks else ''}{', biases' if c.attn_bias else ''}"
            + f"{', QK-norm' if c.qk_norm else ''}{', soft-cap ' + format(c.attn_softcap, 'g') if c.attn_softcap else ''}"
            + f", tied={c.tie_embeddings}",
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
