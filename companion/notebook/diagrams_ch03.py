"""Chapter 3's diagram, drawn with the primitives of ``companion.notebook.diagrams``.

- ``shifted_input(target)``: teacher forcing: the decoder reads BOS + target and is graded on
  target + EOS, one position ahead. (Chapter 3 also shows ``diagrams_ch01.encoder_decoder``.)
"""

from __future__ import annotations

from matplotlib.figure import Figure

from companion.notebook.diagrams import FONT, OP, OUT, TENSOR, _arrow, _box, _canvas

__all__ = ["shifted_input"]


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
