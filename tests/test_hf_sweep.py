"""A property-based sweep of companion.hf against transformers (issues 23, 46): for each family, hypothesis
draws a small random transformers config over the fields that family's classes read, builds the model
with random weights and converts it. Beyond the config it draws (issue 46): the position values of the
batch (0..T-1, with gaps, restarting, or past 10,000), an untied model whose two matrices are equal
(it must stay untied both ways), a float16 / bfloat16 model as transformers loads one (saved and
loaded: the class's keep-in-float32 tensors stay float32, and must stay so both ways), and zero-sized
options (no shared experts, one expert, top_k = the number of experts). Each example must end in one
of two ways:

- ``from_hf`` (and ``to_hf`` of the result, and of a companion-side variant) refuses with a ValueError
  whose message names a config field, or
- the logits are equal in both directions, on a batch with one left-padded row (attention_mask on their
  side, a key mask on ours), within 4 times transformers' own error against its float64 twin (or ours
  against ours, where larger: transformers' eager softmax runs in float32 even in its twin) plus 8
  float32 ulps of the logit scale; MoE layers run transformers' eager experts (hf_support).

A silent mismatch, or an exception of another kind (a crash in either library), fails the test.

CI runs ``SWEEP_DEFAULT`` examples per family, derandomized (about 60 s in all on 2 shared cores);
``COMPANION_HF_SWEEP=N`` runs N per family (issue 23 asks for 2,000 once locally: experiments/hf_sweep.md),
and ``COMPANION_HF_SWEEP_LOG=path`` appends one line per example: the family, the outcome (equal /
refused / equal+variant-refused / equal-float16 or -bfloat16 / rejected when transformers itself refuses or
cannot run the config)
and, for a refusal, the config fields it names. The strategies draw each setting companion refuses
only now and then (``_mostly``), so that most examples (about 85% per family at N=100) end in a logit
comparison while every refusal is still reached.

The fields each family reads, as checked in transformers 5.24 (``transformers/models/<family>/
configuration_<family>.py`` and ``modeling_<family>.py``; RoPE in ``modeling_rope_utils.py``):
- all Llama-named families: vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
  num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, tie_word_embeddings,
  max_position_embeddings, rope_parameters (rope_type, rope_theta, factor, low/high_freq_factor,
  original_max_position_embeddings, beta_fast, beta_slow, truncate, attention_factor, mscale,
  mscale_all_dim), hidden_act.
- Llama: attention_bias (q, k, v and o), mlp_bias.
- Mistral, Mixtral: sliding_window (every layer); Mixtral: num_local_experts, num_experts_per_tok.
- Qwen2 / Qwen3: use_sliding_window, sliding_window, max_window_layers (builds layer_types when absent),
  layer_types; Qwen3: attention_bias; Qwen2: q, k, v biases always, none on o.
- Qwen3-MoE: use_sliding_window, sliding_window (every layer; no layer_types), attention_bias,
  num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, mlp_only_layers,
  decoder_sparse_step.
- Gemma 2: hidden_activation, query_pre_attn_scalar, sliding_window, layer_types,
  attn_logit_softcapping, final_logit_softcapping, attention_bias.
- Gemma 3 text: as Gemma 2 but rope_parameters per layer type and no attention soft-cap applied
  (Gemma3Attention does not pass attn_logit_softcapping on), use_bidirectional_attention.
- gpt-oss: sliding_window, layer_types, num_local_experts, num_experts_per_tok, attention_bias,
  swiglu_alpha, swiglu_limit (GptOssExperts).
- DeepSeek-V3: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
  n_routed_experts, n_shared_experts, moe_intermediate_size, num_experts_per_tok, n_group,
  topk_group, first_k_dense_replace, routed_scaling_factor, norm_topk_prob, rope_interleave,
  attention_bias, and mscale_all_dim for every non-default rope_type (yarn_apply_mscale).
- GPT-2: n_embd, n_head, n_layer, n_positions, n_inner, activation_function, layer_norm_epsilon,
  scale_attn_weights, scale_attn_by_inverse_layer_idx, tie_word_embeddings.
"""

import copy
import dataclasses
import os
import re
import tempfile

import pytest
import torch

transformers = pytest.importorskip("transformers")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, reject, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from companion.hf import from_hf, to_hf  # noqa: E402
from companion.models import Decoder, DecoderConfig  # noqa: E402
from hf_support import order_free, randomise, seeded, set_eager_experts  # noqa: E402, F401

SWEEP_DEFAULT = 8
EXAMPLES = int(os.environ.get("COMPANION_HF_SWEEP", SWEEP_DEFAULT))
SWEEP = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=EXAMPLES == SWEEP_DEFAULT,
    suppress_health_check=list(HealthCheck), print_blob=True,
)
EPS32 = torch.finfo(torch.float32).eps
T = 12  # tokens per row; windows are drawn shorter and longer than this
MAX_POSITION = 16_384  # max_position_embeddings of the RoPE families: room for positions past 10,000

# ----------------------------------------------------------------------------------- the comparison


def _batch(vocab, data, positions=True):
    """Two rows of T tokens, row 0 left-padded, and the position values of the columns: 0..T-1, or (not
    for GPT-2's learned table) values with gaps, a restart (two sequences side by side), or past 10,000;
    transformers and companion alike mask by token index and rotate by these values."""
    idx = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=T, max_size=T), min_size=2, max_size=2)))
    pad = data.draw(st.integers(0, T - 2), label="left padding of row 0")
    keep = torch.ones(2, T, dtype=torch.long)
    keep[0, :pad] = 0
    kind = data.draw(_one_of("arange", "arange", "gaps", "restart", "far") if positions else st.just("arange"),
                     label="position values")
    if kind == "gaps":
        pos = torch.tensor(data.draw(st.lists(st.integers(1, 5), min_size=T, max_size=T))).cumsum(0) - 1
    elif kind == "restart":
        r = data.draw(st.integers(2, T - 2))
        pos = torch.cat((torch.arange(r), torch.arange(T - r)))
    elif kind == "far":
        pos = torch.arange(T) + data.draw(st.integers(10_000, MAX_POSITION - T))
    else:
        pos = torch.arange(T)
    return idx, keep, pos


def _ours(model, idx, keep, pos, dtype=None):
    """Our logits; ``dtype``: the model cast to it first (None: as converted, its dtypes per tensor)."""
    m = model if dtype is None else copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        if isinstance(m, Decoder):
            return m(idx, positions=pos, mask=keep.bool()[:, None, None, :]).double()
        return m(idx).double()


def _theirs(hf_model, idx, keep, pos):
    with torch.no_grad():
        return hf_model(idx, attention_mask=keep, position_ids=pos[None].expand(idx.shape[0], -1)).logits.double()


def _check_equal(ours, hf_model, idx, keep, pos, dtype=torch.float32):
    """Equal logits on every row that is not padding, within 4 times transformers' own error (its model
    against its float64 twin: the same weights, ``.double()``, eager experts; or ours against our float64
    twin where that is larger) plus 8 float32 ulps of the logit scale; ours run in ``dtype`` (None: the
    converted model's own dtypes, for a float16 / bfloat16 model as transformers loads it, where the
    errors are those of the low precision)."""
    padded = isinstance(ours, Decoder)
    if not padded:  # GPT-2 here takes no key mask: compare unpadded rows
        keep = torch.ones_like(keep)
    theirs = _theirs(hf_model, idx, keep, pos)
    exact = torch.zeros_like(theirs)
    twin = set_eager_experts(copy.deepcopy(hf_model).double())
    for r in range(idx.shape[0]):  # each row's tokens alone: a fully masked (padding) query row is NaN in
        pad = int((keep[r] == 0).sum())  # the twin (its softmax runs in float32) and spreads to the others
        exact[r, pad:] = _theirs(twin, idx[r:r + 1, pad:], keep[r:r + 1, pad:], pos[pad:])[0]
    o, o64 = _ours(ours, idx, keep, pos, dtype), _ours(ours, idx, keep, pos, torch.float64)
    valid = keep.bool()
    scale = exact[valid].abs().max().item()
    # transformers' eager softmax runs in float32 even in its twin, which so undercounts its error; our twin
    # is float64 throughout: the larger of the two errors, times 4 (as companion.tolerance.float32_paths_atol)
    err = max((theirs - exact)[valid].abs().max().item(), (o - o64)[valid].abs().max().item())
    tol = 4 * err + 8 * EPS32 * max(scale, 1.0)
    diff = (o - theirs)[valid].abs().max().item()
    assert diff <= tol, f"silent mismatch: max |ours - transformers| = {diff:.3g} > tolerance {tol:.3g} (logits ~{scale:.3g})"


def _dtypes(state: dict) -> dict:
    """How many tensors of each dtype a state dict holds."""
    return {d: sum(t.dtype == d for t in state.values()) for d in {t.dtype for t in state.values()}}


def _names_a_field(err: ValueError, known: set[str]) -> set[str]:
    """The config fields the refusal names (at least one, or the test fails)."""
    msg = str(err)
    assert "has no equivalent for" in msg, msg
    named = set(re.findall(r"(\w+)\s*[=:]", msg)) & known
    assert named, f"the refusal names no config field: {msg}"
    return named


def _known_fields(hf_conf) -> set[str]:
    """Every name a refusal may give: the transformers config's fields (with those nested in
    rope_parameters) and the companion config's."""
    d = hf_conf.to_dict()
    rope = d.get("rope_parameters") or {}
    nested = [rope] + [v for v in rope.values() if isinstance(v, dict)]
    return set(d) | {k for r in nested for k in r} | {f.name for f in dataclasses.fields(DecoderConfig)} | {"arch", "variant"}


def _log(family, outcome, fields=()):
    path = os.environ.get("COMPANION_HF_SWEEP_LOG")
    if path:
        with open(path, "a") as f:
            f.write(" ".join((family, outcome, *sorted(fields))) + "\n")


def _build(cls_name, kwargs, dtype=torch.float32):
    """The transformers model, or a rejected example when transformers itself refuses the config. A
    float16 / bfloat16 model is saved and loaded in that dtype, as a user loads a checkpoint: transformers'
    loader keeps the class's keep-in-float32 tensors in float32 (a model of mixed dtypes)."""
    try:
        conf_name = "Gemma3TextConfig" if cls_name == "Gemma3ForCausalLM" else re.sub("(ForCausalLM|LMHeadModel)$", "Config", cls_name)
        conf = getattr(transformers, conf_name)(**kwargs)
        conf._attn_implementation = "eager"
        with seeded(0):
            model = getattr(transformers, cls_name)(conf)
    except Exception:  # noqa: BLE001 - transformers' own validation (of several exception types)
        _log(cls_name, "rejected")
        reject()
    model = randomise(set_eager_experts(model), 1, std=0.15)
    if dtype != torch.float32:
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager")
        model = set_eager_experts(model).eval()
    return model


def _run(cls_name, kwargs, data, mutations=()):
    kwargs = dict(kwargs)
    relabel = kwargs.pop("_relabel", None)
    dtype = data.draw(_mostly(torch.float32, torch.float16, torch.bfloat16, one_in=5), label="dtype")
    hf_model = _build(cls_name, kwargs, dtype)
    known = _known_fields(hf_model.config)
    idx, keep, pos = _batch(hf_model.config.vocab_size, data, positions=cls_name != "GPT2LMHeadModel")
    try:  # a config transformers accepts but cannot run (e.g. sliding layers without a sliding_window)
        _theirs(hf_model, idx, keep, pos)
    except Exception:  # noqa: BLE001
        _log(cls_name, "rejected")
        reject()
    equal_untied = not hf_model.config.tie_word_embeddings and data.draw(_mostly(False, True, one_in=4),
                                                                         label="untied, equal matrices")
    if equal_untied:  # two matrices with equal values: still untied (transformers keeps them apart)
        with torch.no_grad():
            hf_model.get_output_embeddings().weight.copy_(hf_model.get_input_embeddings().weight)
    if relabel is not None:
        hf_model.config.layer_types = list(hf_model.config.layer_types)
        hf_model.config.layer_types[relabel[0]] = relabel[1]
    try:
        ours = from_hf(hf_model)
    except ValueError as e:
        _log(cls_name, "refused", _names_a_field(e, known))
        return
    back = set_eager_experts(to_hf(ours))
    if equal_untied:
        assert not ours.config.tie_embeddings and not back.config.tie_word_embeddings
    if dtype != torch.float32:  # the tensors transformers keeps in float32 stay float32, both ways
        assert _dtypes(ours.state_dict()).get(torch.float32, 0) == _dtypes(hf_model.state_dict()).get(torch.float32, 0)
        assert _dtypes(back.state_dict()) == _dtypes(hf_model.state_dict())
        _check_equal(ours, hf_model, idx, keep, pos, dtype=None)
        _log(cls_name, f"equal-{str(dtype).removeprefix('torch.')}")
        return
    _check_equal(ours, hf_model, idx, keep, pos)  # transformers -> companion
    _check_equal(ours, back, idx, keep, pos)  # and back
    if mutations and isinstance(ours, Decoder):  # a companion-side variant of the same family
        field, value = data.draw(st.sampled_from(mutations), label="companion-side change")
        try:
            variant = Decoder(dataclasses.replace(ours.config, **{field: value}))
        except ValueError:  # not a valid companion config
            _log(cls_name, "equal")
            return
        randomise(variant, 2, std=0.15)
        try:
            exported = set_eager_experts(to_hf(variant, arch=hf_model.config.model_type))
        except ValueError as e:
            _log(cls_name, "equal+variant-refused", _names_a_field(e, known))
            return
        _check_equal(variant, exported, idx, keep, pos)
    _log(cls_name, "equal")


# ----------------------------------------------------------------------------------- strategies

def _one_of(*xs):
    return st.sampled_from(xs)


def _mostly(usual, *rare, one_in=10):
    """``usual``, and about one draw in ``one_in`` one of ``rare``: the settings companion refuses stay
    drawn, but most examples end in a logit comparison. ``usual`` is a value or a strategy. (The rare
    branch is the top of the range: hypothesis draws the bottom, 0, far more often than 1 / one_in.)"""
    common = usual if isinstance(usual, st.SearchStrategy) else st.just(usual)
    return st.integers(0, one_in - 1).flatmap(lambda i: st.sampled_from(rare) if i == one_in - 1 else common)


@st.composite
def rope_parameters(draw, head_dim, theta=None, mscales=False):
    """One rope_parameters dict: every rope_type, with its optional fields present or not."""
    rp = {"rope_type": draw(_mostly(_one_of("default", "default", "linear", "llama3", "yarn", "yarn"), "dynamic",
                                    one_in=20)),
          "rope_theta": theta or draw(_one_of(100.0, 10_000.0, 1e6))}
    kind = rp["rope_type"]
    if kind != "default":
        rp["factor"] = draw(_one_of(1.0, 2.0, 4.0, 16.0))
    if kind == "llama3":
        rp.update(low_freq_factor=draw(_one_of(1.0, 2.0)), high_freq_factor=draw(_one_of(4.0, 8.0)),
                  original_max_position_embeddings=draw(_one_of(8, 16, 32)))
    if kind == "yarn":
        rp["original_max_position_embeddings"] = draw(_one_of(8, 16, 32))
        for key, values in (("beta_fast", (8.0, 32.0)), ("beta_slow", (0.5, 1.0, 2.0)), ("truncate", (True, False)),
                            ("attention_factor", (0.8, 1.2))):
            if draw(st.booleans()):
                rp[key] = draw(st.sampled_from(values))
    if kind != "default" and (mscales or kind == "yarn") and draw(st.booleans()):
        rp.update(mscale=draw(_one_of(0.5, 0.707, 1.0)), mscale_all_dim=draw(_one_of(0.0, 0.8, 1.0, 1.3)))
    return rp


@st.composite
def llama_sizes(draw):
    """The size fields every Llama-named family reads; head_dim apart from hidden / heads."""
    heads = draw(_one_of(1, 2, 3, 4, 6))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    head_dim = draw(_one_of(4, 6, 8, 12, 16))
    layers = draw(st.integers(1, 4))
    return dict(
        vocab_size=draw(_one_of(32, 61, 128)), hidden_size=heads * draw(_one_of(4, 6, 8)), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, intermediate_size=draw(_one_of(16, 40)),
        rms_norm_eps=draw(_one_of(1e-6, 1e-5)), tie_word_embeddings=draw(st.booleans()),
        max_position_embeddings=MAX_POSITION,
        rope_parameters=draw(rope_parameters(head_dim)),
    )


def _window(none=True):
    return _one_of(*((None,) if none else ()), 1, 3, 5, T, 40)


def _layer_types(draw, layers):
    """Sliding / full in any order."""
    return draw(st.lists(_one_of("sliding_attention", "full_attention"), min_size=layers, max_size=layers))


def _relabel(draw, kw):
    """Now and then one layer relabelled, after the model is built, as a kind the companion does not model
    (these classes cannot run such a layer: the relabelling must be refused, by name)."""
    if draw(_mostly(False, True, one_in=15)):
        kw["_relabel"] = (draw(st.integers(0, kw["num_hidden_layers"] - 1)), draw(_one_of("chunked_attention", "linear_attention")))
    return kw


_COMMON_MUTATIONS = (("tie_embeddings", True), ("tie_embeddings", False), ("window", 3), ("window", None),
                     ("global_every", 2), ("global_every", None), ("attn_softcap", 3.0), ("final_softcap", 4.0),
                     ("rope_truncate", False), ("attn_bias", True), ("attn_bias", False), ("qk_norm", True))


def _top_k(draw, e):
    """Experts per token: any of 1..e, and every expert (top_k = e) often."""
    return draw(st.one_of(st.just(e), st.integers(1, e)))


@st.composite
def llama(draw):
    kw = draw(llama_sizes())
    kw.update(attention_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()), hidden_act=draw(_mostly("silu", "gelu")))
    return kw


@st.composite
def mistral(draw):
    return dict(draw(llama_sizes()), sliding_window=draw(_window()))


@st.composite
def mixtral(draw):
    e = draw(st.integers(1, 5))
    return dict(draw(llama_sizes()), sliding_window=draw(_window()), num_local_experts=e, num_experts_per_tok=_top_k(draw, e),
                router_jitter_noise=0.0)


@st.composite
def qwen(draw):
    kw = draw(llama_sizes())
    layers = kw["num_hidden_layers"]
    kw.update(use_sliding_window=draw(st.booleans()), sliding_window=draw(_window()),
              max_window_layers=draw(st.integers(0, layers)), attention_bias=draw(st.booleans()))
    if draw(st.booleans()):
        kw["layer_types"] = _layer_types(draw, layers)
        _relabel(draw, kw)
    return kw


@st.composite
def qwen3_moe(draw):
    kw = draw(llama_sizes())
    layers, e = kw["num_hidden_layers"], draw(st.integers(1, 5))
    kw.update(use_sliding_window=draw(st.booleans()), sliding_window=draw(_window()), attention_bias=draw(st.booleans()),
              num_experts=e, num_experts_per_tok=_top_k(draw, e), moe_intermediate_size=draw(_one_of(8, 24)),
              norm_topk_prob=draw(st.booleans()), decoder_sparse_step=draw(_one_of(1, 1, 2)),
              mlp_only_layers=sorted(draw(st.sets(st.integers(0, layers - 1)))))
    return kw


@st.composite
def gemma2(draw):
    kw = draw(llama_sizes())
    kw.update(sliding_window=draw(_window(none=False)), layer_types=_layer_types(draw, kw["num_hidden_layers"]),
              attn_logit_softcapping=draw(_one_of(None, 2.0, 50.0)), final_logit_softcapping=draw(_one_of(None, 3.0, 30.0)),
              query_pre_attn_scalar=draw(_one_of(4, 16, 24)), attention_bias=draw(st.booleans()),
              hidden_activation=draw(_mostly("gelu_pytorch_tanh", "gelu", one_in=15)))
    return _relabel(draw, kw)


@st.composite
def gemma3_text(draw):
    kw = draw(gemma2())
    full = draw(rope_parameters(kw["head_dim"]))
    # sliding layers: mostly the released checkpoints' plain RoPE of base 10,000; sometimes the full layers'
    # RoPE; sometimes another scaled one (refused when both layer kinds are present and both are scaled)
    local = draw(_mostly(_mostly({"rope_type": "default", "rope_theta": 10_000.0}, dict(full), one_in=8),
                         "other", one_in=12))
    if local == "other":
        local = draw(rope_parameters(kw["head_dim"], theta=10_000.0))
    kw["rope_parameters"] = {"sliding_attention": dict(local), "full_attention": full}
    kw["use_bidirectional_attention"] = draw(_mostly(False, True, one_in=15))
    return kw


@st.composite
def gpt_oss(draw):
    kw = draw(llama_sizes())
    e = draw(st.integers(1, 5))
    kw.update(sliding_window=draw(_window(none=False)), layer_types=_layer_types(draw, kw["num_hidden_layers"]),
              num_local_experts=e,
              num_experts_per_tok=_top_k(draw, e), attention_bias=draw(_one_of(True, True, False)),
              swiglu_limit=draw(_one_of(7.0, 7.0, 2.0)), swiglu_alpha=draw(_one_of(1.702, 1.0)), router_aux_loss_coef=0.01)
    return _relabel(draw, kw)


@st.composite
def deepseek_v3(draw):
    kw = draw(llama_sizes())
    kw.pop("head_dim")
    groups = draw(_one_of(1, 1, 2, 3))
    e = groups * draw(st.integers(1, 3))  # DeepseekV3TopkRouter scores a group by its top two (1: rejected)
    rope_dim = draw(_one_of(2, 4, 8))
    kw.update(
        q_lora_rank=draw(_one_of(None, 12, 24)), kv_lora_rank=draw(_one_of(8, 16)), qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=draw(_one_of(4, 8)), v_head_dim=draw(_one_of(4, 8, 12)), n_routed_experts=e,
        n_shared_experts=draw(_one_of(0, 1, 2)), moe_intermediate_size=draw(_one_of(8, 16)),
        num_experts_per_tok=_top_k(draw, e), n_group=groups, topk_group=draw(st.integers(1, groups)),
        first_k_dense_replace=draw(st.integers(0, kw["num_hidden_layers"])),
        routed_scaling_factor=draw(_one_of(1.0, 2.5)), norm_topk_prob=draw(st.booleans()),
        rope_interleave=draw(st.booleans()), num_key_value_heads=kw["num_attention_heads"],
        rope_parameters=draw(rope_parameters(rope_dim, mscales=True)),
    )
    return kw


@st.composite
def gpt2(draw):
    heads = draw(_one_of(1, 2, 4))
    return dict(
        vocab_size=draw(_one_of(32, 61)), n_positions=64, n_embd=heads * draw(_one_of(4, 8)), n_layer=draw(st.integers(1, 3)),
        n_head=heads, n_inner=draw(_mostly(None, 40, one_in=12)),
        activation_function=draw(_mostly(_one_of("gelu_new", "gelu_new", "gelu_pytorch_tanh"), "relu", one_in=12)),
        layer_norm_epsilon=draw(_one_of(1e-5, 1e-3)), tie_word_embeddings=draw(_mostly(True, False, one_in=12)),
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )


FAMILIES = {
    "gpt2": ("GPT2LMHeadModel", gpt2),
    "llama": ("LlamaForCausalLM", llama),
    "mistral": ("MistralForCausalLM", mistral),
    "mixtral": ("MixtralForCausalLM", mixtral),
    "qwen2": ("Qwen2ForCausalLM", qwen),
    "qwen3": ("Qwen3ForCausalLM", qwen),
    "qwen3_moe": ("Qwen3MoeForCausalLM", qwen3_moe),
    "gemma2": ("Gemma2ForCausalLM", gemma2),
    "gemma3_text": ("Gemma3ForCausalLM", gemma3_text),
    "gpt_oss": ("GptOssForCausalLM", gpt_oss),
    "deepseek_v3": ("DeepseekV3ForCausalLM", deepseek_v3),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sweep_equal_logits_or_named_refusal(family):
    cls_name, strategy = FAMILIES[family]

    @SWEEP
    @given(kwargs=strategy(), data=st.data())
    def check(kwargs, data):
        _run(cls_name, kwargs, data, mutations=_COMMON_MUTATIONS if family != "gpt2" else ())

    check()
