"""Checkers for chapter 7's exercises (rotary positions and context extension, ALiBi).

What this module registers
- ``ch07.ntk_base``: ``fn(base, factor, head_dim) -> float``, the NTK-aware base
  b' = b s^(d_h/(d_h-2)) of equation (7.5), compared with ``companion.positions.ntk_base``.
- ``ch07.alibi_bias``: ``fn(n_heads, T) -> (n_heads, T, T)``, the causal ALiBi bias of equation
  (7.7): -m_h (i - j) where j <= i, -inf where j > i, slopes m_h = 2^(-8h/n_heads), h = 1..n_heads,
  when n_heads is a power of two; otherwise ``companion.positions.alibi_slopes``' rule (the slopes of
  the nearest lower power of two n, then every other slope of the sequence for 2n). The cases
  draw both kinds of n_heads.
- ``ch07.llama3_frequencies``: ``fn(inv_freq (d_h/2,), factor, original_max_len, low_freq_factor,
  high_freq_factor) -> (d_h/2,)``, Llama 3.1's piecewise rescale of the RoPE frequencies, compared
  with ``companion.positions.rope_inverse_frequencies(..., scaling="llama3")``.

Each checker compares with the reference first; on a mismatch it tries the usual mistakes (the
exponent inverted, slopes in the wrong order, a bias that rewards distance, the two thresholds read
on the frequency instead of the wavelength, the blend weights swapped) and names the one that
matches.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from companion.exercises import ExerciseFailed, call, diagnose, register
from companion.positions import alibi_bias, alibi_slopes, ntk_base, rope_inverse_frequencies

# ----------------------------------------------------------------------------- NTK-aware base


@register("ch07.ntk_base")
def _check_ntk_base(fn, gen: torch.Generator, report) -> None:
    cases = [(10000.0, 1.0, 16), (10000.0, 8.0, 128), (500_000.0, 4.0, 64)]
    cases.append((float(10 ** int(torch.randint(3, 7, (), generator=gen))),
                  float(torch.randint(2, 33, (), generator=gen)),
                  2 * int(torch.randint(4, 65, (), generator=gen))))
    for i, (base, factor, head_dim) in enumerate(cases):
        case = f"case {i + 1} (base={base:g}, factor={factor:g}, head_dim={head_dim})"
        got = call(case, fn, base, factor, head_dim)
        try:
            value = float(got)
        except (TypeError, ValueError):
            raise ExerciseFailed(f"{case}: expected a number, got {type(got).__name__}") from None
        expected = ntk_base(base, factor, head_dim)
        if math.isclose(value, expected, rel_tol=1e-6):
            report.cases.append(f"b={base:g}, s={factor:g}, d_h={head_dim}")
            continue
        mistakes = {
            ("b * s: that slows the slowest pair by s^((d_h-2)/d_h), slightly less than s; the "
             "exponent d_h/(d_h-2) makes it exactly s"): base * factor,
            ("the exponent is inverted: b s^((d_h-2)/d_h); solve (b')^(-(d_h-2)/d_h) = "
             "b^(-(d_h-2)/d_h) / s for b'"): base * factor ** ((head_dim - 2) / head_dim),
            "b / s^(...): a larger factor must give a larger base (slower pairs)":
                base / factor ** (head_dim / (head_dim - 2)),
        }
        for hint, wrong in mistakes.items():
            if math.isclose(value, wrong, rel_tol=1e-6):
                raise ExerciseFailed(f"{case}: expected {expected:.6g}, got {value:.6g} -- you computed {hint}")
        raise ExerciseFailed(f"{case}: expected b' = {expected:.6g}, got {value:.6g}")


# ----------------------------------------------------------------------------- ALiBi


def _causal_alibi(slopes: Tensor, T: int) -> Tensor:
    """(h,), T -> (h, T, T): -m_h |i - j| on and below the diagonal, -inf above (float64)."""
    pos = torch.arange(T)
    bias = alibi_bias(slopes.double(), pos, pos)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return bias.masked_fill(future, float("-inf"))


@register("ch07.alibi_bias")
def _check_alibi_bias(fn, gen: torch.Generator, report) -> None:
    sizes = [(1, 3), (4, 6), (8, 5)]
    sizes.append((2 ** int(torch.randint(1, 5, (), generator=gen)), int(torch.randint(2, 12, (), generator=gen))))
    not_power = [3, 5, 6, 7, 12][int(torch.randint(0, 5, (), generator=gen))]  # 2^(-8h/H) is not the rule
    sizes.append((not_power, int(torch.randint(2, 12, (), generator=gen))))
    for i, (n_heads, T) in enumerate(sizes):
        case = f"case {i + 1} (n_heads={n_heads}, T={T})"
        got = call(case, fn, n_heads, T)
        slopes = alibi_slopes(n_heads).double()
        expected = _causal_alibi(slopes, T)
        mistakes = {
            "the slopes in reverse order: head 1 has the steepest slope 2^(-8/n), the last head 2^-8":
                _causal_alibi(slopes.flip(0), T),
            "+m |i - j|: the bias must *subtract* the distance, so that far keys lose weight":
                _causal_alibi(-slopes, T),
            "slopes 2^(-h) instead of 2^(-8h/n_heads)":
                _causal_alibi(2.0 ** -torch.arange(1, n_heads + 1, dtype=torch.float64), T),
            (f"slopes 2^(-8h/n_heads) with n_heads = {n_heads}, not a power of two: ALiBi then takes the "
             "slopes of the nearest lower power of two n and fills the other heads with every other slope "
             "of the sequence for 2n (the first, third, ...)"):
                _causal_alibi(2.0 ** (-8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64) / n_heads), T),
        }
        future = torch.ones(T, T, dtype=torch.bool).triu(1).expand(n_heads, T, T)
        if isinstance(got, Tensor) and got.shape == expected.shape and T > 1:
            # compare() treats entries where the reference is -inf as free: check the mask first
            open_future = ~torch.isneginf(got.detach()[future])
            if open_future.any():
                raise ExerciseFailed(f"{case}: {int(open_future.sum())} entries above the diagonal (keys j > i) "
                                     "are not -inf: a decoder's ALiBi bias comes with the causal mask")
        diagnose(case, got, expected, mistakes, atol=1e-6)
        report.cases.append(f"h={n_heads}, T={T}")


# ----------------------------------------------------------------------------- Llama 3's rescale


@register("ch07.llama3_frequencies")
def _check_llama3_frequencies(fn, gen: torch.Generator, report) -> None:
    cases = [(128, 500_000.0, 8.0, 8192, 1.0, 4.0), (16, 10000.0, 4.0, 64, 1.0, 4.0)]
    cases.append((2 * int(torch.randint(8, 65, (), generator=gen)), 10000.0,
                  float(torch.randint(2, 17, (), generator=gen)), int(torch.randint(64, 4096, (), generator=gen)),
                  1.0, 2.0 + float(torch.randint(0, 5, (), generator=gen))))
    for i, (head_dim, base, factor, length, low, high) in enumerate(cases):
        case = (f"case {i + 1} (head_dim={head_dim}, base={base:g}, factor={factor:g}, "
                f"original_max_len={length}, low={low:g}, high={high:g})")
        theta, _ = rope_inverse_frequencies(head_dim, base)
        theta = theta.double()
        expected, _ = rope_inverse_frequencies(head_dim, base, "llama3", factor, length,
                                               low_freq_factor=low, high_freq_factor=high)
        got = call(case, fn, theta.clone(), factor, length, low, high)
        wavelength = 2 * math.pi / theta
        mix = ((length / wavelength - low) / (high - low)).clamp(0.0, 1.0)
        mistakes = {
            "the blend weights swapped: m (the share of the kept theta_i) grows with L / lambda_i":
                torch.where(wavelength < length / high, theta, torch.where(
                    wavelength > length / low, theta / factor, mix * theta / factor + (1 - mix) * theta)),
            "every pair divided by s: that is position interpolation; short wavelengths must be kept":
                theta / factor,
            ("a hard switch at lambda_i = L / high with no blended band: wavelengths between L / high "
             "and L / low mix theta_i and theta_i / s"):
                torch.where(wavelength < length / high, theta, theta / factor),
            ("the thresholds applied to the frequency: the rule compares the *wavelength* "
             "lambda_i = 2 pi / theta_i with L / high and L / low"):
                torch.where(theta < length / high, theta, torch.where(
                    theta > length / low, theta / factor, (1 - mix) * theta / factor + mix * theta)),
        }
        diagnose(case, got, expected.double(), mistakes, atol=1e-9, rtol=1e-5)
        report.cases.append(f"d_h={head_dim}, s={factor:g}, L={length}")
