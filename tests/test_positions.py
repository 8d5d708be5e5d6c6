"""companion.positions: RoPE frequencies and their rescalings, the helpers chapter 7 uses, ALiBi.

References are written independently from the papers' formulas, pair by pair in plain Python.
"""

import math

import pytest
import torch

from companion.positions import (
    RotaryEmbedding,
    alibi_bias,
    alibi_slopes,
    ntk_base,
    rope_inverse_frequencies,
    rope_turns,
    yarn_temperature,
)


def plain_frequencies(head_dim, base):
    """theta_i = base^(-2i/d_h), one Python float per pair."""
    return [base ** (-2 * i / head_dim) for i in range(head_dim // 2)]


# ----------------------------------------------------------------------------- the helpers


@pytest.mark.parametrize("head_dim, length", [(8, 64), (64, 2048), (128, 8192)])
def test_rope_turns_counts_full_turns_of_each_pair(head_dim, length):
    theta, _ = rope_inverse_frequencies(head_dim, 10000.0)
    turns = rope_turns(theta, length)
    expected = [length * t / (2 * math.pi) for t in theta.tolist()]
    assert turns.tolist() == pytest.approx(expected, rel=1e-12)
    # pair 0 turns once every 2 pi positions; the slowest pair turns less than once in 2048
    assert turns[0] == pytest.approx(length / (2 * math.pi), rel=1e-6)


@pytest.mark.parametrize("head_dim, factor", [(8, 2.0), (16, 8.0), (128, 4.0)])
def test_ntk_base_slows_the_slowest_pair_by_exactly_the_factor(head_dim, factor):
    base = 10000.0
    new = plain_frequencies(head_dim, ntk_base(base, factor, head_dim))
    old = plain_frequencies(head_dim, base)
    assert new[0] == old[0] == 1.0                                   # pair 0 is untouched
    assert old[-1] / new[-1] == pytest.approx(factor, rel=1e-9)      # the last pair: s times slower
    for i in range(head_dim // 2):                                   # in between: s^(2i/(d_h-2))
        assert old[i] / new[i] == pytest.approx(factor ** (2 * i / (head_dim - 2)), rel=1e-9)


def test_ntk_base_is_the_base_that_the_ntk_scaling_uses():
    scaled, _ = rope_inverse_frequencies(16, 10000.0, "ntk", 8.0)
    plain, _ = rope_inverse_frequencies(16, ntk_base(10000.0, 8.0, 16))
    torch.testing.assert_close(scaled, plain)


@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0, 32.0])
def test_yarn_temperature_is_the_factor_the_yarn_scaling_applies(factor):
    assert yarn_temperature(factor) == pytest.approx(0.1 * math.log(factor) + 1.0)
    _, mscale = rope_inverse_frequencies(16, 10000.0, "yarn", factor, 64)
    assert mscale == pytest.approx(yarn_temperature(factor))


def test_yarn_temperature_sharpens_rotated_scores_by_its_square():
    rope = RotaryEmbedding(16, scaling="yarn", factor=4.0, original_max_len=64)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 16, generator=gen)
    pos = torch.tensor([0])
    score = (rope(q, pos) * rope(k, pos)).sum()       # position 0: no rotation, only the factor
    assert score.item() == pytest.approx((q * k).sum().item() * yarn_temperature(4.0) ** 2, rel=1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda: rope_turns(torch.ones(2, 2), 8), "inv_freq"),
    (lambda: rope_turns(torch.ones(4), 0), "length"),
    (lambda: ntk_base(10000.0, 2.0, 2), "head_dim"),
    (lambda: ntk_base(10000.0, 2.0, 15), "head_dim"),
    (lambda: ntk_base(1.0, 2.0, 16), "base"),
    (lambda: ntk_base(10000.0, 0.5, 16), "factor"),
    (lambda: yarn_temperature(0.5), "factor"),
])
def test_helpers_reject_bad_input_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ----------------------------------------------------------------------------- the rescalings


def test_position_interpolation_divides_every_frequency():
    scaled, mscale = rope_inverse_frequencies(32, 10000.0, "pi", 4.0)
    expected = [t / 4.0 for t in plain_frequencies(32, 10000.0)]
    assert scaled.tolist() == pytest.approx(expected, rel=1e-6) and mscale == 1.0


def test_yarn_keeps_fast_pairs_and_interpolates_slow_ones():
    head_dim, length, factor = 64, 2048, 8.0
    scaled, _ = rope_inverse_frequencies(head_dim, 10000.0, "yarn", factor, length)
    for i, theta in enumerate(plain_frequencies(head_dim, 10000.0)):
        turns = length * theta / (2 * math.pi)
        gamma = min(max((turns - 1.0) / (32.0 - 1.0), 0.0), 1.0)     # 1 keeps, 0 interpolates
        expected = gamma * theta + (1 - gamma) * theta / factor
        assert scaled[i].item() == pytest.approx(expected, rel=1e-5)
    assert scaled[0].item() == pytest.approx(1.0)                      # > 32 turns: kept
    assert scaled[-1].item() == pytest.approx(plain_frequencies(head_dim, 1e4)[-1] / factor, rel=1e-5)


def test_llama3_rescale_is_piecewise_in_the_wavelength():
    head_dim, base, factor, length = 128, 500_000.0, 8.0, 8192
    scaled, mscale = rope_inverse_frequencies(head_dim, base, "llama3", factor, length,
                                              low_freq_factor=1.0, high_freq_factor=4.0)
    regions = set()
    for i, theta in enumerate(plain_frequencies(head_dim, base)):
        wavelength = 2 * math.pi / theta
        if wavelength < length / 4:
            expected, region = theta, "kept"
        elif wavelength > length:
            expected, region = theta / factor, "divided"
        else:
            m = (length / wavelength - 1.0) / (4.0 - 1.0)
            expected, region = (1 - m) * theta / factor + m * theta, "blended"
        regions.add(region)
        assert scaled[i].item() == pytest.approx(expected, rel=1e-5)
    assert regions == {"kept", "divided", "blended"} and mscale == 1.0


# ----------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_are_geometric_for_a_power_of_two():
    slopes = alibi_slopes(8)
    assert slopes.tolist() == pytest.approx([2.0 ** -(k + 1) for k in range(8)])


def test_alibi_bias_is_minus_slope_times_distance():
    slopes = alibi_slopes(4)
    pos = torch.arange(6)
    bias = alibi_bias(slopes, pos, pos)
    for h in range(4):
        for i in range(6):
            for j in range(6):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * abs(i - j))


def test_rotate_fast_is_rotate_bit_for_bit_and_the_lookup_memo_is_never_stale():
    """rotate_fast moves rotate_half's negation from x to sin (exact in floating point); the memo that
    lets the layers of one forward share a lookup answers only for the same, unchanged positions."""
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, scaling="yarn_hf", factor=4.0, original_max_len=32)
    x = torch.randn(2, 3, 7, 16)
    pos = torch.arange(5, 12)
    cos, sin, signed = rope.lookup(pos)
    assert torch.equal(rope.rotate_fast(x, cos, signed), rope.rotate(x, cos, sin))
    assert rope.lookup(pos)[0] is cos  # the same positions tensor: the memo
    pos.add_(1)  # changed in place: looked up again
    assert torch.equal(rope.lookup(pos)[0], rope.cos_sin(torch.arange(6, 13))[0])
    before = rope.lookup(pos)[0]
    rope.inv_freq.mul_(1.05)  # the frequencies changed: looked up again
    assert not torch.equal(rope.lookup(pos)[0], before)
    q, k = rope.rotate_qk(x, x[:, :1], pos)
    c2, s2 = rope.cos_sin(pos.clone())
    assert torch.equal(q, rope.rotate(x, c2, s2)) and torch.equal(k, rope.rotate(x[:, :1], c2, s2))
