"""Explanatory diagrams for the chapters, drawn with matplotlib (no screenshots, no image files).

What this module provides, each a function returning a ``matplotlib.figure.Figure``, besides the
drawing primitives (``_canvas``, ``_box``, ``_arrow``, ``_grid``) and colours that the chapters'
modules ``diagrams_chNN`` draw with (chapter 1's diagrams are in ``diagrams_ch01``, chapter 3's in
``diagrams_ch03``):
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

__all__ = ["glue_figure", "teacher_forcing_vs_generation"]

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
