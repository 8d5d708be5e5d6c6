"""MultiHeadAttention (MHA/GQA/MQA, masks, sinks, ALiBi, cross-attention) against written-out references."""

import math

import pytest
import torch
import torch.nn.functional as F

from companion.kernels.attend import attend
from companion.cache import ContiguousLayerCache
from companion.mha import MultiHeadAttention, position_mask
from companion.positions import RotaryEmbedding, alibi_slopes


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
    torch.testing.assert_close(m(x), _manual(m, x, torch.ones(6, 6).tril().bool()), atol=1e-5, rtol=1e-5)


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
    m = MultiHeadAttention(16, 2, window=3, keep=1, backend="reference")
    x = torch.randn(2, 8, 16)
    p = torch.arange(8)
    allowed = (p[None] <= p[:, None]) & (((p[:, None] - p[None]) < 3) | (p[None] < 1))
    torch.testing.assert_close(m(x), _manual(m, x, allowed), atol=1e-5, rtol=1e-5)
    assert torch.equal(position_mask(p, p, window=3, keep=1), allowed)
    # padding: extra key mask combined with the causal mask
    pad = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    pad[1, ..., 5:] = False
    m2 = MultiHeadAttention(16, 2, backend="sdpa")
    out = m2(x, mask=pad)
    ref = _manual(m2, x, torch.ones(8, 8).tril().bool() & pad[:, 0])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_sinks_in_the_denominator(backend):
    torch.manual_seed(3)
    m = MultiHeadAttention(16, 4, 2, sinks=True, backend=backend)
    with torch.no_grad():
        m.sinks.copy_(torch.tensor([-1.0, 0.0, 2.0, 5.0]))
    x = torch.randn(2, 5, 16)
    ref = _manual(m, x, torch.ones(5, 5).tril().bool(), sinks=m.sinks)
    torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=1e-5)
    m(x).sum().backward()
    assert m.sinks.grad is not None and m.sinks.grad.abs().sum() > 0


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_alibi_bias(backend):
    torch.manual_seed(4)
    m = MultiHeadAttention(16, 4, alibi=True, backend=backend)
    x = torch.randn(1, 6, 16)
    p = torch.arange(6)
    bias = -alibi_slopes(4)[:, None, None] * (p[:, None] - p[None]).abs()
    torch.testing.assert_close(m(x), _manual(m, x, torch.ones(6, 6).tril().bool(), bias=bias), atol=1e-5, rtol=1e-5)


def test_cross_attention_with_padding():
    torch.manual_seed(5)
    m = MultiHeadAttention(16, 4, cross=True, bias=True)
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    pad = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    pad[0, ..., 4:] = False
    ref = _manual(m, x, pad[:, 0].expand(2, 3, 7), memory=mem)
    torch.testing.assert_close(m(x, memory=mem, mask=pad), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="memory"):
        m(x)


def test_permutation_equivariance_without_positions_or_mask():
    torch.manual_seed(6)
    m = MultiHeadAttention(16, 4, 2, causal=False)
    x = torch.randn(2, 7, 16)
    perm = torch.randperm(7)
    torch.testing.assert_close(m(x)[:, perm], m(x[:, perm]), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(window=3), dict(window=2, keep=2), dict(sinks=True), dict(alibi=True)])
def test_cached_decoding_equals_full_forward(kw):
    torch.manual_seed(7)
    rope = None if kw.get("alibi") else RotaryEmbedding(8)
    m = MultiHeadAttention(32, 4, 2, rope=rope, **kw)
    x = torch.randn(2, 10, 32)
    cache = ContiguousLayerCache(window=kw.get("window"), keep=kw.get("keep", 0))
    outs = [m(x[:, :4], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(outs, 1), m(x), atol=1e-5, rtol=1e-5)
    if "window" in kw:  # the windowed cache holds at most keep + window - 1 rows
        assert cache.stored <= kw["window"] - 1 + kw.get("keep", 0)


def test_validation_messages():
    with pytest.raises(ValueError, match="n_heads \\(6\\) must be divisible by n_kv_heads \\(4\\)"):
        MultiHeadAttention(24, 6, 4)
    with pytest.raises(ValueError, match="d_model \\(30\\) must be divisible by n_heads \\(4\\)"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="window must be >= 1"):
        MultiHeadAttention(16, 4, window=0)
    with pytest.raises(ValueError, match="backend must be one of"):
        MultiHeadAttention(16, 4, backend="magic")
    with pytest.raises(ValueError, match="sinks must hold one logit per query head"):
        attend(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), sinks=torch.zeros(3))
