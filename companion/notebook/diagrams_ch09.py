"""Chapter 9's figures (local attention and mixtures of experts).

What this module provides, each a function returning a ``matplotlib.figure.Figure``:
- ``window_reach(T, window, layers)``: the sliding-window mask beside the inputs that reach the last
  position through L windowed layers, L (w - 1) + 1 of them (equation (9.3)).
- ``moe_routing(n_experts, top_k, chosen, gates)``: one token through a mixture-of-experts layer,
  the router, the top k experts run and their gated sum (equation (9.5)).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from companion.notebook.diagrams import (FONT, HEAD_COLOURS, MASK, OP, OUT, TENSOR, _arrow, _box,
                                         _canvas, _grid)

__all__ = ["window_reach", "moe_routing"]


def window_reach(T: int = 12, window: int = 3, layers: int = 3) -> Figure:
    """Left, the sliding-window mask (T x T): query i reads keys i - w + 1 .. i. Right, the inputs
    that reach the last position through ``layers`` windowed layers: each layer looks w - 1 further
    back, so the reach is L (w - 1) + 1 tokens (chapter 9)."""
    for name, value, low in (("T", T, 2), ("window", window, 1), ("layers", layers, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
    if T > 24:
        raise ValueError(f"T must be <= 24 to stay readable at the column's width; got {T}")
    fig, ax = _canvas(9.0, 3.3)
    cell = 2.3 / T
    keep = [[0 <= i - j < window for j in range(T)] for i in range(T)]
    _grid(ax, 0.45, 0.35, cell, keep)
    ax.text(0.45 + T * cell / 2, 2.95, f"sliding-window mask, w = {window}", ha="center", va="center",
            fontsize=FONT)
    ax.text(0.3, 0.35 + T * cell / 2, "query i", ha="center", va="center", fontsize=FONT - 1,
            rotation=90)
    ax.text(0.45 + T * cell / 2, 0.12, "key j", ha="center", va="center", fontsize=FONT - 1)
    # Right panel: positions as columns, layer 0 (the inputs) at the bottom, layer L on top.
    left, width = 3.6, 5.2
    step, row = width / T, 2.3 / layers
    reach = min(T, layers * (window - 1) + 1)
    for level in range(layers + 1):
        y = 0.35 + level * row * (layers / (layers + 1))
        lo = T - 1 - min(T - 1, (layers - level) * (window - 1))  # first position still in reach
        for p in range(T):
            inside = p >= lo if level < layers else p == T - 1
            ax.add_patch(Rectangle((left + p * step + 0.04, y), step - 0.08, 0.22,
                                   facecolor=HEAD_COLOURS[0] if inside else "white",
                                   edgecolor="#555555", linewidth=0.6))
        ax.text(left - 0.12, y + 0.11, "input" if level == 0 else f"layer {level}", ha="right",
                va="center", fontsize=FONT - 1)
    ax.text(left + width / 2, 2.95, f"reach of the last position: L(w - 1) + 1 = {reach} tokens",
            ha="center", va="center", fontsize=FONT)
    return fig


def moe_routing(n_experts: int = 6, top_k: int = 2, chosen: tuple[int, ...] = (1, 4),
                gates: tuple[float, ...] = (0.7, 0.3)) -> Figure:
    """One token through a mixture-of-experts layer: the router scores every expert, the top k are
    run, and their outputs are summed with the renormalised gates, y = sum_e g_e E_e(x) (chapter 9).
    The other experts are drawn but receive nothing: total parameters grow with the number of
    experts, the work per token with k."""
    if isinstance(n_experts, bool) or not isinstance(n_experts, int) or not 2 <= n_experts <= 8:
        raise ValueError(f"n_experts must be an int in [2, 8] (to fit the column); got {n_experts!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be an int in [1, n_experts={n_experts}]; got {top_k!r}")
    if len(chosen) != top_k or len(set(chosen)) != top_k or not all(0 <= e < n_experts for e in chosen):
        raise ValueError(f"chosen must hold top_k={top_k} distinct expert ids in [0, {n_experts}); got {chosen}")
    if len(gates) != top_k or abs(sum(gates) - 1.0) > 1e-6 or min(gates) < 0:
        raise ValueError(f"gates must hold top_k={top_k} non-negative weights summing to 1; got {gates}")
    fig, ax = _canvas(9.0, 3.2)
    _box(ax, 0.15, 1.35, 0.9, 0.5, "token $x$", TENSOR)
    _box(ax, 1.45, 1.3, 1.25, 0.6, "router\n$\\mathrm{softmax}(x W_r)$", OP)
    _arrow(ax, (1.05, 1.6), (1.45, 1.6))
    ax.text(2.08, 0.95, f"keep the top {top_k}", ha="center", va="center", fontsize=FONT - 1)
    bw, gap = 0.8, 0.12
    x0 = 3.35
    heights = 2.85 / n_experts
    for e in range(n_experts):
        y = 0.2 + (n_experts - 1 - e) * heights
        on = e in chosen
        label = f"expert {e}: $g_{e} = {gates[chosen.index(e)]:.1f}$" if on else f"expert {e}"
        _box(ax, x0, y, bw + 0.9, heights - gap, label, OP if on else MASK,
             weight="bold" if on else "normal")
        if on:
            _arrow(ax, (2.7, 1.6), (x0, y + (heights - gap) / 2), colour="#2c7a2c")
            _arrow(ax, (x0 + bw + 0.9, y + (heights - gap) / 2), (6.3, 1.6), colour="#2c7a2c")
    _box(ax, 6.3, 1.3, 0.9, 0.6, "sum", OP)
    _box(ax, 7.45, 1.3, 1.5, 0.6, "$y = \\sum_{e \\in \\mathrm{TopK}} g_e\\,\\mathcal{E}_e(x)$", OUT)
    _arrow(ax, (7.2, 1.6), (7.45, 1.6))
    return fig
