"""Chapter 13's diagrams (the capstone), drawn with the primitives of ``companion.notebook.diagrams``.

What this module provides, each drawing function returning a ``matplotlib.figure.Figure``:
- ``capstone_pipeline(stages)``: the capstone's stages (equations, model, training, checkpoint,
  serving, export) left to right, each with the check that joins it to the previous one.
- ``capstone_layer()``: one layer of the capstone recurrence, equations (13.2)-(13.7): the residual
  stream on top of each sublayer, and under it one box a step, labelled with what it computes, its
  equation and the companion module that computes it (``LAYER_STEPS``).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from companion.notebook.diagrams import FONT, OP, OUT, TENSOR, _arrow, _box, _canvas

__all__ = ["capstone_pipeline", "capstone_layer", "CAPSTONE_STAGES", "LAYER_STEPS"]

# The capstone's pipeline, one box a stage, with the check that joins it to the last.
CAPSTONE_STAGES = (
    ("equations", "(13.1)-(13.8)", "written out\nby hand"),
    ("model", "from_preset", "= the hand\nrecurrence"),
    ("training", "Trainer", "loss below\nthe bar"),
    ("checkpoint", "save / load", "bit-equal\nlogits"),
    ("serving", "Engine, pages", "tokens as if\nalone"),
    ("export", "to_hf", "logits equal\n(float32)"),
)


def capstone_pipeline(stages=CAPSTONE_STAGES) -> Figure:
    """The capstone's stages left to right: each a box with its title and the companion piece that
    runs it, joined by arrows, with the check the chapter runs on it below.

    ``stages``: 2 to 6 (title, companion piece, check) triples of strings."""
    stages = tuple(stages)
    if not 2 <= len(stages) <= 6:
        raise ValueError(f"stages must hold 2 to 6 (title, piece, check) triples; got {len(stages)}")
    for s in stages:
        if not (isinstance(s, tuple) and len(s) == 3 and all(isinstance(x, str) and x for x in s)):
            raise ValueError(f"stages: each stage is a (title, piece, check) triple of strings; got {s!r}")
    fig, ax = _canvas(9.0, 2.1)
    gap = 0.3
    w = (8.8 - gap * (len(stages) - 1)) / len(stages)  # boxes share the 8.8 inches left by margins
    colours = [TENSOR] + [OP] * (len(stages) - 2) + [OUT]
    for i, ((title, piece, test), colour) in enumerate(zip(stages, colours)):
        x = 0.1 + i * (w + gap)
        _box(ax, x, 1.05, w, 0.95, "", colour)
        ax.text(x + w / 2, 1.72, title, ha="center", va="center", fontsize=FONT, weight="bold")
        ax.text(x + w / 2, 1.3, piece, ha="center", va="center", fontsize=FONT - 1, family="monospace")
        ax.text(x + w / 2, 0.85, test, ha="center", va="top", fontsize=FONT - 1, style="italic")
        if i:
            _arrow(ax, (x - gap, 1.52), (x, 1.52))
    return fig


# One layer, (13.2)-(13.7): per sublayer, its steps as (what, equation, companion module).
LAYER_STEPS = (
    (("RMSNorm", "(13.2)", "norms.RMSNorm"),
     ("$Q$: $h$ heads\n$K, V$: $g$ heads", "(13.3)", "project_qkv"),
     ("rotate by\nposition $R_i$", "(13.4)", "RotaryEmbedding"),
     ("attention, mask $M$\nhead $r$ reads $\\pi(r)$", "(13.5)", "attend, expand_kv"),
     ("concat,\n$W_O$", "(13.6)", "attn.out")),
    (("RMSNorm", "(13.6)", "norms.RMSNorm"),
     ("SiLU$(ZW_g)\\odot ZW_u$", "(13.7)", "SwiGLU"),
     ("$W_d$", "(13.7)", "SwiGLU.down")),
)


def capstone_layer(steps=LAYER_STEPS) -> Figure:
    """One layer of the capstone recurrence: the attention sublayer above, the feed-forward one
    below. In each, the residual stream runs along the top (H^(l-1) -> U, then U -> H^(l)) and the
    sublayer branches off it, one box a step with its equation number and (in monospace) the
    companion module that computes it, and is added back at the circled plus: pre-norm, so the
    stream itself is never normalised.

    ``steps``: two sublayers, each 2 to 5 (what, equation, module) triples of strings."""
    steps = tuple(tuple(row) for row in steps)
    if len(steps) != 2 or not all(2 <= len(row) <= 5 for row in steps):
        raise ValueError("steps must hold two sublayers of 2 to 5 (what, equation, module) triples; "
                         f"got {[len(row) for row in steps]}")
    for row in steps:
        for s in row:
            if not (isinstance(s, tuple) and len(s) == 3 and all(isinstance(x, str) and x for x in s)):
                raise ValueError(f"steps: each step is a (what, equation, module) triple of strings; got {s!r}")
    fig, ax = _canvas(9.0, 4.25)
    ends = (("$H^{(\\ell-1)}$", "$U$"), ("$U$", "$H^{(\\ell)}$"))
    titles = ("attention sublayer (Block.attn)", "feed-forward sublayer (Block.ffn)")
    for r, (row, (start, end), title) in enumerate(zip(steps, ends, titles)):
        top = 3.85 - r * 2.15                      # the stream's height in this sublayer
        ax.text(0.1, top, start, ha="left", va="center", fontsize=FONT + 1)
        ax.text(8.9, top, end, ha="right", va="center", fontsize=FONT + 1)
        _arrow(ax, (0.7, top), (8.05, top), style="-")           # the residual stream
        ax.text(8.2, top, "+", ha="center", va="center", fontsize=FONT + 3, weight="bold",
                bbox=dict(boxstyle="circle,pad=0.15", facecolor="white", edgecolor="#333333"))
        ax.text(4.5, top + 0.17, title, ha="center", va="bottom", fontsize=FONT - 1, style="italic")
        gap, y, h = 0.25, top - 1.25, 0.8
        w = (7.6 - gap * (len(row) - 1)) / len(row)
        for i, (what, eq, module) in enumerate(row):
            x = 0.5 + i * (w + gap)
            _box(ax, x, y, w, h, f"{what}\n{eq}", OUT if i == len(row) - 1 else OP, size=FONT - 1)
            ax.text(x + w / 2, y - 0.08, module, ha="center", va="top", fontsize=FONT - 1,
                    family="monospace")
            if i == 0:
                _arrow(ax, (x + w / 2, top), (x + w / 2, y + h))     # branch off the stream
            else:
                _arrow(ax, (x - gap, y + h / 2), (x, y + h / 2))
        _arrow(ax, (x + w, y + h / 2), (8.2, top - 0.17), rad=0.3)  # back to the add
    return fig
