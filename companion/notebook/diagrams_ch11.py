"""Chapter 11's figures (FlashAttention).

What this module provides
- ``flash_tiling()``: one step of tiled attention: which blocks of Q, K and V a step reads, the
  score tile it computes on chip, the tiles already merged and those a causal mask skips.
- ``memory_traffic()``: the bytes a dense and a tiled attention forward move to and from main
  memory, by what they carry, from ``companion.kernels.flash``'s traffic model.
- ``running_stats(scores, block)``: the online softmax of one row of scores taken ``block`` keys
  at a time: after each block the running maximum m, the factor e^(m_old - m_new) that rescales
  what was summed before, and the running denominator l (equations (11.2)-(11.3)).
- ``online_softmax_row(scores, block)``: those numbers drawn: the scores and the running maximum
  above, the rescale factor of each block below (1 where the maximum did not move).
- ``flash_speed(table, device)``: TFLOP/s against sequence length for the Triton kernel and SDPA's
  FlashAttention backend, forward and forward + backward, one line per (d, causal); ``table`` is
  {(d, causal, T): (triton fwd, sdpa fwd, triton fwd+bwd, sdpa fwd+bwd)}.
"""

from __future__ import annotations

import math

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from companion.notebook.diagrams import FONT, MASK, OUT, TENSOR, _arrow, _canvas

__all__ = ["running_stats", "online_softmax_row", "flash_speed", "flash_tiling", "memory_traffic"]

COLOURS = ("#0072B2", "#E69F00", "#009E73", "#D55E00")


def running_stats(scores, block: int) -> list[tuple[float, float, float]]:
    """[(m, factor, l) after each block]: m the maximum so far, factor = e^(m_before - m) applied
    to the l carried in (1 for the first block, whose carried l is 0), l = factor * l_before +
    sum of e^(s_j - m) over the block."""
    scores = [float(x) for x in scores]
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or not scores:
        raise ValueError(f"need a non-empty row of scores and block >= 1; got {len(scores)}, {block!r}")
    if not all(math.isfinite(x) for x in scores):
        raise ValueError("scores must be finite (a masked key belongs to no block here)")
    out, m, ell = [], -math.inf, 0.0
    for start in range(0, len(scores), block):
        part = scores[start:start + block]
        m_new = max(m, max(part))
        factor = 1.0 if m == -math.inf else math.exp(m - m_new)
        ell = factor * ell + sum(math.exp(x - m_new) for x in part)
        out.append((m_new, factor, ell))
        m = m_new
    return out


def online_softmax_row(scores, block: int) -> Figure:
    """Top: the scores s_j of one row (dots), blocks of ``block`` keys shaded alternately, and the
    running maximum m after each block (a step line over the block). Bottom: the factor
    e^(m_old - m_new) by which each block rescales the carried sums, labelled with its value."""
    stats = running_stats(scores, block)
    scores = [float(x) for x in scores]
    n, nb = len(scores), len(stats)
    fig = Figure(figsize=(8.6, 4.6))
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for b in range(nb):
        for ax in (top, bottom):
            if b % 2:
                ax.axvspan(b * block - 0.5, min(n, (b + 1) * block) - 0.5, color="#eeeeee", zorder=0)
    top.plot(range(n), scores, "o", color=COLOURS[0], label="score $s_j$")
    for b, (m, _, _) in enumerate(stats):
        lo, hi = b * block - 0.5, min(n, (b + 1) * block) - 0.5
        top.plot([lo, hi], [m, m], color=COLOURS[3], linewidth=2.2,
                 label="running maximum $m$" if b == 0 else None)
        if b and stats[b - 1][0] < m:       # the maximum rose: draw the jump
            top.plot([lo, lo], [stats[b - 1][0], m], color=COLOURS[3], linewidth=1.2, linestyle=":")
    top.set_ylabel("score", fontsize=FONT + 1)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=FONT + 1, frameon=False)
    factors = [f for _, f, _ in stats]
    centres = [b * block + (min(n, (b + 1) * block) - b * block - 1) / 2 for b in range(nb)]
    bottom.bar(centres, factors, width=0.6 * block, color=COLOURS[1])
    for x, f in zip(centres, factors):
        bottom.text(x, f + 0.04, f"{f:.2g}" if f < 1 else "1", ha="center", va="bottom",
                    fontsize=FONT + 1)
    bottom.set_ylim(0, 1.35)
    bottom.set_ylabel("$e^{m_{\\mathrm{old}} - m_{\\mathrm{new}}}$", fontsize=FONT + 2)
    bottom.set_xlabel("key $j$ (blocks of %d)" % block, fontsize=FONT + 1)
    bottom.text(1.01, 0.5, "rescales the\ncarried $\\ell$ and $u$", transform=bottom.transAxes,
                ha="left", va="center", fontsize=FONT + 1)
    for ax in (top, bottom):
        ax.tick_params(labelsize=FONT + 1)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.subplots_adjust(left=0.1, right=0.74, top=0.97, bottom=0.12, hspace=0.12)
    return fig


def flash_speed(table: dict, device: str) -> Figure:
    """Two panels (forward; forward + backward) of TFLOP/s against T on a log-2 axis: Triton solid,
    SDPA's flash backend dashed, one colour per (d, causal)."""
    if not table:
        raise ValueError("table is empty")
    for key, row in table.items():
        if len(key) != 3 or len(row) != 4 or not all(x > 0 for x in row):
            raise ValueError(f"table rows are (d, causal, T): four positive rates; got {key}: {row}")
    fig = Figure(figsize=(8.6, 3.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    combos = sorted({(d, causal) for d, causal, _ in table})
    for ax, (title, off) in zip(axes, (("forward", 0), ("forward + backward", 2))):
        for colour, (d, causal) in zip(COLOURS, combos):
            ts = sorted(t for dd, cc, t in table if (dd, cc) == (d, causal))
            name = f"d = {d}, {'causal' if causal else 'full'}"
            for k, style in ((0, "-o"), (1, "--s")):
                ax.plot(ts, [table[d, causal, t][off + k] for t in ts], style, color=colour,
                        label=name if k == 0 else None, markersize=5)
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(t for *_, t in table) / 1.4, max(t for *_, t in table) * 1.4)
        ax.set_xticks(sorted({t for _, _, t in table}))
        ax.set_xticklabels([f"{t:,}" for t in sorted({t for _, _, t in table})])
        ax.set_title(title, fontsize=FONT + 1)
        ax.set_xlabel("sequence length $T$", fontsize=FONT + 1)
        ax.tick_params(labelsize=FONT + 1)
        ax.grid(alpha=0.3)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0].set_ylabel(f"TFLOP/s ({device})", fontsize=FONT + 1)
    axes[0].set_ylim(0, None)
    handles, labels = axes[1].get_legend_handles_labels()
    handles += [Line2D([], [], color="#555555", linestyle="-", marker="o"),
                Line2D([], [], color="#555555", linestyle="--", marker="s")]
    labels += ["Triton (this book)", "SDPA flash"]
    axes[1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                   fontsize=FONT + 1, frameon=False)
    fig.subplots_adjust(left=0.09, right=0.72, top=0.9, bottom=0.16, wspace=0.08)
    return fig


def flash_tiling(n_blocks: int = 4, step: tuple[int, int] = (2, 1), causal: bool = True) -> Figure:
    """One step of tiled attention (chapter 11): query block i meets key block j.

    The step reads Q block i, K block j and V block j, computes the score tile S_ij on chip, and
    merges it into the running state (m, l, u) of block i, which becomes O block i at the end. The
    tiles of row i that came before j are done; with ``causal`` the tiles above the diagonal
    (j > i) are never computed. Blocks are counted from 0.
    """
    if not isinstance(n_blocks, int) or not 2 <= n_blocks <= 8:
        raise ValueError(f"n_blocks must be an int in 2..8; got {n_blocks!r}")
    i, j = step
    if not (0 <= i < n_blocks and 0 <= j < n_blocks) or (causal and j > i):
        raise ValueError(f"step must be a tile (i, j) of the {n_blocks} x {n_blocks} grid"
                         f"{' with j <= i (causal)' if causal else ''}; got {step!r}")
    fig, ax = _canvas(9.0, 3.9)
    c = 2.4 / n_blocks  # side of one block, inches
    top, gx = 3.0, 1.75  # the grid's top edge and left edge
    now, done, idle = "#fd8d3c", "#fdd0a2", "white"

    def column(x, label, hot, colour):  # a tensor split into n_blocks row blocks, block `hot` lit
        for r in range(n_blocks):
            face = colour if r == hot else idle
            ax.add_patch(Rectangle((x, top - (r + 1) * c), 0.45, c, facecolor=face, edgecolor="#555555"))
        ax.text(x + 0.225, top + 0.12, label, ha="center", va="bottom", fontsize=FONT)

    column(0.6, "$Q$", i, TENSOR)
    for col in range(n_blocks):  # K^T: key blocks side by side above the grid
        face = TENSOR if col == j else idle
        ax.add_patch(Rectangle((gx + col * c, top + 0.15), c, 0.4, facecolor=face, edgecolor="#555555"))
    ax.text(gx + n_blocks * c + 0.1, top + 0.35, "$K^{\\top}$", ha="left", va="center", fontsize=FONT)
    for r in range(n_blocks):  # the score grid: which tiles exist, which are done, which is now
        for col in range(n_blocks):
            skipped = causal and col > r
            face = now if (r, col) == (i, j) else done if (r == i and col < j) else idle
            ax.add_patch(Rectangle((gx + col * c, top - (r + 1) * c), c, c, facecolor=MASK if skipped else face,
                                   edgecolor="#555555", hatch="//" if skipped else None))
    ax.text(gx + n_blocks * c / 2, top - n_blocks * c - 0.12, "scores $S_{ij}$: on chip only", ha="center",
            va="top", fontsize=FONT)
    column(4.75, "$V$", j, TENSOR)
    column(6.0, "$O$", i, OUT)
    _arrow(ax, (1.1, top - (i + 0.5) * c), (gx - 0.05, top - (i + 0.5) * c))
    _arrow(ax, (gx + n_blocks * c + 0.05, top - (i + 0.5) * c), (4.7, top - (j + 0.5) * c))
    _arrow(ax, (5.25, top - (j + 0.5) * c), (5.95, top - (i + 0.5) * c))
    for k, line in enumerate((f"step ({i}, {j}):", f"read $Q_{i}$, $K_{j}$, $V_{j}$, then", "merge $S_{ij}$ into the",
                              f"state of row block {i}")):
        ax.text(6.6, top + 0.2 - 0.33 * k, line, ha="left", va="center", fontsize=FONT)
    legend = [(now, None, "this step's tile"), (done, None, "done (merged)")]
    if causal:
        legend.append((MASK, "//", "skipped (causal)"))
    for k, (face, hatch, text) in enumerate(legend):
        y = 1.3 - 0.42 * k
        ax.add_patch(Rectangle((6.6, y - 0.13), 0.26, 0.26, facecolor=face, edgecolor="#555555", hatch=hatch))
        ax.text(6.95, y, text, ha="left", va="center", fontsize=FONT)
    return fig


def memory_traffic(T: int = 4096, d: int = 128, heads: int = 32, bytes_per_value: int = 2,
                   block_q: int = 128) -> Figure:
    """Bytes one attention forward moves to and from main memory (chapter 11), by what they carry.

    Three stacked bars from ``companion.kernels.flash``'s traffic model: dense (Q, K, V, O plus four
    passes over the T x T scores and probabilities), tiled with K and V read once per query block,
    and tiled with K and V kept in the L2 cache. Each bar is labelled with its total in GB (1e9 B).
    """
    from companion.kernels.flash import dense_traffic_bytes, tiled_traffic_bytes

    operands = heads * bytes_per_value * 4 * T * d  # Q, K, V read once, O written once
    dense = dense_traffic_bytes(T, T, d, heads, bytes_per_value)
    streamed = tiled_traffic_bytes(T, T, d, heads, bytes_per_value, block_q)
    cached = tiled_traffic_bytes(T, T, d, heads, bytes_per_value, block_q, kv_cached=True)
    rows = [  # (label, operands, score matrices, K/V re-reads, logsumexp)
        ("dense", operands, dense - operands, 0, 0),
        (f"tiled, K and V re-read\nper query block ({block_q} rows)", operands, 0,
         streamed - operands - 4 * T * heads, 4 * T * heads),
        ("tiled, K and V\nkept in L2 cache", operands, 0, 0, cached - operands),
    ]
    fig = Figure(figsize=(9.0, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.27, 0.33, 0.6, 0.57))
    parts = [("Q, K, V read, O written", "#6baed6"), ("$S$ and $P$ ($T \\times T$) written and read", "#fd8d3c"),
             ("K, V re-read", "#9e9ac8"), ("logsumexp", "#31a354")]
    for y, (label, *sizes) in enumerate(rows):
        left = 0.0
        for (name, colour), size in zip(parts, sizes):
            ax.barh(y, size / 1e9, left=left, color=colour, edgecolor="#444444",
                    label=name if y == 0 or (y == 1 and name != parts[0][0]) else None)
            left += size / 1e9
        ax.text(left + 0.05, y, f"{left:.2f} GB", ha="left", va="center", fontsize=FONT)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=FONT)
    ax.invert_yaxis()
    ax.set_xlim(0, dense / 1e9 * 1.2)
    ax.set_xlabel("GB moved per layer (forward)", fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_title(f"T = {T}, d = {d}, {heads} heads, {bytes_per_value} bytes per value", fontsize=FONT)
    handles, labels = ax.get_legend_handles_labels()
    keep = {l: h for h, l in zip(handles, labels)}
    ax.legend(keep.values(), keep.keys(), fontsize=FONT - 1, loc="upper center", bbox_to_anchor=(0.4, -0.25),
              ncol=2, frameon=False, handlelength=1.2, columnspacing=0.8)
    return fig
