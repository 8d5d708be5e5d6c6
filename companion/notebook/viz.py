"""Plots shared by the chapters, and the one figure style of the book, for screen and print.

What this module provides
- ``apply_style()``: the book's figure style, which ``companion.notebook.style.use_book_style()``, the
  one call at the top of a notebook, applies. Figures are laid out at ``DPI`` (80 CSS
  px per inch, as before: the ``<Figure size WxH>`` text the notebooks store, which nbval compares,
  stays the same) and saved as PNG at ``PIXEL_RATIO`` times that (200 dpi: sharp on high-density
  screens, when zoomed and in print), with the display width in the output's metadata so the page
  shows them at their designed size. PNG, not SVG: nbval skips images, SVG text would be compared.
- ``book_png(fig)``: that PNG and its metadata; ``use_book_style`` registers it as IPython's PNG
  formatter, so every figure a cell shows or glues (``diagrams.glue_figure``) goes through it. It
  also applies the two rules a chapter cannot forget:
  * no text smaller than ``MIN_LABEL_PX`` (11 px) as rendered in the book's column at 1280 px
    (figures wider than the column are shown scaled down: their smallest text is scaled up to match);
  * a legend that covers plotted data is moved below the axes (``legend_off_data``).
- ``use_book_style`` (``companion.notebook.style``) also registers
  ``companion.notebook.phone_figures.book_html`` as the ``text/html`` formatter: the figure drawn for a
  phone's column too, in a ``<picture>`` the browser picks from; the ``image/png`` stays in the bundle.
- ``attention_heatmap(weights, ...)``: a (T, S) weight matrix with token labels on both axes.
- ``text_px(fig)``: the smallest text of a figure in CSS px as displayed (tests use it).
"""

from __future__ import annotations

import io
import re
import struct
from typing import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

__all__ = ["apply_style", "attention_heatmap", "book_png", "legend_off_data", "text_px",
           "figure_record", "read_figure_record",
           "DPI", "PIXEL_RATIO", "COLUMN_PX", "MIN_LABEL_PX"]

DPI = 80  # CSS px per inch of a figure (a point of text is 80/72 = 1.11 CSS px)
PIXEL_RATIO = 2.5  # PNG pixels per CSS px: 200 dpi
COLUMN_PX = 717  # a cell output's width in the book's column at a 1280 px window (tools/check_layout.py)
MIN_LABEL_PX = 11  # the smallest text a figure may show, in CSS px at that width
RECORD_KEY = "companion:figure"  # the PNG text chunk that carries a figure's smallest text (figure_record)
# Okabe and Ito's eight colours: told apart with the common colour-vision deficiencies and in grey print.
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


def apply_style(dpi: int = DPI) -> None:
    """The book's figure style for pyplot figures (``companion.notebook.style.use_book_style`` also
    routes every displayed figure through ``book_png`` and the phone rendition)."""
    from cycler import cycler

    plt.rcParams.update(
        {
            "figure.dpi": dpi,
            "savefig.dpi": dpi * PIXEL_RATIO,
            "figure.figsize": (6.0, 3.6),  # 480 x 288 px
            "figure.facecolor": "white",
            "savefig.facecolor": "white",
            "savefig.bbox": "tight",
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.prop_cycle": cycler(color=COLOURS),
            "axes.grid": True,
            "grid.alpha": 0.3,
            "grid.linewidth": 0.6,
            "lines.linewidth": 1.8,
            "axes.axisbelow": True,
            "font.size": 11,  # 12.2 px
            "axes.titlesize": 12,
            "axes.labelsize": 11,
            "xtick.labelsize": 10,  # 11.1 px
            "ytick.labelsize": 10,
            "legend.fontsize": 10,
            "legend.frameon": False,
            "figure.titlesize": 12,
        }
    )


def _scale(fig: Figure) -> float:
    """How much the page shrinks ``fig`` at 1280 px: 1 when it fits the column."""
    width_px = fig.get_figwidth() * fig.dpi
    return min(1.0, COLUMN_PX / width_px) if width_px else 1.0


def _texts(fig: Figure):
    return [t for t in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text"))
            if t.get_text() and t.get_visible()]


def _smallest_px(fig: Figure) -> float | None:
    """The smallest visible text of ``fig`` in CSS px at its designed width, None without text."""
    sizes = [t.get_fontsize() for t in _texts(fig)]
    return min(sizes) * fig.dpi / 72 if sizes else None


def text_px(fig: Figure) -> float:
    """The smallest visible text of ``fig`` in CSS px as the book shows it at 1280 px."""
    px = _smallest_px(fig)
    return float("inf") if px is None else px * _scale(fig)


def _lift_small_text(fig: Figure, scale: float | None = None) -> None:
    floor_pt = MIN_LABEL_PX * 72 / fig.dpi / (scale or _scale(fig))
    for t in _texts(fig):
        if t.get_fontsize() < floor_pt:
            t.set_fontsize(floor_pt)


def _covers_data(ax, box) -> bool:
    """Whether the display-space ``box`` lies over any line vertex, marker, bar or image of ``ax``."""
    import numpy as np

    def inside(pts) -> bool:
        return bool(np.any((pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)))

    for line in ax.get_lines():
        xy = line.get_xydata()
        if len(xy) == 0 or not line.get_visible():
            continue
        pts = line.get_transform().transform(xy)
        if len(pts) > 1:  # the middle of each segment too
            pts = np.concatenate([pts, (pts[1:] + pts[:-1]) / 2])
        if inside(pts):
            return True
    for coll in ax.collections:
        offsets = coll.get_offsets()
        if coll.get_visible() and len(offsets):
            pts = coll.get_offset_transform().transform(offsets)
            if inside(pts):
                return True
    renderer = ax.figure.canvas.get_renderer()
    for artist in [*ax.patches, *ax.images]:
        if artist.get_visible() and artist.get_window_extent(renderer).overlaps(box):
            return True
    return False


def legend_off_data(ax, *, text: bool = False, beside: bool = False, columns: int = 3) -> bool:
    """Move ``ax``'s legend below the axes (under its tick labels and x label, up to ``columns``) when it
    covers plotted data (or, with ``text``, a text drawn in the axes); returns whether it moved. Legends
    outside the axes are left alone, unless ``beside``: then one to the right of the axes, or nearly as
    wide as the axes, moves below too (on a narrow figure it would leave the panel no width)."""
    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return False
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    covers_text = text and any(t.get_visible() and t.get_window_extent(renderer).overlaps(box) for t in ax.texts)
    panel = ax.get_window_extent(renderer)
    right = beside and (box.x0 >= panel.x1 - 1 or box.width > 0.8 * panel.width)  # beside, or as wide
    inside = box.overlaps(ax.get_window_extent(renderer)) and (_covers_data(ax, box) or covers_text)
    if not (inside or right):
        return False
    handles = getattr(legend, "legend_handles", None) or getattr(legend, "legendHandles", [])
    labels = [t.get_text() for t in legend.get_texts()]
    fontsize = legend.get_texts()[0].get_fontsize() if labels else None
    title = legend.get_title().get_text() or None
    legend.set_visible(False)
    below = ax.get_tightbbox(renderer)
    y = ax.transAxes.inverted().transform((0, below.y0))[1]
    moved = ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, y - 0.02),
                      ncols=max(1, min(len(labels), columns)), fontsize=fontsize, title=title, frameon=False)
    moved.companion_below = True  # phone_figures re-anchors it when the panel is laid out again
    return True


def figure_record(fig: Figure, ratio: float) -> dict[str, str]:
    """The PNG text chunk ``book_png`` writes: the figure's smallest text in CSS px at its designed
    width, and the PNG pixels per CSS px, so a check of the built page (tools/check_layout.py) can
    tell how large a label is as shown: ``text * shown width / (PNG width / ratio)``."""
    return {RECORD_KEY: f"text={_smallest_px(fig) or 0.0:.2f} ratio={ratio:g};"}


def read_figure_record(png: bytes) -> tuple[float, float] | None:
    """``(smallest text in CSS px, PNG px per CSS px)`` from a PNG ``book_png`` wrote, else None."""
    found = re.search(rb"companion:figure\x00text=([0-9.]+) ratio=([0-9.]+);", png)
    return (float(found[1]), float(found[2])) if found else None


def _agg(fig: Figure) -> None:
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure(): give it a canvas that draws
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)


def book_png(fig: Figure, ratio: float = PIXEL_RATIO) -> tuple[bytes, dict] | None:
    """``fig`` as the book shows it: the rules above applied, PNG at ``ratio`` x (``PIXEL_RATIO``,
    or 1 for the many frames of a frame player), its smallest text recorded in the PNG
    (``figure_record``), and ``{"width": css_px}`` for the page (myst-nb writes it on the
    ``<img>``; the height follows)."""
    cached = fig.__dict__.pop("_companion_png", None)  # drawn a moment ago by book_html, same display
    if cached is not None and ratio == PIXEL_RATIO:
        return cached
    if not fig.axes and not fig.texts and not fig.patches:
        return None
    _agg(fig)
    try:  # the rules improve a figure; a figure they cannot handle is still shown as it is
        fig.canvas.draw()  # lays out tick labels, legends and tight_layout before they are measured
        for ax in fig.axes:
            legend_off_data(ax)
        _lift_small_text(fig)
    except Exception:  # noqa: BLE001
        pass
    for attempt in range(4):
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=fig.dpi * ratio, bbox_inches="tight", facecolor="white",
                    metadata=figure_record(fig, ratio))
        data = buffer.getvalue()
        width = struct.unpack(">II", data[16:24])[0] / ratio  # the PNG header, in CSS px
        # Wider than the column with its labels and legend (the tight box), the page shrinks it by
        # COLUMN_PX / width, so its smallest text must be that much larger; lifting text can widen
        # the tight box again (tick labels, a legend outside the axes), hence the few rounds.
        scale = min(1.0, COLUMN_PX / width)
        px = _smallest_px(fig)
        if px is None or px * scale >= MIN_LABEL_PX - 1e-6:
            break
        _lift_small_text(fig, scale)
    return _compact(data, figure_record(fig, ratio)), {"width": round(width)}


def _compact(png: bytes, record: dict[str, str]) -> bytes:
    """``png`` with a palette of at most 256 colours (median cut, no dithering), its record kept: a
    figure's flat colours and anti-aliased edges need no more, and the file is about 2.5 times smaller
    (a notebook stores each figure twice, as PNG and in the HTML, and a player many frames)."""
    from PIL import Image, PngImagePlugin

    image = Image.open(io.BytesIO(png)).convert("RGB")
    image = image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    info = PngImagePlugin.PngInfo()
    for key, value in record.items():
        info.add_text(key, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info, optimize=True)
    return buffer.getvalue()


def attention_heatmap(
    weights: torch.Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ax: plt.Axes | None = None,
    title: str | None = None,
    annotate: bool = True,
    cmap: str = "Blues",
) -> plt.Axes:
    """Draw attention weights A (T, S): row i = query i, column j = key j, darker = more weight."""
    w = torch.as_tensor(weights).detach().to("cpu", torch.float64)
    if w.dim() != 2:
        raise ValueError(f"weights must be a (T, S) matrix; got shape {tuple(w.shape)}")
    T, S = w.shape
    if query_labels is not None and len(query_labels) != T:
        raise ValueError(f"query_labels must have T={T} entries; got {len(query_labels)}")
    if key_labels is not None and len(key_labels) != S:
        raise ValueError(f"key_labels must have S={S} entries; got {len(key_labels)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * S + 1.5, 0.45 * T + 1.0))  # as before: the stored repr
    ax.imshow(w.numpy(), cmap=cmap, vmin=0.0, vmax=1.0)
    ax.grid(False)
    ax.set_xticks(range(S), key_labels if key_labels is not None else range(S), rotation=45, ha="right")
    ax.set_yticks(range(T), query_labels if query_labels is not None else range(T))
    ax.set_xlabel("key (read from)")
    ax.set_ylabel("query (reader)")
    if annotate and T * S <= 144:
        for i in range(T):
            for j in range(S):
                val = float(w[i, j])
                ax.text(j, i, f"{val:.2f}", ha="center", va="center", fontsize=10,
                        color="white" if val > 0.55 else "black")
    if title:
        ax.set_title(title)
    return ax
