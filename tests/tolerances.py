"""Tolerances that follow from float32 arithmetic rather than from one machine's last bits.

Two implementations of one formula that reduce in different orders (another SIMD width, another
blocking, batched rows against single rows) differ by rounding only. For a sum of n terms computed in
any order, |fl(sum) - sum| <= gamma_n * sum |x_i| with gamma_n = n u / (1 - n u) and u the unit roundoff
(2^-24 for float32; Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. (4.4)). Two
such sums differ by at most twice that. A formula with a few reductions in sequence (a mean, then a
variance, then a division) compounds a few of them: ``chain`` counts them.

Measured: every comparison that uses these passes on the AVX2, AVX-512 and no-SIMD kernel paths
(tools/kernel_path.py), where a fixed 1e-6 had failed on AVX-512 (tests/test_translate.py, before it
moved to float64).
"""

from __future__ import annotations

import torch

U = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def gamma(n: int, dtype: torch.dtype = torch.float32) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of an n-term sum in ``dtype``."""
    u = U[dtype]
    if n * u >= 1:
        raise ValueError(f"n={n} is too long a reduction for a bound in {dtype}")
    return n * u / (1 - n * u)


def reduction_atol(n: int, magnitude: float, *, chain: int = 1, dtype: torch.dtype = torch.float32) -> float:
    """Largest difference between two orderings of ``chain`` successive n-term reductions whose terms
    sum in absolute value to at most ``magnitude`` (a bound, not an estimate: 2 * chain * gamma_n * mag)."""
    return 2 * chain * gamma(max(n, 1), dtype) * float(magnitude)
