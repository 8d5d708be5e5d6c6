"""companion.hf: logits equal to transformers' with the converted weights, exact round trips, clear errors."""

import random
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from companion.hf import from_hf, hf_config, to_hf  # noqa: E402
from companion.models import GPT, Decoder, DecoderConfig, from_preset, gpt_from_preset  # noqa: E402
from companion.models.gpt import GPTConfig  # noqa: E402


def _randomise(model, seed, std=0.2):
    """Weights far from the init (std 0.02 makes every logit ~0 and hides mistakes); norms around 1.
    Routing biases of bias-balanced MoE layers random too, so that a missed bias changes the expert
    choice (elsewhere the bias is unused state and stays 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(1.0 + noise / 2 if "norm" in name and name.endswith("weight") else noise)
        for m in model.modules():
            if getattr(m, "bias_balancing", False):
                m.balance_bias.copy_(torch.randn(m.balance_bias.shape, generator=g) * 0.5)
            elif hasattr(m, "e_score_correction_bias"):  # transformers' DeepSeek-V3 router
                m.e_score_correction_bias.copy_(torch.randn(m.e_score_correction_bias.shape, generator=g) * 0.5)
    return model.eval()


def _tokens(vocab, T, seed, B=2):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def _assert_same_logits(model, hf_model, idx):
    with torch.no_grad():
        ours, theirs = model(idx), hf_model(idx).logits
    assert ours.abs().max() > 0.5  # a test with logits ~0 would pass for wrong weights
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)  # float32, logits of size ~1


def _assert_state_equal(a, b, skip=("last_load",)):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        if not k.endswith(skip):
            assert torch.equal(sa[k], sb[k]), k


def _random_config(arch, seed):
    """A random tiny config for arch, with GQA/MQA/MHA head layouts and (mistral, mixtral) windows."""
    r = random.Random(seed)
    n_heads = r.choice([2, 4, 8])
    n_kv = r.choice([d for d in (1, 2, 4, 8) if n_heads % d == 0])
    head_dim = r.choice([8, 16])
    d_model = r.choice([32, 48, 64])
    cfg = dict(
        vocab_size=r.choice([61, 128, 200]), d_model=d_model, n_layers=r.choice([1, 2, 3]), n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim, d_ff=r.choice([40, 64, 96]), max_seq_len=64,
        rope_base=r.choice([10000.0, 500.0, 1e6]), norm_eps=r.choice([1e-6, 1e-5]), tie_embeddings=r.random() < 0.3,
    )
    if arch == "llama":
        cfg.update(attn_bias=r.random() < 0.5, ffn_bias=r.random() < 0.5)
        if r.random() < 0.5:
            cfg.update(rope_scaling="pi", rope_factor=r.choice([2.0, 4.0]))
    if arch in ("mistral", "mixtral"):
        cfg.update(window=r.choice([3, 5, 8]))
    if arch == "mixtral":
        n = r.choice([4, 8])
        cfg.update(n_experts=n, top_k=r.choice([1, 2, 3]), moe_d_ff=r.choice([24, 32]), aux_loss_coef=0.02)
    return DecoderConfig(**cfg)


# ----------------------------------------------------------------------------------- equal logits


@pytest.mark.parametrize("n_layer,n_head,n_embd,vocab", [(2, 4, 64, 256), (1, 2, 32, 50), (3, 8, 64, 97)])
def test_gpt_logits_match_gpt2lmheadmodel(n_layer, n_head, n_embd, vocab):
    model = _randomise(GPT(GPTConfig(vocab_size=vocab, block_size=32, n_layer=n_layer, n_head=n_head, n_embd=n_embd)), 0)
    hf_model = to_hf(model)
    assert type(hf_model).__name__ == "GPT2LMHeadModel"
    assert hf_model.lm_head.weight.data_ptr() == hf_model.transformer.wte.weight.data_ptr()  # still tied
    _assert_same_logits(model, hf_model, _tokens(vocab, 32, 1))


@pytest.mark.parametrize("arch", ["llama", "mistral", "mixtral"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decoder_logits_match_hf_on_random_configs(arch, seed):
    config = _random_config(arch, seed)
    model = _randomise(Decoder(config), seed)
    hf_model = to_hf(model, arch=arch)
    assert type(hf_model).__name__ == {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM"}[arch]
    _assert_same_logits(model, hf_model, _tokens(config.vocab_size, 40, seed))  # 40 > every window


@pytest.mark.parametrize("name,cls", [("llama-like", "LlamaForCausalLM"), ("mistral-like", "MistralForCausalLM"), ("mixtral-like", "MixtralForCausalLM")])
def test_presets_pick_their_hf_class_and_match(name, cls):
    model = _randomise(from_preset(name), 3)
    hf_model = to_hf(model, attn_implementation="sdpa")  # the other HF attention path
    assert type(hf_model).__name__ == cls
    _assert_same_logits(model, hf_model, _tokens(256, 48, 4))


def test_sliding_window_convention_pinned():
    """window=w (w keys, counting the query itself) == HF sliding_window=w, with no offset; w + 1 differs."""
    w, T = 4, 12
    model = _randomise(from_preset("mistral-like", window=w, n_layers=1), 5)
    idx = _tokens(256, T, 6)
    hf_same = to_hf(model)
    assert hf_same.config.sliding_window == w
    _assert_same_logits(model, hf_same, idx)
    wider = Decoder(replace(model.config, window=w + 1))
    wider.load_state_dict(model.state_dict())
    hf_wider = to_hf(wider.eval())
    with torch.no_grad():
        ours, off_by_one = model(idx), hf_wider(idx).logits
    torch.testing.assert_close(off_by_one[:, :w], ours[:, :w], atol=1e-5, rtol=0)  # no row reaches past w yet
    assert (off_by_one[:, w:] - ours[:, w:]).abs().amax(dim=-1).min() > 1e-4  # every later row sees one key more


@pytest.mark.parametrize("overrides", [dict(), dict(q_rank=None), dict(n_shared_experts=2, first_dense_layers=0, n_layers=2), dict(n_experts=0)])
def test_deepseek_mla_logits_match_deepseekv3(overrides):
    model = _randomise(from_preset("deepseek-like", **overrides), 7)
    hf_model = to_hf(model)
    assert type(hf_model).__name__ == "DeepseekV3ForCausalLM" and hf_model.config.rope_interleave
    _assert_same_logits(model, hf_model, _tokens(256, 20, 8))
    for layer in model.layers:  # the absorbed decode path computes the same function
        layer.attn.absorbed = True
    _assert_same_logits(model, hf_model, _tokens(256, 20, 8))


def test_deepseek_from_hf_without_rope_interleave():
    """An HF DeepSeek-V3 built directly (random init, rope_interleave=False) converts with no permutation."""
    ref = _randomise(from_preset("deepseek-like"), 9)
    h = hf_config(ref)
    h.rope_interleave = False
    h._attn_implementation = "eager"
    torch.manual_seed(10)
    hf_model = transformers.DeepseekV3ForCausalLM(h).eval()
    _randomise(hf_model, 11)
    model = from_hf(hf_model)
    _assert_same_logits(model, hf_model, _tokens(256, 16, 12))


# ----------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "make",
    [
        lambda: gpt_from_preset("gpt2-tiny"),
        lambda: Decoder(_random_config("llama", 0)),
        lambda: Decoder(_random_config("llama", 1)),
        lambda: from_preset("llama-like", tie_embeddings=True),
        lambda: Decoder(_random_config("mistral", 2)),
        lambda: Decoder(_random_config("mixtral", 0)),
        lambda: from_preset("deepseek-like", n_shared_experts=2),
    ],
    ids=["gpt2", "llama0", "llama1", "llama-tied", "mistral", "mixtral", "deepseek"],
)
def test_round_trip_is_exact(make):
    model = _randomise(make(), 13)
    back = from_hf(to_hf(model))
    assert type(back) is type(model)
    _assert_state_equal(model, back)
    for f in ("vocab_size", "n_layers", "n_heads", "kv_heads", "attn_head_dim", "window", "n_experts", "top_k", "tie_embeddings",
              "rope_scaling", "rope_factor", "rope_base", "norm_eps", "n_layer", "n_embd", "block_size", "max_seq_len"):
        if hasattr(model.config, f):
            assert getattr(back.config, f) == getattr(model.config, f), f
    if isinstance(model, Decoder):
        assert (back.lm_head.weight is back.embed.weight) == model.config.tie_embeddings  # tying survives


@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_round_trip_from_hf_side_is_exact(arch):
    config = hf_config(Decoder(_random_config(arch, 4)), arch)
    torch.manual_seed(14)
    hf_model = getattr(transformers, {"llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM"}[arch])(config)
    _randomise(hf_model, 15)
    again = to_hf(from_hf(hf_model))
    _assert_state_equal(hf_model, again)


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "model,arch,field",
    [
        (lambda: gpt_from_preset("gpt1", vocab_size=64, block_size=16, n_layer=1, n_embd=32, n_head=2), None, "variant"),
        (lambda: from_preset("llama-like", norm_placement="post"), None, "norm_placement"),
        (lambda: from_preset("llama-like", norm="layer"), None, "norm="),
        (lambda: from_preset("llama-like", position="alibi"), None, "position"),
        (lambda: from_preset("llama-like", ffn="gelu"), None, "ffn"),
        (lambda: from_preset("llama-like", rope_scaling="yarn", rope_factor=2.0), None, "rope_scaling"),
        (lambda: from_preset("llama-like", dropout=0.1), None, "dropout"),
        (lambda: from_preset("llama-like", scale_embeddings=True), None, "scale_embeddings"),
        (lambda: from_preset("mistral-like"), "llama", "window"),
        (lambda: from_preset("mistral-like", attn_bias=True), None, "attn_bias"),
        (lambda: from_preset("mistral-like", keep=2), None, "keep"),
        (lambda: from_preset("gemma3-like"), None, "global_every"),
        (lambda: from_preset("gpt-oss-like"), None, "sinks"),
        (lambda: from_preset("mixtral-like", router="sigmoid"), None, "router"),
        (lambda: from_preset("mixtral-like", n_shared_experts=1), None, "n_shared_experts"),
        (lambda: from_preset("mixtral-like"), "llama", "n_experts"),
        (lambda: from_preset("llama-like"), "mixtral", "n_experts"),
        (lambda: from_preset("deepseek-like", router="softmax"), None, "router"),
        (lambda: from_preset("llama-like"), "gpt9", "arch"),
    ],
)
def test_features_without_hf_equivalent_raise_naming_the_field(model, arch, field):
    with pytest.raises(ValueError, match=field):
        to_hf(model(), arch=arch)


def test_hf_features_without_companion_equivalent_raise():
    gpt = hf_config(gpt_from_preset("gpt2-tiny"))
    gpt.tie_word_embeddings = False
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        from_hf(transformers.GPT2LMHeadModel(gpt))
    mix = hf_config(from_preset("mixtral-like", n_layers=1))
    mix.router_jitter_noise = 0.1
    with pytest.raises(ValueError, match="router_jitter_noise"):
        from_hf(transformers.MixtralForCausalLM(mix))
    ds = hf_config(from_preset("deepseek-like"))
    ds.routed_scaling_factor = 2.5
    with pytest.raises(ValueError, match="routed_scaling_factor"):
        from_hf(transformers.DeepseekV3ForCausalLM(ds))
    with pytest.raises(ValueError, match="hf_model must be"):
        from_hf(transformers.GPT2Model(hf_config(gpt_from_preset("gpt2-tiny"))))
    with pytest.raises(ValueError, match="hf_model must be"):
        from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="model must be a companion"):
        to_hf(torch.nn.Linear(2, 2))


def test_companion_imports_without_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import companion, companion.models, companion.hf\n"
        "from companion.models import gpt_from_preset\n"
        "try:\n    companion.hf.to_hf(gpt_from_preset('gpt2-tiny'))\n"
        "except ImportError as e:\n    assert 'companion[hf]' in str(e); print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
