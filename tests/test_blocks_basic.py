"""Norms, positions and feed-forward layers against independent formulations."""

import math

import pytest
import torch
import torch.nn.functional as F
from tolerances import U, gamma, reduction_atol

from companion.feedforward import MLP, SwiGLU, make_ffn, swiglu_hidden
from companion.norms import LayerNorm, RMSNorm, make_norm
from companion.positions import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    alibi_bias,
    alibi_slopes,
    rope_inverse_frequencies,
    sinusoidal_table,
)


@pytest.mark.parametrize("fused", [False, True], ids=["written-out", "fused"])
@pytest.mark.parametrize("shape", [(3, 8), (2, 5, 16), (1, 1, 7)])
def test_layernorm_matches_torch(shape, fused):
    torch.manual_seed(0)
    d = shape[-1]
    ours, ref = LayerNorm(d, fused=fused), torch.nn.LayerNorm(d)
    with torch.no_grad():
        w, b = torch.randn(d), torch.randn(d)
        ours.weight.copy_(w); ours.bias.copy_(b); ref.weight.copy_(w); ref.bias.copy_(b)
    x = torch.randn(shape) * 3 + 1
    # mean, variance and normalisation are three length-d reductions; the output is w * x_hat + b
    scale = (w.abs() * ((x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)).abs().amax() + b.abs()).max()
    torch.testing.assert_close(ours(x), ref(x), atol=reduction_atol(d, scale, chain=3), rtol=0)


@pytest.mark.parametrize("fused", [False, True], ids=["written-out", "fused"])
@pytest.mark.parametrize("shape", [(3, 8), (2, 5, 16)])
def test_rmsnorm_matches_torch(shape, fused):
    torch.manual_seed(1)
    d = shape[-1]
    ours, ref = RMSNorm(d, eps=1e-6, fused=fused), torch.nn.RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        w = torch.randn(d)
        ours.weight.copy_(w); ref.weight.copy_(w)
    x = torch.randn(shape) * 2
    # the mean square is one length-d reduction, then a reciprocal square root and two products
    scale = (w.abs().max() * (x / x.pow(2).mean(-1, keepdim=True).sqrt()).abs().max()).item()
    torch.testing.assert_close(ours(x), ref(x), atol=reduction_atol(d, scale, chain=2), rtol=0)


def test_make_norm_rejects_unknown():
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("batch", 4)


def test_sinusoidal_table_formula_and_scale():
    d = 16
    table = sinusoidal_table(torch.arange(50), d)
    p, i = 37, 3
    assert math.isclose(table[p, 2 * i].item(), math.sin(p / 10000 ** (2 * i / d)), abs_tol=1e-6)
    assert math.isclose(table[p, 2 * i + 1].item(), math.cos(p / 10000 ** (2 * i / d)), abs_tol=1e-6)
    mod = SinusoidalPositions(d, 50)
    torch.testing.assert_close(mod(torch.tensor([5, 37])), table[[5, 37]])
    with pytest.raises(ValueError, match="max_len=50"):
        mod(torch.tensor([50]))
    with pytest.raises(ValueError, match="even"):
        sinusoidal_table(torch.arange(3), 7)


def test_learned_positions_bounds():
    pos = LearnedPositions(8, 10)
    assert pos(torch.arange(10)).shape == (10, 8)
    with pytest.raises(ValueError, match="beyond the configured context"):
        pos(torch.tensor([10]))


def _rope_by_pairs(x, positions, inv_freq, mscale=1.0):
    """Independent RoPE: explicit 2x2 rotation of each channel pair (i, i + d/2)."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for t, m in enumerate(positions.tolist()):
        for i in range(d // 2):
            a = m * inv_freq[i].item()
            c, s = math.cos(a), math.sin(a)
            x1, x2 = x[..., t, i], x[..., t, i + d // 2]
            out[..., t, i] = (c * x1 - s * x2) * mscale
            out[..., t, i + d // 2] = (s * x1 + c * x2) * mscale
    return out


@pytest.mark.parametrize("scaling,factor", [(None, 1.0), ("pi", 4.0), ("ntk", 4.0), ("yarn", 8.0)])
def test_rope_is_a_pairwise_rotation(scaling, factor):
    torch.manual_seed(2)
    rope = RotaryEmbedding(8, base=100.0, scaling=scaling, factor=factor, original_max_len=32)
    x = torch.randn(2, 5, 8)
    pos = torch.tensor([0, 3, 7, 20, 63])
    # bound (tolerances.U = 2^-24): each side rounds the angle m theta_i once (U times the largest angle A,
    # which moves cos and sin by as much), cos / sin within 4 ulps, then the scale, two products and a sum:
    # each output is within mscale (|x1| + |x2|) (U A + gamma_8) of exact, so the two within twice that
    A = pos.max().item() * rope.inv_freq.max().item()
    atol = 2 * rope.mscale * 2 * x.abs().max().item() * (U[torch.float32] * A + gamma(8))
    torch.testing.assert_close(rope(x, pos), _rope_by_pairs(x, pos, rope.inv_freq, rope.mscale), atol=atol, rtol=0)


def test_rope_relative_position_property():
    torch.manual_seed(3)
    rope = RotaryEmbedding(16, base=500.0)
    q, k = torch.randn(16), torch.randn(16)

    def score(m, n):
        return (rope(q.view(1, 16), torch.tensor([m])) * rope(k.view(1, 16), torch.tensor([n]))).sum().item()

    assert math.isclose(score(5, 2), score(105, 102), rel_tol=1e-4, abs_tol=1e-4)
    assert math.isclose(score(0, 7), score(40, 47), rel_tol=1e-4, abs_tol=1e-4)
    assert not math.isclose(score(5, 2), score(5, 3), rel_tol=1e-3)


def test_rope_scaling_formulas():
    d, base, s = 8, 10000.0, 4.0
    plain, _ = rope_inverse_frequencies(d, base)
    expected = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)])
    torch.testing.assert_close(plain, expected)
    pi, _ = rope_inverse_frequencies(d, base, "pi", s)
    torch.testing.assert_close(pi, expected / s)
    ntk, _ = rope_inverse_frequencies(d, base, "ntk", s)
    torch.testing.assert_close(ntk[0], expected[0])  # highest frequency unchanged
    torch.testing.assert_close(ntk[-1], expected[-1] / s)  # lowest stretched by exactly s
    yarn, mscale = rope_inverse_frequencies(d, base, "yarn", s, original_max_len=4096)
    assert math.isclose(mscale, 0.1 * math.log(s) + 1)
    torch.testing.assert_close(yarn[0], expected[0])  # many turns over L: untouched
    torch.testing.assert_close(yarn[-1], expected[-1] / s)  # < 1 turn over L: interpolated
    with pytest.raises(ValueError, match="head_dim must be even"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="scaling must be one of"):
        RotaryEmbedding(8, scaling="linear")


def test_alibi_slopes_and_bias():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    s6 = alibi_slopes(6)  # 4 from the power-of-two sequence, then odd entries of the 8-sequence
    torch.testing.assert_close(s6, torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]))
    b = alibi_bias(alibi_slopes(2), torch.tensor([3, 4]), torch.arange(5))
    assert b.shape == (2, 2, 5)
    assert b[1, 1, 1].item() == pytest.approx(-alibi_slopes(2)[1].item() * 3)


def test_mlp_matches_written_formula():
    torch.manual_seed(4)
    for act, fn in (("relu", F.relu), ("gelu", F.gelu), ("gelu_tanh", lambda z: F.gelu(z, approximate="tanh"))):
        mlp = MLP(8, 32, act)
        x = torch.randn(3, 8)
        ref = fn(x @ mlp.up.weight.T + mlp.up.bias) @ mlp.down.weight.T + mlp.down.bias
        torch.testing.assert_close(mlp(x), ref)


def test_swiglu_formula_and_width():
    assert swiglu_hidden(64) == 192  # 8*64/3 = 170.7 -> 192
    assert swiglu_hidden(4096, multiple_of=256) == 11008  # Llama-7B rounds to multiples of 256
    torch.manual_seed(5)
    f = SwiGLU(16)
    assert f.up.bias is None and f.up.out_features == swiglu_hidden(16)
    x = torch.randn(2, 3, 16)
    a, b = x @ f.gate.weight.T, x @ f.up.weight.T
    torch.testing.assert_close(f(x), (a * torch.sigmoid(a) * b) @ f.down.weight.T)
    with pytest.raises(ValueError, match="ffn must be one of"):
        make_ffn("tanh", 4)
