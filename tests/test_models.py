"""Every model: cached incremental decoding == no-cache forward, prefix invariance, validation, sizes."""

import pytest
import torch

from companion.models import (
    GPT, GPT_PRESETS, PRESETS, SEQ2SEQ_PRESETS, Decoder, DecoderConfig, Seq2SeqConfig, Seq2SeqTransformer, from_preset,
    gpt_from_preset, preset_config, preset_family, seq2seq_from_preset,
)
from companion.models.gpt import GPTConfig
from tolerances import float64_twin_atol

# tolerances: a cached decode against the full forward, a prefix against the whole, a model against its
# written-out form: two float32 computations of one function, within float64_twin_atol of each other (4 times
# the full forward's own float32 error, measured against its float64 twin, plus 8 ulps; tests/tolerances.py)


def _call(model, *args):
    return model(*args)


def _incremental(model, idx, prefill):
    cache = model.new_cache()
    outs = [model(idx[:, :prefill], cache)]
    outs += [model(idx[:, t : t + 1], cache) for t in range(prefill, idx.shape[1])]
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_cached_decoding_equals_full_forward(name):
    torch.manual_seed(0)
    model = from_preset(name).eval()
    idx = torch.randint(0, model.config.vocab_size, (2, 24))  # longer than every toy window
    full, atol = model(idx), float64_twin_atol(_call, model, idx)
    inc, cache = _incremental(model, idx, prefill=5)
    torch.testing.assert_close(inc, full, atol=atol, rtol=0)
    assert cache.length == 24
    for w, layer in zip(model.config.layer_windows(), cache.layers):
        if w is not None and model.config.attention == "mha":
            assert layer.stored <= w - 1 + model.config.keep  # local layers keep a bounded ring


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_causal_prefix_invariance(name):
    torch.manual_seed(1)
    model = from_preset(name).eval()
    idx = torch.randint(0, 256, (1, 12))
    short = model(idx[:, :7])
    torch.testing.assert_close(model(idx)[:, :7], short, atol=float64_twin_atol(_call, model, idx), rtol=0)


def test_deepseek_absorbed_decode_matches_expanded():
    torch.manual_seed(2)
    model = from_preset("deepseek-like").eval()
    idx = torch.randint(0, 256, (2, 10))
    full, atol = model(idx), float64_twin_atol(_call, model, idx)
    for layer in model.layers:
        layer.attn.absorbed = True
    inc, _ = _incremental(model, idx, prefill=3)
    torch.testing.assert_close(inc, full, atol=atol, rtol=0)


def test_one_choice_at_a_time_variants_run_and_cache():
    torch.manual_seed(3)
    variants = [
        dict(norm="layer", norm_placement="post", position="learned", ffn="gelu", attn_bias=True, ffn_bias=True),
        dict(position="alibi", n_kv_heads=1),
        dict(position="sinusoidal", scale_embeddings=True, tie_embeddings=True),
        dict(window=4, keep=2, sinks=True, global_every=2),
        dict(rope_scaling="ntk", rope_factor=2.0, backend="reference"),
    ]
    for overrides in variants:
        model = from_preset("llama-like", **overrides).eval()
        idx = torch.randint(0, 256, (2, 14))
        inc, _ = _incremental(model, idx, prefill=4)
        atol = float64_twin_atol(_call, model, idx)
        torch.testing.assert_close(inc, model(idx), atol=atol, rtol=0, msg=str(overrides))


def test_moe_reports_expert_load_and_gradients_reach_the_router():
    torch.manual_seed(4)
    model = from_preset("mixtral-like")
    idx = torch.randint(0, 256, (2, 16))
    logits = model(idx)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()) + model.aux_loss()
    loss.backward()
    load = model.expert_load()
    assert set(load) == {0, 1} and all(v.sum().item() == 2 * 16 * 2 for v in load.values())
    assert model.layers[0].ffn.router.weight.grad is not None
    ds = from_preset("deepseek-like")
    ds(idx)
    before = ds.layers[1].ffn.balance_bias.clone()
    ds.update_expert_bias()
    assert not torch.equal(before, ds.layers[1].ffn.balance_bias)


def test_parameter_counts():
    llama = from_preset("llama-like")
    c = llama.config
    d, V, L, f = c.d_model, c.vocab_size, c.n_layers, c.ffn_hidden
    per_layer = d * (c.n_heads + 2 * c.kv_heads) * c.attn_head_dim + c.n_heads * c.attn_head_dim * d + 3 * d * f + 2 * d
    assert llama.num_parameters() == 2 * V * d + L * per_layer + d
    mix = from_preset("mixtral-like")
    expert = 3 * d * mix.config.moe_d_ff
    assert mix.num_parameters() - mix.num_parameters(active=True) == L * (8 - 2) * expert
    g3 = from_preset("gemma3-like")
    assert g3.lm_head.weight.data_ptr() == g3.embed.weight.data_ptr()
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        gpt2, base = from_preset("gpt2").num_parameters(), from_preset("base").num_parameters()
    assert gpt2 == 124_439_808  # GPT-2 small, tied embeddings
    assert abs(base - 65e6) / 65e6 < 0.05  # the paper's "65M" for the base model


def test_gemma3_layout_and_repr():
    model = from_preset("gemma3-like")
    assert model.config.layer_windows() == [8, 8, 8, 8, 8, None]
    bases = [layer.attn.rope.base for layer in model.layers]
    assert bases == [10000.0] * 5 + [1_000_000.0]
    text = repr(model)
    assert "layer 5: global" in text and "MQA" in text


def test_validation_errors():
    with pytest.raises(ValueError, match="unknown preset 'gpt5'; valid presets: llama-like"):
        from_preset("gpt5")
    with pytest.raises(ValueError, match="d_model \\(30\\) must be divisible by n_heads"):
        DecoderConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_heads \\(4\\) must be divisible by n_kv_heads \\(3\\)"):
        DecoderConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="head_dim must be even with RoPE"):
        DecoderConfig(d_model=28, n_heads=4)
    with pytest.raises(ValueError, match="window must be >= 1"):
        DecoderConfig(window=0)
    with pytest.raises(ValueError, match="top_k must satisfy"):
        DecoderConfig(n_experts=2, top_k=3)
    with pytest.raises(ValueError, match="unknown DecoderConfig field"):
        from_preset("llama-like", heads=3)
    model = from_preset("llama-like", max_seq_len=8)
    with pytest.raises(ValueError, match="token ids must be in \\[0, vocab_size=256\\)"):
        model(torch.tensor([[1, 256]]))
    with pytest.raises(ValueError, match="longer than the configured context"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="n_embd \\(10\\) must be divisible by n_heads \\(4\\)|d_model \\(10\\) must be divisible"):
        GPTConfig(n_embd=10, n_head=4)


@pytest.mark.parametrize("variant", ["gpt1", "gpt2"])
def test_gpt_cache_prefix_and_tying(variant):
    torch.manual_seed(5)
    model = from_preset("gpt2-tiny", variant=variant).eval()
    idx = torch.randint(0, 256, (2, 12))
    full, atol = model(idx), float64_twin_atol(_call, model, idx)
    inc, _ = _incremental(model, idx, prefill=4)
    torch.testing.assert_close(inc, full, atol=atol, rtol=0)
    assert model.lm_head.weight is model.wte.weight
    with pytest.raises(ValueError, match="block_size=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_gpt2_block_written_out():
    """GPT-2 forward == a plain re-implementation using torch's own LayerNorm, GELU and SDPA."""
    torch.manual_seed(6)
    model = from_preset("gpt2-tiny").eval()
    idx = torch.randint(0, 256, (2, 9))
    F = torch.nn.functional
    x = model.wte.weight[idx] + model.wpe.weight[:9]
    for b in model.blocks:
        h = F.layer_norm(x, (64,), b.attn_norm.weight, b.attn_norm.bias, 1e-5)
        q, k, v = F.linear(h, b.attn.qkv.weight, b.attn.qkv.bias).split(64, -1)
        q, k, v = (t.view(2, 9, 4, 16).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 9, 64)
        x = x + b.attn.out(a)
        h = F.layer_norm(x, (64,), b.ffn_norm.weight, b.ffn_norm.bias, 1e-5)
        x = x + b.ffn.down(F.gelu(b.ffn.up(h), approximate="tanh"))
    x = F.layer_norm(x, (64,), model.ln_f.weight, model.ln_f.bias, 1e-5)
    torch.testing.assert_close(model(idx), x @ model.wte.weight.T, atol=float64_twin_atol(_call, model, idx), rtol=0)


def test_seq2seq_cache_padding_and_shapes():
    torch.manual_seed(7)
    model = from_preset("tiny").eval()
    src = torch.randint(1, 64, (2, 9))
    src[0, 6:] = model.config.pad_id
    tgt = torch.randint(1, 64, (2, 8))
    full, atol = model(src, tgt), float64_twin_atol(_call, model, src, tgt)
    assert full.shape == (2, 8, 64)
    memory, smask = model.encode(src), model.source_mask(src)
    cache = model.new_cache()
    outs = [model.decode(tgt[:, :3], memory, smask, cache)] + [model.decode(tgt[:, t : t + 1], memory, smask, cache) for t in range(3, 8)]
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=atol, rtol=0)
    # padding is invisible: changing padded source tokens changes nothing
    longer = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], 1)  # extra padding columns
    longer[1, 9:] = 0
    torch.testing.assert_close(model(longer, tgt)[0], full[0], atol=atol, rtol=0)
    assert model.out.weight is model.src_embed.weight is model.tgt_embed.weight
    with pytest.raises(ValueError, match="unknown preset"):
        seq2seq_from_preset("big")


@pytest.mark.parametrize("backend", ["sdpa", "tiled"])
def test_backends_agree_on_a_windowed_preset(backend):
    torch.manual_seed(8)
    ref = from_preset("mistral-like", window=6, backend="reference").eval()
    other = from_preset("mistral-like", window=6, backend=backend).eval()
    other.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 256, (2, 16))
    full, atol = ref(idx), float64_twin_atol(_call, ref, idx)
    torch.testing.assert_close(other(idx), full, atol=atol, rtol=0)
    inc, _ = _incremental(other, idx, prefill=4)
    torch.testing.assert_close(inc, full, atol=atol, rtol=0)


def test_from_preset_builds_every_family_by_name():
    families = {"decoder": (PRESETS, Decoder), "gpt": (GPT_PRESETS, GPT), "seq2seq": (SEQ2SEQ_PRESETS, Seq2SeqTransformer)}
    for family, (presets, cls) in families.items():
        for name in presets:
            assert preset_family(name) == family
            with torch.device("meta"):  # the big presets (gpt2, base) cost nothing here
                model = from_preset(name)
            assert type(model) is cls and model.config.name == name
            # every field the preset sets is in the config it builds
            assert all(getattr(model.config, k) == v for k, v in presets[name].items())
    with pytest.raises(ValueError, match="unknown preset 'big'; valid presets: .*gpt2-tiny.*tiny"):
        from_preset("big")
    with pytest.raises(ValueError, match="unknown GPTConfig field"):
        from_preset("gpt2-tiny", n_layers=3)  # GPT's own field is n_layer; n_layers only reads it
    assert preset_config("tiny", max_len=32) == Seq2SeqConfig(**{**SEQ2SEQ_PRESETS["tiny"], "name": "tiny", "max_len": 32})
    # the family-named helpers the chapters import stay within their family
    assert type(seq2seq_from_preset("tiny")) is Seq2SeqTransformer and type(gpt_from_preset("gpt2-tiny")) is GPT
    with pytest.raises(ValueError, match="unknown preset 'llama-like'; valid presets: base, tiny"):
        seq2seq_from_preset("llama-like")
    with pytest.raises(ValueError, match="unknown preset 'tiny'; valid presets: gpt1"):
        gpt_from_preset("tiny")


def test_configs_share_one_vocabulary():
    gpt = from_preset("gpt2-tiny", n_layer=3, block_size=40).config
    assert (gpt.n_layers, gpt.d_model, gpt.n_heads, gpt.context_length) == (3, gpt.n_embd, gpt.n_head, 40)
    assert (gpt.kv_heads, gpt.attn_head_dim, gpt.attention) == (gpt.n_head, gpt.n_embd // gpt.n_head, "mha")
    dec = from_preset("llama-like", max_seq_len=48).config
    assert dec.context_length == 48
    s2s = from_preset("tiny", max_len=24).config
    assert (s2s.context_length, s2s.d_model, s2s.n_heads) == (24, 32, 4)
    with pytest.raises(AttributeError):  # read-only: the real field is the one to set
        gpt.n_layers = 5


@pytest.mark.parametrize("family", ["gpt", "decoder"])
def test_forward_value_checks_name_the_argument_and_the_rule(family):
    """On a CPU the ids and positions are read (free) and a broken rule is a ValueError saying which
    argument breaks which rule; a cached forward's positions come from cache.length, read nowhere."""
    model = (from_preset("gpt2-tiny") if family == "gpt" else from_preset("llama-like", max_seq_len=64)).eval()
    context = "block_size=64" if family == "gpt" else "max_seq_len=64"
    with pytest.raises(ValueError, match=r"token ids must be in \[0, vocab_size=256\); got range \[0, 300\]"):
        model(torch.tensor([[0, 300]]))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, vocab_size=256\); got range \[-1, 3\]"):
        model(torch.tensor([[3, -1]]))
    with pytest.raises(ValueError, match="positions must be >= 0; got -1"):
        model(torch.zeros(1, 2, dtype=torch.long), positions=torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=f"sequence longer than the configured context: position 64 >= {context}"):
        model(torch.zeros(1, 65, dtype=torch.long))
    cache = model.new_cache()
    model(torch.zeros(1, 63, dtype=torch.long), cache)
    model(torch.zeros(1, 1, dtype=torch.long), cache)  # position 63: the last one
    with pytest.raises(ValueError, match=f"position 64 >= {context}"):
        model(torch.zeros(1, 1, dtype=torch.long), cache)


def test_seq2seq_value_checks_name_src_or_tgt():
    model = seq2seq_from_preset("tiny", src_vocab_size=20, tgt_vocab_size=12, share_embeddings=False, max_len=8).eval()
    with pytest.raises(ValueError, match=r"src token ids must be in \[0, src_vocab_size=20\); got range \[1, 20\]"):
        model.encode(torch.tensor([[1, 20]]))
    memory = model.encode(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"tgt token ids must be in \[0, tgt_vocab_size=12\)"):
        model.decode(torch.tensor([[12]]), memory)
    with pytest.raises(ValueError, match="position 8 >= max_len=8"):
        model.decode(torch.zeros(1, 9, dtype=torch.long), memory)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["gpt", "decoder"])
def test_forward_on_a_gpu_makes_no_host_sync(family):
    """GPT.forward and Decoder.forward check token ids and positions on the device (torch._assert_async),
    never by reading them: with sync debug mode "error" any synchronising read would raise."""
    model = (from_preset("gpt2-tiny") if family == "gpt" else from_preset("llama-like", max_seq_len=64)).eval().cuda()
    idx = torch.randint(0, 256, (2, 16), device="cuda")
    cache = model.new_cache()
    with torch.no_grad():
        model(idx)  # warm-up (lazy initialisation may synchronise once)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(idx)
            model(idx[:, :8], cache)  # a prefill
            model(idx[:, 8:9], cache)  # a decode step
        finally:
            torch.cuda.set_sync_debug_mode("default")
