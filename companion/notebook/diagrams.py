"""Explanatory diagrams for the chapters, drawn with matplotlib (no screenshots, no image files).

What this module provides, each a function returning a ``matplotlib.figure.Figure``:
- ``attention_steps()``: the four steps of equation (1.2) with the shape of every intermediate
  (score Q K^T, scale by 1/sqrt(d_k), mask + softmax, weighted sum with V).
- ``multihead_split()``: d_model split into h heads of width d_k, all heads attended as one
  batched product on (B, h, T, d_k), then concatenated and mixed by W_O (chapter 1).
- ``encoder_decoder()``: the 2017 encoder-decoder with its three kinds of attention: encoder
  self-attention, decoder masked self-attention, and cross-attention whose queries come from the
  decoder and whose keys and values come from the encoder (chapters 1 and 3).
- ``shifted_input()``: teacher forcing: the decoder reads BOS + target and is graded on
  target + EOS, one position ahead (chapter 3).
- ``teacher_forcing_vs_generation()``: training reads the true prefix and predicts every position in
  one pass under the causal mask; generation runs one pass per new token and feeds each sampled
  token back as the next input (chapter 4).
- ``glue_figure(name, fig)``: hand any figure to the book build under ``name``, where a
  ``{glue:figure}`` directive gives it a number, a caption and alt text; it is also displayed in
  the notebook itself (tag the cell ``remove-output`` so the book shows it once).

The figures are sized for the book's text column (about 9 x 3 inches at the book's 80 dpi) with
labels of at least 9 points. Coordinates inside each figure are inches, so a box of width 1 is an
inch wide on the page. The figures are not registered with pyplot: nothing is shown until the
caller displays or glues them.
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

__all__ = ["attention_steps", "multihead_split", "encoder_decoder", "shifted_input", "glue_figure",
           "teacher_forcing_vs_generation"]

DIAGRAMS = ("attention_steps", "multihead_split", "encoder_decoder", "shifted_input")

# Colours: inputs / tensors (blue), operations (orange), masks (grey), outputs (green).
TENSOR, OP, MASK, OUT, HEAD_COLOURS = "#dbe9f6", "#fde2c4", "#e6e6e6", "#d5efd5", (
    "#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc")
FONT = 10


def _canvas(width: float, height: float):
    """A Figure of ``width`` x ``height`` inches whose single axes uses inches as data units."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)  # lets callers (and tests) render it without pyplot
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def _box(ax, x, y, w, h, text, colour, *, size=FONT, weight="normal"):
    """A rounded box with its lower-left corner at (x, y) and ``text`` centred inside."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.06",
                                facecolor=colour, edgecolor="#444444", linewidth=1.0))
    return ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                   weight=weight)


def _arrow(ax, start, end, *, colour="#333333", style="-|>", rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=colour,
                                 linewidth=1.2, connectionstyle=f"arc3,rad={rad}",
                                 shrinkA=0, shrinkB=0))


def _grid(ax, x, y, cell, keep, colour="#6baed6"):
    """A small mask picture: ``keep[i][j]`` True = query row i may read key column j."""
    rows, cols = len(keep), len(keep[0])
    for i in range(rows):
        for j in range(cols):
            face = colour if keep[i][j] else "white"
            ax.add_patch(Rectangle((x + j * cell, y + (rows - 1 - i) * cell), cell, cell,
                                   facecolor=face, edgecolor="#555555", linewidth=0.6))


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


def shifted_input(target: tuple[str, ...] = ("le", "chat", "dort")) -> Figure:
    """Teacher forcing: decoder input = <bos> + target, labels = target + <eos>.

    With the whole sequence s = <bos> + target + <eos>, the input is s[:-1] and the labels are
    s[1:]: position i reads the true tokens up to i (causal mask) and is graded on token i + 1.
    """
    if not target or not all(isinstance(t, str) and t for t in target):
        raise ValueError(f"target must be a non-empty sequence of non-empty strings; got {target!r}")
    inputs = ["<bos>", *target]
    labels = [*target, "<eos>"]
    n = len(inputs)
    step = 1.25
    width = 2.6 + n * step
    fig, ax = _canvas(width, 2.9)
    x0, bw = 2.5, 1.0
    ax.text(0.1, 2.7, "teacher forcing", ha="left", va="center", fontsize=FONT, weight="bold")
    ax.text(0.1, 2.15, "labels\n= target + <eos>", ha="left", va="center", fontsize=FONT)
    ax.text(0.1, 1.2, "decoder\n(causal)", ha="left", va="center", fontsize=FONT)
    ax.text(0.1, 0.35, "input\n= <bos> + target", ha="left", va="center", fontsize=FONT)
    for i in range(n):
        x = x0 + i * step
        _box(ax, x, 0.1, bw, 0.5, inputs[i], TENSOR)
        _box(ax, x, 2.0, bw, 0.5, labels[i], OUT)
        _arrow(ax, (x + bw / 2, 0.6), (x + bw / 2, 0.95))
        _arrow(ax, (x + bw / 2, 1.45), (x + bw / 2, 2.0))
        ax.text(x + bw / 2, 2.65, f"position {i}", ha="center", va="center", fontsize=FONT - 1)
    _box(ax, x0, 0.95, (n - 1) * step + bw, 0.5,
         "position i reads inputs 0..i and predicts label i", OP)
    return fig


def teacher_forcing_vs_generation(tokens: tuple[str, ...] = ("to", "be", "or", "not", "to")) -> Figure:
    """Left: training reads tokens[:-1] and is graded on tokens[1:], every position in one pass.
    Right: generation starts from tokens[0]; pass t reads tokens[:t + 1] (its own earlier samples)
    and samples token t + 1, which the next pass reads."""
    if len(tokens) < 3 or not all(isinstance(t, str) and t for t in tokens):
        raise ValueError(f"tokens must be at least 3 non-empty strings; got {tokens!r}")
    inputs, labels = tokens[:-1], tokens[1:]
    n = len(inputs)
    step, bw = 0.95, 0.75
    width = 2 * (0.3 + n * step) + 0.6
    fig, ax = _canvas(width, 3.4)
    left, right = 0.3, 0.3 + n * step + 0.6
    ax.text(left, 3.15, "training: teacher forcing", ha="left", va="center", fontsize=FONT, weight="bold")
    ax.text(right, 3.15, "generation: one pass per token", ha="left", va="center", fontsize=FONT,
            weight="bold")
    for i in range(n):
        x = left + i * step
        _box(ax, x, 0.2, bw, 0.45, inputs[i], TENSOR)
        _box(ax, x, 2.2, bw, 0.45, labels[i], OUT)
        _arrow(ax, (x + bw / 2, 0.65), (x + bw / 2, 1.05))
        _arrow(ax, (x + bw / 2, 1.6), (x + bw / 2, 2.2))
    _box(ax, left, 1.05, (n - 1) * step + bw, 0.55, "one pass, causal mask:\nall T positions at once", OP)
    ax.text(left + ((n - 1) * step + bw) / 2, 2.85, "graded on the true next tokens", ha="center",
            va="center", fontsize=FONT - 1)
    for i in range(n):
        x = right + i * step
        _box(ax, x, 0.2, bw, 0.45, inputs[0] if i == 0 else labels[i - 1], TENSOR if i == 0 else OUT)
        _box(ax, x, 1.05, bw, 0.55, f"pass {i + 1}", OP)
        _box(ax, x, 2.2, bw, 0.45, labels[i], OUT)
        _arrow(ax, (x + bw / 2, 0.65), (x + bw / 2, 1.05))
        _arrow(ax, (x + bw / 2, 1.6), (x + bw / 2, 2.2))
        if i + 1 < n:  # the sample becomes the next pass's input
            _arrow(ax, (x + bw, 2.3), (x + step, 0.55), colour="#2c7a2c", rad=-0.25)
    ax.text(right + ((n - 1) * step + bw) / 2, 2.85, "each sample is fed back as input", ha="center",
            va="center", fontsize=FONT - 1)
    return fig


def glue_figure(name: str, fig: Figure) -> None:
    """Display ``fig`` and record it under ``name`` for a ``{glue:figure}`` directive.

    The output carries the same ``scrapbook`` metadata that ``myst_nb.glue(name, fig,
    display=True)`` writes, so the book build finds it, without importing myst_nb (and Sphinx
    with it) into the kernel; Jupyter and Colab simply display the figure. A figure made with
    pyplot is closed first, so that the notebook does not draw it a second time at the end of
    the cell.
    """
    if not isinstance(fig, Figure):
        raise ValueError(f"fig must be a matplotlib Figure; got {type(fig).__name__}")
    if not (isinstance(name, str) and name.startswith("fig-")):
        raise ValueError(f"name must be a figure label starting with 'fig-'; got {name!r}")
    import matplotlib.pyplot as plt
    from IPython.core.formatters import format_display_data
    from IPython.display import display

    plt.close(fig)
    data, metadata = format_display_data(fig)
    display(data, raw=True, metadata={**metadata, "scrapbook": {"name": name, "mime_prefix": ""}})
