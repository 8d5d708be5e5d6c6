"""Weights to and from Hugging Face ``transformers`` (optional extra: ``pip install companion[hf]``).

    hf_model = to_hf(model)        # GPT -> GPT2LMHeadModel; Decoder -> the family whose block it is
    model = from_hf(hf_model)      # and back; the companion config is rebuilt field by field

The families (transformers 5.24; tests/test_hf.py holds logits equal within 1e-5 in float32 on
random weights of std 0.2, with a negative control, and round trips exact in both directions;
tests/test_hf_sweep.py draws random configs of each family, hypothesis-style, and requires equal
logits both ways or a ValueError naming the field):

    family (transformers class)          status
    GPT-2 (GPT2LMHeadModel)               both directions, logits equal
    Llama (LlamaForCausalLM)              both directions, logits equal; rope_type default, linear
                                          (= "pi"), llama3, yarn (= "yarn_hf"); 'dynamic' and 'longrope'
                                          refused (frequencies that change with the sequence length)
    Mistral (MistralForCausalLM)          both directions, logits equal
    Mixtral (MixtralForCausalLM)          both directions, logits equal
    Qwen2 (Qwen2ForCausalLM)              both directions, logits equal (q, k, v biases, none on W_O;
                                          layer_types / max_window_layers as a layer pattern)
    Qwen3 (Qwen3ForCausalLM)              both directions, logits equal (QK-norm)
    Qwen3-MoE (Qwen3MoeForCausalLM)       both directions, logits equal (norm_topk_prob either way,
                                          mlp_only_layers and decoder_sparse_step as moe_layers; one
                                          window for every layer: the class reads no layer_types)
    Gemma 2 (Gemma2ForCausalLM)           both directions, logits equal (soft-caps, sandwich norms)
    Gemma 3 text (Gemma3ForCausalLM)      both directions, logits equal (5 local : 1 global, a RoPE per
                                          layer kind; no attention soft-cap and YaRN always truncated,
                                          as transformers computes it); the multimodal
                                          Gemma3ForConditionalGeneration is refused (no vision tower here)
    gpt-oss (GptOssForCausalLM)           both directions, logits equal (sinks, 128-window / full
                                          layers, YaRN, router bias, clamped SwiGLU experts with the
                                          config's swiglu_alpha / swiglu_limit, with or without
                                          attention biases)
    DeepSeek-V3 (DeepseekV3ForCausalLM)   both directions, logits equal (MLA, V3 routing with groups,
                                          norm_topk_prob, routed_scaling_factor; YaRN with mscale, and
                                          the softmax's m(mscale_all_dim)^2 for every scaled RoPE)

Layer patterns: the companion's per-layer list of windows (``DecoderConfig.layer_windows()``; None =
full attention, with the global RoPE) is what converts: ``layer_types`` (and Qwen2's
``max_window_layers``) in any order load, kept as ``window`` + ``global_every`` when that builds the
list and as ``layer_pattern`` otherwise; per-layer MoE flags likewise (``first_dense_layers`` or
``moe_layers``).

Which class a ``Decoder`` becomes (``to_hf(model, arch=...)`` overrides the choice, one of
``DECODER_ARCHS``): MLA -> DeepSeek-V3; sinks or clamped SwiGLU experts -> gpt-oss; sandwich norms
-> Gemma 3 with QK-norm, else Gemma 2; QK-norm -> Qwen3-MoE with experts, else Qwen3; experts ->
Mixtral; q, k, v biases without a W_O bias -> Qwen2; a window -> Mistral; otherwise Llama.

Every config field is mapped explicitly (``configs._decoder_to_hf_config``,
``configs._decoder_from_hf_config``). A companion feature with no counterpart in the target class
(post-norm, ALiBi, sinks outside gpt-oss, interleaved windows on Llama / Mistral / Mixtral, the
book's YaRN and NTK RoPE, dropout on the residual stream, a GPT-1 model, ...) raises
``ValueError("transformers has no equivalent for: ...")`` listing every such field with its rule,
and an HF config using something the companion does not model raises ``ValueError("companion has no
equivalent for: ...")`` likewise. Fields that act only in training (attention_dropout,
router_jitter_noise) are accepted: the conversions are for evaluation. Nothing is dropped silently:
every tensor of the source model must be consumed by the mapping, and every parameter of the target
must be written.

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

What the target class decides, the conversion decides the same way (issue 46): the converted model
rotates by the float32 frequencies transformers' model holds (its rotary module's ``inv_freq`` and
``attention_scaling``, from transformers' own rope init functions; ours, rounded once from float64, are
1-2 ulps away, which position m multiplies), and masks by token index whatever the position values
(the soft-cap path included); a config key the class never reads (``sliding_window`` on Llama or
DeepSeek-V3, ``attention_bias`` on Mistral / Mixtral) is not read here either
(tests/test_hf_config_reads.py derives what each class reads from transformers at run time).

Dtypes, tying, activations: a conversion keeps the source's dtype (``dtype=`` overrides it; a model of
mixed dtypes needs it), apart from the tensors the target class keeps in float32 in a float16 /
bfloat16 model (its ``_keep_in_fp32_modules`` / ``_keep_in_fp32_modules_strict``, read from the class:
gpt-oss's norm gains in float16, DeepSeek-V3's router and correction bias): those stay float32 both
ways, and our RMSNorm and router compute in their precision as transformers does. RoPE frequencies stay
float32 whatever the weights' dtype, on both sides. DeepSeek-V3 with ``n_shared_experts=0`` converts
(transformers builds a shared expert of width 0).
Embeddings are tied when the two tensors are one (the same storage), never because their values
happen to be equal (an untied model stays untied, as transformers keeps it by its flag): a model whose
flag says tied but whose output matrix was replaced converts untied, with a warning (the companion
GPT, always tied, refuses it). ``hidden_act`` aliases of the functions the companion computes are
accepted ("swish" = silu; "gelu_new", "gelu_fast", "gelu_accurate" = the tanh GELU);
``partial_rotary_factor`` with a scaled RoPE (linear, llama3, yarn) is refused, since companion rotates
every channel (with the default RoPE the Llama-named classes ignore it, as does the conversion).

transformers is imported inside the functions only, so ``import companion`` never needs it.

The package: ``common`` (classes, refusals), ``configs`` (decoder configs both ways), ``rope``
(rope_parameters), ``weights`` (tensor links and the checked copy), ``gpt2`` and ``deepseek`` (the
families whose config and tensors do not follow Llama's names).
"""


from __future__ import annotations

import torch

from companion.hf.common import _HF_CLASSES, DECODER_ARCHS, _hf_class, _one_dtype, _tied_from_tensors
from companion.hf.configs import _decoder_arch, _decoder_from_hf_config, hf_config
from companion.hf.deepseek import _deepseek_links
from companion.hf.gpt2 import _gpt_from_hf_config, _gpt_links
from companion.hf.rope import _use_their_frequencies
from companion.hf.weights import _float32_names, _llama_links, _ours_kept_float32, _set_dtypes, _transfer
from companion.models.decoder import Decoder
from companion.models.gpt import GPT

__all__ = ["to_hf", "from_hf", "hf_config", "DECODER_ARCHS"]



def to_hf(model: GPT | Decoder, arch: str | None = None, attn_implementation: str = "eager",
          dtype: torch.dtype | None = None):
    """A transformers model (eval mode, on the CPU) computing the same function as ``model``.

    GPT -> GPT2LMHeadModel. Decoder -> the class named by ``arch`` (one of ``DECODER_ARCHS``), chosen
    from the config when None (see module docstring). Raises ValueError for a config the target
    class cannot express, naming the field(s). The weights keep ``model``'s dtype (``dtype`` overrides;
    a model of mixed dtypes needs it); RoPE frequencies stay float32, as transformers keeps them.
    Embeddings are tied when the two tensors are one (see ``_tied_from_tensors``), whatever the config says.
    """
    config = hf_config(model, arch)
    if isinstance(model, GPT):
        arch, links = "gpt2", _gpt_links(model.config)
    else:
        arch = arch or _decoder_arch(model.config)
        c = model.config
        links = _deepseek_links(c, interleaved=True) if arch == "deepseek_v3" else _llama_links(c, arch)
    cls = _hf_class(arch, 1)
    may_keep = set(_ours_kept_float32(links, _float32_names(cls, torch.float16)))
    dtype = _one_dtype(model, dtype, "model", may_keep.__contains__)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):  # the init, overwritten below, draws nothing from the caller's RNG
        hf_model = cls._from_config(config, dtype=dtype)
    kept = _float32_names(cls, dtype)  # as transformers loads a checkpoint in ``dtype``
    _set_dtypes(hf_model, {n: p.data.float() for n, p in hf_model.named_parameters() if kept(n)})
    was_training = model.training
    with torch.no_grad():
        _transfer(model.eval(), hf_model, links, forward=True)
    model.train(was_training)
    return hf_model.eval()


# What a refused neighbour of a supported family has that the companion does not model.
_MISSING = {
    "gemma3": ("the vision tower and multimodal projector of Gemma3ForConditionalGeneration "
               "(Gemma3ForCausalLM converts)"),
    "gemma": "Gemma 1's block (pre-norm GeGLU without sandwich norms is not mapped)",
    "qwen2_moe": "Qwen2-MoE's sigmoid-gated shared expert",
    "deepseek_v2": "DeepSeek-V2's softmax group routing",
    "llama4": "Llama 4's chunked attention, NoPE layers and interleaved MoE",
    "gemma3n": "Gemma 3n's per-layer embeddings, AltUp and laurel blocks",
}


def from_hf(hf_model, backend: str = "auto", dtype: torch.dtype | None = None) -> GPT | Decoder:
    """The companion model (eval mode) equivalent to a transformers model of one of the classes in
    the module docstring's table. Raises ValueError for any other class, or for an HF config feature
    the companion does not model ("companion has no equivalent for: ..."), naming the field(s). The
    model keeps ``hf_model``'s dtype (``dtype`` overrides it; mixed dtypes need it), and ties its
    embeddings when the two tensors are one (the same storage), whatever tie_word_embeddings says. RoPE
    turns by transformers' own float32 frequencies (``rope._use_their_frequencies``)."""
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
    dtype = _one_dtype(hf_model, dtype, "hf_model", _float32_names(type(hf_model), torch.float16))
    tied = _tied_from_tensors(bool(h.tie_word_embeddings), hf_model.get_input_embeddings().weight,
                              hf_model.get_output_embeddings().weight, type(hf_model).__name__)
    if arch == "gpt2":
        config = _gpt_from_hf_config(h, backend, tied)
    else:
        config = _decoder_from_hf_config(h, arch, backend, tied)
    with torch.random.fork_rng(devices=[]):  # the init, overwritten below, draws nothing from the caller's RNG
        model = GPT(config) if arch == "gpt2" else Decoder(config)
    if arch == "gpt2":
        links = _gpt_links(model.config)
    elif arch == "deepseek_v3":
        links = _deepseek_links(model.config, interleaved=bool(getattr(h, "rope_interleave", True)))
    else:
        links = _llama_links(model.config, arch)
    with torch.no_grad():
        _transfer(hf_model, model, links, forward=False)
    if arch != "gpt2":
        _use_their_frequencies(hf_model, model, arch)
    # built in float32, the copied values exact in it; RoPE frequencies stay float32, and so do the tensors
    # that transformers' class keeps in float32 in a model of this dtype and that hf_model holds so
    kept, theirs = _float32_names(type(hf_model), dtype), hf_model.state_dict()
    links = [link for link in links if all(theirs[t].dtype == torch.float32 for t in link[1])]
    state = model.state_dict()
    wide = {n: state[n].detach().clone() for n in _ours_kept_float32(links, kept)} if dtype != torch.float32 else {}
    model.to(dtype)
    _set_dtypes(model, wide)
    return model.eval()
