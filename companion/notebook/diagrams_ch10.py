"""Chapter 10's figures (the KV cache).

What this module provides, each a function returning a ``matplotlib.figure.Figure``:
- ``prefill_decode()``: prefill (the prompt in one pass, every position's k, v cached) beside one
  decode step (one row at position n, its k, v appended, its query reading all n + 1).
- ``chunk_masks(n, T, window)``: the (T, S) mask of T new rows after n cached ones, its rows and
  columns labelled with absolute positions, without and with a sliding window (equation (10.3)).
- ``cache_growth(curves)``: cache size against context on log axes, one line per model shape
  (MHA, GQA, MQA, MLA), from {label: bytes per token}.
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from companion.notebook.diagrams import FONT, MASK, OP, OUT, TENSOR, _arrow, _box, _canvas, _grid

__all__ = ["prefill_decode", "chunk_masks", "cache_growth"]


def prefill_decode(prompt: tuple[str, ...] = ("the", "cat", "sat", "on"), new: str = "the") -> Figure:
    """Prefill beside one decode step with a KV cache (chapter 10).

    Left, prefill: the P prompt tokens go through one forward under a (P, P) causal mask; every
    layer writes the keys and values of all P positions to its cache, and the last row's logits give
    the first new token. Right, one decode step: the newest token alone, at position P = the cache
    length, computes q, k, v for one row; k, v are appended (the cache grows to S = P + 1 rows) and q
    reads all S keys through a (1, S) mask row. Old queries are not kept: nothing reads them again.
    """
    if not 2 <= len(prompt) <= 6 or not all(isinstance(t, str) and t for t in prompt):
        raise ValueError(f"prompt must be 2 to 6 non-empty strings; got {prompt!r}")
    if not (isinstance(new, str) and new):
        raise ValueError(f"new must be a non-empty string; got {new!r}")
    n = len(prompt)
    fig, ax = _canvas(9.0, 3.9)
    bw, cw, span = 0.56, 0.5, 2.5  # token box and cache cell widths; width of the prompt row
    step = (span - bw) / (n - 1)  # token pitch: any prompt length fills the same width
    bw, cw = min(bw, step - 0.06), min(cw, step - 0.06)
    # --- prefill -----------------------------------------------------------------------------------
    left = 0.25
    ax.text(left, 3.68, "prefill: the prompt in one pass", ha="left", va="center", fontsize=FONT,
            weight="bold")
    for i, tok in enumerate(prompt):
        _box(ax, left + i * step, 0.15, bw, 0.4, tok, TENSOR, size=FONT - 1)
        _arrow(ax, (left + i * step + bw / 2, 0.55), (left + i * step + bw / 2, 0.85))
    _box(ax, left, 0.85, span, 0.7, f"one forward over\n{n} rows, causal mask", OP, size=FONT - 1)
    _grid(ax, left + span + 0.15, 0.92, 0.14, [[j <= i for j in range(n)] for i in range(n)])
    ax.text(left + span + 0.15 + n * 0.07, 0.8, f"{n} x {n}", ha="center", va="top", fontsize=FONT - 1)
    for i in range(n):
        x = left + i * step + (bw - cw) / 2
        _arrow(ax, (x + cw / 2, 1.55), (x + cw / 2, 1.95))
        _box(ax, x, 1.95, cw, 0.45, f"k,v\n{i}", TENSOR, size=FONT - 1)
    ax.text(left + span / 2, 2.6, "cache: k, v of every position,\nin every layer", ha="center",
            va="bottom", fontsize=FONT - 1)
    _box(ax, left + span + 0.15, 2.0, 1.35, 0.4, "logits of\nlast row", OUT, size=FONT - 1)
    _arrow(ax, (left + span, 1.35), (left + span + 0.5, 2.0), rad=0.2)
    # --- one decode step -----------------------------------------------------------------------------
    right = 4.75
    ax.text(right, 3.68, f"decode: one row at position {n}", ha="left", va="center", fontsize=FONT,
            weight="bold")
    ox = 7.6  # the new row sits at the same place for any prompt length; the old rows share the rest
    pitch = (ox - right) / n
    for i in range(n + 1):
        colour = OUT if i == n else MASK
        _box(ax, right + i * pitch, 1.95, min(cw, pitch - 0.08), 0.45, f"k,v\n{i}", colour, size=FONT - 1)
    ax.text((right + ox + cw) / 2, 2.6, f"cache after the append: S = {n + 1} rows",
            ha="center", va="bottom", fontsize=FONT - 1)
    ax.text(right, 1.75, "grey rows: read only", ha="left", va="center", fontsize=FONT - 1)
    _box(ax, ox, 0.15, bw, 0.4, new, TENSOR, size=FONT - 1)
    _arrow(ax, (ox + bw / 2, 0.55), (ox + bw / 2, 0.85))
    _box(ax, ox - 0.45, 0.85, bw + 0.9, 0.7, "q, k, v of\none row", OP, size=FONT - 1)
    _arrow(ax, (ox + cw / 2, 1.55), (ox + cw / 2, 1.95))  # append k, v
    _grid(ax, right, 1.2, 0.14, [[True] * (n + 1)], colour="#fd8d3c")
    ax.text(right, 1.08, f"q reads all S keys (1 x {n + 1})", ha="left", va="top", fontsize=FONT - 1)
    _arrow(ax, (ox - 0.45, 1.3), (right + (n + 1) * 0.14 + 0.05, 1.27))
    _box(ax, ox - 0.45, 3.0, bw + 0.9, 0.4, "next token", OUT, size=FONT - 1)
    _arrow(ax, (ox + bw + 0.45, 1.4), (ox + bw + 0.45, 3.0), rad=0.0)
    return fig


def chunk_masks(n: int = 5, T: int = 3, window: int = 4) -> Figure:
    """The (T, S) mask of T new rows after n cached ones, S = n + T, beside the same with a window.

    Row i is the query at absolute position n + i; column j the key at position j. A cell is readable
    when j <= n + i, and with the window also when (n + i) - j < window (equation (10.3)). Readable
    cells are filled, the cached columns 0..n - 1 are set apart from the new ones by a rule, and the
    diagonal cell of each row (the query reading its own key) is outlined.
    """
    if not (isinstance(n, int) and isinstance(T, int) and 1 <= n <= 12 and 1 <= T <= 6):
        raise ValueError(f"n must be an int in 1..12 and T in 1..6; got n={n!r}, T={T!r}")
    if not (isinstance(window, int) and 1 <= window <= n + T):
        raise ValueError(f"window must be an int in 1..n + T = {n + T}; got {window!r}")
    S = n + T
    cell = min(0.34, 3.6 / S)
    fig, ax = _canvas(9.0, 1.3 + cell * T)
    for panel, (left, w, title) in enumerate([(0.9, None, "causal"),
                                              (5.0, window, f"causal, window w = {window}")]):
        top = 0.55 + cell * T
        ax.text(left, top + 0.45, title, ha="left", va="center", fontsize=FONT, weight="bold")
        for j in range(S):
            ax.text(left + (j + 0.5) * cell, top + 0.12, str(j), ha="center", va="bottom",
                    fontsize=FONT - 1)
        for i in range(T):
            p = n + i
            y = top - (i + 1) * cell
            ax.text(left - 0.08, y + cell / 2, f"q {p}", ha="right", va="center", fontsize=FONT - 1)
            for j in range(S):
                readable = j <= p and (w is None or p - j < w)
                face = ("#6baed6" if j < n else "#fd8d3c") if readable else "white"
                ax.add_patch(Rectangle((left + j * cell, y), cell, cell, facecolor=face,
                                       edgecolor="#777777", linewidth=0.6))
            ax.add_patch(Rectangle((left + p * cell, y), cell, cell, fill=False,
                                   edgecolor="#222222", linewidth=1.6))
        ax.plot([left + n * cell] * 2, [top - T * cell - 0.05, top + 0.05], color="#222222",
                linewidth=1.5)
        ax.text(left + n * cell / 2, top - T * cell - 0.12, f"cached keys 0..{n - 1}", ha="center",
                va="top", fontsize=FONT - 1)
        ax.text(left + (n + T / 2) * cell, top - T * cell - 0.12, "new", ha="center", va="top",
                fontsize=FONT - 1)
    return fig


def cache_growth(curves: dict, contexts=(1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
                 bytes_per_gib: int = 2**30, budget: tuple[str, float] | None = None) -> Figure:
    """Cache size of one sequence against context on log-log axes, one line per entry of ``curves``
    ({label: bytes per token, all layers}); the size is linear in the context, so every line has
    slope 1 and the shapes differ by a constant factor, the vertical gap between the lines.
    ``budget`` = (label, bytes) draws a dashed horizontal line at that memory size."""
    if not curves or any(not (isinstance(b, int) and b > 0) for b in curves.values()):
        raise ValueError(f"curves must map labels to positive int bytes per token; got {curves!r}")
    fig = Figure(figsize=(7.5, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.12, 0.14, 0.5, 0.76))
    for k, (label, per_token) in enumerate(sorted(curves.items(), key=lambda kv: -kv[1])):
        gib = [per_token * n / bytes_per_gib for n in contexts]
        ax.loglog(contexts, gib, "o-", ms=3, color=f"C{k}", label=label)
    if budget is not None:
        ax.axhline(budget[1] / bytes_per_gib, color="#555555", linestyle="--", linewidth=1,
                   label=budget[0])
    ax.set_xlabel("context (tokens, one sequence)", fontsize=FONT)
    ax.set_ylabel("cache size (GiB, bf16)", fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=FONT - 1, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    return fig
