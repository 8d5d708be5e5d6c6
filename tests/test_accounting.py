"""Formulas in companion.accounting == measured counts and bytes."""

import pytest
import torch

from companion.accounting import decoder_parameters, gpt_parameters, kv_cache_bytes, mla_cache_bytes, seq2seq_parameters
from companion.models import PRESETS, from_preset, gpt_from_preset, preset_config, seq2seq_from_preset


@pytest.mark.parametrize("name", list(PRESETS))
def test_decoder_parameter_formula(name):
    model = from_preset(name)
    assert decoder_parameters(model.config) == model.num_parameters()
    assert decoder_parameters(model.config, active=True) == model.num_parameters(active=True)


def test_variant_and_other_model_formulas():
    cfg = preset_config("llama-like", norm="layer", position="learned", ffn="gelu", attn_bias=True, ffn_bias=True, tie_embeddings=True, sinks=True)
    assert decoder_parameters(cfg) == from_preset("llama-like", norm="layer", position="learned", ffn="gelu", attn_bias=True, ffn_bias=True, tie_embeddings=True, sinks=True).num_parameters()
    for variant in ("gpt1", "gpt2"):
        m = gpt_from_preset("gpt2-tiny", variant=variant)
        assert gpt_parameters(m.config) == m.num_parameters()
    t = seq2seq_from_preset("tiny")
    assert seq2seq_parameters(t.config) == t.num_parameters()
    u = seq2seq_from_preset("tiny", share_embeddings=False)
    assert seq2seq_parameters(u.config) == u.num_parameters()


def test_seed_kv_table():
    L, T, h, dh = 32, 8192, 32, 128
    assert kv_cache_bytes(L, h, dh, T) == 4 * 2**30  # MHA (g = h = 32): 4 GiB
    assert kv_cache_bytes(L, 8, dh, T) == 2**30  # GQA g=8: 1 GiB
    assert kv_cache_bytes(L, 1, dh, T) == 128 * 2**20  # MQA: 128 MiB


@pytest.mark.parametrize("name", ["llama-like", "mistral-like", "deepseek-like"])
def test_cache_bytes_formula_matches_measured(name):
    model = from_preset(name).eval()
    c = model.config
    cache = model.new_cache()
    T = 12 if c.window is None else c.window - 1  # a windowed layer stores w-1 rows between steps
    model(torch.randint(0, 256, (1, T)), cache)
    if c.attention == "mla":
        expected = mla_cache_bytes(c.n_layers, c.kv_rank, c.rope_dim, T, bytes_per_value=4)
    else:
        expected = kv_cache_bytes(c.n_layers, c.kv_heads, c.attn_head_dim, T, bytes_per_value=4)
    assert cache.nbytes() == expected
