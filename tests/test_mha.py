"""MultiHeadAttention (MHA/GQA/MQA, masks, sinks, ALiBi, cross-attention) against written-out references."""

import math

import pytest
import torch
import torch.nn.functional as F

from tolerances import float64_twin_atol

from companion.kernels.attend import attend
from companion.cache import ContiguousLayerCache
from companion.mha import AttentionVariant, MultiHeadAttention, position_mask
from companion.positions import RotaryEmbedding, alibi_slopes


def _call(m, x, *args, **kwargs):
    return m(x, *args, **kwargs)


# tolerances: the layer against _manual (or one path of the layer against another) are two float32
# computations of one function; float64_twin_atol bounds their difference by 4 times the layer's own float32
# error, measured against its float64 twin, plus 8 ulps (tests/tolerances.py, float32_paths_atol)


def _manual(m: MultiHeadAttention, x, allowed, sinks=None, bias=None, memory=None):
    """Independent path: separate per-head loops with explicit softmax (sink logit in the denominator)."""
    B, T, _ = x.shape
    h, g, dh = m.n_heads, m.n_kv_heads, m.head_dim
    if m.fused_qkv:
        W, b = m.qkv.weight, m.qkv.bias
        Wq, Wk, Wv = W[: h * dh], W[h * dh : (h + g) * dh], W[(h + g) * dh :]
        bq, bk, bv = (None, None, None) if b is None else (b[: h * dh], b[h * dh : (h + g) * dh], b[(h + g) * dh :])
        src = x
    else:
        Wq, Wk, Wv, bq, bk, bv = m.q.weight, m.k.weight, m.v.weight, m.q.bias, m.k.bias, m.v.bias
        src = memory
    q = F.linear(x, Wq, bq).view(B, T, h, dh)
    k = F.linear(src, Wk, bk).view(B, src.shape[1], g, dh)
    v = F.linear(src, Wv, bv).view(B, src.shape[1], g, dh)
    heads = []
    for i in range(h):
        j = i // (h // g)
        s = torch.einsum("btd,bsd->bts", q[:, :, i], k[:, :, j]) / math.sqrt(dh)
        if bias is not None:
            s = s + bias[i]
        s = s.masked_fill(~allowed, float("-inf"))
        e = torch.exp(s - s.amax(-1, keepdim=True).clamp_min(-1e30))
        denom = e.sum(-1, keepdim=True)
        if sinks is not None:
            mx = s.amax(-1, keepdim=True)
            e = torch.exp(s - mx)
            denom = e.sum(-1, keepdim=True) + torch.exp(sinks[i] - mx)
        heads.append((e / denom) @ v[:, :, j])
    return m.out(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("h,g", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_gqa_matches_manual(h, g, backend):
    torch.manual_seed(0)
    m = MultiHeadAttention(32, h, g, bias=True, backend=backend)
    x = torch.randn(2, 6, 32)
    torch.testing.assert_close(m(x), _manual(m, x, torch.ones(6, 6).tril().bool()), atol=float64_twin_atol(_call, m, x), rtol=0)


def test_fused_and_separate_projections_agree():
    torch.manual_seed(1)
    fused = MultiHeadAttention(16, 4, 2, bias=True)
    sep = MultiHeadAttention(16, 4, 2, bias=True, fused_qkv=False)
    with torch.no_grad():
        sep.q.weight.copy_(fused.qkv.weight[:16]); sep.k.weight.copy_(fused.qkv.weight[16:24]); sep.v.weight.copy_(fused.qkv.weight[24:])
        sep.q.bias.copy_(fused.qkv.bias[:16]); sep.k.bias.copy_(fused.qkv.bias[16:24]); sep.v.bias.copy_(fused.qkv.bias[24:])
        sep.out.load_state_dict(fused.out.state_dict())
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(fused(x), sep(x))


def test_sliding_window_keep_and_padding_masks():
    torch.manual_seed(2)
    m = MultiHeadAttention(16, 2, backend='reference', variant=AttentionVariant(window=3, keep=1))
    x = torch.randn(2, 8, 16)
    p = torch.arange(8)
    allowed = (p[None] <= p[:, None]) & (((p[:, None] - p[None]) < 3) | (p[None] < 1))
    torch.testing.assert_close(m(x), _manual(m, x, allowed), atol=float64_twin_atol(_call, m, x), rtol=0)
    assert torch.equal(position_mask(p, p, window=3, keep=1), allowed)
    # padding: extra key mask combined with the causal mask
    pad = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    pad[1, ..., 5:] = False
    m2 = MultiHeadAttention(16, 2, backend="sdpa")
    out = m2(x, mask=pad)
    ref = _manual(m2, x, torch.ones(8, 8).tril().bool() & pad[:, 0])
    torch.testing.assert_close(out, ref, atol=float64_twin_atol(_call, m2, x, mask=pad), rtol=0)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_sinks_in_the_denominator(backend):
    torch.manual_seed(3)
    m = MultiHeadAttention(16, 4, 2, backend=backend, variant=AttentionVariant(sinks=True))
    with torch.no_grad():
        m.sinks.copy_(torch.tensor([-1.0, 0.0, 2.0, 5.0]))
    x = torch.randn(2, 5, 16)
    ref = _manual(m, x, torch.ones(5, 5).tril().bool(), sinks=m.sinks)
    torch.testing.assert_close(m(x), ref, atol=float64_twin_atol(_call, m, x), rtol=0)
    m(x).sum().backward()
    assert m.sinks.grad is not None and m.sinks.grad.abs().sum() > 0


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_alibi_bias(backend):
    torch.manual_seed(4)
    m = MultiHeadAttention(16, 4, backend=backend, variant=AttentionVariant(alibi=True))
    x = torch.randn(1, 6, 16)
    p = torch.arange(6)
    bias = -alibi_slopes(4)[:, None, None] * (p[:, None] - p[None]).abs()
    atol = float64_twin_atol(_call, m, x)
    torch.testing.assert_close(m(x), _manual(m, x, torch.ones(6, 6).tril().bool(), bias=bias), atol=atol, rtol=0)


def test_cross_attention_with_padding():
    torch.manual_seed(5)
    m = MultiHeadAttention(16, 4, bias=True, variant=AttentionVariant(cross=True))
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    pad = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    pad[0, ..., 4:] = False
    ref = _manual(m, x, pad[:, 0].expand(2, 3, 7), memory=mem)
    atol = float64_twin_atol(_call, m, x, memory=mem, mask=pad)
    torch.testing.assert_close(m(x, memory=mem, mask=pad), ref, atol=atol, rtol=0)
    with pytest.raises(ValueError, match="memory"):
        m(x)


def test_permutation_equivariance_without_positions_or_mask():
    torch.manual_seed(6)
    m = MultiHeadAttention(16, 4, 2, causal=False)
    x = torch.randn(2, 7, 16)
    perm = torch.randperm(7)
    torch.testing.assert_close(m(x)[:, perm], m(x[:, perm]), atol=float64_twin_atol(_call, m, x), rtol=0)


@pytest.mark.parametrize("kw", [dict(), dict(window=3), dict(window=2, keep=2), dict(sinks=True), dict(alibi=True)])
def test_cached_decoding_equals_full_forward(kw):
    torch.manual_seed(7)
    rope = None if kw.get("alibi") else RotaryEmbedding(8)
    m = MultiHeadAttention(32, 4, 2, rope=rope, variant=AttentionVariant(**kw))
    x = torch.randn(2, 10, 32)
    cache = ContiguousLayerCache(window=kw.get("window"), keep=kw.get("keep", 0))
    outs = [m(x[:, :4], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(outs, 1), m(x), atol=float64_twin_atol(_call, m, x), rtol=0)
    if "window" in kw:  # the windowed cache holds at most keep + window - 1 rows
        assert cache.stored <= kw["window"] - 1 + kw.get("keep", 0)


def test_validation_messages():
    with pytest.raises(ValueError, match="n_heads \\(6\\) must be divisible by n_kv_heads \\(4\\)"):
        MultiHeadAttention(24, 6, 4)
    with pytest.raises(ValueError, match="d_model \\(30\\) must be divisible by n_heads \\(4\\)"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="window must be >= 1"):
        MultiHeadAttention(16, 4, variant=AttentionVariant(window=0))
    with pytest.raises(ValueError, match="backend must be one of"):
        MultiHeadAttention(16, 4, backend="magic")
    with pytest.raises(ValueError, match="sinks must hold one logit per query head"):
        attend(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), sinks=torch.zeros(3))


def test_rope_layers_read_no_position_values_off_the_cpu():
    """Every layer rotates q and k: reading the positions on the host there (min/max checks, a table
    size) would be one device sync per layer on a GPU. On the meta device any such read raises, so a
    forward that completes there read none."""
    from companion.positions import RotaryEmbedding

    rope = RotaryEmbedding(8).to("meta")
    cos, sin = rope.cos_sin(torch.arange(5, device="meta"))
    assert cos.shape == sin.shape == (5, 8)
    layer = MultiHeadAttention(32, 4, 2, rope=RotaryEmbedding(8)).to("meta")
    out = layer(torch.randn(2, 5, 32, device="meta"), positions=torch.arange(3, 8, device="meta"))
    assert out.shape == (2, 5, 32) and out.device.type == "meta"


def test_decoder_forward_still_rejects_bad_positions_and_ids():
    from companion.models import from_preset

    model = from_preset("llama-like", max_seq_len=16).eval()
    with pytest.raises(ValueError, match="positions must be >= 0"):
        model(torch.zeros(1, 3, dtype=torch.long), positions=torch.tensor([-1, 0, 1]))
    with pytest.raises(ValueError, match="position 16 >= max_seq_len=16"):
        model(torch.zeros(1, 3, dtype=torch.long), positions=torch.tensor([14, 15, 16]))
    with pytest.raises(ValueError, match="token ids must be in \\[0, vocab_size=256\\); got range \\[0, 300\\]"):
        model(torch.tensor([[0, 300]]))


def test_layer_cache_interface_is_what_attention_uses():
    """``companion.cache.LayerCache``: a view that implements only ``update`` inherits ``attend``
    (returns None: the layer attends itself) and ``same_sequence`` (None); a view whose ``attend``
    answers is used instead of ``update``. Every view of the package derives from the base."""
    from companion.cache import LayerCache, PackedLayerView
    from companion.engine.compiled import _StepLayerView
    from companion.inference.batch import PagedBatchLayerView
    from companion.inference.paged import PagedLayerView

    for view in (ContiguousLayerCache, PackedLayerView, PagedLayerView, PagedBatchLayerView, _StepLayerView):
        assert issubclass(view, LayerCache), view.__name__

    class Recording(LayerCache):
        def __init__(self):
            self.inner, self.calls = ContiguousLayerCache(), []

        @property
        def length(self):
            return self.inner.length

        def update(self, positions, *rows):
            self.calls.append("update")
            return self.inner.update(positions, *rows)

    class Attending(Recording):
        def attend(self, q, k, v, positions, *, window=None, backend="auto"):
            self.calls.append("attend")
            return torch.zeros_like(q)

    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, 2, bias=True)
    x = torch.randn(1, 5, 16)
    plain = Recording()
    torch.testing.assert_close(layer(x, cache=plain), layer(x))
    assert plain.calls == ["update"] and plain.same_sequence is None and plain.length == 5
    own = Attending()
    out = layer(x, cache=own)
    assert own.calls == ["attend"]  # its answer replaces update + attention
    torch.testing.assert_close(out, layer.out.bias.expand(1, 5, 16))  # zeros through the output projection
    with pytest.raises(NotImplementedError, match="must implement update"):
        LayerCache().update(torch.arange(2), x)


# --- chapter 8: the head map and what scales with g or with h ------------------------------------


@pytest.mark.parametrize("h,g", [(8, 8), (8, 2), (8, 1), (6, 3)])
def test_head_map_groups_consecutive_query_heads(h, g):
    from companion.kernels.attend import expand_kv
    from companion.mha import head_map

    pi = head_map(h, g)
    expected = [r // (h // g) for r in range(h)]  # written out: h / g consecutive heads per group
    assert pi.tolist() == expected
    # the same order as the expansion attend uses: expanded head r is kv head pi(r)
    kv = torch.arange(g, dtype=torch.float32).view(1, g, 1, 1)
    assert expand_kv(kv, h).flatten().long().tolist() == expected


def test_head_map_rejects_groups_that_do_not_divide():
    from companion.mha import head_map

    with pytest.raises(ValueError, match="n_heads \\(6\\) must be divisible by n_kv_heads \\(4\\)"):
        head_map(6, 4)
    with pytest.raises(ValueError, match="must be >= 1"):
        head_map(4, 0)


@pytest.mark.parametrize("g", [4, 2, 1])
def test_sharing_costs_match_the_layer_and_the_flop_counter(g):
    from torch.utils.flop_counter import FlopCounterMode

    from companion.mha import sharing_costs

    d, h, T = 32, 4, 6
    m = MultiHeadAttention(d, h, g, backend="reference", causal=False)
    costs = sharing_costs(d, h, g, tokens=T)
    assert costs["q_params"] + costs["kv_params"] == m.qkv.weight.numel()
    assert costs["out_params"] == m.out.weight.numel()
    x = torch.randn(1, T, d)
    with FlopCounterMode(display=False) as counter:
        m(x)
    total = counter.get_total_flops()
    assert total == costs["projection_flops"] + costs["score_flops"] + costs["value_flops"]
    q, k, v = m.project_qkv(x)
    assert k.shape[1] * k.shape[-1] * 2 == costs["kv_cache_per_token"]


def test_sharing_costs_attention_arithmetic_does_not_depend_on_g():
    from companion.mha import sharing_costs

    mha, mqa = sharing_costs(64, 8, 8, tokens=10), sharing_costs(64, 8, 1, tokens=10)
    assert mha["score_flops"] == mqa["score_flops"] and mha["value_flops"] == mqa["value_flops"]
    assert mha["kv_cache_per_token"] == 8 * mqa["kv_cache_per_token"]
    assert mha["kv_params"] == 8 * mqa["kv_params"]
    with pytest.raises(ValueError, match="tokens must be an int >= 1"):
        sharing_costs(64, 8, 2, tokens=0)


def test_options_set_on_a_built_layer_choose_the_path_again():
    # Chapter 4's exercise turns `causal` off on a copy of a trained model: the layer must then attend
    # both ways, not keep the path it chose when it was built.
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 4, n_kv_heads=2)
    x = torch.randn(1, 6, 32)
    full = torch.softmax(torch.zeros(6, 6), -1) > 0  # every query reads every key
    causal_out = layer(x)
    layer.causal = False
    assert layer.path == "full"
    out = layer(x)
    assert torch.allclose(out, layer(x, mask=full))
    assert not torch.allclose(out[:, :-1], causal_out[:, :-1], atol=1e-4)
    # the last row read everything anyway: two float32 paths (causal and full), tests/tolerances.py
    assert torch.allclose(out[:, -1], causal_out[:, -1], atol=float64_twin_atol(_call, layer, x), rtol=0)
    layer.causal = True
    assert layer.path == "causal" and torch.equal(layer(x), causal_out)
    # the variant is fixed at construction: a window is another layer, not an attribute to set
    with pytest.raises(AttributeError):
        layer.window = 2
    windowed = MultiHeadAttention(32, 4, n_kv_heads=2, variant=AttentionVariant(window=2))
    windowed.load_state_dict(layer.state_dict())
    assert windowed.path == "causal" and not torch.allclose(windowed(x), causal_out, atol=1e-4)
    cross = MultiHeadAttention(32, 4, variant=AttentionVariant(cross=True))
    cross.causal = True
    assert not cross.causal and cross.path == "cross"


def test_the_layer_takes_at_most_twelve_arguments_and_the_variant_is_checked():
    import inspect

    params = [p for p in inspect.signature(MultiHeadAttention.__init__).parameters if p != "self"]
    assert len(params) <= 12, params
    with pytest.raises(ValueError, match="variant must be an AttentionVariant"):
        MultiHeadAttention(16, 4, variant=dict(window=2))
    for kw, match in [(dict(keep=-1), "keep must be >= 0"), (dict(scale=0.0), "scale must be > 0"),
                      (dict(softcap=-1.0), "softcap must be > 0"), (dict(cross=True, window=4), "cross-attention takes no")]:
        with pytest.raises(ValueError, match=match):
            AttentionVariant(**kw)
    with pytest.raises(ValueError, match="cross-attention takes no"):
        MultiHeadAttention(16, 4, rope=RotaryEmbedding(4), variant=AttentionVariant(cross=True))
