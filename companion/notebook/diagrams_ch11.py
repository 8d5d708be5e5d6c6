"""Chapter 11's figures (FlashAttention) beyond the tiling and traffic diagrams of
``companion.notebook.diagrams``.

What this module provides
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

from companion.notebook.diagrams import FONT

__all__ = ["running_stats", "online_softmax_row", "flash_speed"]

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
