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

import math

import torch

from companion.tolerance import (EPS32, U, float32_paths_atol, float64_twin_atol, gamma,  # noqa: F401 (re-exported)
                                 reduction_atol)


def matmul_atol(a: torch.Tensor, b: torch.Tensor, *, sides: int = 2, dtype: torch.dtype = torch.float32) -> float:
    """Largest difference between two computations of ``a @ b`` (another blocking, another SIMD width):
    each is within gamma_k (|A| |B|) of the exact product, entry by entry, k the inner dimension (Higham,
    eq. (3.13)); so two differ by at most 2 gamma_k max(|A| |B|). ``sides=1`` when the other side is exact
    (a float64 oracle)."""
    mag = (a.detach().abs().double() @ b.detach().abs().double()).max().item()
    return sides / 2 * reduction_atol(a.shape[-1], mag, dtype=dtype)


def attention_atol(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None, rescales: int = 0,
                   sides: int = 2, bias: float = 0.0, dtype: torch.dtype = torch.float32) -> float:
    """Largest difference between two computations of softmax(scale q k^T + mask) v (any order, any
    blocking, any mask: masked keys only shorten the sums), from the arithmetic of one of them:

    - a score is a d-term dot product, then a scaling, a max subtraction and (exp2 kernels) a product by
      log2 e: its error is at most Delta = gamma_{d+3} * 2 * scale * max|q| |k| (Cauchy-Schwarz bounds
      sum_l |q_l k_l| by |q| |k|);
    - scores off by at most Delta move each weight by a factor within e^(+-2 Delta) (the normaliser
      moves too), so the weights move by (e^(2 Delta) - 1) in sum and the output by that times max|v|;
    - exp (<= 4 ulps here: SLEEF's u10 and glibc are within 1), the S-term normaliser and the
      division add gamma_{S+5} relative to each weight; an online (flash) softmax adds, for each of
      ``rescales`` block rescalings, one more exp and product per weight: gamma_{5 rescales};
    - the output is an S-term sum of weights times values, sum_j p_j |v_j| <= max|v|: gamma_S.

    One computation is within e = max|v| ((e^(2 Delta) - 1) + gamma_{S+5+5 rescales} + gamma_S) of the
    exact result; two differ by at most ``sides`` * e (``sides=1`` against a float64 oracle). q is
    (..., T, d), k and v (..., S, d) with any number of heads (GQA: the bound uses maxima only). An
    additive mask of finite entries up to ``bias`` in size rounds once more when it is added to a score:
    Delta grows by u (max|s| + bias), which the factor 2 in Delta covers for max|s|; ``bias`` adds u bias."""
    d, S = q.shape[-1], k.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    qn = q.detach().double().norm(dim=-1).max().item()
    kn = k.detach().double().norm(dim=-1).max().item()
    delta = gamma(d + 3, dtype) * 2 * scale * qn * kn + U[dtype] * bias
    vmax = v.detach().double().abs().max().item()
    e = vmax * (math.expm1(2 * delta) + gamma(S + 5 + 5 * rescales, dtype) + gamma(S, dtype))
    return sides * e


def logsumexp_atol(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None, rescales: int = 0, sides: int = 2,
                   bias: float = 0.0, dtype: torch.dtype = torch.float32) -> float:
    """Largest difference between two computations of logsumexp_j(scale q_i . k_j) over the keys a mask
    allows, by the steps of ``attention_atol``: the scores are within Delta, which moves the result by at most
    Delta (logsumexp is 1-Lipschitz in the max norm); the exps, the S-term sum and its rescalings are within
    gamma_{S+5+5 rescales} relative, so log moves by at most that (log(1 + x) <= x); the log itself and the
    max added back round once on |lse| <= max|s| + log S. Twice that for two computations (``sides``).
    ``bias``: the largest finite entry of an additive mask, as in ``attention_atol``."""
    d, S = q.shape[-1], k.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    smax = scale * q.detach().double().norm(dim=-1).max().item() * k.detach().double().norm(dim=-1).max().item()
    delta = gamma(d + 2, dtype) * 2 * smax + U[dtype] * bias
    e = delta + gamma(S + 5 + 5 * rescales, dtype) + 2 * U[dtype] * (smax + bias + math.log(max(S, 1)))
    return sides * e


