"""Weights to and from Hugging Face ``transformers`` (optional extra: ``pip install companion[hf]``).

    hf_model = to_hf(model)        # GPT -> GPT2LMHeadModel; Decoder -> Llama / Mistral / Mixtral / DeepseekV3
    model = from_hf(hf_model)      # and back; the companion config is rebuilt field by field

Which transformers class a ``Decoder`` becomes (``to_hf(model, arch=...)`` overrides the choice):
- ``attention="mla"``                     -> DeepseekV3ForCausalLM (MLA, optional MoE with shared experts)
- ``n_experts > 0``                       -> MixtralForCausalLM (its ``sliding_window`` = our ``window``)
- a sliding window on every layer          -> MistralForCausalLM
- otherwise                                -> LlamaForCausalLM

Every config field is mapped explicitly (``_decoder_to_hf_config`` and friends). A companion feature
with no counterpart in the target class (post-norm, ALiBi, sinks, interleaved local/global layers,
YaRN/NTK RoPE, dropout on the residual stream, a GPT-1 model, ...) raises a ``ValueError`` that
names the field and the rule, and so does an HF config using something the companion does not
model (e.g. ``routed_scaling_factor != 1``). Nothing is dropped silently: every tensor of the source
model must be consumed by the mapping, and every parameter of the target must be written.

Layout differences the mapping takes care of
- GPT-2 stores its linear maps as ``Conv1D`` with weight (in, out): the transpose of ``nn.Linear``.
- Our attention projects q, k and v with one fused matrix (rows [q heads | k heads | v heads]);
  Llama-family checkpoints keep three matrices. Split / concatenate along the output rows.
- Mixtral (transformers 5) keeps all experts of a layer in two 3-D tensors,
  ``gate_up_proj`` (E, 2 d_ff, d) with the gate rows first, and ``down_proj`` (E, d, d_ff).
- DeepSeek-V3: ``kv_b_proj`` holds U_K and U_V interleaved per head ([k_nope_h | v_h] for each h);
  we keep ``k_up`` and ``v_up`` apart. Its RoPE channels are stored interleaved (pairs (2i, 2i+1),
  ``rope_interleave=True``) while ``companion.positions`` rotates pairs (i, i + d_R/2): the rows of the
  RoPE outputs (of ``q_b_proj`` / ``q_proj`` and ``kv_a_proj_with_mqa``) are permuted accordingly.
  Its shared experts are one SwiGLU of width n_shared * d_ff; ours are n_shared SwiGLUs of width
  d_ff, whose sum is exactly that wider SwiGLU with the hidden units concatenated.

Sliding windows: ``window=w`` here means a query at position i reads keys j with i - j < w, i.e. w
keys counting itself. transformers 5 builds its causal sliding mask with ``kv_idx > q_idx - w``: the
same w keys, so ``sliding_window = window`` with no offset, in its eager and sdpa paths alike. (4.x
releases did not all agree on this across attention kernels: in some, the flash-attention path was
given a window admitting w + 1 keys; the ``hf`` extra requires transformers 5, whose tensor layouts
this module also relies on.) tests/test_hf.py pins the convention: equal logits for
``sliding_window=w`` on sequences longer than w, different logits for ``sliding_window=w + 1``.

transformers is imported inside the functions only, so ``import companion`` never needs it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from companion.models.decoder import Decoder, DecoderConfig
from companion.models.gpt import GPT, GPTConfig

__all__ = ["to_hf", "from_hf", "hf_config", "DECODER_ARCHS"]

DECODER_ARCHS = ("llama", "mistral", "mixtral", "deepseek_v3")

_HF_CLASSES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
}


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("companion.hf needs transformers: pip install 'companion[hf]'") from e
    return transformers


def _hf_class(arch: str, which: int):
    tf = _transformers()
    name = _HF_CLASSES[arch][which]
    if not hasattr(tf, name):
        raise ValueError(f"the installed transformers {tf.__version__} has no {name}; arch={arch!r} is unavailable")
    return getattr(tf, name)


def _require(problems: list[str]) -> None:
    if problems:
        raise ValueError("no Hugging Face equivalent for: " + "; ".join(problems))


def _special_ids(vocab_size: int, bos: int | None, eos: int | None) -> dict:
    """HF configs carry bos/eos ids; keep the usual ones when they fit the (toy) vocabulary."""
    return dict(
        bos_token_id=bos if bos is not None and bos < vocab_size else None,
        eos_token_id=eos if eos is not None and eos < vocab_size else None,
    )


# ---------------------------------------------------------------------------------- configs


def _gpt_to_hf_config(c: GPTConfig):
    _require(
        [f"variant={c.variant!r}: GPT2LMHeadModel is the pre-LN GPT-2 (variant='gpt2'); GPT-1 is post-LN with exact GELU"]
        if c.variant != "gpt2" else []
    )
    last = c.vocab_size - 1  # GPT-2's <|endoftext|> is the last id of its vocabulary
    return _hf_class("gpt2", 0)(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        n_inner=4 * c.n_embd, activation_function="gelu_new", resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.dropout, layer_norm_epsilon=c.layer_norm_eps, scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False, add_cross_attention=False,
        tie_word_embeddings=True, bos_token_id=last, eos_token_id=last,
    )


def _gpt_from_hf_config(h, backend: str) -> GPTConfig:
    problems = []
    if h.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        problems.append(f"activation_function={h.activation_function!r} (GPT-2 uses the tanh GELU, 'gelu_new')")
    if h.n_inner not in (None, 4 * h.n_embd):
        problems.append(f"n_inner={h.n_inner} (the companion GPT's MLP is 4 * n_embd = {4 * h.n_embd} wide)")
    if not h.scale_attn_weights or h.scale_attn_by_inverse_layer_idx:
        problems.append("scale_attn_weights must be True and scale_attn_by_inverse_layer_idx False (scores / sqrt(d_h))")
    if getattr(h, "add_cross_attention", False):
        problems.append("add_cross_attention=True (the companion GPT is decoder-only)")
    if not h.tie_word_embeddings:
        problems.append("tie_word_embeddings=False (the companion GPT always ties lm_head to wte)")
    drops = {h.resid_pdrop, h.embd_pdrop, h.attn_pdrop}
    if len(drops) != 1:
        problems.append(f"resid_pdrop, embd_pdrop, attn_pdrop = {h.resid_pdrop}, {h.embd_pdrop}, {h.attn_pdrop} (one dropout rate here)")
    _require(problems)
    return GPTConfig(
        vocab_size=h.vocab_size, block_size=h.n_positions, n_layer=h.n_layer, n_head=h.n_head, n_embd=h.n_embd,
        variant="gpt2", dropout=float(h.resid_pdrop), layer_norm_eps=h.layer_norm_epsilon, backend=backend,
        name="from-hf",
    )


def _decoder_arch(c: DecoderConfig) -> str:
    if c.attention == "mla":
        return "deepseek_v3"
    if c.n_experts:
        return "mixtral"
    return "mistral" if c.window is not None else "llama"


def _rope_base(c: DecoderConfig, problems: list[str]) -> float:
    bases = {c.rope_base_global if (c.rope_base_global is not None and c.is_global(i)) else c.rope_base for i in range(c.n_layers)}
    if len(bases) > 1:
        problems.append(f"rope_base_global={c.rope_base_global} differs from rope_base={c.rope_base} on some layers (one RoPE base per model)")
    return bases.pop()


def _rope_parameters(c: DecoderConfig, theta: float, problems: list[str]) -> dict:
    if c.rope_scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    if c.rope_scaling == "pi":
        return {"rope_type": "linear", "factor": float(c.rope_factor), "rope_theta": theta}
    problems.append(
        f"rope_scaling={c.rope_scaling!r} (mapped: None and 'pi' -> 'linear'; HF's 'dynamic' and 'yarn' compute other frequencies)"
    )
    return {"rope_type": "default", "rope_theta": theta}


def _common_decoder_checks(c: DecoderConfig, arch: str) -> list[str]:
    p = []
    if c.norm != "rms":
        p.append(f"norm={c.norm!r} (the {arch} class uses RMSNorm: norm='rms')")
    if c.norm_placement != "pre":
        p.append(f"norm_placement={c.norm_placement!r} (pre-norm only)")
    if c.position != "rope":
        p.append(f"position={c.position!r} (RoPE only)")
    if c.ffn != "swiglu":
        p.append(f"ffn={c.ffn!r} (SwiGLU only)")
    if c.sinks:
        p.append("sinks=True (no attention sinks in the Llama/Mistral/Mixtral/DeepSeek-V3 classes)")
    if c.keep:
        p.append(f"keep={c.keep} (no StreamingLLM kept tokens)")
    if c.scale_embeddings:
        p.append("scale_embeddings=True (no sqrt(d) embedding scale)")
    if c.dropout:
        p.append(f"dropout={c.dropout} (HF applies dropout to attention weights only; ours also to the residual stream: set dropout=0)")
    return p


def _decoder_to_hf_config(c: DecoderConfig, arch: str):
    if arch not in DECODER_ARCHS:
        raise ValueError(f"arch must be one of {DECODER_ARCHS}; got {arch!r}")
    p = _common_decoder_checks(c, arch)
    theta = _rope_base(c, p)
    rope = _rope_parameters(c, theta, p)
    common = dict(
        vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        hidden_act="silu", max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
        tie_word_embeddings=c.tie_embeddings, rope_parameters=rope, attention_dropout=0.0,
    )
    if arch == "deepseek_v3":
        return _deepseek_to_hf_config(c, p, common)
    if c.attention != "mha":
        p.append(f"attention={c.attention!r} with arch={arch!r} (MLA maps to 'deepseek_v3')")
    windows = set(c.layer_windows())
    if len(windows) > 1:
        p.append(f"window={c.window} with global_every={c.global_every}: interleaved local/global layers (one window for all layers)")
    window = next(iter(windows))
    if arch == "llama" and window is not None:
        p.append(f"window={c.window} with arch='llama' (Llama has no sliding window; use 'mistral' or 'mixtral')")
    if arch != "llama":
        for f in ("attn_bias", "ffn_bias"):
            if getattr(c, f):
                p.append(f"{f}=True with arch={arch!r} (only LlamaConfig has attention_bias / mlp_bias)")
    if arch == "mixtral":
        if not c.n_experts:
            p.append("n_experts=0 with arch='mixtral' (every Mixtral layer is a mixture of experts)")
        else:
            if c.first_dense_layers:
                p.append(f"first_dense_layers={c.first_dense_layers} (every Mixtral layer is MoE)")
            if c.n_shared_experts:
                p.append(f"n_shared_experts={c.n_shared_experts} (Mixtral has no shared experts)")
            if c.router != "softmax":
                p.append(f"router={c.router!r} (Mixtral routes with a softmax)")
            if c.bias_balancing:
                p.append("bias_balancing=True (Mixtral has no routing bias)")
    elif c.n_experts:
        p.append(f"n_experts={c.n_experts} with arch={arch!r} (MoE maps to 'mixtral' or 'deepseek_v3')")
    _require(p)
    heads = dict(num_key_value_heads=c.kv_heads, head_dim=c.attn_head_dim)
    if arch == "llama":
        extra = dict(intermediate_size=c.ffn_hidden, attention_bias=c.attn_bias, mlp_bias=c.ffn_bias, **_special_ids(c.vocab_size, 1, 2))
    elif arch == "mistral":
        extra = dict(intermediate_size=c.ffn_hidden, sliding_window=window, **_special_ids(c.vocab_size, 1, 2))
    else:
        extra = dict(
            intermediate_size=c.moe_d_ff or c.ffn_hidden, sliding_window=window, num_local_experts=c.n_experts,
            num_experts_per_tok=c.top_k, router_aux_loss_coef=c.aux_loss_coef, router_jitter_noise=0.0,
            output_router_logits=False, **_special_ids(c.vocab_size, 1, 2),
        )
    return _hf_class(arch, 0)(**common, **heads, **extra)


def _deepseek_to_hf_config(c: DecoderConfig, p: list[str], common: dict):
    if c.attention != "mla":
        p.append(f"attention={c.attention!r} with arch='deepseek_v3' (DeepSeek-V3 uses MLA: attention='mla')")
    if c.attn_bias:
        p.append("attn_bias=True with arch='deepseek_v3' (MLA here has no biases)")
    if c.ffn_bias:
        p.append("ffn_bias=True with arch='deepseek_v3'")
    if c.rope_scaling is not None:
        p.append(f"rope_scaling={c.rope_scaling!r} with arch='deepseek_v3' (its scaled RoPE also rescales the softmax; not mapped)")
    moe = c.n_experts > 0 and c.first_dense_layers < c.n_layers
    if moe:
        if c.router != "sigmoid":
            p.append(f"router={c.router!r} (DeepSeek-V3 routes with sigmoid scores: router='sigmoid')")
        if c.n_shared_experts < 1:
            p.append("n_shared_experts=0 (DeepSeek-V3 always has shared experts)")
    _require(p)
    d_moe = c.moe_d_ff or c.ffn_hidden
    return _hf_class("deepseek_v3", 0)(
        **common, intermediate_size=c.ffn_hidden, moe_intermediate_size=d_moe, num_key_value_heads=c.n_heads,
        n_shared_experts=c.n_shared_experts if moe else 1, n_routed_experts=c.n_experts if moe else 1,
        num_experts_per_tok=c.top_k if moe else 1, first_k_dense_replace=c.first_dense_layers if moe else c.n_layers,
        routed_scaling_factor=1.0, n_group=1, topk_group=1, norm_topk_prob=True,
        kv_lora_rank=c.kv_rank, q_lora_rank=c.q_rank, qk_rope_head_dim=c.rope_dim, qk_nope_head_dim=c.mla_head_dim,
        v_head_dim=c.v_head_dim or c.mla_head_dim, rope_interleave=True, attention_bias=False,
        **_special_ids(c.vocab_size, 0, 1),
    )


def _hf_rope(h, problems: list[str]) -> dict:
    rp = dict(getattr(h, "rope_parameters", None) or {})
    kind = rp.get("rope_type", "default")
    out = dict(rope_base=float(rp.get("rope_theta", 10000.0)))
    if kind == "linear":
        out.update(rope_scaling="pi", rope_factor=float(rp["factor"]))
    elif kind != "default":
        problems.append(f"rope_parameters rope_type={kind!r} (mapped: 'default', and 'linear' -> rope_scaling='pi')")
    return out


def _decoder_from_hf_config(h, arch: str, backend: str) -> DecoderConfig:
    p = []
    if h.hidden_act != "silu":
        p.append(f"hidden_act={h.hidden_act!r} (SwiGLU uses SiLU)")
    if getattr(h, "attention_dropout", 0.0):
        p.append(f"attention_dropout={h.attention_dropout} (the companion's dropout also acts on the residual stream)")
    rope = _hf_rope(h, p)
    common = dict(
        vocab_size=h.vocab_size, d_model=h.hidden_size, n_layers=h.num_hidden_layers, n_heads=h.num_attention_heads,
        max_seq_len=h.max_position_embeddings, norm="rms", norm_placement="pre", norm_eps=h.rms_norm_eps,
        position="rope", ffn="swiglu", tie_embeddings=bool(h.tie_word_embeddings), backend=backend, name=f"from-hf-{arch}",
        **rope,
    )
    if arch == "deepseek_v3":
        return _deepseek_from_hf_config(h, p, common)
    heads = dict(n_kv_heads=h.num_key_value_heads, head_dim=getattr(h, "head_dim", None) or h.hidden_size // h.num_attention_heads)
    if arch == "llama":
        _require(p)
        return DecoderConfig(**common, **heads, d_ff=h.intermediate_size, attn_bias=bool(h.attention_bias), ffn_bias=bool(h.mlp_bias))
    window = dict(window=h.sliding_window)
    if arch == "mistral":
        _require(p)
        return DecoderConfig(**common, **heads, **window, d_ff=h.intermediate_size)
    if h.router_jitter_noise:
        p.append(f"router_jitter_noise={h.router_jitter_noise} (the companion router adds no noise)")
    _require(p)
    return DecoderConfig(
        **common, **heads, **window, d_ff=h.intermediate_size, moe_d_ff=h.intermediate_size, n_experts=h.num_local_experts,
        top_k=h.num_experts_per_tok, router="softmax", aux_loss_coef=h.router_aux_loss_coef,
    )


def _deepseek_from_hf_config(h, p: list[str], common: dict) -> DecoderConfig:
    if h.attention_bias:
        p.append("attention_bias=True (MLA here has no biases)")
    if common.get("rope_scaling") is not None:
        p.append("scaled RoPE on DeepSeek-V3 (it also rescales the softmax; not mapped)")
    moe = h.first_k_dense_replace < h.num_hidden_layers
    if moe:
        if h.routed_scaling_factor != 1.0:
            p.append(f"routed_scaling_factor={h.routed_scaling_factor} (the companion's gates sum to 1, no extra scale)")
        if not h.norm_topk_prob:
            p.append("norm_topk_prob=False (the companion renormalises the top-k gates)")
        if h.n_group and h.topk_group != h.n_group:
            p.append(f"n_group={h.n_group}, topk_group={h.topk_group} (group-limited routing; need topk_group == n_group)")
    _require(p)
    return DecoderConfig(
        **common, attention="mla", kv_rank=h.kv_lora_rank, q_rank=h.q_lora_rank, mla_head_dim=h.qk_nope_head_dim,
        rope_dim=h.qk_rope_head_dim, v_head_dim=h.v_head_dim, d_ff=h.intermediate_size,
        n_experts=h.n_routed_experts if moe else 0, top_k=h.num_experts_per_tok if moe else 2,
        n_shared_experts=h.n_shared_experts if moe else 0, moe_d_ff=h.moe_intermediate_size,
        first_dense_layers=h.first_k_dense_replace if moe else 0, router="sigmoid", bias_balancing=moe,
    )


def hf_config(model: GPT | Decoder, arch: str | None = None):
    """The transformers config equivalent to ``model``'s config (raises ValueError if there is none)."""
    if isinstance(model, GPT):
        if arch not in (None, "gpt2"):
            raise ValueError(f"arch for a GPT must be 'gpt2' or None; got {arch!r}")
        return _gpt_to_hf_config(model.config)
    if isinstance(model, Decoder):
        return _decoder_to_hf_config(model.config, arch or _decoder_arch(model.config))
    raise ValueError(f"model must be a companion GPT or Decoder; got {type(model).__name__}")


# ---------------------------------------------------------------------------------- tensor links
# A link ties some of our tensors to some of theirs: (ours, theirs, ours -> theirs, theirs -> ours).
Fn = Callable[[Sequence[Tensor]], list[Tensor]]
Link = tuple[tuple[str, ...], tuple[str, ...], Fn, Fn]


def _same(ours: str, theirs: str) -> Link:
    return (ours,), (theirs,), lambda t: [t[0]], lambda t: [t[0]]


def _transposed(ours: str, theirs: str) -> Link:  # GPT-2 Conv1D (in, out) <-> nn.Linear (out, in)
    return (ours,), (theirs,), lambda t: [t[0].t()], lambda t: [t[0].t()]


def _rows(ours: str, theirs: Sequence[str], sizes: Sequence[int]) -> Link:
    """One of our tensors = their tensors stacked along dim 0 (fused qkv <-> q_proj, k_proj, v_proj)."""
    return (ours,), tuple(theirs), lambda t: list(t[0].split(list(sizes), dim=0)), lambda t: [torch.cat(list(t), dim=0)]


def _gpt_links(c: GPTConfig) -> list[Link]:
    links = [_same("wte.weight", "transformer.wte.weight"), _same("wpe.weight", "transformer.wpe.weight")]
    for i in range(c.n_layer):
        o, t = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, theirs in (("attn_norm", "ln_1"), ("ffn_norm", "ln_2")):
            links += [_same(o + ours + ".weight", t + theirs + ".weight"), _same(o + ours + ".bias", t + theirs + ".bias")]
        for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.out", "attn.c_proj"), ("ffn.up", "mlp.c_fc"), ("ffn.down", "mlp.c_proj")):
            links += [_transposed(o + ours + ".weight", t + theirs + ".weight"), _same(o + ours + ".bias", t + theirs + ".bias")]
    links += [_same("ln_f.weight", "transformer.ln_f.weight"), _same("ln_f.bias", "transformer.ln_f.bias")]
    return links + [_same("lm_head.weight", "lm_head.weight")]


def _experts_link(o: str, t: str, n: int) -> list[Link]:
    """Our experts e = 0..n-1 (gate, up, down SwiGLUs) <-> the fused (E, 2 d_ff, d) and (E, d, d_ff) tensors."""
    gate_up = tuple(f"{o}experts.{e}.{w}.weight" for e in range(n) for w in ("gate", "up"))
    down = tuple(f"{o}experts.{e}.down.weight" for e in range(n))

    def fuse(ts):
        return [torch.stack([torch.cat((ts[2 * e], ts[2 * e + 1]), dim=0) for e in range(n)])]

    def unfuse(ts):
        return [part for e in range(n) for part in ts[0][e].chunk(2, dim=0)]

    return [
        (gate_up, (t + "experts.gate_up_proj",), fuse, unfuse),
        (down, (t + "experts.down_proj",), lambda ts: [torch.stack(list(ts))], lambda ts: list(ts[0].unbind(0))),
    ]


def _llama_links(c: DecoderConfig, arch: str) -> list[Link]:
    h, g, dh = c.n_heads, c.kv_heads, c.attn_head_dim
    links = [_same("embed.weight", "model.embed_tokens.weight")]
    for i in range(c.n_layers):
        o, t = f"layers.{i}.", f"model.layers.{i}."
        links += [_same(o + "attn_norm.weight", t + "input_layernorm.weight"), _same(o + "ffn_norm.weight", t + "post_attention_layernorm.weight")]
        qkv = [t + f"self_attn.{x}_proj" for x in "qkv"]
        params = ("weight", "bias") if c.attn_bias else ("weight",)
        for p in params:
            links += [_rows(o + f"attn.qkv.{p}", [n + f".{p}" for n in qkv], (h * dh, g * dh, g * dh)), _same(o + f"attn.out.{p}", t + f"self_attn.o_proj.{p}")]
        if arch == "mixtral":
            links.append(_same(o + "ffn.router.weight", t + "mlp.gate.weight"))
            links += _experts_link(o + "ffn.", t + "mlp.", c.n_experts)
        else:
            for p in ("weight", "bias") if c.ffn_bias else ("weight",):
                links += [_same(o + f"ffn.{w}.{p}", t + f"mlp.{w}_proj.{p}") for w in ("gate", "up", "down")]
    return links + [_same("final_norm.weight", "model.norm.weight"), _same("lm_head.weight", "lm_head.weight")]


def _deinterleave(n: int) -> Tensor:
    """Index map taking DeepSeek's interleaved RoPE channels (pairs 2i, 2i+1) to our halves (i, i + n/2)."""
    return torch.cat((torch.arange(0, n, 2), torch.arange(1, n, 2)))


def _deepseek_links(c: DecoderConfig, interleaved: bool) -> list[Link]:
    h, dn, dr, dc = c.n_heads, c.mla_head_dim, c.rope_dim, c.kv_rank
    dv = c.v_head_dim or dn
    perm = _deinterleave(dr) if interleaved else torch.arange(dr)
    inv = torch.argsort(perm)

    def q_to_theirs(ts):  # per head [nope | rope]: permute the rope rows into their channel order
        w = ts[0].view(h, dn + dr, -1)
        return [torch.cat((w[:, :dn], w[:, dn:][:, inv]), dim=1).reshape(h * (dn + dr), -1)]

    def q_to_ours(ts):
        w = ts[0].view(h, dn + dr, -1)
        return [torch.cat((w[:, :dn], w[:, dn:][:, perm]), dim=1).reshape(h * (dn + dr), -1)]

    def kv_a_to_theirs(ts):  # [latent c | rope key]
        return [torch.cat((ts[0][:dc], ts[0][dc:][inv]), dim=0)]

    def kv_a_to_ours(ts):
        return [torch.cat((ts[0][:dc], ts[0][dc:][perm]), dim=0)]

    def kv_b_to_theirs(ts):  # k_up (h dn, dc), v_up (h dv, dc) -> (h (dn + dv), dc), per head [k | v]
        return [torch.cat((ts[0].view(h, dn, dc), ts[1].view(h, dv, dc)), dim=1).reshape(h * (dn + dv), dc)]

    def kv_b_to_ours(ts):
        k, v = ts[0].view(h, dn + dv, dc).split([dn, dv], dim=1)
        return [k.reshape(h * dn, dc), v.reshape(h * dv, dc)]

    links = [_same("embed.weight", "model.embed_tokens.weight")]
    for i in range(c.n_layers):
        o, t = f"layers.{i}.", f"model.layers.{i}."
        a, ta = o + "attn.", t + "self_attn."
        links += [_same(o + "attn_norm.weight", t + "input_layernorm.weight"), _same(o + "ffn_norm.weight", t + "post_attention_layernorm.weight")]
        if c.q_rank is None:
            links.append(((a + "q_proj.weight",), (ta + "q_proj.weight",), q_to_theirs, q_to_ours))
        else:
            links += [_same(a + "q_down.weight", ta + "q_a_proj.weight"), _same(a + "q_norm.weight", ta + "q_a_layernorm.weight")]
            links.append(((a + "q_up.weight",), (ta + "q_b_proj.weight",), q_to_theirs, q_to_ours))
        links += [
            ((a + "kv_down.weight",), (ta + "kv_a_proj_with_mqa.weight",), kv_a_to_theirs, kv_a_to_ours),
            _same(a + "kv_norm.weight", ta + "kv_a_layernorm.weight"),
            ((a + "k_up.weight", a + "v_up.weight"), (ta + "kv_b_proj.weight",), kv_b_to_theirs, kv_b_to_ours),
            _same(a + "out.weight", ta + "o_proj.weight"),
        ]
        if c.is_moe(i):
            f, tm = o + "ffn.", t + "mlp."
            links += [_same(f + "router.weight", tm + "gate.weight"), _same(f + "balance_bias", tm + "gate.e_score_correction_bias")]
            links += _experts_link(f, tm, c.n_experts)
            n = c.n_shared_experts
            for w, dim in (("gate", 0), ("up", 0), ("down", 1)):  # n shared SwiGLUs == one of n times the width
                ours = tuple(f"{f}shared.{s}.{w}.weight" for s in range(n))
                links.append((ours, (f"{tm}shared_experts.{w}_proj.weight",),
                              lambda ts, dim=dim: [torch.cat(list(ts), dim=dim)],
                              lambda ts, dim=dim, n=n: list(ts[0].chunk(n, dim=dim))))
        else:
            links += [_same(o + f"ffn.{w}.weight", t + f"mlp.{w}_proj.weight") for w in ("gate", "up", "down")]
    return links + [_same("final_norm.weight", "model.norm.weight"), _same("lm_head.weight", "lm_head.weight")]


# Tensors that are state, not weights: the MoE load report of the last forward, and our routing bias
# when the target has none (Mixtral; the bias is unused unless bias_balancing=True, which then raises).
_OURS_NOT_WEIGHTS = ("ffn.last_load", "ffn.balance_bias")


def _transfer(src: nn.Module, dst: nn.Module, links: list[Link], forward: bool) -> None:
    """Copy every linked tensor from src to dst; check that nothing in src is left unread and nothing in
    dst unwritten (apart from our non-weight state), and that every shape matches."""
    s_sd, d_sd = src.state_dict(), dst.state_dict()
    new, read = {}, set()
    for ours, theirs, to_theirs, to_ours in links:
        src_keys, dst_keys, fn = (ours, theirs, to_theirs) if forward else (theirs, ours, to_ours)
        missing = [k for k in src_keys if k not in s_sd]
        if missing:
            raise ValueError(f"the source model has no tensor(s) {missing}: its layout does not match its config")
        outs = fn([s_sd[k] for k in src_keys])
        for k, v in zip(dst_keys, outs, strict=True):
            if k not in d_sd or d_sd[k].shape != v.shape:
                raise ValueError(f"tensor {k}: expected {tuple(d_sd[k].shape) if k in d_sd else 'absent'}, converted {tuple(v.shape)}")
            new[k] = v.detach().clone().to(d_sd[k].dtype)
        read.update(src_keys)

    def is_state(k: str) -> bool:
        return k.endswith(_OURS_NOT_WEIGHTS)

    unread = [k for k in s_sd if k not in read and not (forward and is_state(k))]
    unwritten = [k for k in d_sd if k not in new and not (not forward and is_state(k))]
    if unread or unwritten:
        raise ValueError(f"weights not mapped: unread in source {unread}, unwritten in target {unwritten}")
    d_sd.update(new)
    dst.load_state_dict(d_sd, strict=True)


# ---------------------------------------------------------------------------------- entry points


def to_hf(model: GPT | Decoder, arch: str | None = None, attn_implementation: str = "eager"):
    """A transformers model (eval mode, float32, on the CPU) computing the same function as ``model``.

    GPT -> GPT2LMHeadModel. Decoder -> the class named by ``arch`` (one of ``DECODER_ARCHS``), chosen
    from the config when None (see module docstring). Raises ValueError for a config the target
    class cannot express, naming the field(s).
    """
    config = hf_config(model, arch)
    config._attn_implementation = attn_implementation
    if isinstance(model, GPT):
        arch, links = "gpt2", _gpt_links(model.config)
    else:
        arch = arch or _decoder_arch(model.config)
        links = _deepseek_links(model.config, interleaved=True) if arch == "deepseek_v3" else _llama_links(model.config, arch)
    hf_model = _hf_class(arch, 1)(config)
    was_training = model.training
    with torch.no_grad():
        _transfer(model.eval(), hf_model, links, forward=True)
    model.train(was_training)
    return hf_model.eval()


def from_hf(hf_model, backend: str = "auto") -> GPT | Decoder:
    """The companion model (eval mode) equivalent to a transformers GPT2LMHeadModel, LlamaForCausalLM,
    MistralForCausalLM, MixtralForCausalLM or DeepseekV3ForCausalLM. Raises ValueError for any other
    class, or for an HF config feature the companion does not model, naming the field(s)."""
    h = getattr(hf_model, "config", None)
    kind = getattr(h, "model_type", None)
    if kind is None:
        raise ValueError(f"hf_model must be a transformers model with a config; got {type(hf_model).__name__}")
    arch = {"gpt2": "gpt2", "llama": "llama", "mistral": "mistral", "mixtral": "mixtral", "deepseek_v3": "deepseek_v3"}.get(kind)
    expected = _HF_CLASSES.get(arch, (None, None))[1]
    if arch is None or type(hf_model).__name__ != expected:
        supported = ", ".join(v[1] for v in _HF_CLASSES.values())
        raise ValueError(f"hf_model must be one of {supported}; got {type(hf_model).__name__} (model_type={kind!r})")
    if arch == "gpt2":
        model = GPT(_gpt_from_hf_config(h, backend))
        links = _gpt_links(model.config)
    else:
        model = Decoder(_decoder_from_hf_config(h, arch, backend))
        if arch == "deepseek_v3":
            links = _deepseek_links(model.config, interleaved=bool(getattr(h, "rope_interleave", True)))
        else:
            links = _llama_links(model.config, arch)
    with torch.no_grad():
        _transfer(hf_model, model, links, forward=False)
    return model.eval()
