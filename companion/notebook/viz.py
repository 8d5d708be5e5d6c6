"""Plots shared by the chapters.

What this module provides
- ``use_book_style()``: one call at the top of a notebook for compact PNG figures (nbval skips
  images, so PNG keeps the committed outputs comparable; SVG text would be compared).
- ``attention_heatmap(weights, ...)``: a (T, S) weight matrix with token labels on both axes.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import torch

__all__ = ["use_book_style", "attention_heatmap"]


def use_book_style(dpi: int = 80) -> None:
    """Small, legible PNG figures for notebooks and the rendered book."""
    plt.rcParams.update(
        {
            "figure.dpi": dpi,
            "savefig.dpi": dpi,
            "figure.figsize": (6.0, 3.6),
            "axes.spines.top": False,
            "axes.spines.right": False,
            "font.size": 10,
        }
    )
    try:  # inside IPython: make sure figures are PNG, not SVG
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except ImportError:  # plain Python: nothing to configure
        pass


def attention_heatmap(
    weights: torch.Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ax: plt.Axes | None = None,
    title: str | None = None,
    annotate: bool = True,
    cmap: str = "Blues",
) -> plt.Axes:
    """Draw attention weights A (T, S): row i = query i, column j = key j, darker = more weight."""
    w = torch.as_tensor(weights).detach().to("cpu", torch.float64)
    if w.dim() != 2:
        raise ValueError(f"weights must be a (T, S) matrix; got shape {tuple(w.shape)}")
    T, S = w.shape
    if query_labels is not None and len(query_labels) != T:
        raise ValueError(f"query_labels must have T={T} entries; got {len(query_labels)}")
    if key_labels is not None and len(key_labels) != S:
        raise ValueError(f"key_labels must have S={S} entries; got {len(key_labels)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * S + 1.5, 0.45 * T + 1.0))
    ax.imshow(w.numpy(), cmap=cmap, vmin=0.0, vmax=1.0)
    ax.set_xticks(range(S), key_labels if key_labels is not None else range(S), rotation=45, ha="right")
    ax.set_yticks(range(T), query_labels if query_labels is not None else range(T))
    ax.set_xlabel("key (read from)")
    ax.set_ylabel("query (reader)")
    if annotate and T * S <= 144:
        for i in range(T):
            for j in range(S):
                val = float(w[i, j])
                ax.text(j, i, f"{val:.2f}", ha="center", va="center", fontsize=7, color="white" if val > 0.55 else "black")
    if title:
        ax.set_title(title)
    return ax
