"""How far apart two floating-point computations of one formula may be, from the arithmetic.

Two computations of one formula that reduce in different orders (another SIMD width, another blocking,
a batch against its rows one at a time, a cache against a full forward) differ by rounding only. A
check that they agree needs a tolerance, and a fixed one (1e-5) is either too loose to catch a real
mistake or too tight for the next machine. The book derives its tolerances instead:

- ``gamma(n)``: Higham's bound on an n-term sum: |fl(sum) - sum| <= gamma_n sum |x_i|, with
  gamma_n = n u / (1 - n u) and u the unit roundoff (2^-24 for float32, 2^-53 for float64; Higham,
  *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. (4.4)); ``reduction_atol`` is twice
  that, for two such sums.
- ``float64_twin_atol(fn, *args)``: for a whole model, where such bounds compound too far to be useful,
  the error is measured instead: ``fn`` runs once in float32 and once on float64 copies of its
  modules and tensors, the float64 run standing in for the exact result. Two float32 computations then
  differ by at most their two errors; ``float32_paths_atol`` allows the other one up to 3 times the one
  measured (twice the largest ratio seen against transformers' own float32), plus a few ulps of the
  output's scale.

tests/tolerances.py builds the bounds for attention, matrix products and logsumexp on these, and
every chapter's comparison of two float32 computations uses ``float64_twin_atol`` (issue 36).
"""

from __future__ import annotations

import copy

import torch

__all__ = ["U", "EPS32", "gamma", "reduction_atol", "float32_paths_atol", "float64_twin_atol"]

U = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
EPS32 = torch.finfo(torch.float32).eps


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
