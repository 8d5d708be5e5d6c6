"""Figures a phone can read: each figure of the book drawn a second time for a phone's column.

At a 400 px window the book's column is ``PHONE_COLUMN_PX`` (352 px) wide, and a figure drawn for the
717 px column at 1280 px is shown at half its size: 11 px labels at 5.4 px. ``book_html(fig)``, which
``style.use_book_style`` registers as IPython's ``text/html`` formatter, returns a ``<picture>``: a phone
source that the browser shows below ``PHONE_MEDIA``, drawn so that its smallest label is at least
``PHONE_MIN_LABEL_PX`` (9 px) as shown there, and above it the desktop PNG of ``viz.book_png`` (the
``image/png`` of the same output, kept for frontends that do not show HTML). tools/check_layout.py
measures both renditions from the record each PNG carries (``viz.figure_record``).

- ``phone_png(fig)``: the phone rendition, or None when the desktop one already reads at 9 px. A plot
  is drawn again on a copy, with the same point sizes on a narrower figure: panels side by side are
  stacked (``_restack``), the copy re-laid out, a legend that now covers data or a label moved below
  it. A diagram (axes without ticks: boxes, arrows, labels) is wrapped instead, like a line of text
  (``_wrapped_png``): narrowing it would squeeze its boxes under their labels.
- ``book_html(fig)``: the ``<picture>``, or None (the PNG alone) when no phone rendition is needed.
"""

from __future__ import annotations

import html
import io
import math
import struct

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

# The helpers of the book's figure style that both renditions share (one copy of each rule).
from companion.notebook.viz import (PIXEL_RATIO, _agg, _compact, _smallest_px, _texts, book_png, figure_record,
                                    legend_off_data)

__all__ = ["book_html", "phone_png", "PHONE_COLUMN_PX", "PHONE_MIN_LABEL_PX", "PHONE_RATIO", "PHONE_MEDIA"]

PHONE_COLUMN_PX = 352  # a cell output's width at a 400 px window (tools/check_layout.py)
PHONE_MIN_LABEL_PX = 9  # the smallest text a figure may show there
PHONE_RATIO = 2  # PNG px per CSS px of the phone rendition (scale-2 phone screens)
PHONE_MEDIA = "(max-width: 720px)"  # windows whose column is too narrow for the desktop rendition


def _restack(fig: Figure) -> int:
    """Put panels that sit side by side in one row one above the other, each with what shares its cell
    (a twin axes; a colorbar, in a grid nested in the cell); returns how many rows that made (1: left as
    it was: one panel, a grid of several rows, or axes placed outside a grid)."""
    specs = [ax.get_subplotspec() for ax in fig.axes]
    if len(specs) < 2 or any(s is None for s in specs):
        return 1
    tops = [s.get_topmost_subplotspec() for s in specs]
    grid = tops[0].get_gridspec()
    if grid.nrows != 1 or grid.ncols < 2 or any(t.get_gridspec() is not grid or t.num1 != t.num2 for t in tops):
        return 1
    # A nested grid (a GridSpecFromSubplotSpec: a panel and its colorbar) must sit directly in the cell.
    nested = {id(s.get_gridspec()): (s.get_gridspec(), t) for s, t in zip(specs, tops) if s.get_gridspec() is not grid}
    if any(getattr(g, "_subplot_spec", None) is not t for g, t in nested.values()):
        return 1
    column = fig.add_gridspec(grid.ncols, 1)
    for g, top in nested.values():
        g._subplot_spec = column[top.num1, 0]  # matplotlib has no public setter for a nested grid's cell
    for ax, spec, top in zip(fig.axes, specs, tops):
        ax.set_subplotspec(column[top.num1, 0] if spec.get_gridspec() is grid else spec)
    return grid.ncols


def _png_width(fig: Figure, ratio: float) -> tuple[bytes, float]:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi * ratio, bbox_inches="tight", facecolor="white",
                metadata=figure_record(fig, ratio))
    data = buffer.getvalue()
    return data, struct.unpack(">II", data[16:24])[0] / ratio


def _relayout(fig: Figure) -> None:
    """``tight_layout`` once more, unless constrained layout lays ``fig`` out at every draw."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    if not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
        try:
            fig.tight_layout()
        except Exception:  # noqa: BLE001  (axes tight_layout cannot place: left where they are)
            pass


def _below_again(fig: Figure) -> None:
    """A legend that legend_off_data moved below its panel, put just under the panel's labels again
    once the layout has shrunk the panel to make room for it (twice: the layout answers each move)."""
    for _ in range(2):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None or not getattr(legend, "companion_below", False):
                continue
            legend.set_visible(False)
            y = ax.transAxes.inverted().transform((0, ax.get_tightbbox(renderer).y0))[1]
            legend.set_visible(True)
            legend.set_bbox_to_anchor((0.5, y - 0.02), transform=ax.transAxes)
        _relayout(fig)


def phone_png(fig: Figure) -> tuple[bytes, dict] | None:
    """``fig`` drawn for a phone's 352 px column, or None when the desktop rendition already shows
    every label at ``PHONE_MIN_LABEL_PX`` there. A diagram (no axes with ticks) is wrapped
    (``_wrapped_png``). A plot is drawn again on a copy, never ``fig``: the same point sizes on a figure
    about 390 px wide, panels in one row stacked (``_restack``), re-laid out (constrained layout, or
    ``tight_layout`` where a colorbar rules it out), a legend that now covers data or a label, or
    sits beside the panel, moved below it (``legend_off_data``); the column then shrinks it by at most 352 / 434, so text of 11.1 px
    (10 pt) shows at >= 9 px. A figure still too wide after three rounds gets its small text lifted, as
    ``book_png`` does at 1280 px. PNG at ``PHONE_RATIO`` x, with the same record as ``book_png``."""
    text = _smallest_px(fig)
    if text is None:
        return None
    _agg(fig)
    _, desktop = _png_width(fig, 1)
    if text * min(PHONE_COLUMN_PX, desktop) / desktop >= PHONE_MIN_LABEL_PX:
        return None
    if not any(ax.axison for ax in fig.axes):  # a diagram: wrapped, not narrowed
        return _wrapped_png(fig, text)
    try:
        return _narrowed_png(fig, text)
    except ZeroDivisionError:  # constrained layout could not solve the narrowed grid (ch13's surprisal
        return _narrowed_png(fig, text, constrained=False)  # figure): tight_layout instead


def _narrowed_png(fig: Figure, text: float, constrained: bool = True) -> tuple[bytes, dict]:
    """``phone_png``'s rendition of a plot: a copy of ``fig`` narrowed, restacked and re-laid out
    (by constrained layout unless ``constrained`` is False or the figure has its own engine)."""
    import pickle
    import warnings

    narrow = pickle.loads(pickle.dumps(fig))  # an unpicklable artist raises: phone_png wraps instead
    plt.close(narrow)  # unpickling registers a pyplot copy; the notebook must not draw it again
    _agg(narrow)  # closing it left a bare canvas, on which legend_off_data could not measure
    rows = _restack(narrow)
    if constrained and narrow.get_layout_engine() is None:  # laid out at every draw: nested grids and colorbars included
        try:
            narrow.set_layout_engine("constrained")
        except Exception:  # noqa: BLE001  (an engine that cannot be swapped: tight_layout below)
            pass
    width_in, height_in = narrow.get_size_inches()
    goal = PHONE_COLUMN_PX * text / PHONE_MIN_LABEL_PX * 0.9  # CSS px the tight box may take
    narrow.set_size_inches(min(width_in, goal / narrow.dpi), height_in * (0.85 * rows if rows > 1 else 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tight_layout's notes on axes it cannot place
        for _ in range(3):
            for _again in range(2):  # laid out, then again once a legend on the narrower data has moved
                _relayout(narrow)
                try:
                    moved = [legend_off_data(ax, text=True, beside=True, columns=1) for ax in narrow.axes]
                except Exception:  # noqa: BLE001
                    moved = []
                if not any(moved):
                    break
            _below_again(narrow)
            data, width = _png_width(narrow, PHONE_RATIO)
            if width <= goal / 0.9:
                break
            narrow.set_size_inches(narrow.get_figwidth() * goal / width, narrow.get_figheight())
        scale = min(1.0, PHONE_COLUMN_PX / width)
        if text * scale < PHONE_MIN_LABEL_PX:
            floor_pt = PHONE_MIN_LABEL_PX * 72 / narrow.dpi / scale
            for t in _texts(narrow):
                t.set_fontsize(max(t.get_fontsize(), floor_pt))
            _relayout(narrow)
            data, width = _png_width(narrow, PHONE_RATIO)
    return _compact(data, figure_record(narrow, PHONE_RATIO)), {"width": round(width)}


def _blocked_columns(fig: Figure, columns: int):
    """What a cut through each PNG column (at ``PHONE_RATIO``, tight box) would split: 1e6 where a label
    lies (a word cut in two), 1e3 where only a box (any patch but an arrow) does (its outline goes on in
    the next piece), 0 elsewhere. Arrows may be cut."""
    import numpy as np
    from matplotlib.patches import FancyArrowPatch

    renderer = fig.canvas.get_renderer()
    left = fig.get_tightbbox(renderer).x0 - plt.rcParams["savefig.pad_inches"]  # inches
    cost = np.zeros(columns)
    labels = _texts(fig)
    boxes = [p for ax in fig.axes for p in ax.patches if not isinstance(p, FancyArrowPatch)]
    for artist in labels + boxes:
        box = artist.get_window_extent(renderer)
        if box.width >= 0.5 * fig.bbox.width:  # a frame around a whole group, a long title: no way round
            continue
        lo, hi = ((x / fig.dpi - left) * fig.dpi * PHONE_RATIO for x in (box.x0, box.x1))
        span = slice(max(int(lo) - 2, 0), max(int(hi) + 3, 0))
        cost[span] = np.maximum(cost[span], 1e6 if artist in labels else 1e3)
    return cost


def _wrapped_png(fig: Figure, text: float) -> tuple[bytes, dict]:
    """A diagram (boxes, arrows, text on axes without ticks) for a phone: its picture cut into pieces
    narrow enough for the phone rule, each cut at the emptiest pixel column near its ideal place (the
    gap between two boxes; at worst through an arrow), and the pieces stacked top to bottom, as a line
    of text wraps. Narrowing the figure instead would squeeze the boxes under their labels."""
    import numpy as np
    from PIL import Image

    data, width = _png_width(fig, PHONE_RATIO)
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    ink = (pixels.min(axis=2) < 235).sum(axis=0).astype(float)  # non-white pixels in each column
    ink += _blocked_columns(fig, pixels.shape[1])  # through a label or a box only if nothing else will do
    limit = PHONE_COLUMN_PX * text / PHONE_MIN_LABEL_PX * 0.9 * PHONE_RATIO  # PNG px a piece may take
    pieces, left = [], 0
    while pixels.shape[1] - left > limit:
        count = math.ceil((pixels.shape[1] - left) / limit)  # pieces still to make
        ideal = left + (pixels.shape[1] - left) / count
        hi = int(left + limit)  # no piece wider than the limit, and no more pieces than needed
        lo = min(hi - 1, max(int(left + 0.5 * limit), math.ceil(pixels.shape[1] - limit * (count - 1))))
        if ink[lo:hi].min() >= 1e3:  # every cut there splits a label or a box: one piece more instead
            lo = int(left + 0.15 * limit)
        cut = lo + int(np.argmin(ink[lo:hi] + np.abs(np.arange(lo, hi) - ideal) * 1e-3))
        pieces.append(pixels[:, left:cut])
        left = cut
    pieces.append(pixels[:, left:])
    trimmed = []
    for piece in pieces:  # white margins off each piece, and white rows off its top and bottom
        cols = np.flatnonzero((piece.min(axis=2) < 235).any(axis=0))
        rows = np.flatnonzero((piece.min(axis=2) < 235).any(axis=1))
        if len(cols) and len(rows):
            trimmed.append(piece[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1])
    gap = 12 * PHONE_RATIO  # px between pieces
    out = np.full((sum(p.shape[0] for p in trimmed) + gap * (len(trimmed) - 1),
                   max(p.shape[1] for p in trimmed), 3), 255, dtype=np.uint8)
    top = 0
    for piece in trimmed:
        out[top:top + piece.shape[0], :piece.shape[1]] = piece
        top += piece.shape[0] + gap
    buffer = io.BytesIO()
    Image.fromarray(out).save(buffer, format="PNG")
    return _compact(buffer.getvalue(), figure_record(fig, PHONE_RATIO)), {"width": round(out.shape[1] / PHONE_RATIO)}


def _data_url(png: bytes) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(png).decode()


def book_html(fig: Figure) -> str | None:
    """``fig`` for the page at every width: a ``<picture>`` whose phone source (``phone_png``) the
    browser shows below ``PHONE_MEDIA``, and the desktop PNG (``book_png``) above; None (the PNG
    alone) when no phone rendition is needed. The desktop PNG is kept for ``book_png``'s call that
    follows in the same display (IPython asks for text/html before image/png)."""
    desktop = book_png(fig)  # first: its rules (labels lifted for the 717 px column) hold for the phone too
    if desktop is None:
        return None
    try:  # the phone rendition improves a figure; one it cannot draw keeps the desktop rendition only
        phone = phone_png(fig)
    except Exception:  # noqa: BLE001  (e.g. a layout matplotlib cannot solve at the narrow size)
        phone = None
    fig.__dict__["_companion_png"] = desktop
    if phone is None:
        return None

    def size(png: bytes, ratio: float) -> str:
        w, h = struct.unpack(">II", png[16:24])
        return f'width="{round(w / ratio)}" height="{round(h / ratio)}"'

    return (f'<picture class="companion-figure"><source media="{PHONE_MEDIA}" '
            f'srcset="{_data_url(phone[0])}" {size(phone[0], PHONE_RATIO)}>'
            f'<img src="{_data_url(desktop[0])}" {size(desktop[0], PIXEL_RATIO)} '
            f'alt="{html.escape(_describe(fig))}" style="max-width:100%;height:auto"></picture>')


def _describe(fig: Figure) -> str:
    """A text alternative from the figure's own words: each panel's title, axis labels and legend
    entries (a diagram: its labels). The page's ``{glue:figure}`` ``:alt:`` applies to an image output
    only, not to this HTML; the caption under the figure still says what it shows."""
    panels = []
    for ax in fig.axes:
        legend = ax.get_legend()
        words = [ax.get_title(), ax.get_xlabel() and f"x: {ax.get_xlabel()}",
                 ax.get_ylabel() and f"y: {ax.get_ylabel()}",
                 legend and "key: " + ", ".join(t.get_text() for t in legend.get_texts())]
        panels.append("; ".join(w for w in words if w))
    said = " | ".join(p for p in panels if p) or " ".join(t.get_text() for t in _texts(fig))
    return "Figure: " + " ".join(said.split())[:400]
