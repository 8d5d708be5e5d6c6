"""Chapter 7's exercise checkers accept a correct answer and name the usual mistakes.

The correct answers below are written from the formulas, independently of the checkers' references
(which use companion.positions).
"""

import math

import pytest
import torch

from exercise_checks import fails
from companion.exercises import check, checkers


def test_chapter_7_checkers_are_registered():
    names = {"ch07.ntk_base", "ch07.alibi_bias", "ch07.llama3_frequencies"}
    assert names == {name for name in checkers() if name.startswith("ch07.")}


# ----------------------------------------------------------------------------- NTK base


def ntk(base, factor, head_dim):
    # the slowest pair base^(-(d-2)/d) must become s times slower: solve for the new base
    return math.exp(math.log(base) + math.log(factor) * head_dim / (head_dim - 2))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ntk_base_accepts_the_formula(seed):
    report = check("ch07.ntk_base", ntk, seed=seed, quiet=True)
    assert len(report.cases) == 4


@pytest.mark.parametrize("wrong, needle", [
    (lambda b, s, d: b * s, "exactly s"),
    (lambda b, s, d: b * s ** ((d - 2) / d), "exponent is inverted"),
    (lambda b, s, d: b / s ** (d / (d - 2)), "larger base"),
    (lambda b, s, d: b * s ** 2, "expected b'"),
    (lambda b, s, d: "big", "expected a number"),
])
def test_ntk_base_names_the_mistake(wrong, needle):
    fails("ch07.ntk_base", wrong, needle)


# ----------------------------------------------------------------------------- ALiBi


def slopes(n):
    # ALiBi's slopes: 2^(-8h/n) for n a power of two; otherwise those of the nearest lower power of
    # two k, then every other slope of the sequence for 2k
    k = 2 ** int(math.log2(n))
    return ([2.0 ** (-8.0 * h / k) for h in range(1, k + 1)]
            + [2.0 ** (-4.0 * h / k) for h in range(1, 2 * k, 2)][: n - k])


def power_of_two_formula(n):
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]


def alibi(n_heads, T, slope_fn=slopes, sign=-1.0, causal=True):
    out = torch.empty(n_heads, T, T, dtype=torch.float64)
    for h, m in enumerate(slope_fn(n_heads)):
        for i in range(T):
            for j in range(T):
                out[h, i, j] = float("-inf") if (causal and j > i) else sign * m * abs(i - j)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alibi_bias_accepts_a_loop_answer(seed):
    assert len(check("ch07.alibi_bias", alibi, seed=seed, quiet=True).cases) == 5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alibi_bias_draws_a_number_of_heads_that_is_not_a_power_of_two(seed):
    heads = [int(c.split(",")[0][2:]) for c in check("ch07.alibi_bias", alibi, seed=seed, quiet=True).cases]
    assert any(h & (h - 1) for h in heads), heads
    assert slopes(6) == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]


@pytest.mark.parametrize("wrong, needle", [
    (lambda n, T: alibi(n, T, lambda k: slopes(k)[::-1]), "reverse order"),
    (lambda n, T: alibi(n, T, sign=1.0), "subtract"),
    (lambda n, T: alibi(n, T, causal=False), "causal mask"),
    (lambda n, T: alibi(n, T, lambda k: [2.0 ** -h for h in range(1, k + 1)]), "2^(-h)"),
    (lambda n, T: alibi(n, T, power_of_two_formula), "not a power of two"),
    (lambda n, T: alibi(n, T)[:, :-1], "wrong shape"),
])
def test_alibi_bias_names_the_mistake(wrong, needle):
    fails("ch07.alibi_bias", wrong, needle)


# ----------------------------------------------------------------------------- Llama 3


def llama3(inv_freq, factor, length, low, high):
    out = []
    for theta in inv_freq.tolist():
        wavelength = 2 * math.pi / theta
        if wavelength < length / high:
            out.append(theta)
        elif wavelength > length / low:
            out.append(theta / factor)
        else:
            m = (length / wavelength - low) / (high - low)
            out.append((1 - m) * theta / factor + m * theta)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_llama3_frequencies_accepts_a_loop_answer(seed):
    assert len(check("ch07.llama3_frequencies", llama3, seed=seed, quiet=True).cases) == 3


def swapped_blend(inv_freq, factor, length, low, high):
    kept = llama3(inv_freq, 1.0, length, low, high)                # theta everywhere
    out = llama3(inv_freq, factor, length, low, high)
    wavelength = 2 * math.pi / inv_freq
    band = (wavelength >= length / high) & (wavelength <= length / low)
    m = (length / wavelength - low) / (high - low)
    out[band] = (m * inv_freq / factor + (1 - m) * kept)[band]
    return out


def on_frequency(inv_freq, factor, length, low, high):
    # the thresholds L / high and L / low compared with theta_i instead of 2 pi / theta_i
    out = []
    for theta in inv_freq.tolist():
        m = (length * theta / (2 * math.pi) - low) / (high - low)
        m = min(max(m, 0.0), 1.0)
        if theta < length / high:
            out.append(theta)
        elif theta > length / low:
            out.append(theta / factor)
        else:
            out.append((1 - m) * theta / factor + m * theta)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("wrong, needle", [
    (swapped_blend, "blend weights swapped"),
    (lambda f, s, L, lo, hi: f / s, "position interpolation"),
    (lambda f, s, L, lo, hi: torch.where(2 * math.pi / f < L / hi, f, f / s), "hard switch"),
    (on_frequency, "applied to the frequency"),
    (lambda f, s, L, lo, hi: f * s, "differ from the reference"),
])
def test_llama3_frequencies_names_the_mistake(wrong, needle):
    fails("ch07.llama3_frequencies", wrong, needle)
