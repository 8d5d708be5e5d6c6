"""Regressions for the seven defect classes of issue 23 (each failed before its fix): a silent logit
mismatch with transformers 5.24 or a crash inside it, where the conversion must either compute what
transformers computes or refuse with a ValueError naming the field."""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from companion.hf import from_hf, hf_config, to_hf  # noqa: E402
from companion.models import from_preset  # noqa: E402
from companion.positions import rope_inverse_frequencies  # noqa: E402
from hf_support import assert_same_logits, hf_model_of, order_free, randomise, tokens  # noqa: E402, F401


def _both_ways(model, T=24, seed=1):
    """to_hf and back from an HF model of the same config: equal logits each time."""
    hf_model = to_hf(model)
    idx = tokens(model.config.vocab_size, T, seed)
    assert_same_logits(model, hf_model, idx)
    theirs = hf_model_of(hf_config(model), seed + 1)
    assert_same_logits(from_hf(theirs), theirs, idx)
    return hf_model


def _m(k, s):
    return 0.1 * k * math.log(s) + 1.0


# 1. YaRN's temperature m(mscale) / m(mscale_all_dim): the mscale argument was overwritten with 1.
def test_yarn_temperature_reads_mscale_and_mscale_all_dim():
    s = 8.0
    _, t = rope_inverse_frequencies(16, 10_000.0, "yarn_hf", s, 64, mscale=0.707, mscale_all_dim=1.3)
    assert t == pytest.approx(_m(0.707, s) / _m(1.3, s))
    llama = randomise(from_preset("llama-like", rope_scaling="yarn_hf", rope_factor=s, rope_original_max_len=16,
                                  rope_mscale=2.0, rope_mscale_all_dim=1.0), 3)
    _both_ways(llama)
    deepseek = randomise(from_preset("deepseek-like", rope_scaling="yarn_hf", rope_factor=s, rope_original_max_len=16,
                                     rope_mscale=0.5, rope_mscale_all_dim=1.0), 4, 0.15)
    _both_ways(deepseek)


# 2. DeepSeek-V3 multiplies the softmax scale by m(mscale_all_dim)^2 for every non-default rope type.
@pytest.mark.parametrize("rope", [dict(rope_scaling="pi", rope_factor=4.0),
                                  dict(rope_scaling="llama3", rope_factor=4.0, rope_original_max_len=16)])
def test_deepseek_softmax_scale_correction_for_every_rope_type(rope):
    model = randomise(from_preset("deepseek-like", rope_mscale_all_dim=0.8, **rope), 5, 0.15)
    hf_model = _both_ways(model)
    assert hf_model.config.rope_parameters["mscale_all_dim"] == 0.8


# 3. Qwen3-MoE reads no layer_types: every layer gets the window.
def test_qwen3_moe_interleaved_windows_refused_and_layer_types_ignored_on_import():
    moe = dict(n_experts=4, top_k=2, moe_d_ff=32, window=4)
    with pytest.raises(ValueError, match="global_every"):
        to_hf(from_preset("qwen3-like", global_every=2, **moe))
    model = randomise(from_preset("qwen3-like", **moe), 6)
    h = hf_config(model)
    h.layer_types = ["full_attention", "sliding_attention"]  # what the old export wrote; the class ignores it
    theirs = hf_model_of(h, 7)
    back = from_hf(theirs)
    assert back.config.layer_windows() == [4, 4]
    assert_same_logits(back, theirs, tokens(256, 16, 8))


# 4. Gemma 3's attention does not soft-cap its scores (attn_logit_softcapping is read, never applied).
def test_gemma3_attn_logit_softcapping_matches_transformers_or_is_refused():
    with pytest.raises(ValueError, match="attn_softcap"):
        to_hf(from_preset("gemma3-like", attn_softcap=3.0))
    h = hf_config(from_preset("gemma3-like"))
    h.attn_logit_softcapping = 3.0
    theirs = hf_model_of(h, 9)
    back = from_hf(theirs)
    assert back.config.attn_softcap is None
    assert_same_logits(back, theirs, tokens(256, 24, 10))
    assert to_hf(from_preset("gemma2-like", attn_softcap=3.0)).config.attn_logit_softcapping == 3.0  # Gemma 2 caps


# 5. Gemma 3 reads YaRN's truncate from the top of rope_parameters (a dict per layer type): always True.
def test_gemma3_yarn_truncate_false_matches_transformers_or_is_refused():
    yarn = dict(rope_scaling="yarn_hf", rope_factor=8.0, rope_original_max_len=16, rope_scaling_layers="global")
    with pytest.raises(ValueError, match="rope_truncate"):
        to_hf(from_preset("gemma3-like", rope_truncate=False, **yarn))
    h = hf_config(from_preset("gemma3-like", **yarn))
    h.rope_parameters["full_attention"]["truncate"] = False
    theirs = hf_model_of(h, 11)
    back = from_hf(theirs)
    assert back.config.rope_truncate
    assert_same_logits(back, theirs, tokens(256, 24, 12))


# 6. No windowed layer: sliding_window=None crashed Gemma 2 / 3 and gpt-oss at their first forward.
@pytest.mark.parametrize("preset", ["gemma2-like", "gemma3-like", "gpt-oss-like"])
def test_export_without_windowed_layers_runs_in_transformers(preset):
    model = randomise(from_preset(preset, window=None, global_every=None), 13, 0.12)
    hf_model = _both_ways(model, T=20)
    assert set(hf_model.config.layer_types) == {"full_attention"}


# 7. Layer types other than sliding / full attention are refused, naming the field.
@pytest.mark.parametrize("kind", ["chunked_attention", "linear_attention"])
def test_unknown_layer_types_refused(kind):
    h = hf_config(from_preset("gemma2-like"))
    h.layer_types = [kind if t == "full_attention" else t for t in h.layer_types]  # was read as full attention
    with pytest.raises(ValueError, match="layer_types"):
        from_hf(transformers.Gemma2ForCausalLM(h))
