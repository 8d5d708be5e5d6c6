"""The blocks of real model families (Gemma 2/3, Qwen3, gpt-oss, Llama 3, DeepSeek-V3), each against a
written-out oracle; their presets decode with a cache exactly as they run without one.

The comparison with transformers' own classes lives in tests/test_hf.py (it needs the ``hf`` extra).
"""

import copy
import math

import pytest
import torch

from companion.blocks import Block
from companion.feedforward import ClampedSwiGLU, GeGLU, SwiGLU
from companion.mha import AttentionVariant, MultiHeadAttention
from companion.models import PRESETS, from_preset
from companion.norms import RMSNorm
from companion.positions import RotaryEmbedding, rope_inverse_frequencies
from tolerances import EPS32, float32_paths_atol, float64_twin_atol, matmul_atol

NEW_PRESETS = ["llama3-like", "qwen3-like", "gemma3-like", "gemma2-like", "gpt-oss-like", "deepseek-like"]


def _spread(model, seed, std=0.2):
    """Weights far from the init (whose logits are ~0 and would hide mistakes); norm gains near their identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            is_gain = "norm" in name and name.endswith("weight")
            offset = is_gain and getattr(model, "config", None) is not None and model.config.norm_offset
            p.copy_(noise / 2 if offset else (1.0 + noise / 2 if is_gain else noise))
    return model.eval()


def _gelu_tanh(z):
    return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))


def _rms(x, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# --------------------------------------------------------------------------------- feed-forward


def test_geglu_gate_is_the_tanh_gelu():
    torch.manual_seed(0)
    ffn, x = GeGLU(16, 24), torch.randn(5, 16)
    ref = (_gelu_tanh(x @ ffn.gate.weight.T) * (x @ ffn.up.weight.T)) @ ffn.down.weight.T
    # tolerances: the module and its formula are two float32 computations of one function; the bound is 4 times
    # the module's own float32 error (its float64 twin) plus 8 ulps (float32_paths_atol)
    torch.testing.assert_close(ffn(x), ref, atol=float64_twin_atol(lambda f, x: f(x), ffn, x), rtol=0)
    swiglu = SwiGLU(16, 24)
    swiglu.load_state_dict(ffn.state_dict())
    assert (swiglu(x) - ffn(x)).abs().max() > 1e-3  # the gate is what differs


def test_clamped_swiglu_matches_gpt_oss_formula():
    torch.manual_seed(1)
    ffn, x = ClampedSwiGLU(8, 12), torch.randn(50, 8) * 4  # large inputs: the clamps act
    with torch.no_grad():
        for lin in (ffn.gate, ffn.up, ffn.down):
            lin.weight.normal_(0, 1.0)
            lin.bias.normal_(0, 1.0)
    gate = (x @ ffn.gate.weight.T + ffn.gate.bias).clamp(max=7.0)
    up = (x @ ffn.up.weight.T + ffn.up.bias).clamp(-7.0, 7.0)
    assert (x @ ffn.up.weight.T + ffn.up.bias).abs().max() > 7  # the clamp is exercised
    ref = ((up + 1) * gate * torch.sigmoid(1.702 * gate)) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), ref, atol=float64_twin_atol(lambda f, x: f(x), ffn, x), rtol=0)  # as above


# --------------------------------------------------------------------------------- norms and blocks


@pytest.mark.parametrize("fused", [True, False])
def test_rmsnorm_offset_gain_is_one_plus_w(fused):
    torch.manual_seed(2)
    norm, x = RMSNorm(12, eps=1e-3, fused=fused, offset=True), torch.randn(4, 12)
    assert torch.equal(norm.weight, torch.zeros(12))  # identity gain at init: w = 0
    torch.testing.assert_close(norm(x), _rms(x, 1e-3))
    with torch.no_grad():
        norm.weight.normal_()
    atol = float64_twin_atol(lambda n, x: n(x), norm, x)  # tolerances: module against formula, both float32
    torch.testing.assert_close(norm(x), _rms(x, 1e-3) * (1 + norm.weight), atol=atol, rtol=0)


def test_sandwich_block_normalises_before_and_after_each_sublayer():
    torch.manual_seed(3)
    d = 16
    attn = MultiHeadAttention(d, 2, rope=RotaryEmbedding(8))
    block = _spread(Block(d, attn, GeGLU(d, 24), norm="rms", placement="sandwich", norm_eps=1e-6, norm_offset=True), 4)
    x = torch.randn(2, 6, d)

    def norm(m, h):
        return _rms(h, 1e-6) * (1 + m.weight)

    h = x + norm(block.attn_post_norm, attn(norm(block.attn_norm, x)))
    ref = h + norm(block.ffn_post_norm, block.ffn(norm(block.ffn_norm, h)))
    atol = float64_twin_atol(lambda b, x: b(x), block, x)  # tolerances: module against formula, both float32
    torch.testing.assert_close(block(x), ref, atol=atol, rtol=0)


# --------------------------------------------------------------------------------- attention options


def _oracle_attention(attn, x, *, qk_norm_eps=None, scale=None, cap=None, window=None):
    """softmax over keys j <= i (and i - j < window) of [cap tanh(s / cap)], s = scale q.k, with q and k
    RMS-normalised per head before RoPE when qk_norm_eps is given; one head-group loop, written out."""
    B, T, _ = x.shape
    h, g, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, v = (x @ attn.qkv.weight.T).split([h * dh, g * dh, g * dh], -1)
    q, k, v = (t.view(B, T, -1, dh).transpose(1, 2) for t in (q, k, v))
    if qk_norm_eps is not None:
        q, k = _rms(q, qk_norm_eps) * attn.q_norm.weight, _rms(k, qk_norm_eps) * attn.k_norm.weight
    pos = torch.arange(T)
    q, k = attn.rope(q, pos), attn.rope(k, pos)
    out = torch.zeros(B, h, T, dh)
    for head in range(h):
        s = (q[:, head] @ k[:, head // (h // g)].transpose(-1, -2)) * (scale or dh**-0.5)
        if cap is not None:
            s = cap * torch.tanh(s / cap)
        i, j = pos[:, None], pos[None, :]
        allowed = (j <= i) & ((i - j < window) if window else True)
        out[:, head] = s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[:, head // (h // g)]
    return out.transpose(1, 2).reshape(B, T, -1) @ attn.out.weight.T


def test_qk_norm_normalises_each_head_before_rope():
    torch.manual_seed(5)
    attn = _spread(MultiHeadAttention(32, 4, 2, 8, rope=RotaryEmbedding(8, base=100.0), variant=AttentionVariant(qk_norm=True, qk_norm_eps=1e-05)), 6)
    x = torch.randn(2, 7, 32)
    atol = float64_twin_atol(lambda a, x: a(x), attn, x)  # tolerances: module against oracle, both float32
    torch.testing.assert_close(attn(x), _oracle_attention(attn, x, qk_norm_eps=1e-5), atol=atol, rtol=0)
    assert set(attn.state_dict()) >= {"q_norm.weight", "k_norm.weight"} and attn.q_norm.weight.shape == (8,)


@pytest.mark.parametrize("window", [None, 3])
def test_softcap_and_query_pre_attn_scalar(window):
    torch.manual_seed(7)
    s, cap = 20.0, 1.5  # scale 20^(-1/2) instead of 8^(-1/2); a cap that bites
    attn = _spread(MultiHeadAttention(32, 4, 1, 8, rope=RotaryEmbedding(8), variant=AttentionVariant(scale=s ** (-0.5), softcap=cap, window=window)), 8)
    x = torch.randn(2, 9, 32) * 2
    ref = _oracle_attention(attn, x, scale=s**-0.5, cap=cap, window=window)
    atol = float64_twin_atol(lambda a, x: a(x), attn, x)  # tolerances: module against oracle, both float32
    torch.testing.assert_close(attn(x), ref, atol=atol, rtol=0)
    uncapped = _oracle_attention(attn, x, scale=s**-0.5, window=window)
    assert (uncapped - ref).abs().max() > 1e-2  # the cap changes the answer: the test can fail
    cache_out = torch.cat([attn(x[:, t : t + 1], torch.tensor([t]), cache) for cache in [_cache(window)] for t in range(9)], 1)
    torch.testing.assert_close(cache_out, ref, atol=atol, rtol=0)  # the capped path reads the cache too


def _cache(window):
    from companion.cache import ModelCache

    return ModelCache(1, [window]).layer(0)


def test_embedding_scale_and_final_softcap():
    model = _spread(from_preset("gemma2-like", final_softcap=2.0), 9)
    idx = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(10))
    seen = {}
    model.layers[0].register_forward_hook(lambda m, args, out: seen.setdefault("x0", args[0]))
    model.final_norm.register_forward_hook(lambda m, args, out: seen.setdefault("h", out))
    logits = model(idx)
    torch.testing.assert_close(seen["x0"], model.embed.weight[idx] * math.sqrt(64))
    z = seen["h"] @ model.lm_head.weight.T
    assert z.abs().max() > 4  # logits the cap must squeeze
    # the head's product is k-term sums (matmul_atol); the cap 2 tanh(z / 2) has slope <= 1, then tanh adds
    # at most 4 ulps of |logits| < 2 on each side (SLEEF's u10 and glibc are within 1-2)
    atol = matmul_atol(seen["h"], model.lm_head.weight.T) + 2 * 4 * EPS32 * 2.0
    torch.testing.assert_close(logits, 2.0 * torch.tanh(z / 2.0), atol=atol, rtol=0)
    assert logits.abs().max() < 2.0


def test_gemma3_layer_kinds_have_their_own_window_and_rope():
    model = from_preset("gemma3-like", rope_scaling="pi", rope_factor=8.0, rope_scaling_layers="global")
    assert model.config.layer_windows() == [8] * 5 + [None]
    plain_local, _ = rope_inverse_frequencies(16, 10_000.0)
    plain_global, _ = rope_inverse_frequencies(16, 1_000_000.0)
    for i, layer in enumerate(model.layers):
        want = plain_global / 8 if i == 5 else plain_local  # linear scaling on the global layer only (Gemma 3)
        torch.testing.assert_close(layer.attn.rope.inv_freq, want)
        assert layer.attn.window == (None if i == 5 else 8)
        assert layer.attn.qk_norm and layer.attn.q_norm.offset and isinstance(layer.ffn, GeGLU)
        assert layer.placement == "sandwich"


# --------------------------------------------------------------------------------- RoPE rescaling


def _llama3_oracle(d, base, s, L, low, high):
    out = []
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        wavelength = 2 * math.pi / theta
        if wavelength < L / high:
            out.append(theta)
        elif wavelength > L / low:
            out.append(theta / s)
        else:
            m = (L / wavelength - low) / (high - low)
            out.append((1 - m) * theta / s + m * theta)
    return torch.tensor(out)


def test_llama3_rope_piecewise_rescale():
    d, base, s, L = 16, 500_000.0, 8.0, 64
    inv, mscale = rope_inverse_frequencies(d, base, "llama3", s, L, low_freq_factor=1.0, high_freq_factor=4.0)
    torch.testing.assert_close(inv, _llama3_oracle(d, base, s, L, 1.0, 4.0))
    plain, _ = rope_inverse_frequencies(d, base)
    kept, divided = (inv == plain), torch.isclose(inv, plain / s)
    assert mscale == 1.0 and kept.any() and divided.any() and (~kept & ~divided).any()  # all three regimes


def _yarn_hf_oracle(d, base, s, L, fast, slow, truncate):
    """transformers' YaRN: a ramp over the channel index between the indices where r_i = fast and r_i = slow."""
    def index(turns):
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = index(fast), index(slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    out = []
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: keep theta, 1: theta / s
        out.append((1 - ramp) * theta + ramp * theta / s)
    return torch.tensor(out), 0.1 * math.log(s) + 1


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_as_transformers_computes_it(truncate):
    d, base, s, L = 32, 10_000.0, 16.0, 256
    inv, mscale = rope_inverse_frequencies(d, base, "yarn_hf", s, L, truncate=truncate)
    ref, ref_mscale = _yarn_hf_oracle(d, base, s, L, 32.0, 1.0, truncate)
    torch.testing.assert_close(inv, ref)
    assert mscale == pytest.approx(ref_mscale)
    book, book_mscale = rope_inverse_frequencies(d, base, "yarn", s, L)
    assert book_mscale == pytest.approx(mscale)  # same temperature ...
    torch.testing.assert_close(book[[0, -1]], inv[[0, -1]])  # ... same ends of the spectrum ...
    assert ((book - inv).abs() / inv).max() > 0.05  # ... different ramp in between
    _, forced = rope_inverse_frequencies(d, base, "yarn_hf", s, L, attention_factor=1.0)
    assert forced == 1.0


# --------------------------------------------------------------------------------- presets


def test_new_presets_are_registered_and_old_names_kept():
    for name in NEW_PRESETS + ["llama-like", "mistral-like", "mixtral-like"]:
        assert name in PRESETS
    oss = from_preset("gpt-oss-like").config
    assert oss.layer_windows() == [128, None, 128, None] and oss.sinks and oss.rope_scaling == "yarn_hf"
    ds = from_preset("deepseek-like").config
    assert (ds.router, ds.expert_groups, ds.topk_groups, ds.routed_scaling_factor) == ("sigmoid", 4, 2, 2.5)


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_new_presets_cached_decode_equals_full_forward(name):
    model = _spread(from_preset(name), 11, std=0.12)  # 0.2 puts float32 noise at ~3e-5 over 136 tokens
    T = 136 if name == "gpt-oss-like" else 24  # past gpt-oss's 128-token window
    idx = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        full, exact = model(idx), copy.deepcopy(model).double()(idx)
        cache = model.new_cache()
        steps = [model(idx[:, :5], cache)] + [model(idx[:, t : t + 1], cache) for t in range(5, T)]
    assert full.abs().max() > 0.5
    atol = float32_paths_atol(full, exact)  # tolerances: a cached decode and the full forward, both float32
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=atol, rtol=0)
