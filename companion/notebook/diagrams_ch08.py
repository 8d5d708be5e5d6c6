"""Chapter 8's figures (sharing keys and values).

What this module provides, each a function returning a ``matplotlib.figure.Figure``:
- ``kv_head_sharing(n_heads, kv_heads)``: which query heads read which key/value head, the head map
  pi(r) = floor(r / (h / g)) of equation (8.1), one panel per g (MHA, GQA, MQA).
- ``mla_flow()``: one multi-head latent attention layer as data flow: the cached latent and RoPE
  key, the expanded and the absorbed paths, the score of equation (8.7).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from companion.notebook.diagrams import FONT, OP, OUT, TENSOR, _arrow, _box, _canvas

__all__ = ["kv_head_sharing", "mla_flow"]


def kv_head_sharing(n_heads: int = 8, kv_heads: tuple[int, ...] = (8, 2, 1)) -> Figure:
    """One panel per g in ``kv_heads``: h query heads (top row) each joined to the key/value head
    pi(r) = floor(r / (h / g)) it reads (bottom row), coloured by group; below each panel, the numbers
    one token and layer leave in the cache, 2 g d_h. g = h is MHA, g = 1 MQA, anything between GQA."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or not 2 <= n_heads <= 12:
        raise ValueError(f"n_heads must be an int in [2, 12] (the boxes must fit); got {n_heads!r}")
    if not kv_heads or len(kv_heads) > 3 or any(
            isinstance(g, bool) or not isinstance(g, int) or g < 1 or n_heads % g for g in kv_heads):
        raise ValueError(f"kv_heads must be 1 to 3 ints that divide n_heads={n_heads}; got {kv_heads!r}")
    colours = ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#c7e9c0", "#fdd0a2",
               "#dadaeb")
    panel, gap = 2.9, 0.15
    fig, ax = _canvas(len(kv_heads) * panel + (len(kv_heads) - 1) * gap, 3.2)
    step = (panel - 0.2) / n_heads
    bw = min(0.3, step * 0.8)
    for p, g in enumerate(kv_heads):
        x0 = p * (panel + gap) + 0.1
        kind = "MHA" if g == n_heads else ("MQA" if g == 1 else "GQA")
        ax.text(x0 + panel / 2 - 0.1, 3.0, f"{kind}: $h = {n_heads}$, $g = {g}$", ha="center",
                va="center", fontsize=FONT, weight="bold")
        ax.text(x0, 2.62, "query heads $r$", ha="left", va="center", fontsize=FONT - 1)
        group = n_heads // g
        kv_step = (panel - 0.2) / g
        kv_w = min(kv_step * 0.85, max(bw, 0.45))
        kv_x = [x0 + (kv_step - kv_w) / 2 + j * kv_step for j in range(g)]
        for r in range(n_heads):
            x = x0 + (step - bw) / 2 + r * step
            j = r // group
            colour = colours[j % len(colours)]
            _box(ax, x, 2.0, bw, 0.38, f"{r}", colour, size=FONT - 1)
            _arrow(ax, (x + bw / 2, 2.0), (kv_x[j] + kv_w / 2, 1.18), colour="#555555",
                   style="-")
        for j in range(g):
            label = f"{j}" if g > 2 else f"K, V {j}"  # numbered from 0, like (8.1)
            _box(ax, kv_x[j], 0.8, kv_w, 0.38, label, colours[j % len(colours)], size=FONT - 1)
        ax.text(x0, 0.55, "key/value heads $\\pi(r)$", ha="left", va="center", fontsize=FONT - 1)
        ax.text(x0, 0.2, f"cache: $2 \\cdot {g}\\, d_h$ per token", ha="left", va="center",
                fontsize=FONT - 1)
    return fig


def mla_flow() -> Figure:
    """Multi-head latent attention, one layer (DeepSeek-V2/V3), as data flow.

    Bottom: an earlier token x_j is compressed to the latent c_j = RMSNorm(x_j W_DKV) (d_c numbers)
    and gives one RoPE key k^R_j = RoPE_j(x_j W_KR) (d_R numbers), shared by all heads: these two are
    the cache. Expanded path: k^C_{j,r} = c_j U_K^r, v_{j,r} = c_j U_V^r per head. Top: the query
    token x_i gives q^C_{i,r} and q^R_{i,r} (RoPE at i). The score adds q^C . k^C and q^R . k^R over
    sqrt(d_h + d_R). Absorbed path: q^C U_K^{rT} is dotted with c_j directly.
    """
    fig, ax = _canvas(9.0, 3.9)
    # Query side (top row).
    _box(ax, 0.1, 3.05, 1.0, 0.55, "$x_i$\nnew token", TENSOR)
    _box(ax, 1.55, 3.05, 1.75, 0.55, "$c'_i = \\mathrm{RMSNorm}(x_i W_{DQ})$", OP, size=FONT - 1)
    _box(ax, 3.75, 3.05, 2.0, 0.55, "$q^C_{i,r}$, $q^R_{i,r}$ (RoPE$_i$)\nper head $r$", OP,
         size=FONT - 1)
    _arrow(ax, (1.1, 3.32), (1.55, 3.32))
    _arrow(ax, (3.3, 3.32), (3.75, 3.32))
    # Key side: the cache (dashed frame) and the expansion.
    ax.add_patch(FancyBboxPatch((1.45, 0.15), 1.95, 1.95, boxstyle="round,pad=0.02", fill=False,
                                edgecolor="#b30000", linestyle="--", linewidth=1.3))
    ax.text(2.42, 2.28, "cache: $d_c + d_R$ per token", ha="center", va="center",
            fontsize=FONT - 1, color="#b30000")
    _box(ax, 0.1, 0.85, 1.0, 0.55, "$x_j$\nearlier token", TENSOR)
    _box(ax, 1.55, 1.3, 1.75, 0.6, "$c_j$ latent $(d_c)$\n$\\mathrm{RMSNorm}(x_j W_{DKV})$", OUT,
         size=FONT - 1)
    _box(ax, 1.55, 0.3, 1.75, 0.6, "$k^R_j$ RoPE key $(d_R)$\n$\\mathrm{RoPE}_j(x_j W_{KR})$", OUT,
         size=FONT - 1)
    _arrow(ax, (1.1, 1.2), (1.55, 1.55))
    _arrow(ax, (1.1, 1.05), (1.55, 0.65))
    _box(ax, 3.85, 1.3, 1.8, 0.6, "$k^C_{j,r} = c_j U_K^r$\n$v_{j,r} = c_j U_V^r$", OP,
         size=FONT - 1)
    _arrow(ax, (3.3, 1.6), (3.85, 1.6))
    ax.text(4.75, 1.97, "expanded: every head", ha="center", va="bottom", fontsize=FONT - 1)
    # Scores and output.
    _box(ax, 6.2, 1.85, 2.7, 0.9,
         "$s_{ij,r} = \\dfrac{q^C_{i,r} \\cdot k^C_{j,r} + q^R_{i,r} \\cdot k^R_j}"
         "{\\sqrt{d_h + d_R}}$", OP, size=FONT - 1)
    _box(ax, 6.2, 0.55, 2.7, 0.75, "softmax over $j$, then\n$o_{i,r} = \\sum_j a_{ij,r}\\, v_{j,r}$",
         OUT, size=FONT - 1)
    _arrow(ax, (5.75, 3.2), (6.6, 2.75))
    _arrow(ax, (5.65, 1.75), (6.2, 2.1))
    _arrow(ax, (3.4, 0.55), (6.2, 1.95), rad=0.25)
    _arrow(ax, (7.55, 1.85), (7.55, 1.3))
    _arrow(ax, (3.8, 3.05), (3.2, 1.9), colour="#b30000")  # absorbed: the query reads c_j itself
    ax.text(5.0, 2.6, "absorbed: $(q^C_{i,r} U_K^{r\\top}) \\cdot c_j$", ha="center",
            va="center", fontsize=FONT - 1, style="italic")
    return fig
