"""Normalisation layers, written out (chapters 3 and 6).

What this module provides
- ``LayerNorm``: y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta, over the last dimension
  (Ba, Kiros and Hinton 2016; the 2017 Transformer and GPT).
- ``RMSNorm``: y = x / sqrt(mean(x^2) + eps) * gamma, no centring and no bias (Zhang and Sennrich
  2019; the modern decoder).
- ``RMSNorm(d, offset=True)``: Gemma's parameterisation, y = x / sqrt(mean(x^2) + eps) * (1 + w),
  w initialised to 0: the same function with gamma = 1 + w (so weight decay pulls the gain to 1).
- ``make_norm(kind, d)``: pick one by name, so a model's config can say ``norm="rms"``.

Each module has the plain path (the formula, written out, which is what the book teaches) and a
fast path (torch's fused kernel) side by side; ``fused=False`` selects the plain one, and the tests
hold the two equal. The fused path matters: the written-out LayerNorm launches about seven small
kernels where torch's launches one, which cost about 11% of a small GPT's CPU training throughput
(benchmarks/README.md, model_overhead.py).

Where a norm sits in a residual block (pre-norm: x + f(norm(x)); post-norm: norm(x + f(x))) is
decided by the blocks that use these modules, see ``companion.blocks``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LayerNorm", "RMSNorm", "make_norm", "NORMS"]

NORMS = ("layer", "rms")


class LayerNorm(nn.Module):
    """LayerNorm(x) = (x - mu) / sqrt(sigma^2 + eps) * gamma + beta, mu and sigma^2 over the last dim.

    The variance is the biased one (divide by d, not d - 1), as in torch.nn.LayerNorm.
    """

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True, fused: bool = True):
        super().__init__()
        if d < 1:
            raise ValueError(f"d must be >= 1; got {d}")
        self.eps, self.fused = eps, fused
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., d)
        if self.fused:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        mu = x.mean(dim=-1, keepdim=True)
        var = (x - mu).pow(2).mean(dim=-1, keepdim=True)
        y = (x - mu) * torch.rsqrt(var + self.eps) * self.weight
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}, fused={self.fused}"


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gamma.

    Dropping the mean subtraction and the bias saves work and, empirically, loses nothing: the
    re-scaling (not the re-centring) is what stabilises training.
    """

    def __init__(self, d: int, eps: float = 1e-6, fused: bool = True, offset: bool = False):
        super().__init__()
        if d < 1:
            raise ValueError(f"d must be >= 1; got {d}")
        self.eps, self.offset = eps, offset
        self.fused = fused and hasattr(F, "rms_norm")  # torch >= 2.4
        # offset=True stores w with gamma = 1 + w (Gemma): the identity gain is w = 0
        self.weight = nn.Parameter(torch.zeros(d) if offset else torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., d)
        gain = 1.0 + self.weight if self.offset else self.weight
        if gain.dtype != x.dtype and gain.dtype.itemsize > x.dtype.itemsize:
            # a gain kept wider than the stream (transformers keeps gpt-oss's in float32 in a float16
            # model): normalise and scale in the gain's precision, round once to the stream's
            return self.forward(x.to(gain.dtype)).to(x.dtype)
        if self.fused:
            return F.rms_norm(x, gain.shape, gain, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * gain

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, fused={self.fused}" + (", gain 1 + w" if self.offset else "")


def make_norm(kind: str, d: int, eps: float | None = None, bias: bool = True, offset: bool = False) -> nn.Module:
    """``kind`` is "layer" (LayerNorm, with or without bias) or "rms" (RMSNorm; ``offset``: gain 1 + w)."""
    if kind == "layer":
        return LayerNorm(d, eps=1e-5 if eps is None else eps, bias=bias)
    if kind == "rms":
        return RMSNorm(d, eps=1e-6 if eps is None else eps, offset=offset)
    raise ValueError(f"norm must be one of {NORMS}; got {kind!r}")
