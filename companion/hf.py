"""Weights to and from Hugging Face ``transformers`` (optional extra: ``pip install companion[hf]``).

    hf_model = to_hf(model)        # GPT -> GPT2LMHeadModel; Decoder -> the family whose block it is
    model = from_hf(hf_model)      # and back; the companion config is rebuilt field by field

The families (transformers 5.24; tests/test_hf.py holds logits equal within 1e-5 in float32 on
random weights of std 0.2, with a negative control, and round trips exact in both directions):

    family (transformers class)          status
    GPT-2 (GPT2LMHeadModel)               both directions, logits equal
    Llama (LlamaForCausalLM)              both directions, logits equal; rope_type default, linear
                                          (= "pi"), llama3, yarn (= "yarn_hf"); 'dynamic' and 'longrope'
                                          refused (frequencies that change with the sequence length)
    Mistral (MistralForCausalLM)          both directions, logits equal
    Mixtral (MixtralForCausalLM)          both directions, logits equal
    Qwen2 (Qwen2ForCausalLM)              both directions, logits equal (q, k, v biases, none on W_O)
    Qwen3 (Qwen3ForCausalLM)              both directions, logits equal (QK-norm)
    Qwen3-MoE (Qwen3MoeForCausalLM)       both directions, logits equal (norm_topk_prob either way,
                                          mlp_only_layers as first_dense_layers)
    Gemma 2 (Gemma2ForCausalLM)           both directions, logits equal (soft-caps, sandwich norms)
    Gemma 3 text (Gemma3ForCausalLM)      both directions, logits equal (5 local : 1 global, a RoPE per
                                          layer kind); the multimodal Gemma3ForConditionalGeneration is
                                          refused (no vision tower here)
    gpt-oss (GptOssForCausalLM)           both directions, logits equal (sinks, 128-window / full
                                          layers, YaRN, router bias, clamped SwiGLU experts)
    DeepSeek-V3 (DeepseekV3ForCausalLM)   both directions, logits equal (MLA, V3 routing with groups,
                                          norm_topk_prob, routed_scaling_factor; YaRN with mscale)

Which class a ``Decoder`` becomes (``to_hf(model, arch=...)`` overrides the choice, one of
``DECODER_ARCHS``): MLA -> DeepSeek-V3; sinks or clamped SwiGLU experts -> gpt-oss; sandwich norms
-> Gemma 3 with QK-norm, else Gemma 2; QK-norm -> Qwen3-MoE with experts, else Qwen3; experts ->
Mixtral; q, k, v biases without a W_O bias -> Qwen2; a window -> Mistral; otherwise Llama.

Every config field is mapped explicitly (``_decoder_to_hf_config``, ``_decoder_from_hf_config``). A
companion feature with no counterpart in the target class (post-norm, ALiBi, sinks outside gpt-oss,
interleaved windows on Llama / Mistral / Mixtral, the book's YaRN and NTK RoPE, dropout on the residual
stream, a GPT-1 model, ...) raises ``ValueError("transformers has no equivalent for: ...")`` listing
every such field with its rule, and an HF config using something the companion does not model
raises ``ValueError("companion has no equivalent for: ...")`` likewise. Fields that act only in
training (attention_dropout, router_jitter_noise) are accepted: the conversions are for evaluation.
Nothing is dropped silently: every tensor of the source model must be consumed by the mapping, and
every parameter of the target must be written.

Layout differences the mapping takes care of
- GPT-2 stores its linear maps as ``Conv1D`` with weight (in, out): the transpose of ``nn.Linear``.
- Our attention projects q, k and v with one fused matrix (rows [q heads | k heads | v heads]);
  Llama-family checkpoints keep three matrices. Split / concatenate along the output rows.
- Mixtral (transformers 5) keeps all experts of a layer in two 3-D tensors,
  ``gate_up_proj`` (E, 2 d_ff, d) with the gate rows first, and ``down_proj`` (E, d, d_ff).
- Qwen3-MoE uses Mixtral's expert layout. gpt-oss stores the input dimension first and interleaves
  gate and up columns: ``gate_up_proj`` (E, d, 2 d_ff) with gate = [..., 0::2], up = [..., 1::2] (and
  the same for its bias), ``down_proj`` (E, d_ff, d); its router has a bias.
- Gemma's sandwich norms: input_layernorm / post_attention_layernorm around attention,
  pre_feedforward_layernorm / post_feedforward_layernorm around the MLP; its RMSNorm gains are
  stored as w with gain 1 + w, which is our ``norm_offset=True``, so tensors are copied unchanged.
- DeepSeek-V3's latent norms (q_a_layernorm, kv_a_layernorm) use eps 1e-6 whatever rms_norm_eps
  says: that is our ``mla_norm_eps``, apart from ``norm_eps``.
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

DECODER_ARCHS = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "gpt_oss", "deepseek_v3")

_HF_CLASSES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
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


def _require(problems: list[str], missing_in: str = "transformers") -> None:
    """Raise one ValueError listing every feature ``missing_in`` ("transformers": the target class,
    converting to HF; "companion": converting from HF) cannot express."""
    if problems:
        raise ValueError(f"{missing_in} has no equivalent for: " + "; ".join(problems))


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
    _require(problems, "companion")
    return GPTConfig(
        vocab_size=h.vocab_size, block_size=h.n_positions, n_layer=h.n_layer, n_head=h.n_head, n_embd=h.n_embd,
        variant="gpt2", dropout=float(h.resid_pdrop), layer_norm_eps=h.layer_norm_epsilon, backend=backend,
        name="from-hf",
    )


_GEMMA = ("gemma2", "gemma3_text")
_QWEN3 = ("qwen3", "qwen3_moe")
# Classes that read a sliding/full list per layer (layer_types). Qwen3-MoE has the field in neither its config
# nor its attention (transformers 5.24 modeling_qwen3_moe: one sliding_window for every layer), like Mistral.
_LAYER_TYPED = ("qwen2", "qwen3", "gemma2", "gemma3_text", "gpt_oss")
_LAYER_TYPES = ("sliding_attention", "full_attention")
_MOE_ARCHS = ("mixtral", "qwen3_moe", "gpt_oss")
_FAMILY = {
    "llama": "Llama", "mistral": "Mistral", "mixtral": "Mixtral", "qwen2": "Qwen2", "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3-MoE", "gemma2": "Gemma 2", "gemma3_text": "Gemma 3", "gpt_oss": "gpt-oss", "deepseek_v3": "DeepSeek-V3",
}
_GEGLU_ACT = "gelu_pytorch_tanh"  # Gemma's gate: the tanh GELU


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
    return "mistral" if c.window is not None else "llama"


def _rope_dict(c: DecoderConfig, scaling: str | None, theta: float, problems: list[str]) -> dict:
    """One transformers ``rope_parameters`` dict for a RoPE of base theta scaled by ``scaling``."""
    rope = {"rope_type": "default", "rope_theta": float(theta)}
    if scaling is not None and (c.rope_mscale or c.rope_mscale_all_dim):
        # DeepSeek's temperature (yarn) and its MLA softmax correction m(mscale_all_dim)^2, which
        # DeepseekV3Attention applies for every rope_type other than "default" (yarn_apply_mscale)
        rope.update(mscale=float(c.rope_mscale), mscale_all_dim=float(c.rope_mscale_all_dim))
    if scaling == "pi":
        rope.update(rope_type="linear", factor=float(c.rope_factor))
    elif scaling == "llama3":
        rope.update(
            rope_type="llama3", factor=float(c.rope_factor), low_freq_factor=float(c.rope_low_freq_factor),
            high_freq_factor=float(c.rope_high_freq_factor), original_max_position_embeddings=c.rope_original_max_len,
        )
    elif scaling == "yarn_hf":
        rope.update(
            rope_type="yarn", factor=float(c.rope_factor), beta_fast=float(c.rope_beta_fast), beta_slow=float(c.rope_beta_slow),
            truncate=bool(c.rope_truncate), original_max_position_embeddings=c.rope_original_max_len,
        )
        if c.rope_attention_factor is not None:
            rope["attention_factor"] = float(c.rope_attention_factor)
    elif scaling is not None:
        problems.append(
            f"rope_scaling={scaling!r} (transformers computes 'linear' = 'pi', 'llama3' and 'yarn' = 'yarn_hf'; the book's "
            "'yarn' ramps over turns instead of channel indices and 'ntk' is a fixed base change, neither a rope_type)"
        )
    return rope


def _rope_parameters(c: DecoderConfig, arch: str, problems: list[str]) -> dict:
    """rope_parameters for the target: one dict, or (Gemma 3) one per layer type."""
    def kind(i):
        glob = c.is_global(i)
        base = c.rope_base_global if (c.rope_base_global is not None and glob) else c.rope_base
        return base, c.rope_scaling if (c.rope_scaling_layers == "all" or glob) else None

    kinds = {kind(i) for i in range(c.n_layers)}
    if arch == "gemma3_text":
        if not c.rope_truncate and any(kind(i)[1] == "yarn_hf" for i in range(c.n_layers)):
            problems.append("rope_truncate=False (Gemma 3 reads YaRN's truncate from the top of rope_parameters, a dict "
                            "per layer type, so a nested truncate=False is never applied)")
        local = kind(next((i for i in range(c.n_layers) if not c.is_global(i)), 0))
        glob = kind(next((i for i in range(c.n_layers) if c.is_global(i)), 0))
        return {"sliding_attention": _rope_dict(c, local[1], local[0], problems), "full_attention": _rope_dict(c, glob[1], glob[0], problems)}
    if len(kinds) > 1:
        problems.append(
            f"rope_base_global={c.rope_base_global} / rope_scaling_layers={c.rope_scaling_layers!r}: a different RoPE on global "
            f"layers (the {_FAMILY[arch]} class has one RoPE for all layers; Gemma 3 has one per layer kind)"
        )
    base, scaling = kinds.pop()
    return _rope_dict(c, scaling, base, problems)


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
        p.append(f"norm_offset={c.norm_offset} ({fam}'s RMSNorm gain is {'1 + w' if gemma else 'w'}: norm_offset={gemma})")
    if c.position != "rope":
        p.append(f"position={c.position!r} (RoPE only)")
    want_ffn = "geglu" if gemma else "swiglu"
    if c.ffn != want_ffn and any(not c.is_moe(i) for i in range(c.n_layers)):
        p.append(f"ffn={c.ffn!r} (the {fam} feed-forward is ffn={want_ffn!r})")
    if c.sinks != oss:
        p.append(f"sinks={c.sinks} (attention sinks exist in gpt-oss only)" if c.sinks else "sinks=False (every gpt-oss layer has sinks)")
    if c.keep:
        p.append(f"keep={c.keep} (no StreamingLLM kept tokens)")
    if c.scale_embeddings != gemma:
        p.append(f"scale_embeddings={c.scale_embeddings} ({fam} {'multiplies' if gemma else 'does not multiply'} the embeddings by sqrt(d))")
    if c.dropout:
        p.append(f"dropout={c.dropout} (HF applies dropout to attention weights only; ours also to the residual stream: set dropout=0)")
    if c.attention == "mha":
        want_qk = arch in _QWEN3 or arch == "gemma3_text"
        if c.qk_norm != want_qk:
            p.append(f"qk_norm={c.qk_norm} ({fam} {'always has' if want_qk else 'has no'} QK-norm)")
        if gemma and c.query_pre_attn_scalar is not None and c.query_pre_attn_scalar != int(c.query_pre_attn_scalar):
            p.append(f"query_pre_attn_scalar={c.query_pre_attn_scalar} (an integer in the {fam} config)")
        if not gemma:
            if c.query_pre_attn_scalar not in (None, c.attn_head_dim):
                p.append(f"query_pre_attn_scalar={c.query_pre_attn_scalar} (the {fam} class scales scores by 1/sqrt(head_dim))")
            for f in ("attn_softcap", "final_softcap"):
                if getattr(c, f) is not None:
                    p.append(f"{f}={getattr(c, f)} (soft-capping exists in Gemma 2 / 3 only)")
        elif arch == "gemma3_text" and c.attn_softcap is not None:
            p.append(f"attn_softcap={c.attn_softcap} (Gemma 3's attention reads attn_logit_softcapping but never applies it; "
                     "Gemma 2 soft-caps its scores)")
        out_bias = c.attn_bias if c.attn_out_bias is None else c.attn_out_bias
        if arch == "qwen2":
            if not (c.attn_bias and not out_bias):
                p.append(f"attn_bias={c.attn_bias}, attn_out_bias={c.attn_out_bias} (Qwen2 has q, k, v biases and none on W_O)")
        elif arch in ("llama", "gpt_oss") + _QWEN3 + _GEMMA:
            if out_bias != c.attn_bias:
                p.append(f"attn_out_bias={c.attn_out_bias} with attn_bias={c.attn_bias} (the {fam} class has one attention_bias for q, k, v and W_O)")
            if oss and not c.attn_bias:
                p.append("attn_bias=False (gpt-oss has biases on q, k, v and W_O)")
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
    if c.first_dense_layers and arch != "qwen3_moe":
        p.append(f"first_dense_layers={c.first_dense_layers} (every {fam} layer is MoE)")
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
    if arch in _LAYER_TYPED:
        window = c.window if windows != {None} else None
        if window is None and arch in _GEMMA + ("gpt_oss",):
            # these classes build a sliding mask whatever the layer types say and raise without a window;
            # no layer reads it when every layer is full attention
            window = c.max_seq_len
    else:
        if len(windows) > 1:
            p.append(f"window={c.window} with global_every={c.global_every}: interleaved local/global layers (the {_FAMILY[arch]} class has one window for all layers)")
        window = next(iter(windows))
        if arch == "llama" and window is not None:
            p.append(f"window={c.window} with arch='llama' (Llama has no sliding window; use 'mistral' or 'mixtral')")
    if arch in _MOE_ARCHS:
        if not c.n_experts:
            p.append(f"n_experts=0 with arch={arch!r} (a {_FAMILY[arch]} model is a mixture of experts)")
        else:
            p += _plain_routing_checks(c, arch)
    elif c.n_experts:
        p.append(f"n_experts={c.n_experts} with arch={arch!r} (MoE maps to 'mixtral', 'qwen3_moe', 'gpt_oss' or 'deepseek_v3')")
    _require(p)
    heads = dict(num_key_value_heads=c.kv_heads, head_dim=c.attn_head_dim)
    ids = _special_ids(c.vocab_size, 1, 2)
    if arch == "llama":
        extra = dict(hidden_act="silu", intermediate_size=c.ffn_hidden, attention_bias=c.attn_bias, mlp_bias=c.ffn_bias)
    elif arch == "mistral":
        extra = dict(hidden_act="silu", intermediate_size=c.ffn_hidden, sliding_window=window)
    elif arch == "mixtral":
        extra = dict(
            hidden_act="silu", intermediate_size=c.moe_d_ff or c.ffn_hidden, sliding_window=window, num_local_experts=c.n_experts,
            num_experts_per_tok=c.top_k, router_aux_loss_coef=c.aux_loss_coef, router_jitter_noise=0.0, output_router_logits=False,
        )
    else:
        extra = dict(layer_types=_layer_types(c), sliding_window=window) if arch in _LAYER_TYPED else dict(sliding_window=window)
        if arch in ("qwen2",) + _QWEN3:
            extra.update(hidden_act="silu", intermediate_size=c.ffn_hidden, use_sliding_window=window is not None)
            if arch in _QWEN3:
                extra.update(attention_bias=c.attn_bias)
            if arch == "qwen3_moe":
                extra.update(
                    moe_intermediate_size=c.moe_d_ff or c.ffn_hidden, num_experts=c.n_experts, num_experts_per_tok=c.top_k,
                    norm_topk_prob=c.norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=list(range(c.first_dense_layers)),
                    router_aux_loss_coef=c.aux_loss_coef, output_router_logits=False,
                )
        elif arch in _GEMMA:
            extra.update(
                hidden_activation=_GEGLU_ACT, intermediate_size=c.ffn_hidden, attention_bias=c.attn_bias,
                query_pre_attn_scalar=int(c.query_pre_attn_scalar or c.attn_head_dim),
                attn_logit_softcapping=c.attn_softcap if arch == "gemma2" else None, final_logit_softcapping=c.final_softcap,
            )
            if arch == "gemma3_text":
                extra.update(use_bidirectional_attention=False)
            ids = dict(_special_ids(c.vocab_size, 2, 1), pad_token_id=0)
        elif arch == "gpt_oss":
            extra.update(
                intermediate_size=c.moe_d_ff or c.ffn_hidden, num_local_experts=c.n_experts, num_experts_per_tok=c.top_k,
                attention_bias=c.attn_bias, swiglu_alpha=1.702, swiglu_limit=7.0, router_aux_loss_coef=c.aux_loss_coef,
                output_router_logits=False,
            )
    return _hf_class(arch, 0)(**common, **heads, **extra, **ids)


# transformers' DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm with the RMSNorm default
# eps, 1e-6, not config.rms_norm_eps (so does DeepSeek's own modelling code).
_DEEPSEEK_LATENT_EPS = 1e-6


def _deepseek_to_hf_config(c: DecoderConfig, p: list[str], common: dict):
    if c.attention != "mla":
        p.append(f"attention={c.attention!r} with arch='deepseek_v3' (DeepSeek-V3 uses MLA: attention='mla')")
    if c.attn_bias:
        p.append("attn_bias=True with arch='deepseek_v3' (MLA here has no biases)")
    if c.ffn_bias:
        p.append("ffn_bias=True with arch='deepseek_v3'")
    if c.mla_norm_eps != _DEEPSEEK_LATENT_EPS:
        p.append(f"mla_norm_eps={c.mla_norm_eps} (DeepseekV3's q_a_layernorm / kv_a_layernorm use eps {_DEEPSEEK_LATENT_EPS:g} always)")
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
        routed_scaling_factor=float(c.routed_scaling_factor) if moe else 1.0, n_group=c.expert_groups if moe else 1,
        topk_group=(c.topk_groups or c.expert_groups) if moe else 1, norm_topk_prob=c.norm_topk_prob if moe else True,
        kv_lora_rank=c.kv_rank, q_lora_rank=c.q_rank, qk_rope_head_dim=c.rope_dim, qk_nope_head_dim=c.mla_head_dim,
        v_head_dim=c.v_head_dim or c.mla_head_dim, rope_interleave=True, attention_bias=False,
        **_special_ids(c.vocab_size, 0, 1),
    )


def _hf_rope_fields(rp: dict, problems: list[str]) -> tuple[float, dict]:
    """(base, our rope_* fields) from one transformers rope_parameters dict."""
    kind = rp.get("rope_type", "default")
    base = float(rp.get("rope_theta", 10000.0))
    if kind == "default":
        return base, {}
    mscales = dict(rope_mscale=float(rp.get("mscale") or 0.0), rope_mscale_all_dim=float(rp.get("mscale_all_dim") or 0.0))
    if kind in ("linear", "llama3", "yarn") and rp.get("factor") is None:
        problems.append(f"rope_parameters factor={rp.get('factor')!r} (rope_type={kind!r} needs its factor)")
        return base, {}
    if kind == "linear":
        return base, dict(rope_scaling="pi", rope_factor=float(rp["factor"]), **mscales)
    if kind == "llama3":
        return base, dict(
            **mscales, rope_scaling="llama3", rope_factor=float(rp["factor"]), rope_low_freq_factor=float(rp["low_freq_factor"]),
            rope_high_freq_factor=float(rp["high_freq_factor"]), rope_original_max_len=int(rp["original_max_position_embeddings"]),
        )
    if kind == "yarn":
        return base, dict(
            **mscales, rope_scaling="yarn_hf", rope_factor=float(rp["factor"]), rope_beta_fast=float(rp.get("beta_fast") or 32.0),
            rope_beta_slow=float(rp.get("beta_slow") or 1.0), rope_truncate=bool(rp.get("truncate", True)),
            rope_original_max_len=int(rp["original_max_position_embeddings"]), rope_attention_factor=rp.get("attention_factor"),
        )
    problems.append(
        f"rope_parameters rope_type={kind!r} (mapped: 'default', 'linear', 'llama3', 'yarn'; 'dynamic' changes the "
        "frequencies with the sequence length, 'longrope' per channel)"
    )
    return base, {}


def _hf_rope(h, arch: str, layer_global: list[bool], problems: list[str]) -> dict:
    rp = dict(getattr(h, "rope_parameters", None) or {})
    if arch != "gemma3_text":
        base, fields = _hf_rope_fields(rp, problems)
        return dict(rope_base=base, **fields)
    # transformers 5.24 _compute_yarn_parameters reads truncate from config.rope_parameters itself, which for
    # Gemma 3 is the dict of layer types: a nested truncate=False is never seen, the ramp is always truncated
    local_base, local = _hf_rope_fields(dict(rp["sliding_attention"], truncate=True), problems)
    glob_base, glob = _hf_rope_fields(dict(rp["full_attention"], truncate=True), problems)
    out = dict(rope_base=local_base, rope_base_global=glob_base if glob_base != local_base else None)
    has_local, has_global = not all(layer_global), any(layer_global)
    if local and has_local:
        if glob != local and has_global:
            problems.append(f"rope_parameters: scaled RoPE on sliding layers ({local}) and another on full layers ({glob})")
        out.update(local)
    elif glob and has_global:
        out.update(glob, rope_scaling_layers="global" if has_local else "all")
    return out


def _hf_windows(h, arch: str, problems: list[str]) -> tuple[dict, list[bool]]:
    """Our window / global_every from the HF layer types; and which layers are global."""
    L = h.num_hidden_layers
    window = getattr(h, "sliding_window", None)
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
    for k in range(2, L + 1):
        if all(sliding[i] == ((i + 1) % k != 0) for i in range(L)):
            return dict(window=window, global_every=k), [not s for s in sliding]
    problems.append(f"layer_types={types} (companion's layer pattern is every global_every-th layer global, the others windowed)")
    return dict(window=window, global_every=None), [not s for s in sliding]


def _decoder_from_hf_config(h, arch: str, backend: str) -> DecoderConfig:
    p = []
    gemma = arch in _GEMMA
    act = getattr(h, "hidden_activation", None) if gemma else getattr(h, "hidden_act", "silu")
    if arch != "gpt_oss" and act != (_GEGLU_ACT if gemma else "silu"):
        p.append(f"{'hidden_activation' if gemma else 'hidden_act'}={act!r} ({'GeGLU uses ' + _GEGLU_ACT if gemma else 'SwiGLU uses silu'})")
    if arch == "deepseek_v3":
        windows, layer_global = dict(), [True] * h.num_hidden_layers
    else:
        windows, layer_global = _hf_windows(h, arch, p)
    rope = _hf_rope(h, arch, layer_global, p)
    common = dict(
        vocab_size=h.vocab_size, d_model=h.hidden_size, n_layers=h.num_hidden_layers, n_heads=h.num_attention_heads,
        max_seq_len=h.max_position_embeddings, norm="rms", norm_placement="sandwich" if gemma else "pre",
        norm_offset=gemma, norm_eps=h.rms_norm_eps, position="rope", ffn="geglu" if gemma else "swiglu",
        tie_embeddings=bool(h.tie_word_embeddings), scale_embeddings=gemma, backend=backend, name=f"from-hf-{arch}",
        **rope,
    )
    if arch == "deepseek_v3":
        return _deepseek_from_hf_config(h, p, common)
    head_dim = getattr(h, "head_dim", None) or h.hidden_size // h.num_attention_heads
    attn = dict(n_kv_heads=h.num_key_value_heads, head_dim=head_dim, qk_norm=arch in _QWEN3 or arch == "gemma3_text", **windows)
    bias = bool(getattr(h, "attention_bias", False))
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
            attn_softcap=h.attn_logit_softcapping if arch == "gemma2" else None, final_softcap=h.final_logit_softcapping,
        )
    if arch == "gpt_oss":
        if (h.swiglu_alpha, h.swiglu_limit) != (1.702, 7.0):
            p.append(f"swiglu_alpha={h.swiglu_alpha}, swiglu_limit={h.swiglu_limit} (companion's ClampedSwiGLU experts use 1.702 and 7.0)")
        attn.update(sinks=True)
    if arch == "llama":
        attn.update(ffn_bias=bool(h.mlp_bias))
    ffn = dict(d_ff=h.intermediate_size)
    if arch == "mixtral":
        ffn.update(moe_d_ff=h.intermediate_size, n_experts=h.num_local_experts, top_k=h.num_experts_per_tok,
                   router="softmax", aux_loss_coef=h.router_aux_loss_coef)
    elif arch == "qwen3_moe":
        dense = sorted(set(h.mlp_only_layers))
        first = next((k for k in range(h.num_hidden_layers + 1) if dense == list(range(k))), None)
        if first is None or h.decoder_sparse_step != 1:
            p.append(f"mlp_only_layers={h.mlp_only_layers}, decoder_sparse_step={h.decoder_sparse_step} (companion: the first k layers dense, the rest MoE)")
            first = 0
        ffn.update(moe_d_ff=h.moe_intermediate_size, n_experts=h.num_experts, top_k=h.num_experts_per_tok, router="softmax",
                   norm_topk_prob=bool(h.norm_topk_prob), first_dense_layers=first, aux_loss_coef=h.router_aux_loss_coef)
    elif arch == "gpt_oss":
        ffn.update(moe_d_ff=h.intermediate_size, n_experts=h.num_local_experts, top_k=h.num_experts_per_tok, router="softmax",
                   router_bias=True, moe_expert="clamped_swiglu", aux_loss_coef=h.router_aux_loss_coef)
    _require(p, "companion")
    return DecoderConfig(**common, **attn, **ffn)


def _deepseek_from_hf_config(h, p: list[str], common: dict) -> DecoderConfig:
    if h.attention_bias:
        p.append("attention_bias=True (MLA here has no biases)")
    moe = h.first_k_dense_replace < h.num_hidden_layers
    if moe:
        groups = h.n_group or 1
        if h.n_routed_experts % groups or (groups > 1 and h.n_routed_experts // groups < 2):
            p.append(f"n_group={h.n_group} with n_routed_experts={h.n_routed_experts} (groups of >= 2 experts each)")
    _require(p, "companion")
    routing = dict(
        expert_groups=(h.n_group or 1) if moe else 1, topk_groups=(h.topk_group or h.n_group or 1) if moe else None,
        norm_topk_prob=bool(h.norm_topk_prob) if moe else True,
        routed_scaling_factor=float(h.routed_scaling_factor) if moe else 1.0,
    )
    return DecoderConfig(
        **common, attention="mla", kv_rank=h.kv_lora_rank, q_rank=h.q_lora_rank, mla_head_dim=h.qk_nope_head_dim,
        rope_dim=h.qk_rope_head_dim, v_head_dim=h.v_head_dim, d_ff=h.intermediate_size,
        n_experts=h.n_routed_experts if moe else 0, top_k=h.num_experts_per_tok if moe else 2,
        n_shared_experts=h.n_shared_experts if moe else 0, moe_d_ff=h.moe_intermediate_size,
        first_dense_layers=h.first_k_dense_replace if moe else 0, router="sigmoid", bias_balancing=moe,
        mla_norm_eps=_DEEPSEEK_LATENT_EPS, **routing,
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


def _gpt_oss_experts_link(o: str, t: str, n: int) -> list[Link]:
    """Our clamped SwiGLUs (gate, up, down with biases) <-> gpt-oss's fused tensors, which store the
    input dimension first and interleave the gate and up columns: gate_up_proj (E, d, 2 d_ff) with
    gate = [..., 0::2], up = [..., 1::2]; gate_up_proj_bias (E, 2 d_ff) likewise; down_proj (E, d_ff, d)."""
    names = [f"{o}experts.{e}.{w}.{p}" for e in range(n) for w in ("gate", "up") for p in ("weight", "bias")]

    def fuse(ts):
        ws, bs = [], []
        for e in range(n):
            gw, gb, uw, ub = ts[4 * e: 4 * e + 4]
            ws.append(torch.stack((gw.t(), uw.t()), dim=-1).flatten(-2))  # (d, d_ff, 2) -> (d, 2 d_ff)
            bs.append(torch.stack((gb, ub), dim=-1).flatten(-2))
        return [torch.stack(ws), torch.stack(bs)]

    def unfuse(ts):
        w, b = ts
        return [x for e in range(n) for x in (w[e][:, 0::2].t(), b[e][0::2], w[e][:, 1::2].t(), b[e][1::2])]

    downs_w = tuple(f"{o}experts.{e}.down.weight" for e in range(n))
    downs_b = tuple(f"{o}experts.{e}.down.bias" for e in range(n))
    return [
        (tuple(names), (t + "experts.gate_up_proj", t + "experts.gate_up_proj_bias"), fuse, unfuse),
        (downs_w, (t + "experts.down_proj",), lambda ts: [torch.stack([w.t() for w in ts])], lambda ts: [w.t() for w in ts[0].unbind(0)]),
        (downs_b, (t + "experts.down_proj_bias",), lambda ts: [torch.stack(list(ts))], lambda ts: list(ts[0].unbind(0))),
    ]


def _llama_links(c: DecoderConfig, arch: str) -> list[Link]:
    """Every family with Llama's tensor names (Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, Gemma 2/3, gpt-oss)."""
    h, g, dh = c.n_heads, c.kv_heads, c.attn_head_dim
    out_bias = c.attn_bias if c.attn_out_bias is None else c.attn_out_bias
    links = [_same("embed.weight", "model.embed_tokens.weight")]
    for i in range(c.n_layers):
        o, t = f"layers.{i}.", f"model.layers.{i}."
        if c.norm_placement == "sandwich":  # Gemma: pre and post norm around each sublayer
            norms = (("attn_norm", "input_layernorm"), ("attn_post_norm", "post_attention_layernorm"),
                     ("ffn_norm", "pre_feedforward_layernorm"), ("ffn_post_norm", "post_feedforward_layernorm"))
        else:
            norms = (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"))
        links += [_same(o + ours + ".weight", t + theirs + ".weight") for ours, theirs in norms]
        qkv = [t + f"self_attn.{x}_proj" for x in "qkv"]
        for p in ("weight", "bias") if c.attn_bias else ("weight",):
            links.append(_rows(o + f"attn.qkv.{p}", [n + f".{p}" for n in qkv], (h * dh, g * dh, g * dh)))
        for p in ("weight", "bias") if out_bias else ("weight",):
            links.append(_same(o + f"attn.out.{p}", t + f"self_attn.o_proj.{p}"))
        if c.qk_norm:
            links += [_same(o + "attn.q_norm.weight", t + "self_attn.q_norm.weight"), _same(o + "attn.k_norm.weight", t + "self_attn.k_norm.weight")]
        if c.sinks:
            links.append(_same(o + "attn.sinks", t + "self_attn.sinks"))
        if c.is_moe(i) and arch == "gpt_oss":
            links += [_same(o + "ffn.router.weight", t + "mlp.router.weight"), _same(o + "ffn.router.bias", t + "mlp.router.bias")]
            links += _gpt_oss_experts_link(o + "ffn.", t + "mlp.", c.n_experts)
        elif c.is_moe(i):
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


# What a refused neighbour of a supported family has that the companion does not model.
_MISSING = {
    "gemma3": "the vision tower and multimodal projector of Gemma3ForConditionalGeneration (Gemma3ForCausalLM converts)",
    "gemma": "Gemma 1's block (pre-norm GeGLU without sandwich norms is not mapped)",
    "qwen2_moe": "Qwen2-MoE's sigmoid-gated shared expert",
    "deepseek_v2": "DeepSeek-V2's softmax group routing",
    "llama4": "Llama 4's chunked attention, NoPE layers and interleaved MoE",
    "gemma3n": "Gemma 3n's per-layer embeddings, AltUp and laurel blocks",
}


def from_hf(hf_model, backend: str = "auto") -> GPT | Decoder:
    """The companion model (eval mode) equivalent to a transformers model of one of the classes in
    the module docstring's table. Raises ValueError for any other class, or for an HF config feature
    the companion does not model ("companion has no equivalent for: ..."), naming the field(s)."""
    h = getattr(hf_model, "config", None)
    kind = getattr(h, "model_type", None)
    if kind is None:
        raise ValueError(f"hf_model must be a transformers model with a config; got {type(hf_model).__name__}")
    arch = "gpt2" if kind == "gpt2" else (kind if kind in DECODER_ARCHS else None)
    expected = _HF_CLASSES.get(arch, (None, None))[1]
    if arch is None or type(hf_model).__name__ != expected:
        supported = ", ".join(v[1] for v in _HF_CLASSES.values())
        missing = _MISSING.get(kind, "")
        raise ValueError(
            f"hf_model must be one of {supported}; got {type(hf_model).__name__} (model_type={kind!r})"
            + (f": companion has no equivalent for {missing}" if missing else "")
            + ("" if arch is None else f" (only the causal-LM class {expected} converts)")
        )
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
