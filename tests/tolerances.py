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


EPS32 = torch.finfo(torch.float32).eps


def float32_paths_atol(ours32: torch.Tensor, ours64: torch.Tensor, *, others: float = 3.0, ulps: int = 8) -> float:
    """Largest difference allowed between two float32 computations of one function whose outputs are
    compared (companion's logits against transformers'; a cached decode against the full forward),
    given ``ours32``, one of them, and ``ours64``, the same computation in float64 on the same
    (float32-representable) weights, i.e. the exact result to float32's eyes.

    Each float32 computation differs from the exact result by its own rounding, so the two differ by at
    most e_ours + e_other (the triangle inequality). e_ours = max |ours32 - ours64| is measured here. The
    other one runs the same matrix products, norms and softmaxes in another order, and its error is of
    the same size: where transformers runs in float64 (every non-MoE family of tests/test_hf.py, pinned
    kernel path), e_theirs / e_ours was 0.6 to 1.6, and the whole difference 0.34 to 1.71 times e_ours
    over the 27 cases of that file. ``others=3`` allows the other error up to 3 e_ours (twice the largest
    ratio seen), so the bound is 4 e_ours; ``ulps`` float32 ulps of the output's scale keep it from
    vanishing when e_ours happens to be tiny. A real mismatch (a 5% RoPE error, a window one key wider)
    moves logits by > 1e-3, against bounds of ~1e-4 and below here."""
    err = (ours32.double() - ours64.double()).abs().max().item()
    scale = ours64.abs().max().item()
    return (1 + others) * err + ulps * EPS32 * max(scale, 1.0)
