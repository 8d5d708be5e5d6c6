"""Chapter 6's diagrams (going deeper), drawn with matplotlib in the style of ``companion.notebook.diagrams``.

What this module provides, each a function returning a ``matplotlib.figure.Figure``:
- ``residual_streams()``: post-LN beside pre-LN, where the norm sits on one block's residual stream,
  with each placement's Jacobian per sublayer (eq. (6.2)).
- ``modern_decoder_layer()``: one layer of the modern decoder (eq. (6.9)): the residual stream as an
  identity path, the attention branch (RMSNorm, the fused QKV projection with h query and g key/value
  heads, RoPE on queries and keys, causal grouped-query attention, W_O) and the SwiGLU branch (RMSNorm,
  gate and up projections, SiLU times up, the down projection), each rejoining the stream at a sum.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch

from companion.notebook.diagrams import FONT, MASK, OP, OUT, TENSOR, _arrow, _box, _canvas

__all__ = ["residual_streams", "modern_decoder_layer"]

STREAM = "#2c7a2c"  # the identity path, as in chapter 6's other figure


def _circle(x: float, y: float, r: float = 0.13) -> Circle:
    """The circle of a residual addition, centred at (x, y)."""
    return Circle((x, y), r, facecolor="white", edgecolor="#333333", linewidth=1.2)


def residual_streams() -> Figure:
    """Post-LN beside pre-LN: where the norm sits on one block's residual stream (chapter 6).

    Left, post-LN (2017, GPT-1): x <- LN(x + F(x)); every LayerNorm sits *on* the stream, so a
    gradient from the top passes through 2L norms on its way down (Jacobian J_LN (I + J_F) per
    sublayer). Right, pre-LN (GPT-2 onwards): x <- x + F(LN(x)); the norms sit on the branches and
    the stream itself is an unbroken identity path (Jacobian I + J_F J_LN per sublayer), with one
    final norm after the last block."""
    fig, ax = _canvas(8.8, 4.7)
    path = STREAM
    columns = ((0.2, "post-LN (2017, GPT-1)", False), (4.6, "pre-LN (GPT-2 onwards)", True))
    for left, title, pre in columns:
        cx = left + 1.45  # the stream's x
        ax.text(left, 4.5, title, ha="left", va="center", fontsize=FONT, weight="bold")
        ax.text(cx, 0.2, "$x_\\ell$", ha="center", va="center", fontsize=FONT)
        y = 0.4
        for name in ("attention", "FFN"):
            join = y + 1.05  # where the branch rejoins the stream
            ax.add_patch(FancyArrowPatch((cx, y), (cx, join - 0.13), arrowstyle="-",
                                         color=path if pre else "#333333", linewidth=3.0 if pre else 1.2))
            bx = cx + 0.6  # the branch leaves the stream at y + 0.2 and rejoins at the + sign
            _arrow(ax, (cx, y + 0.2), (bx, y + 0.2), style="-")
            if pre:
                _box(ax, bx, y + 0.05, 0.5, 0.3, "LN", MASK)
                _box(ax, bx + 0.7, y + 0.05, 1.05, 0.3, name, OP)
                _arrow(ax, (bx + 0.5, y + 0.2), (bx + 0.7, y + 0.2))
                _arrow(ax, (bx + 1.22, y + 0.35), (cx + 0.13, join), rad=0.15)
            else:
                _box(ax, bx, y + 0.05, 1.05, 0.3, name, OP)
                _arrow(ax, (bx + 0.52, y + 0.35), (cx + 0.13, join), rad=0.15)
            ax.add_patch(_circle(cx, join))
            ax.text(cx, join, "+", ha="center", va="center", fontsize=FONT + 1, weight="bold")
            y = join + 0.13
            if not pre:  # the norm on the stream itself
                _arrow(ax, (cx, y), (cx, y + 0.12), style="-")
                _box(ax, cx - 0.3, y + 0.12, 0.6, 0.3, "LN", MASK)
                y += 0.42
        top = 3.95
        if pre:
            ax.add_patch(FancyArrowPatch((cx, y), (cx, top), arrowstyle="-|>", mutation_scale=12, color=path,
                                         linewidth=3.0, shrinkA=0, shrinkB=0))
            ax.text(cx, top + 0.15, "$x \\leftarrow x + F(\\mathrm{LN}(x))$", ha="center", va="center",
                    fontsize=FONT)
            ax.text(cx - 0.2, 2.3, "identity\npath:\n$I + J_F J_{LN}$", ha="right", va="center",
                    fontsize=FONT - 1, color=path)
            ax.text(cx + 0.2, 3.55, "(one final LN after the last block)", ha="left", va="center",
                    fontsize=FONT - 1)
        else:
            _arrow(ax, (cx, y), (cx, top))
            ax.text(cx, top + 0.15, "$x \\leftarrow \\mathrm{LN}(x + F(x))$", ha="center", va="center",
                    fontsize=FONT)
            ax.text(cx - 0.4, 2.3, "every LN\non the path:\n$J_{LN}(I + J_F)$", ha="right", va="center",
                    fontsize=FONT - 1)
    return fig


def _circle(x: float, y: float, r: float = 0.13):
    """The circle of a residual addition, centred at (x, y)."""
    from matplotlib.patches import Circle

    return Circle((x, y), r, facecolor="white", edgecolor="#333333", linewidth=1.2)


def modern_decoder_layer() -> Figure:
    """One layer of eq. (6.9), bottom to top: the stream H^(l-1) runs straight up (the identity path);
    the attention branch leaves it through RMSNorm, the fused projection X [W_Q W_K W_V] of width
    (h + 2g) d_h, RoPE on Q and K, causal attention in which query head r reads key/value head pi(r),
    and W_O, and rejoins at a sum (U); the SwiGLU branch leaves U through RMSNorm, the gate and up
    projections, SiLU(gate) times up, and W_d, and rejoins at the second sum (H^(l))."""
    fig, ax = _canvas(9.0, 4.3)
    cx = 0.75                                         # the stream's x
    ax.text(cx, 0.2, "$H^{(\\ell-1)}$", ha="center", va="center", fontsize=FONT)
    rows = (  # (branch y, boxes: (text, width, colour), what the sum gives)
        (0.75, (("RMSNorm", 0.95, MASK), ("fused QKV\n$(h + 2g)\\,d_h$", 1.25, OP),
                ("RoPE\non Q, K", 0.95, OP), ("causal GQA\nhead $r$ reads $\\pi(r)$", 1.75, OP),
                ("$W_O$", 0.6, OP)), "$U$"),
        (2.35, (("RMSNorm", 0.95, MASK), ("$Z W_g$ and $Z W_u$", 1.5, OP),
                ("SiLU$(ZW_g) \\odot ZW_u$", 2.0, OP), ("$W_d$", 0.6, OP)), "$H^{(\\ell)}$"),
    )
    y = 0.4
    for by, boxes, result in rows:
        join = by + 0.95                              # where the branch rejoins the stream
        ax.add_patch(FancyArrowPatch((cx, y), (cx, join - 0.13), arrowstyle="-", color=STREAM,
                                     linewidth=3.0, shrinkA=0, shrinkB=0))
        x, h = cx + 0.45, 0.5
        _arrow(ax, (cx, by + h / 2), (x, by + h / 2), style="-")
        for i, (text, w, colour) in enumerate(boxes):
            _box(ax, x, by, w, h, text, colour)
            if i + 1 < len(boxes):
                _arrow(ax, (x + w, by + h / 2), (x + w + 0.25, by + h / 2))
            x += w + 0.25
        right = x - 0.25                              # the last box's right edge
        ax.add_patch(FancyArrowPatch((right - 0.3, by + h), (cx + 0.13, join), arrowstyle="-|>",
                                     mutation_scale=12, color="#333333", linewidth=1.2,
                                     connectionstyle="arc3,rad=0.08", shrinkA=0, shrinkB=0))
        ax.add_patch(_circle(cx, join))
        ax.text(cx, join, "+", ha="center", va="center", fontsize=FONT + 1, weight="bold")
        ax.text(cx - 0.25, join, result, ha="right", va="center", fontsize=FONT)
        y = join + 0.13
    ax.add_patch(FancyArrowPatch((cx, y), (cx, 4.0), arrowstyle="-|>", mutation_scale=12, color=STREAM,
                                 linewidth=3.0, shrinkA=0, shrinkB=0))
    ax.text(cx + 0.2, 3.85, "identity path: no norm on the stream; one final RMSNorm after the last layer",
            ha="left", va="center", fontsize=FONT - 1, color=STREAM)
    ax.text(cx + 0.45, 0.2, "Q: $h$ heads, K and V: $g$ heads of width $d_h$; no biases anywhere",
            ha="left", va="center", fontsize=FONT - 1)
    return fig
