"""Decoder config translation, field by field, for the Llama-named families (and the dispatch to
DeepSeek-V3): ``_decoder_to_hf_config`` and ``_decoder_from_hf_config``."""

from __future__ import annotations

from dataclasses import replace

from companion.hf.common import (
    _ATTENTION_BIASED, _FAMILY, _GEGLU_ACT, _GEMMA, _LAYER_TYPED, _LAYER_TYPES, _MOE_ARCHS, _QWEN3, DECODER_ARCHS, _hf_class, _require,
    _SILU_ACTS, _TANH_GELU_ACTS, _WINDOWED, _special_ids, _tied_from_tensors,
)
from companion.hf.deepseek import _deepseek_from_hf_config, _deepseek_to_hf_config
from companion.hf.gpt2 import _gpt_to_hf_config
from companion.hf.rope import _hf_rope, _rope_parameters
from companion.models.decoder import Decoder, DecoderConfig
from companion.models.gpt import GPT

def _decoder_arch(c: DecoderConfig) -> str:
    """The transformers family whose block is this config's block (see the module docstring)."""
    if c.attention == "mla":
        return "deepseek_v3"
    if c.sinks or c.moe_expert == "clamped_swiglu":
        return "gpt_oss"
    if c.norm_placement == "sandwich":
        return "gemma3_text" if c.qk_norm else "gemma2"
    if c.qk_norm:
        return "qwen3_moe" if c.n_experts else "qwen3"
    if c.n_experts:
        return "mixtral"
    if c.attn_bias and c.attn_out_bias is False:
        return "qwen2"
    return "mistral" if any(w is not None for w in c.layer_windows()) else "llama"


def _layer_types(c: DecoderConfig) -> list[str]:
    return ["sliding_attention" if w is not None else "full_attention" for w in c.layer_windows()]


def _common_decoder_checks(c: DecoderConfig, arch: str) -> list[str]:
    """Every feature whose presence or absence the target class fixes."""
    p, fam = [], _FAMILY[arch]
    gemma, oss = arch in _GEMMA, arch == "gpt_oss"
    if c.norm != "rms":
        p.append(f"norm={c.norm!r} (the {fam} class uses RMSNorm: norm='rms')")
    want = "sandwich" if gemma else "pre"
    if c.norm_placement != want:
        p.append(f"norm_placement={c.norm_placement!r} (the {fam} block is norm_placement={want!r})")
    if c.norm_offset != gemma:
        gain = "1 + w" if gemma else "w"
        p.append(f"norm_offset={c.norm_offset} ({fam}'s RMSNorm gain is {gain}: norm_offset={gemma})")
    if c.position != "rope":
        p.append(f"position={c.position!r} (RoPE only)")
    want_ffn = "geglu" if gemma else "swiglu"
    if c.ffn != want_ffn and any(not c.is_moe(i) for i in range(c.n_layers)):
        p.append(f"ffn={c.ffn!r} (the {fam} feed-forward is ffn={want_ffn!r})")
    if c.sinks != oss:
        p.append(f"sinks={c.sinks} (attention sinks exist in gpt-oss only)" if c.sinks
                 else "sinks=False (every gpt-oss layer has sinks)")
    if c.keep:
        p.append(f"keep={c.keep} (no StreamingLLM kept tokens)")
    if c.scale_embeddings != gemma:
        does = "multiplies" if gemma else "does not multiply"
        p.append(f"scale_embeddings={c.scale_embeddings} ({fam} {does} the embeddings by sqrt(d))")
    if c.dropout:
        p.append(f"dropout={c.dropout} (HF applies dropout to attention weights only; ours also to the residual "
                 "stream: set dropout=0)")
    if c.final_softcap is not None and not gemma:  # whatever the attention (MLA included)
        p.append(f"final_softcap={c.final_softcap} (soft-capping exists in Gemma 2 / 3 only)")
    if c.attention == "mha":
        want_qk = arch in _QWEN3 or arch == "gemma3_text"
        if c.qk_norm != want_qk:
            p.append(f"qk_norm={c.qk_norm} ({fam} {'always has' if want_qk else 'has no'} QK-norm)")
        if gemma and c.query_pre_attn_scalar is not None and c.query_pre_attn_scalar != int(c.query_pre_attn_scalar):
            p.append(f"query_pre_attn_scalar={c.query_pre_attn_scalar} (an integer in the {fam} config)")
        if not gemma:
            if c.query_pre_attn_scalar not in (None, c.attn_head_dim):
                p.append(f"query_pre_attn_scalar={c.query_pre_attn_scalar} "
                         f"(the {fam} class scales scores by 1/sqrt(head_dim))")
            if c.attn_softcap is not None:
                p.append(f"attn_softcap={c.attn_softcap} (soft-capping exists in Gemma 2 / 3 only)")
        elif arch == "gemma3_text" and c.attn_softcap is not None:
            p.append(f"attn_softcap={c.attn_softcap} (Gemma 3's attention reads attn_logit_softcapping but never "
                     "applies it; Gemma 2 soft-caps its scores)")
        out_bias = c.attn_bias if c.attn_out_bias is None else c.attn_out_bias
        if arch == "qwen2":
            if not (c.attn_bias and not out_bias):
                p.append(f"attn_bias={c.attn_bias}, attn_out_bias={c.attn_out_bias} "
                         "(Qwen2 has q, k, v biases and none on W_O)")
        elif arch in ("llama", "gpt_oss") + _QWEN3 + _GEMMA:
            if out_bias != c.attn_bias:
                p.append(f"attn_out_bias={c.attn_out_bias} with attn_bias={c.attn_bias} "
                         f"(the {fam} class has one attention_bias for q, k, v and W_O)")
        elif c.attn_bias or out_bias:
            p.append(f"attn_bias=True with arch={arch!r} (the {fam} class has no attention biases)")
    if c.ffn_bias and arch != "llama":
        p.append(f"ffn_bias=True with arch={arch!r} (only LlamaConfig has mlp_bias)")
    return p


def _plain_routing_checks(c: DecoderConfig, arch: str) -> list[str]:
    """The routing of a softmax-routed MoE class (Mixtral, Qwen3-MoE, gpt-oss)."""
    p, fam = [], _FAMILY[arch]
    if c.router != "softmax":
        p.append(f"router={c.router!r} ({fam} routes with a softmax)")
    if c.bias_balancing:
        p.append(f"bias_balancing=True ({fam} has no balancing bias)")
    if c.n_shared_experts:
        p.append(f"n_shared_experts={c.n_shared_experts} ({fam} has no shared experts)")
    if c.expert_groups != 1:
        p.append(f"expert_groups={c.expert_groups} ({fam} has no group-limited routing)")
    if not c.norm_topk_prob and arch != "qwen3_moe":
        p.append(f"norm_topk_prob=False ({fam} renormalises its top-k gates)")
    if c.routed_scaling_factor != 1.0:
        p.append(f"routed_scaling_factor={c.routed_scaling_factor} ({fam} does not scale its gates)")
    if c.router_bias != (arch == "gpt_oss"):
        p.append(f"router_bias={c.router_bias} ({fam} {'has' if arch == 'gpt_oss' else 'has no'} router bias)")
    want = "clamped_swiglu" if arch == "gpt_oss" else "swiglu"
    if c.moe_expert != want:
        p.append(f"moe_expert={c.moe_expert!r} ({fam}'s experts are {want!r})")
    dense = [i for i in range(c.n_layers) if not c.is_moe(i)]
    if dense and arch != "qwen3_moe":
        field = (f"moe_layers={c.moe_layers}" if c.moe_layers is not None
                 else f"first_dense_layers={c.first_dense_layers}")
        p.append(f"{field} (every {fam} layer is MoE)")
    return p


def _decoder_to_hf_config(c: DecoderConfig, arch: str):
    if arch not in DECODER_ARCHS:
        raise ValueError(f"arch must be one of {DECODER_ARCHS}; got {arch!r}")
    p = _common_decoder_checks(c, arch)
    rope = _rope_parameters(c, arch, p)
    common = dict(
        vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
        tie_word_embeddings=c.tie_embeddings, rope_parameters=rope, attention_dropout=0.0,
    )
    if arch == "deepseek_v3":
        return _deepseek_to_hf_config(c, p, dict(common, hidden_act="silu"))
    if c.attention != "mha":
        p.append(f"attention={c.attention!r} with arch={arch!r} (MLA maps to 'deepseek_v3')")
    windows = set(c.layer_windows())
    sizes = windows - {None}
    pattern = f"layer_pattern={c.layer_pattern}" if c.layer_pattern is not None else f"window={c.window}"
    if len(sizes) > 1:
        p.append(f"{pattern}: windows of {len(sizes)} sizes (transformers classes have one sliding_window)")
    if arch in _LAYER_TYPED:
        window = min(sizes) if sizes else None
        if window is None and arch in _GEMMA + ("gpt_oss",):
            # these classes build a sliding mask whatever the layer types say and raise without a window;
            # no layer reads it when every layer is full attention
            window = c.max_seq_len
    else:
        if len(windows) > 1 and None in windows:
            given = pattern if c.layer_pattern is not None else f"{pattern} with global_every={c.global_every}"
            p.append(f"{given}: interleaved local/global layers "
                     f"(the {_FAMILY[arch]} class has one window for all layers)")
        window = min(sizes) if sizes else None
        if arch == "llama" and window is not None:
            p.append(f"{pattern} with arch='llama' (Llama has no sliding window; use 'mistral' or 'mixtral')")
    if arch in _MOE_ARCHS:
        if not c.n_experts:
            p.append(f"n_experts=0 with arch={arch!r} (a {_FAMILY[arch]} model is a mixture of experts)")
        else:
            p += _plain_routing_checks(c, arch)
    elif c.n_experts:
        p.append(f"n_experts={c.n_experts} with arch={arch!r} "
                 "(MoE maps to 'mixtral', 'qwen3_moe', 'gpt_oss' or 'deepseek_v3')")
    _require(p)
    heads = dict(num_key_value_heads=c.kv_heads, head_dim=c.attn_head_dim)
    ids = _special_ids(c.vocab_size, 1, 2)
    if arch == "llama":
        extra = dict(hidden_act="silu", intermediate_size=c.ffn_hidden, attention_bias=c.attn_bias, mlp_bias=c.ffn_bias)
    elif arch == "mistral":
        extra = dict(hidden_act="silu", intermediate_size=c.ffn_hidden, sliding_window=window)
    elif arch == "mixtral":
        extra = dict(
            hidden_act="silu", intermediate_size=c.moe_d_ff or c.ffn_hidden, sliding_window=window,
            num_local_experts=c.n_experts, num_experts_per_tok=c.top_k, router_aux_loss_coef=c.aux_loss_coef,
            router_jitter_noise=0.0, output_router_logits=False,
        )
    else:
        extra = dict(sliding_window=window)
        if arch in _LAYER_TYPED:
            extra.update(layer_types=_layer_types(c))
        if arch in ("qwen2",) + _QWEN3:
            extra.update(hidden_act="silu", intermediate_size=c.ffn_hidden, use_sliding_window=window is not None)
            if arch in _QWEN3:
                extra.update(attention_bias=c.attn_bias)
            if arch == "qwen3_moe":
                extra.update(
                    moe_intermediate_size=c.moe_d_ff or c.ffn_hidden, num_experts=c.n_experts,
                    num_experts_per_tok=c.top_k,
                    norm_topk_prob=c.norm_topk_prob, decoder_sparse_step=1,
                    mlp_only_layers=[i for i in range(c.n_layers) if not c.is_moe(i)],
                    router_aux_loss_coef=c.aux_loss_coef, output_router_logits=False,
                )
        elif arch in _GEMMA:
            extra.update(
                hidden_activation=_GEGLU_ACT, intermediate_size=c.ffn_hidden, attention_bias=c.attn_bias,
                query_pre_attn_scalar=int(c.query_pre_attn_scalar or c.attn_head_dim),
                attn_logit_softcapping=c.attn_softcap if arch == "gemma2" else None,
                final_logit_softcapping=c.final_softcap,
            )
            if arch == "gemma3_text":
                extra.update(use_bidirectional_attention=False)
            ids = dict(_special_ids(c.vocab_size, 2, 1), pad_token_id=0)
        elif arch == "gpt_oss":
            extra.update(
                intermediate_size=c.moe_d_ff or c.ffn_hidden, num_local_experts=c.n_experts,
                num_experts_per_tok=c.top_k, attention_bias=c.attn_bias, swiglu_alpha=c.swiglu_alpha,
                swiglu_limit=c.swiglu_limit, router_aux_loss_coef=c.aux_loss_coef,
                output_router_logits=False,
            )
    return _hf_class(arch, 0)(**common, **heads, **extra, **ids)


def _hf_windows(h, arch: str, problems: list[str]) -> tuple[dict, list[bool]]:
    """Our window / global_every (or, for any other order, layer_pattern) from the HF layer types; and which
    layers are global."""
    L = h.num_hidden_layers
    window = getattr(h, "sliding_window", None) if arch in _WINDOWED else None
    if arch in ("qwen2",) + _QWEN3 and not getattr(h, "use_sliding_window", False):
        window = None
    types = list(getattr(h, "layer_types", None) or []) if arch in _LAYER_TYPED else []
    unknown = sorted({t for t in types if t not in _LAYER_TYPES})
    if unknown:
        problems.append(f"layer_types={types}: {unknown} (companion layers are {' or '.join(_LAYER_TYPES)})")
    sliding = [t == "sliding_attention" for t in types] if types else [True] * L
    if window is None or not any(sliding):
        return dict(window=None, global_every=None), [True] * L
    if all(sliding):
        return dict(window=window, global_every=None), [False] * L
    for k in range(2, L + 1):  # the patterns global_every builds keep that short form
        if all(sliding[i] == ((i + 1) % k != 0) for i in range(L)):
            return dict(window=window, global_every=k), [not s for s in sliding]
    return dict(layer_pattern=tuple(window if s else None for s in sliding)), [not s for s in sliding]


def _decoder_from_hf_config(h, arch: str, backend: str, tied: bool | None = None) -> DecoderConfig:
    """The companion config of ``h``; ``tied`` (from the tensors, see ``_tied_from_tensors``) overrides
    the config's tie_word_embeddings."""
    p = []
    gemma = arch in _GEMMA
    act = getattr(h, "hidden_activation", None) if gemma else getattr(h, "hidden_act", "silu")
    if arch != "gpt_oss" and act not in (_TANH_GELU_ACTS if gemma else _SILU_ACTS):
        field, rule = (("hidden_activation", "GeGLU's gate is the tanh GELU: " + " / ".join(_TANH_GELU_ACTS)) if gemma
                       else ("hidden_act", "SwiGLU's gate is SiLU: " + " / ".join(_SILU_ACTS)))
        p.append(f"{field}={act!r} ({rule})")
    if arch == "deepseek_v3":
        windows, layer_global = dict(), [True] * h.num_hidden_layers
    else:
        windows, layer_global = _hf_windows(h, arch, p)
    rope = _hf_rope(h, arch, layer_global, p)
    common = dict(
        vocab_size=h.vocab_size, d_model=h.hidden_size, n_layers=h.num_hidden_layers, n_heads=h.num_attention_heads,
        max_seq_len=h.max_position_embeddings, norm="rms", norm_placement="sandwich" if gemma else "pre",
        norm_offset=gemma, norm_eps=h.rms_norm_eps, position="rope", ffn="geglu" if gemma else "swiglu",
        tie_embeddings=bool(h.tie_word_embeddings) if tied is None else tied, scale_embeddings=gemma, backend=backend, name=f"from-hf-{arch}",
        **rope,
    )
    if arch == "deepseek_v3":
        return _deepseek_from_hf_config(h, p, common)
    head_dim = getattr(h, "head_dim", None) or h.hidden_size // h.num_attention_heads
    qk_norm = arch in _QWEN3 or arch == "gemma3_text"
    attn = dict(n_kv_heads=h.num_key_value_heads, head_dim=head_dim, qk_norm=qk_norm, **windows)
    bias = bool(getattr(h, "attention_bias", False)) if arch in _ATTENTION_BIASED else False
    if arch == "qwen2":
        attn.update(attn_bias=True, attn_out_bias=False)
    else:
        attn.update(attn_bias=bias)
    if gemma:
        if getattr(h, "use_bidirectional_attention", False):
            p.append("use_bidirectional_attention=True (companion decoders are causal)")
        s = getattr(h, "query_pre_attn_scalar", None)
        attn.update(
            query_pre_attn_scalar=s,
            # transformers 5.24 Gemma3Attention keeps attn_logit_softcapping but never passes it on: not applied
            attn_softcap=h.attn_logit_softcapping if arch == "gemma2" else None,
            final_softcap=h.final_logit_softcapping,
        )
    if arch == "gpt_oss":
        attn.update(sinks=True)
    if arch == "llama":
        attn.update(ffn_bias=bool(h.mlp_bias))
    ffn = dict(d_ff=h.intermediate_size)
    if arch == "mixtral":
        ffn.update(moe_d_ff=h.intermediate_size, n_experts=h.num_local_experts, top_k=h.num_experts_per_tok,
                   router="softmax", aux_loss_coef=h.router_aux_loss_coef)
    elif arch == "qwen3_moe":
        ffn.update(moe_d_ff=h.moe_intermediate_size, n_experts=h.num_experts, top_k=h.num_experts_per_tok,
                   router="softmax", norm_topk_prob=bool(h.norm_topk_prob), aux_loss_coef=h.router_aux_loss_coef,
                   **_qwen3_moe_layers(h))
    elif arch == "gpt_oss":
        ffn.update(moe_d_ff=h.intermediate_size, n_experts=h.num_local_experts, top_k=h.num_experts_per_tok,
                   router="softmax", router_bias=True, moe_expert="clamped_swiglu",
                   aux_loss_coef=h.router_aux_loss_coef,
                   swiglu_alpha=float(h.swiglu_alpha), swiglu_limit=float(h.swiglu_limit))
    _require(p, "companion")
    return DecoderConfig(**common, **attn, **ffn)


def _qwen3_moe_layers(h) -> dict:
    """Qwen3MoeDecoderLayer is MoE where i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0:
    first_dense_layers when that is a dense prefix, else the list itself (moe_layers)."""
    step = h.decoder_sparse_step or 1
    moe = tuple(i not in h.mlp_only_layers and (i + 1) % step == 0 for i in range(h.num_hidden_layers))
    first = moe.index(True) if True in moe else len(moe)
    if all(moe[first:]):
        return dict(first_dense_layers=first)
    return dict(moe_layers=moe)


def hf_config(model: GPT | Decoder, arch: str | None = None):
    """The transformers config equivalent to ``model`` (raises ValueError if there is none): its config,
    with tie_word_embeddings from the tensors (``_tied_from_tensors``)."""
    if isinstance(model, GPT):
        if arch not in (None, "gpt2"):
            raise ValueError(f"arch for a GPT must be 'gpt2' or None; got {arch!r}")
        return _gpt_to_hf_config(model.config, _tied_from_tensors(True, model.wte.weight, model.lm_head.weight, "GPT"))
    if isinstance(model, Decoder):
        tied = _tied_from_tensors(model.config.tie_embeddings, model.embed.weight, model.lm_head.weight, "Decoder")
        c = replace(model.config, tie_embeddings=tied)
        return _decoder_to_hf_config(c, arch or _decoder_arch(c))
    raise ValueError(f"model must be a companion GPT or Decoder; got {type(model).__name__}")
