"""Per-layer patterns as data (issue 23): one list of windows per layer (None = full attention) and
one of MoE flags per layer, which any order of transformers' layer_types, Qwen2's max_window_layers,
Qwen3-MoE's mlp_only_layers / decoder_sparse_step and DeepSeek-V3's first_k_dense_replace map to;
gpt-oss's swiglu_alpha / swiglu_limit and attention_bias=False."""

import pytest
import torch

from companion.models import Decoder, DecoderConfig, from_preset
from hf_support import assert_same_logits, float64_twin, hf_model_of, order_free, randomise, tokens  # noqa: F401
from tolerances import float32_paths_atol


def test_global_every_builds_the_layer_pattern():
    built = DecoderConfig(n_layers=4, window=3, global_every=2)
    given = DecoderConfig(n_layers=4, layer_pattern=[3, None, 3, None])
    assert built.layer_windows() == given.layer_windows() == [3, None, 3, None]
    assert [built.is_global(i) for i in range(4)] == [given.is_global(i) for i in range(4)]
    a, b = Decoder(built), Decoder(given)
    b.load_state_dict(a.state_dict())
    idx = tokens(256, 10, 0)
    with torch.no_grad():
        assert torch.equal(a(idx), b(idx))
    with pytest.raises(ValueError, match="layer_pattern"):
        DecoderConfig(n_layers=2, window=3, layer_pattern=[3, None])
    with pytest.raises(ValueError, match="layer_pattern"):
        DecoderConfig(n_layers=3, layer_pattern=[3, None])


@pytest.mark.parametrize("pattern", [(None, 4, 4), (None, None, 2), (4, None, None)])
def test_layer_pattern_cached_decode_equals_full_forward(pattern):
    model = randomise(Decoder(DecoderConfig(n_layers=3, n_kv_heads=2, layer_pattern=pattern, n_experts=4, top_k=2,
                                            moe_layers=(True, False, True))), 1, std=0.12)
    idx = tokens(256, 16, 2, B=1)
    with torch.no_grad():
        full, exact = model(idx), float64_twin(model)(idx)
        cache = model.new_cache()
        steps = [model(idx[:, :3], cache)] + [model(idx[:, t: t + 1], cache) for t in range(3, 16)]
    atol = float32_paths_atol(full, exact)  # tolerances: a cached decode and the full forward, both float32
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=atol, rtol=0)
    assert [layer.ffn.__class__.__name__ for layer in model.layers] == ["MoE", "SwiGLU", "MoE"]


transformers = pytest.importorskip("transformers")
from companion.hf import from_hf, hf_config, to_hf  # noqa: E402


def _from_theirs(h, seed, T=16):
    theirs = hf_model_of(h, seed)
    ours = from_hf(theirs)
    idx = tokens(h.vocab_size, T, seed)
    assert_same_logits(ours, theirs, idx)
    assert_same_logits(ours, to_hf(ours), idx)
    return ours


def test_qwen2_max_window_layers_first_layers_full():
    h = hf_config(from_preset("llama-like", n_layers=3, attn_bias=True, attn_out_bias=False))
    h = transformers.Qwen2Config(**{**h.to_dict(), "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1,
                                    "layer_types": None})
    assert h.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    ours = _from_theirs(h, 3)
    assert ours.config.layer_windows() == [None, 4, 4]


@pytest.mark.parametrize("preset", ["gemma2-like", "gemma3-like", "gpt-oss-like"])
def test_layer_types_in_any_order(preset):
    h = hf_config(from_preset(preset, window=3))
    L = h.num_hidden_layers
    h.layer_types = ["full_attention"] + ["sliding_attention"] * (L - 2) + ["full_attention"]
    ours = _from_theirs(h, 4)
    assert ours.config.layer_windows() == [None] + [3] * (L - 2) + [None]


@pytest.mark.parametrize("dense,step", [([1], 1), ([], 2), ([0, 2], 1)])
def test_qwen3_moe_mlp_only_layers_and_sparse_step(dense, step):
    h = hf_config(from_preset("qwen3-like", n_layers=3, n_experts=4, top_k=2, moe_d_ff=32))
    h.mlp_only_layers, h.decoder_sparse_step = dense, step
    ours = _from_theirs(h, 5)
    assert [ours.config.is_moe(i) for i in range(3)] == [i not in dense and (i + 1) % step == 0 for i in range(3)]


def test_deepseek_refuses_dense_layers_after_moe_layers():
    with pytest.raises(ValueError, match="moe_layers"):
        to_hf(from_preset("deepseek-like", first_dense_layers=0, moe_layers=(True, False, True)))
    with pytest.raises(ValueError, match="moe_layers"):
        to_hf(from_preset("mixtral-like", moe_layers=(True, False)))


def test_gpt_oss_swiglu_alpha_limit_and_no_attention_bias():
    h = hf_config(from_preset("gpt-oss-like", window=3))
    h.swiglu_alpha, h.swiglu_limit, h.attention_bias = 1.0, 0.5, False
    ours = _from_theirs(h, 6, T=12)
    assert (ours.config.swiglu_alpha, ours.config.swiglu_limit, ours.config.attn_bias) == (1.0, 0.5, False)
