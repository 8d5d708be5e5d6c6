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

import copy
import math

import torch

U = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


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


def float64_twin_atol(fn, *args, **kwargs) -> float:
    """``float32_paths_atol`` for ``fn(*args, **kwargs)`` against another float32 computation of the same
    function: runs ``fn`` once on the float32 arguments and once on float64 copies of them (modules
    deep-copied and converted with ``.double()``, floating tensors with ``.double()``, anything else as
    it is) and bounds the difference by 4 times the float32 error measured, plus 8 ulps of the output's
    scale (the derivation is in ``float32_paths_atol``)."""

    def up(a):
        if isinstance(a, torch.nn.Module):
            return copy.deepcopy(a).double()
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return a.detach().double()
        return a

    with torch.no_grad():
        ours32 = fn(*args, **kwargs)
        ours64 = fn(*(up(a) for a in args), **{n: up(a) for n, a in kwargs.items()})
    return float32_paths_atol(ours32, ours64)
