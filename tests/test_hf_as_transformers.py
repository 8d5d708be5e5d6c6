"""The converter decides what transformers' class decides (issue 46): RoPE frequencies, the soft-cap
mask, keys a class never reads, ties, float32-kept tensors, zero shared experts, activation aliases.
Each test failed on 26bdf99 (a silent logit difference, a wrong dtype, a crash or a refusal) and
compares within transformers' own float32 (or float16 / bfloat16) error, measured against its float64
twin (hf_support.transformers_atol); MoE models run transformers' eager experts (hf_support)."""

import copy
import tempfile

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from companion.hf import from_hf, hf_config, to_hf  # noqa: E402
from companion.models import from_preset, gpt_from_preset  # noqa: E402
from hf_support import (  # noqa: E402, F401
    hf_model_of, max_logit_difference, order_free, randomise, set_eager_experts, tokens, transformers_atol,
)

# ----------------------------------------------------------------------------------- A. RoPE frequencies

ROPES = {  # every rope_type the package converts, with the optional fields that change theta_i
    "default": dict(),
    "linear": dict(rope_scaling="pi", rope_factor=4.0),
    "llama3": dict(rope_scaling="llama3", rope_factor=8.0, rope_original_max_len=64),
    "yarn": dict(rope_scaling="yarn_hf", rope_factor=4.0, rope_original_max_len=64),
    "yarn-untruncated": dict(rope_scaling="yarn_hf", rope_factor=4.0, rope_original_max_len=64, rope_truncate=False,
                             rope_attention_factor=1.2),
}


def _their_frequencies(hf_model):
    """(layer type or "", inv_freq, attention scaling) from transformers' own rope init functions."""
    rotary, config = hf_model.model.rotary_emb, hf_model.config
    kinds = sorted(set(config.layer_types)) if config.model_type == "gemma3_text" else [None]
    out = []
    for kind in kinds:
        params = config.rope_parameters[kind] if kind else config.rope_parameters
        fn = (type(rotary).compute_default_rope_parameters if params["rope_type"] == "default"
              else ROPE_INIT_FUNCTIONS[params["rope_type"]])
        inv, scaling = fn(config, layer_type=kind) if kind else fn(config)
        out.append((kind or "", inv, scaling))
    return out


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("preset", ["llama-like", "qwen3-like", "gemma3-like", "gpt-oss-like", "deepseek-like"])
def test_inverse_frequencies_are_transformers_own(preset, rope):
    overrides = dict(ROPES[rope])
    if preset == "gemma3-like" and overrides:
        overrides.update(rope_scaling_layers="global", rope_truncate=True)  # Gemma 3 always truncates YaRN
    if preset == "gpt-oss-like":
        overrides = dict(dict(rope_scaling=None, rope_truncate=True), **overrides)
    theirs = hf_model_of(hf_config(from_preset(preset, **overrides)), 1, 0.12)
    ours = from_hf(theirs)
    types = list(getattr(theirs.config, "layer_types", None) or [])
    wanted = {kind: (inv, scaling) for kind, inv, scaling in _their_frequencies(theirs)}
    for i, layer in enumerate(ours.layers):
        inv, scaling = wanted[types[i] if preset == "gemma3-like" else ""]
        assert layer.attn.rope.inv_freq.dtype == torch.float32
        assert torch.equal(layer.attn.rope.inv_freq, inv), (i, (layer.attn.rope.inv_freq - inv).abs().max())
        assert layer.attn.rope.mscale == scaling


@pytest.mark.parametrize("preset", ["llama-like", "qwen3-like", "gemma3-like", "deepseek-like"])
def test_logits_equal_at_positions_up_to_40000(preset):
    """26bdf99 (float64 frequencies rounded once): up to 6.6e-5 (llama), 2.3e-4 (qwen3), 6.2e-5 (gemma3)
    at positions 3,000-40,000, against tolerances of 1.2e-5 to 2e-5; now 1.9e-6 to 3.1e-6."""
    theirs = hf_model_of(hf_config(from_preset(preset, max_seq_len=1 << 16)), 2, 0.12)
    ours = from_hf(theirs)
    idx = tokens(theirs.config.vocab_size, 6, 3)
    for start in (3_000, 8_000, 20_000, 40_000):
        diff, atol = max_logit_difference(ours, theirs, idx, torch.arange(start, start + 6))
        assert diff <= atol, (start, diff, atol)


def test_given_frequencies_are_checked():
    from companion.positions import RotaryEmbedding

    with pytest.raises(ValueError, match="inv_freq"):
        RotaryEmbedding(8, inv_freq=torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="inv_freq"):
        RotaryEmbedding(8, inv_freq=torch.ones(3))
    with pytest.raises(ValueError, match="inv_freq"):
        RotaryEmbedding(8, inv_freq=-torch.ones(4))
    given = RotaryEmbedding(8, inv_freq=torch.full((4,), 0.5), temperature=1.5)
    assert torch.equal(given.inv_freq, torch.full((4,), 0.5)) and given.mscale == 1.5


# ----------------------------------------------------------------------------------- B. the soft-cap mask

POSITIONS = {  # position values that are not 0..T-1: gaps, restarts, and past 10,000
    "gaps": [0, 1, 2, 5, 6, 7, 20, 21, 22, 23, 24, 30],
    "restarts": [0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2],
    "far": list(range(12_000, 12_012)),
}


@pytest.mark.parametrize("positions", list(POSITIONS))
@pytest.mark.parametrize("preset,overrides", [
    ("gemma2-like", dict(attn_softcap=3.0, window=4)),  # the soft-cap path: 26bdf99 masked by value, 4.5-6.3 off
    ("gemma2-like", dict(attn_softcap=None, window=4)),
    ("mistral-like", dict(window=3)),
    ("llama-like", dict()),
])
def test_masks_by_token_index_whatever_the_position_values(preset, overrides, positions):
    theirs = hf_model_of(hf_config(from_preset(preset, max_seq_len=1 << 14, **overrides)), 4, 0.15)
    ours = from_hf(theirs)
    idx = tokens(theirs.config.vocab_size, 12, 5)
    diff, atol = max_logit_difference(ours, theirs, idx, torch.tensor(POSITIONS[positions]))
    assert diff <= atol, (diff, atol)


# ----------------------------------------------------------------------------------- C. keys never read


@pytest.mark.parametrize("keys", [dict(sliding_window=3), dict(sliding_window=3, layer_types=["sliding_attention"] * 2),
                                  dict(use_sliding_window=True, sliding_window=3)])
def test_keys_llama_never_reads_change_nothing(keys):
    """LlamaForCausalLM reads no sliding_window: 26bdf99 built a windowed model, 7.3-9.6 apart here."""
    h = transformers.LlamaConfig(**{**hf_config(from_preset("llama-like")).to_dict(), **keys})
    theirs = hf_model_of(h, 6)
    ours = from_hf(theirs)
    assert ours.config.layer_windows() == [None] * ours.config.n_layers
    diff, atol = max_logit_difference(ours, theirs, tokens(h.vocab_size, 16, 7))
    assert diff <= atol, (diff, atol)


def test_attention_bias_on_mistral_is_ignored_as_transformers_does():
    """MistralAttention builds q, k, v and o without biases whatever attention_bias says (26bdf99 refused:
    "the source model has no tensor q_proj.bias")."""
    for arch in ("mistral", "mixtral"):
        h = hf_config(from_preset(f"{arch}-like"))
        h.attention_bias = True
        theirs = hf_model_of(h, 8)
        ours = from_hf(theirs)
        assert not ours.config.attn_bias
        diff, atol = max_logit_difference(ours, theirs, tokens(h.vocab_size, 16, 9))
        assert diff <= atol, (arch, diff, atol)


# ----------------------------------------------------------------------------------- D. ties


def _sgd_step(model, logits_of, idx):
    """One SGD step of lr 0.5 on the mean log-probability of ``idx`` shifted by one."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    logits = logits_of(model, idx)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    model.eval()


@pytest.mark.parametrize("preset", ["llama-like", "mistral-like", "qwen3-like", "gemma3-like", "gpt-oss-like"])
def test_untied_model_with_equal_matrices_stays_untied(preset):
    """26bdf99 tied by equal values: logits equal at first, 1.1-3.0 apart after one identical SGD step."""
    theirs = hf_model_of(hf_config(from_preset(preset, tie_embeddings=False)), 10, 0.12)
    with torch.no_grad():
        theirs.lm_head.weight.copy_(theirs.get_input_embeddings().weight)  # equal, not one tensor
    ours = from_hf(theirs)
    assert not ours.config.tie_embeddings and ours.lm_head.weight.data_ptr() != ours.embed.weight.data_ptr()
    idx = tokens(theirs.config.vocab_size, 12, 11)
    _sgd_step(ours.train(), lambda m, x: m(x), idx)
    _sgd_step(theirs.train(), lambda m, x: m(x).logits, idx)
    diff, atol = max_logit_difference(ours, theirs, idx)
    # the forward after the step is bounded by atol (its rounding, measured on transformers' side); the step
    # itself moved the weights by lr times a float32 gradient on each side, the backward of the same
    # forward, whose rounding is of the same size again: twice the bound (26bdf99: 1.1-3.0 apart)
    assert diff <= 2 * atol, (diff, atol)
    exported = to_hf(ours)
    assert not exported.config.tie_word_embeddings


def test_to_hf_of_an_untied_model_with_equal_matrices_stays_untied():
    model = randomise(from_preset("llama-like", tie_embeddings=False), 12)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.embed.weight)
    exported = to_hf(model)
    assert not exported.config.tie_word_embeddings
    assert exported.lm_head.weight.data_ptr() != exported.get_input_embeddings().weight.data_ptr()
    tied = randomise(from_preset("llama-like", tie_embeddings=True), 12)
    assert to_hf(tied).config.tie_word_embeddings and from_hf(to_hf(tied)).config.tie_embeddings


# ----------------------------------------------------------------------------------- E, F. float32-kept tensors


def _loaded(hf_model, dtype):
    """``hf_model`` saved and loaded in ``dtype`` as a user loads a checkpoint (the class's keep-in-float32
    lists applied by transformers' loader), eager attention and experts."""
    with tempfile.TemporaryDirectory() as d:
        hf_model.save_pretrained(d)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager")
    return set_eager_experts(loaded).eval()


@pytest.mark.parametrize("preset,dtype", [("gpt-oss-like", torch.float16), ("deepseek-like", torch.float16),
                                          ("deepseek-like", torch.bfloat16)])
def test_tensors_transformers_keeps_in_float32_stay_float32(preset, dtype):
    """gpt-oss keeps its norm gains in float32 in a float16 model, DeepSeek-V3 its router and correction bias
    in float16 and bfloat16 (the classes' _keep_in_fp32_modules(_strict)); 26bdf99 rounded them to ``dtype``."""
    theirs = _loaded(hf_model_of(hf_config(from_preset(preset)), 13, 0.15), dtype)
    kept = {n: t for n, t in theirs.state_dict().items() if t.dtype == torch.float32 and "inv_freq" not in n}
    assert kept  # what transformers keeps: the test reads it from the model, not from a list of its own
    ours = from_hf(theirs)
    wide = {n: t for n, t in ours.state_dict().items() if t.dtype == torch.float32}
    assert len(wide) == len(kept) and {t.dtype for t in ours.state_dict().values()} == {dtype, torch.float32}
    for name, t in kept.items():  # the same values, unrounded
        assert any(torch.equal(t.reshape(-1), w.reshape(-1)) for w in wide.values()), name
    back = to_hf(ours)
    for name, t in kept.items():
        assert torch.equal(back.state_dict()[name], t), name
    idx = tokens(theirs.config.vocab_size, 12, 14)
    diff, atol = max_logit_difference(ours, theirs, idx)
    assert diff <= atol, (diff, atol)


def test_float32_norm_and_router_compute_as_transformers():
    """Module by module, the same low-precision input: gpt-oss's float32 norm and DeepSeek-V3's float32 router
    give transformers' outputs exactly (26bdf99: the gain rounded to float16, the router to bfloat16)."""
    theirs = _loaded(hf_model_of(hf_config(from_preset("gpt-oss-like")), 15, 0.15), torch.float16)
    ours = from_hf(theirs)
    x = torch.randn(2, 5, theirs.config.hidden_size, generator=torch.Generator().manual_seed(16)).half()
    with torch.no_grad():
        expected = theirs.model.layers[0].input_layernorm(x)
        torch.testing.assert_close(ours.layers[0].attn_norm(x), expected, atol=0, rtol=2 ** -10)
    theirs = _loaded(hf_model_of(hf_config(from_preset("deepseek-like")), 17, 0.15), torch.bfloat16)
    ours = from_hf(theirs)
    layer = next(i for i in range(ours.config.n_layers) if ours.config.is_moe(i))
    x = torch.randn(40, theirs.config.hidden_size, generator=torch.Generator().manual_seed(18)).bfloat16()
    with torch.no_grad():
        _, their_gates, their_ids = theirs.model.layers[layer].mlp.gate(x)
        ids, gates, _ = ours.layers[layer].ffn.route(x)
    order, their_order = ids.sort(-1), their_ids.sort(-1)
    assert torch.equal(order.values, their_order.values)
    assert torch.equal(gates.gather(-1, order.indices), their_gates.gather(-1, their_order.indices))


# ----------------------------------------------------------------------------------- G. zero shared experts


def test_deepseek_without_shared_experts_converts_both_ways():
    """n_shared_experts=0: transformers builds a shared expert of width 0 (it adds zero); 26bdf99 crashed
    in torch.chunk."""
    h = hf_config(from_preset("deepseek-like"))
    h.n_shared_experts = 0
    theirs = hf_model_of(h, 19, 0.15)
    ours = from_hf(theirs)
    assert ours.config.n_shared_experts == 0
    idx = tokens(h.vocab_size, 12, 20)
    diff, atol = max_logit_difference(ours, theirs, idx)
    assert diff <= atol, (diff, atol)
    back = set_eager_experts(to_hf(ours))
    assert back.config.n_shared_experts == 0
    diff, atol = max_logit_difference(ours, back, idx)
    assert diff <= atol, (diff, atol)


# ----------------------------------------------------------------------------------- over-strict refusals


@pytest.mark.parametrize("make,field", [(lambda: hf_config(gpt_from_preset("gpt2-tiny")), "activation_function"),
                                        (lambda: hf_config(from_preset("gemma3-like")), "hidden_activation"),
                                        (lambda: hf_config(from_preset("gemma2-like")), "hidden_activation")])
def test_gelu_accurate_is_the_tanh_gelu(make, field):
    h = make()
    setattr(h, field, "gelu_accurate")
    theirs = hf_model_of(h, 21, 0.15)
    ours = from_hf(theirs)
    diff, atol = max_logit_difference(ours, theirs, tokens(h.vocab_size, 12, 22))
    assert diff <= atol, (diff, atol)
    llama = hf_config(from_preset("llama-like"))
    llama.hidden_act = "gelu_accurate"  # SwiGLU's gate is SiLU: still refused, by name
    with pytest.raises(ValueError, match="hidden_act"):
        from_hf(hf_model_of(llama, 23))
