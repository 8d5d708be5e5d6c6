"""Chapter 4's diagrams (GPT), drawn with matplotlib in the style of ``companion.notebook.diagrams``.

What this module provides, each a function returning a ``matplotlib.figure.Figure``:
- ``training_vs_generation(tokens)``: training reads the true text and grades every position in one
  pass under the causal mask; generation runs one pass per new token, and pass t reads the whole
  prefix so far (the prompt and every earlier sample), not only the last token.
- ``gpt_architecture(n_layer)``: token ids to logits: token and position embeddings, N pre-LN
  blocks (norm, causal self-attention, add; norm, MLP, add), the final norm and the tied head, with
  the shape of the tensor on every arrow.
- ``training_step()``: the data flow of one optimizer step: a batch of windows, inputs and targets,
  logits, the loss, the gradients, clipping by one global norm, the scheduled AdamW update.
- ``sampling_step()``: one step of generation: the last position's logits, temperature, the
  top-k / top-p filter, softmax, one draw, appended to the prefix that the next pass reads.
- ``token_rows(rows, labels)``: one piece of text cut into tokens at successive stages (bytes, then
  after each merge of a byte-pair encoding), one row of boxes per stage.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from companion.notebook.diagrams import FONT, MASK, OP, OUT, TENSOR, _arrow, _box, _canvas

__all__ = ["training_vs_generation", "gpt_architecture", "training_step", "sampling_step",
           "token_rows"]


def training_vs_generation(tokens: tuple[str, ...] = ("to", "be", "or", "not", "to")) -> Figure:
    """Left: one pass reads tokens[:-1] and is graded on tokens[1:]. Right: pass t reads the prefix
    tokens[:t + 1] (tokens[0] is the prompt, the rest the model's own samples) and samples
    tokens[t + 1], which the next pass reads on top of the same prefix."""
    if len(tokens) < 3 or not all(isinstance(t, str) and t for t in tokens):
        raise ValueError(f"tokens must be at least 3 non-empty strings; got {tokens!r}")
    inputs, labels = tokens[:-1], tokens[1:]
    n = len(inputs)
    step, bw, th = 0.95, 0.75, 0.3
    width = 2 * (0.3 + n * step) + 0.6
    top = 0.2 + n * th + 0.15                   # the passes sit above the tallest prefix
    height = top + 0.55 + 0.35 + 0.4 + 0.75
    fig, ax = _canvas(width, height)
    left, right = 0.3, 0.3 + n * step + 0.6
    ax.text(left, height - 0.25, "training: teacher forcing", ha="left", va="center",
            fontsize=FONT, weight="bold")
    ax.text(right, height - 0.25, "generation: one pass per token", ha="left", va="center",
            fontsize=FONT, weight="bold")
    out_y = top + 0.55 + 0.35
    for i in range(n):
        x = left + i * step
        _box(ax, x, top - 0.6, bw, 0.4, inputs[i], TENSOR)
        _box(ax, x, out_y, bw, 0.4, labels[i], OUT)
        _arrow(ax, (x + bw / 2, top - 0.2), (x + bw / 2, top))
        _arrow(ax, (x + bw / 2, top + 0.55), (x + bw / 2, out_y))
    _box(ax, left, top, (n - 1) * step + bw, 0.55, "one pass, causal mask:\nall T positions at once",
         OP)
    ax.text(left + ((n - 1) * step + bw) / 2, out_y + 0.6, "graded on the true next tokens",
            ha="center", va="center", fontsize=FONT - 1)
    for i in range(n):
        x = right + i * step
        for j in range(i + 1):                  # pass i reads the whole prefix tokens[: i + 1]
            word = inputs[0] if j == 0 else labels[j - 1]
            _box(ax, x, top - 0.15 - (i + 1 - j) * th, bw, th - 0.04, word,
                 TENSOR if j == 0 else OUT, size=FONT - 1)
        _box(ax, x, top, bw, 0.55, f"pass {i + 1}", OP)
        _arrow(ax, (x + bw / 2, top - 0.17), (x + bw / 2, top))
        _box(ax, x, out_y, bw, 0.4, labels[i], OUT)
        _arrow(ax, (x + bw / 2, top + 0.55), (x + bw / 2, out_y))
        if i + 1 < n:  # the sample joins the prefix that the next pass reads
            _arrow(ax, (x + bw + 0.03, out_y + 0.2), (x + step - 0.03, top - 0.15 - th / 2),
                   colour="#2c7a2c")
    ax.text(right + ((n - 1) * step + bw) / 2, out_y + 0.6,
            "each pass reads the prompt and every sample so far", ha="center", va="center",
            fontsize=FONT - 1)
    return fig


def gpt_architecture(n_layer: int = 2) -> Figure:
    """GPT-2 from token ids (B, T) to logits (B, T, V), one pre-LN block drawn out, shapes on the arrows."""
    if not (isinstance(n_layer, int) and n_layer >= 1):
        raise ValueError(f"n_layer must be an int >= 1; got {n_layer!r}")
    fig, ax = _canvas(9.0, 3.6)
    y, h = 1.35, 0.6
    _box(ax, 0.05, y, 0.8, h, "token ids", TENSOR)
    _box(ax, 1.05, y + 0.45, 1.25, 0.5, "wte $(V, d)$", OP, size=FONT - 1)
    _box(ax, 1.05, y - 0.35, 1.25, 0.5, "wpe $(T_{\\max}, d)$", OP, size=FONT - 1)
    _box(ax, 2.45, y + 0.1, 0.4, 0.4, "+", OP)
    _arrow(ax, (0.85, y + 0.45), (1.05, y + 0.7))
    _arrow(ax, (0.85, y + 0.15), (1.05, y - 0.1))
    _arrow(ax, (2.3, y + 0.7), (2.45, y + 0.4))
    _arrow(ax, (2.3, y - 0.1), (2.45, y + 0.2))
    ax.text(0.45, y - 0.2, "(B, T)", ha="center", va="center", fontsize=FONT - 1)
    # one block, drawn out, inside a dashed frame
    bx, bw = 3.1, 3.9
    ax.add_patch(Rectangle((bx, 0.25), bw, 2.75, fill=False, linestyle="--", edgecolor="#555555"))
    ax.text(bx + bw / 2, 3.2, f"block, repeated N = {n_layer} times (pre-LN)", ha="center",
            va="center", fontsize=FONT, weight="bold")
    _arrow(ax, (2.85, y + 0.3), (bx + 0.1, y + 0.3))
    ax.text(2.98, y + 0.75, "(B, T, d)", ha="center", va="center", fontsize=FONT - 1, rotation=90)
    row_attn, row_mlp = 2.2, 0.55
    for row, label, inner in ((row_attn, "causal\nself-attention", "h heads of d/h"),
                              (row_mlp, "MLP\n$d \\to 4d \\to d$", "GELU")):
        _box(ax, bx + 0.45, row, 0.6, 0.45, "LN", OP)
        _box(ax, bx + 1.35, row - 0.05, 1.3, 0.55, label, OP, size=FONT - 1)
        _box(ax, bx + 3.0, row, 0.4, 0.45, "+", OP)
        _arrow(ax, (bx + 1.05, row + 0.22), (bx + 1.35, row + 0.22))
        _arrow(ax, (bx + 2.65, row + 0.22), (bx + 3.0, row + 0.22))
        ax.text(bx + 2.0, row - 0.2, inner, ha="center", va="center", fontsize=FONT - 1)
    # the residual stream: down the left edge into each LN, and around each sub-layer to its "+"
    _arrow(ax, (bx + 0.1, y + 0.3), (bx + 0.1, row_attn + 0.22), style="-")
    _arrow(ax, (bx + 0.1, row_attn + 0.22), (bx + 0.45, row_attn + 0.22))
    _arrow(ax, (bx + 0.25, row_attn + 0.22), (bx + 3.2, row_attn + 0.45), colour="#2c7a2c",
           rad=-0.25)
    _arrow(ax, (bx + 3.4, row_attn + 0.22), (bx + 3.6, row_attn + 0.22), style="-")
    _arrow(ax, (bx + 3.6, row_attn + 0.22), (bx + 3.6, 1.5), style="-")
    _arrow(ax, (bx + 3.6, 1.5), (bx + 0.3, 1.5), style="-")
    _arrow(ax, (bx + 0.3, 1.5), (bx + 0.3, row_mlp + 0.22), style="-")
    _arrow(ax, (bx + 0.3, row_mlp + 0.22), (bx + 0.45, row_mlp + 0.22))
    _arrow(ax, (bx + 0.3, 1.0), (bx + 3.2, row_mlp + 0.45), colour="#2c7a2c", rad=-0.2)
    ax.text(bx + 1.9, 1.68, "residual stream (B, T, d)", ha="center", va="center",
            fontsize=FONT - 1, color="#2c7a2c")
    # after the blocks
    _arrow(ax, (bx + 3.4, row_mlp + 0.22), (7.25, y + 0.3))
    _box(ax, 7.25, y + 0.05, 0.5, 0.5, "LN", OP)
    _box(ax, 7.25, y + 1.0, 1.65, 0.55, "head: $\\mathrm{wte}^{\\top}$\n(tied, $d \\to V$)", OP,
         size=FONT - 1)
    _arrow(ax, (7.5, y + 0.55), (7.5, y + 1.0))
    _box(ax, 7.95, 0.35, 0.95, 0.55, "logits", OUT)
    _arrow(ax, (8.5, y + 1.0), (8.45, 0.9))
    ax.text(8.42, 0.15, "(B, T, V)", ha="center", va="center", fontsize=FONT - 1)
    return fig


def _chain(ax, stages, y, h):
    """Boxes (x, width, text, colour) at height y, each joined to the next by an arrow."""
    for i, (x, w, text, colour) in enumerate(stages):
        _box(ax, x, y, w, h, text, colour, size=FONT - 1)
        if i:
            prev_x, prev_w = stages[i - 1][:2]
            _arrow(ax, (prev_x + prev_w, y + h / 2), (x, y + h / 2))


def training_step() -> Figure:
    """One optimizer step as data flow: batch -> (x, y) -> logits -> loss -> grads -> clip -> AdamW."""
    fig, ax = _canvas(9.0, 2.9)
    top, low, h = 1.75, 0.3, 0.7
    stages = [(0.05, 1.35, "random windows\n(B, T + 1) ids", TENSOR),
              (1.75, 1.35, "x = [:, :-1]\ny = [:, 1:]", TENSOR),
              (3.45, 1.35, "model(x)\nlogits (B, T, V)", OP),
              (5.15, 1.55, "cross-entropy\nwith y: loss ()", OP),
              (7.05, 1.85, "loss.backward()\ngrads, as params", OP)]
    _chain(ax, stages, top, h)
    bottom = [(7.05, 1.85, "clip: scale all by\nmin(1, c / ||g||)", OP),
              (4.6, 2.1, "lr = schedule(step)\nwarm-up, cosine", MASK),
              (2.1, 2.1, "AdamW step:\nweights updated", OUT)]
    for i, (x, w, text, colour) in enumerate(bottom):
        _box(ax, x, low, w, h, text, colour, size=FONT - 1)
        if i:
            prev_x = bottom[i - 1][0]
            _arrow(ax, (prev_x, low + h / 2), (x + w, low + h / 2))
    _arrow(ax, (7.05 + 1.85 / 2, top), (7.05 + 1.85 / 2, low + h))
    _arrow(ax, (3.45 + 1.35 / 2, low + h), (3.45 + 1.35 / 2, top), colour="#2c7a2c")
    ax.text(0.1, 0.65, "next step:\nnew batch,\nnew weights", ha="left", va="center",
            fontsize=FONT - 1, color="#2c7a2c")
    return fig


def sampling_step() -> Figure:
    """One generation step: prefix -> logits z -> z / tau -> top-k / top-p -> softmax -> draw -> append."""
    fig, ax = _canvas(9.0, 2.4)
    y, h = 1.2, 0.75
    stages = [(0.05, 1.3, "prefix\n(last T tokens)", TENSOR),
              (1.6, 1.2, "model: last\nrow $z$ $(V)$", OP),
              (2.98, 1.14, "$z / \\tau$\n(temperature)", OP),
              (4.3, 1.45, "top-$k$ / top-$p$:\nothers $\\to {-\\infty}$", MASK),
              (5.93, 1.28, "softmax:\nprobabilities $(V)$", OP),
              (7.35, 1.6, "draw one id\n(greedy: argmax)", OUT)]
    _chain(ax, stages, y, h)
    _arrow(ax, (8.15, y), (0.7, y), colour="#2c7a2c", rad=-0.12)
    ax.text(4.5, 0.25, "append the id to the prefix; the next pass reads it", ha="center",
            va="center", fontsize=FONT - 1, color="#2c7a2c")
    return fig


def token_rows(rows: list[list[str]], labels: list[str]) -> Figure:
    """One text cut into tokens at successive stages: ``rows[i]`` the tokens (as text) after stage
    ``labels[i]``; box widths follow the characters each token spells."""
    if not rows or len(rows) != len(labels):
        raise ValueError(f"rows and labels must be non-empty and as many; got {len(rows)} and "
                         f"{len(labels)}")
    texts = {"".join(r) for r in rows}
    if len(texts) != 1:
        raise ValueError("every row must spell the same text")
    chars = max(len(r_text) for r_text in texts)
    label_w = 1.9
    unit = min(0.3, (9.0 - label_w - 0.1) / chars)
    height = 0.5 * len(rows) + 0.2
    fig, ax = _canvas(label_w + chars * unit + 0.1, height)
    for i, (row, label) in enumerate(zip(rows, labels)):
        y = height - 0.5 * (i + 1)
        ax.text(0.05, y + 0.2, f"{label} ({len(row)})", ha="left", va="center", fontsize=FONT - 1)
        x = label_w
        for j, token in enumerate(row):
            w = len(token) * unit
            _box(ax, x + 0.02, y + 0.02, w - 0.04, 0.36, token.replace(" ", "\u2423"),
                 OUT if len(token) > 1 else TENSOR, size=FONT - 1)
            x += w
    return fig
