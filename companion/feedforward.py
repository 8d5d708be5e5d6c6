"""Position-wise feed-forward networks (chapters 3, 4 and 6).

What this module provides
- ``MLP``: FFN(x) = act(x W_1 + b_1) W_2 + b_2 with act = ReLU (2017 Transformer) or GELU (GPT).
- ``SwiGLU``: FFN(x) = (SiLU(x W_gate) * (x W_up)) W_down, no biases (Shazeer 2020; Llama).
- ``GeGLU``: the same gated form with the tanh GELU as the gate, (GELU_tanh(x W_gate) * (x W_up)) W_down
  (Shazeer 2020; Gemma).
- ``ClampedSwiGLU``: gpt-oss's expert, (up + 1) * g * sigmoid(alpha g) with g = min(gate, L) and
  up clamped to [-L, L] (alpha = 1.702, L = 7), biases on every matrix.
- ``swiglu_hidden(d)``: the default hidden width: 8d/3 rounded up to a multiple of 64. SwiGLU has
  three matrices instead of two, so 2/3 of the usual 4d keeps the parameter count at about 8 d^2.
- ``make_ffn(kind, d, d_ff, bias)``: pick one by name.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MLP", "SwiGLU", "GeGLU", "ClampedSwiGLU", "swiglu_hidden", "make_ffn", "FFNS", "GATED_FFNS"]

FFNS = ("relu", "gelu", "gelu_tanh", "swiglu", "geglu")
GATED_FFNS = ("swiglu", "geglu")  # three matrices: gate, up, down


def swiglu_hidden(d: int, multiple_of: int = 64) -> int:
    """d_f = 8d/3 rounded up to a multiple of ``multiple_of`` (hardware-friendly matrix shapes)."""
    if d < 1 or multiple_of < 1:
        raise ValueError(f"d and multiple_of must be >= 1; got d={d}, multiple_of={multiple_of}")
    return multiple_of * math.ceil(8 * d / 3 / multiple_of)


class MLP(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, equation (3.x) of the 2017 paper; act in {relu, gelu, gelu_tanh}.

    GPT-2 uses the tanh approximation of GELU ("gelu_tanh"); BERT and GPT-1 code the exact erf form.
    """

    def __init__(self, d: int, d_ff: int, activation: str = "relu", bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if activation not in ("relu", "gelu", "gelu_tanh"):
            raise ValueError(f"activation must be 'relu', 'gelu' or 'gelu_tanh'; got {activation!r}")
        if d < 1 or d_ff < 1:
            raise ValueError(f"d and d_ff must be >= 1; got d={d}, d_ff={d_ff}")
        self.activation = activation
        self.up = nn.Linear(d, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., d)
        h = self.up(x)
        if self.activation == "relu":
            h = F.relu(h)
        else:
            h = F.gelu(h, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.dropout(self.down(h))

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


class SwiGLU(nn.Module):
    """FFN_SwiGLU(x) = (SiLU(x W_gate) ⊙ x W_up) W_down, SiLU(z) = z * sigmoid(z); no biases by default."""

    def __init__(self, d: int, d_ff: int | None = None, bias: bool = False, dropout: float = 0.0):
        super().__init__()
        d_ff = swiglu_hidden(d) if d_ff is None else d_ff
        if d < 1 or d_ff < 1:
            raise ValueError(f"d and d_ff must be >= 1; got d={d}, d_ff={d_ff}")
        self.gate = nn.Linear(d, d_ff, bias=bias)
        self.up = nn.Linear(d, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def act(self, z: Tensor) -> Tensor:  # the gate's nonlinearity
        return F.silu(z)

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., d)
        return self.dropout(self.down(self.act(self.gate(x)) * self.up(x)))


class GeGLU(SwiGLU):
    """FFN_GeGLU(x) = (GELU_tanh(x W_gate) ⊙ x W_up) W_down: Gemma's gate (``gelu_pytorch_tanh``)."""

    def act(self, z: Tensor) -> Tensor:
        return F.gelu(z, approximate="tanh")


class ClampedSwiGLU(SwiGLU):
    """gpt-oss's expert: FFN(x) = ((clamp(x W_up + b_up, -L, L) + 1) * g sigmoid(alpha g)) W_down + b_down,
    g = min(x W_gate + b_gate, L). The clamps bound what one expert can emit; sigmoid(alpha g) with
    alpha = 1.702 is the sigmoid approximation of GELU's gate, and the + 1 lets the gate pass x W_gate
    through when up is 0."""

    def __init__(self, d: int, d_ff: int | None = None, bias: bool = True, alpha: float = 1.702, limit: float = 7.0):
        super().__init__(d, d_ff, bias=bias)
        if not limit > 0:
            raise ValueError(f"limit must be > 0; got {limit}")
        self.alpha, self.limit = alpha, limit

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., d)
        g = self.gate(x).clamp(max=self.limit)
        up = self.up(x).clamp(-self.limit, self.limit)
        return self.down((up + 1) * g * torch.sigmoid(self.alpha * g))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, limit={self.limit}"


def make_ffn(kind: str, d: int, d_ff: int | None = None, bias: bool = True, dropout: float = 0.0) -> nn.Module:
    """``kind`` in FFNS; ``d_ff`` defaults to 4d for the MLPs and ``swiglu_hidden(d)`` for SwiGLU and GeGLU."""
    if kind in GATED_FFNS:
        return (SwiGLU if kind == "swiglu" else GeGLU)(d, d_ff, bias=bias, dropout=dropout)
    if kind in ("relu", "gelu", "gelu_tanh"):
        return MLP(d, 4 * d if d_ff is None else d_ff, activation=kind, bias=bias, dropout=dropout)
    raise ValueError(f"ffn must be one of {FFNS}; got {kind!r}")
