"""ipywidgets explorers used by the chapters.

What this module provides
- ``softmax_temperature_explorer(scores, values=None)``: a slider for the factor that multiplies
  the scores before the softmax (1/sqrt(d_k) in equation 1.2, or 1/temperature when sampling) and
  a bar chart of the resulting weights, redrawn as the slider moves.

The explorers are thin: the numbers they show come from ``companion.attention``.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import torch

from .attention import stable_softmax

__all__ = ["softmax_temperature_explorer"]


def softmax_temperature_explorer(
    scores: Sequence[float] | torch.Tensor,
    labels: Sequence[str] | None = None,
    *,
    scale: float = 1.0,
    scale_range: tuple[float, float] = (0.05, 4.0),
):
    """Return an ipywidgets ``interactive`` showing softmax(scale * scores) for a slider-chosen scale."""
    import ipywidgets as widgets  # imported here so the package works without a notebook stack

    s = torch.as_tensor(scores, dtype=torch.float64)
    if s.dim() != 1 or s.numel() < 2:
        raise ValueError(f"scores must be a 1-D sequence of at least 2 numbers; got shape {tuple(s.shape)}")
    lo, hi = scale_range
    if not (0 < lo < hi and lo <= scale <= hi):
        raise ValueError(f"scale_range must satisfy 0 < low <= scale <= high; got {scale_range} with scale={scale}")
    names = list(labels) if labels is not None else [f"key {j}" for j in range(s.numel())]
    if len(names) != s.numel():
        raise ValueError(f"labels must have {s.numel()} entries; got {len(names)}")

    def draw(scale: float) -> None:
        w = stable_softmax(scale * s)
        fig, ax = plt.subplots(figsize=(5.0, 2.6))
        ax.bar(names, w.numpy(), color="tab:blue")
        ax.set_ylim(0, 1)
        ax.set_ylabel("weight")
        ax.set_title(f"softmax({scale:.2f} x scores): max weight {float(w.max()):.3f}")
        plt.show()

    slider = widgets.FloatSlider(value=scale, min=lo, max=hi, step=0.05, description="scale", continuous_update=False)
    return widgets.interactive(draw, scale=slider)
