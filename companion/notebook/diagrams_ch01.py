"""Chapter 1's diagrams, drawn with the primitives of ``companion.notebook.diagrams``.

What this module provides, each a function returning a ``matplotlib.figure.Figure``:
- ``attention_steps()``: the four steps of equation (1.2) with the shape of every intermediate
  (score Q K^T, scale by 1/sqrt(d_k), mask + softmax, weighted sum with V).
- ``multihead_split()``: d_model split into h heads of width d_k, all heads attended as one
  batched product on (B, h, T, d_k), then concatenated and mixed by W_O.
- ``encoder_decoder()``: the 2017 encoder-decoder with its three kinds of attention: encoder
  self-attention, decoder masked self-attention, and cross-attention whose queries come from the
  decoder and whose keys and values come from the encoder (chapter 3 shows it again).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from companion.notebook.diagrams import (FONT, HEAD_COLOURS, MASK, OP, OUT, TENSOR, _arrow, _box,
                                         _canvas, _grid)

__all__ = ["attention_steps", "multihead_split", "encoder_decoder"]


def attention_steps() -> Figure:
    """The four steps of scaled dot-product attention, equation (1.2), with shapes.

    Q (T, d_k) and K (S, d_k) give scores Q K^T (T, S); the scores are scaled by 1/sqrt(d_k),
    the mask M (0 or -inf) is added and each row goes through a softmax, giving weights A (T, S)
    whose rows sum to 1; the output O = A V has shape (T, d_v).
    """
    fig, ax = _canvas(9.0, 3.3)
    # Inputs on the left and below.
    _box(ax, 0.1, 2.0, 0.9, 0.55, "$Q$\n$(T, d_k)$", TENSOR)
    _box(ax, 0.1, 1.05, 0.9, 0.55, "$K$\n$(S, d_k)$", TENSOR)
    _box(ax, 4.05, 0.1, 1.3, 0.55, "mask $M$ $(T, S)$\n0 or $-\\infty$", MASK)
    _box(ax, 6.05, 0.1, 1.1, 0.55, "$V$\n$(S, d_v)$", TENSOR)
    # The four steps, each with the shape of what it produces.
    y0, h, w = 1.2, 1.15, 1.3
    steps = [(1.4, "1. score\n$QK^{\\top}$\n$(T, S)$"),
             (2.95, "2. scale\n$\\times\\, 1/\\sqrt{d_k}$\n$(T, S)$"),
             (4.5, "3. mask +\nsoftmax\n$A$ $(T, S)$"),
             (6.05, "4. weighted\nsum $AV$\n$(T, d_v)$")]
    for x, text in steps:
        _box(ax, x, y0, w, h, text, OP)
    _box(ax, 7.75, y0 + 0.28, 1.15, 0.6, "output $O$\n$(T, d_v)$", OUT)
    mid = y0 + h / 2
    _arrow(ax, (1.0, 2.27), (1.4, mid + 0.2))
    _arrow(ax, (1.0, 1.32), (1.4, mid - 0.2))
    for x in (2.7, 4.25, 5.8, 7.35):
        _arrow(ax, (x, mid), (x + 0.25 if x < 7 else 7.75, mid))
    _arrow(ax, (4.7, 0.65), (4.7, y0))
    _arrow(ax, (6.6, 0.65), (6.6, y0))
    ax.text(5.15, y0 + h + 0.1, "each row of $A$ sums to 1", ha="center", va="bottom",
            fontsize=FONT - 1, style="italic")
    ax.text(0.1, 3.0, "$\\mathrm{Attn}(Q, K, V; M) = \\mathrm{softmax}(QK^{\\top}/\\sqrt{d_k}"
            " + M)\\,V$", ha="left", va="center", fontsize=FONT + 1)
    return fig


def multihead_split() -> Figure:
    """Multi-head attention computed as one batched product.

    x (B, T, d_model) is projected by W_Q (likewise W_K, W_V), the last axis is split into h
    heads of width d_k = d_model / h and moved in front of T: (B, h, T, d_k). One batched
    attention call serves every head; transposing back and merging the last two axes
    concatenates the heads, (B, T, h d_k), and W_O mixes them into (B, T, d_model).
    """
    fig, ax = _canvas(9.0, 3.4)
    h = len(HEAD_COLOURS)
    # 1. The projected row, d_model wide, coloured by head.
    x0, y0, seg = 0.15, 1.55, 0.42
    ax.text(x0, 2.75, "1. project: $xW_Q$\n(same for $K$, $V$)\n$(B, T, d_{model})$", ha="left", va="center",
            fontsize=FONT)
    for r, colour in enumerate(HEAD_COLOURS):
        ax.add_patch(Rectangle((x0 + r * seg, y0), seg, 0.6, facecolor=colour,
                               edgecolor="#444444"))
        ax.text(x0 + (r + 0.5) * seg, y0 + 0.3, f"{r + 1}", ha="center", va="center",
                fontsize=FONT)
    ax.text(x0 + h * seg / 2, y0 - 0.2, f"$h = {h}$ heads of $d_k$", ha="center", va="top",
            fontsize=FONT - 1)
    # 2. Split and transpose: the heads become a batch axis.
    _arrow(ax, (x0 + h * seg + 0.1, y0 + 0.3), (2.45, y0 + 0.3))
    ax.text(2.0, 0.75, "view $(B, T, h, d_k)$\ntranspose(1, 2)", ha="center", va="center",
            fontsize=FONT - 1)
    sx, sy, sw, sh, off = 2.55, 1.0, 0.55, 1.15, 0.16
    for r, colour in reversed(list(enumerate(HEAD_COLOURS))):
        ax.add_patch(Rectangle((sx + r * off, sy + r * off), sw, sh, facecolor=colour,
                               edgecolor="#444444"))
    ax.text(sx + 0.55, 2.95, "2. split\n$(B, h, T, d_k)$", ha="center", va="center",
            fontsize=FONT)
    # 3. One batched attention call.
    _arrow(ax, (3.75, 1.85), (4.15, 1.85))
    _box(ax, 4.15, 1.35, 1.45, 1.0, "3. attention,\none batched\nproduct", OP)
    ax.text(4.87, 0.95, "every head at once:\n$(B, h, T, d_k)$", ha="center", va="top",
            fontsize=FONT - 1)
    # 4. Concatenate: transpose back and merge the head axis into the features.
    _arrow(ax, (5.6, 1.85), (6.0, 1.85))
    cx = 6.0
    for r, colour in enumerate(HEAD_COLOURS):
        ax.add_patch(Rectangle((cx + r * 0.3, 1.55), 0.3, 0.6, facecolor=colour,
                               edgecolor="#444444"))
    ax.text(cx + 0.6, 2.75, "4. concat\n$(B, T, h\\,d_k)$", ha="center", va="center",
            fontsize=FONT)
    ax.text(cx + 0.6, 1.35, "transpose,\nreshape", ha="center", va="top", fontsize=FONT - 1)
    # 5. W_O mixes the heads.
    _arrow(ax, (7.25, 1.85), (7.55, 1.85))
    _box(ax, 7.55, 1.5, 1.35, 0.7, "5. $W_O$\n$(B, T, d_{model})$", OUT)
    return fig


def encoder_decoder() -> Figure:
    """The encoder-decoder and its three kinds of attention.

    Encoder self-attention: every source token reads every source token (padding aside).
    Decoder masked self-attention: target position i reads target positions <= i.
    Cross-attention: queries from the decoder, keys and values from the encoder's output, so
    its weight matrix is (T, S) and needs no causal mask.
    """
    fig, ax = _canvas(9.0, 4.4)
    # Encoder column.
    ex, w = 0.9, 2.3
    ax.text(ex + w / 2, 4.15, "encoder ($\\times N$)", ha="center", va="center", fontsize=FONT + 1,
            weight="bold")
    _box(ax, ex, 0.2, w, 0.5, "source tokens + positions", TENSOR)
    _box(ax, ex, 1.1, w, 0.75, "self-attention\n(all source tokens)", OP)
    _box(ax, ex, 2.25, w, 0.55, "feed-forward", OP)
    _box(ax, ex, 3.2, w, 0.55, "encoder output $(S, d)$", OUT)
    for y_from, y_to in [(0.7, 1.1), (1.85, 2.25), (2.8, 3.2)]:
        _arrow(ax, (ex + w / 2, y_from), (ex + w / 2, y_to))
    # Decoder column.
    dx = 5.2
    ax.text(dx + w / 2, 4.15, "decoder ($\\times N$)", ha="center", va="center", fontsize=FONT + 1,
            weight="bold")
    _box(ax, dx, 0.2, w, 0.5, "shifted target + positions", TENSOR)
    _box(ax, dx, 0.95, w, 0.75, "masked self-attention\n(causal)", OP)
    _box(ax, dx, 1.95, w, 0.75, "cross-attention\n(queries from decoder)", OP)
    _box(ax, dx, 2.95, w, 0.45, "feed-forward", OP)
    _box(ax, dx, 3.6, w, 0.35, "next-token probabilities", OUT)
    for y_from, y_to in [(0.7, 0.95), (1.7, 1.95), (2.7, 2.95), (3.4, 3.6)]:
        _arrow(ax, (dx + w / 2, y_from), (dx + w / 2, y_to))
    # Encoder output feeds every decoder layer's cross-attention as keys and values.
    _arrow(ax, (ex + w, 3.47), (dx, 2.4), rad=0.0)
    ax.text(4.35, 3.25, "keys, values\nfrom the encoder", ha="center", va="bottom",
            fontsize=FONT - 1)
    # Mask pictures: rows = queries, columns = keys.
    cell = 0.13
    full = [[True] * 4 for _ in range(4)]
    causal = [[j <= i for j in range(4)] for i in range(4)]
    cross = [[True] * 5 for _ in range(4)]
    _grid(ax, 0.12, 1.22, cell, full)
    ax.text(0.38, 1.1, "$S \\times S$", ha="center", va="top", fontsize=FONT - 1)
    _grid(ax, 7.65, 1.07, cell, causal)
    ax.text(7.92, 0.95, "$T \\times T$", ha="center", va="top", fontsize=FONT - 1)
    _grid(ax, 7.65, 2.07, cell, cross, colour="#fd8d3c")
    ax.text(7.98, 1.95, "$T \\times S$", ha="center", va="top", fontsize=FONT - 1)
    return fig
