"""companion.notebook.phone_figures: a figure the page shows at 400 px with every label >= 9 px
(book_html's <picture>: the narrow source for phones, the desktop PNG above 720 px)."""

from __future__ import annotations

import base64
import configparser
import io
import re
import struct
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from companion.notebook import phone_figures as pf  # noqa: E402
from companion.notebook import viz
from companion.notebook.style import use_book_style  # noqa: E402
from test_viz import book_style  # noqa: E402, F401  (the book's figure style, restored after each test)

ROOT = Path(__file__).resolve().parent.parent


def phone_label(png: bytes) -> float:
    """The smallest label of ``png`` in CSS px as the 352 px column of a 400 px window shows it."""
    text, ratio = viz.read_figure_record(png)
    width = struct.unpack(">II", png[16:24])[0] / ratio
    return text * min(pf.PHONE_COLUMN_PX, width) / width


def sources(page: str) -> tuple[bytes, bytes]:
    """(phone PNG, desktop PNG) of a book_html <picture>."""
    phone = re.search(r'<source media="[^"]+" srcset="data:image/png;base64,([^"]+)"', page)[1]
    desktop = re.search(r'<img src="data:image/png;base64,([^"]+)"', page)[1]
    return base64.b64decode(phone), base64.b64decode(desktop)


def wide_plot(fontsize: float | None = None):
    fig, ax = plt.subplots(figsize=(9, 3))
    for k in range(3):
        ax.plot(range(50), [k * i for i in range(50)], label=f"series {k}")
    ax.set_xlabel("position", fontsize=fontsize)
    ax.set_ylabel("value")
    ax.set_title("a title as long as a chapter's titles are")
    return fig


def test_planted_wide_figure_is_below_9_px_on_a_phone_without_its_phone_rendition(book_style):
    """The failure the phone rule catches: a 720 px figure in the 352 px column shows 11 px text at ~5.4 px."""
    desktop, _ = viz.book_png(wide_plot())
    assert phone_label(desktop) < pf.PHONE_MIN_LABEL_PX - 2


def test_a_wide_plot_gets_a_phone_rendition_with_labels_of_9_px(book_style):
    fig = wide_plot()
    page = pf.book_html(fig)
    assert page.startswith('<picture class="companion-figure">') and f'media="{pf.PHONE_MEDIA}"' in page
    phone, desktop = sources(page)
    assert phone_label(phone) >= pf.PHONE_MIN_LABEL_PX
    assert viz.read_figure_record(phone)[1] == pf.PHONE_RATIO
    assert viz.book_png(fig)[0] == desktop  # the image/png of the same display is the <img>'s PNG
    assert f'width="{round(struct.unpack(">I", desktop[16:20])[0] / viz.PIXEL_RATIO)}"' in page
    # the text alternative from the figure's own words (a {glue:figure}'s :alt: reaches image outputs only)
    assert 'alt="Figure: a title as long as a chapter&#x27;s titles are; x: position; y: value"' in page


def test_side_by_side_panels_are_stacked_on_a_copy_only(book_style):
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.plot([0, 1], [1, 0])
    b.bar(["x", "y"], [1, 2])
    before = [tuple(ax.get_position().bounds) for ax in fig.axes]
    figures = plt.get_fignums()
    phone, _ = sources(pf.book_html(fig))
    width, height = struct.unpack(">II", phone[16:24])
    assert height > width  # one panel above the other
    assert phone_label(phone) >= pf.PHONE_MIN_LABEL_PX
    # the figure itself is as it was, and no second copy is left for the notebook to draw
    assert tuple(fig.get_size_inches()) == (9, 3.6) and plt.get_fignums() == figures
    assert [tuple(ax.get_position().bounds) for ax in fig.axes] == before


def test_a_figure_that_fits_a_phone_has_no_phone_rendition(book_style):
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1])
    assert pf.phone_png(fig) is None and pf.book_html(fig) is None
    assert phone_label(viz.book_png(fig)[0]) >= pf.PHONE_MIN_LABEL_PX


def test_planted_tiny_text_is_lifted_for_the_phone(book_style):
    """A 5 pt axis label (5.6 px): book_png lifts it for 1280 px, phone_png for 400 px."""
    fig = wide_plot(fontsize=5)
    phone, desktop = pf.phone_png(fig)[0], viz.book_png(fig)[0]
    assert phone_label(phone) >= pf.PHONE_MIN_LABEL_PX
    assert phone_label(desktop) < pf.PHONE_MIN_LABEL_PX


def boxes_diagram():
    """Six coloured boxes with labels in a row, 9 inches wide: a diagram as diagrams.py draws them."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, Rectangle

    fig = Figure(figsize=(9, 1.2))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 9)
    ax.set_ylim(0, 1.2)
    ax.axis("off")
    for i, colour in enumerate(viz.COLOURS[:6]):
        ax.add_patch(Rectangle((0.1 + 1.5 * i, 0.3), 1.0, 0.6, facecolor=colour))
        ax.text(0.6 + 1.5 * i, 0.15, f"step {i}", ha="center")
        if i:
            ax.add_patch(FancyArrowPatch((1.5 * i - 0.4, 0.6), (1.5 * i + 0.1, 0.6), arrowstyle="-|>"))
    return fig


def colour_widths(png: bytes) -> dict[str, int]:
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    widths = {}
    for colour in viz.COLOURS[:6]:
        rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
        cols = np.flatnonzero((np.abs(pixels - rgb).sum(axis=2) < 6).any(axis=0))
        widths[colour] = int(cols[-1] - cols[0] + 1) if len(cols) else 0
    return widths


def test_a_diagram_is_wrapped_between_its_boxes(book_style):
    """Narrowing would squeeze the boxes under their labels: a diagram is cut between boxes and the pieces
    stacked. Every box keeps its whole width (no box is cut), and every label is >= 9 px on a phone."""
    fig = boxes_diagram()
    phone = pf.phone_png(fig)[0]
    whole = pf._png_width(fig, pf.PHONE_RATIO)[0]
    (width, height), (whole_width, whole_height) = (struct.unpack(">II", png[16:24]) for png in (phone, whole))
    assert phone_label(phone) >= pf.PHONE_MIN_LABEL_PX
    assert width < 0.6 * whole_width and height > whole_height  # in two rows
    assert colour_widths(phone) == colour_widths(whole) and min(colour_widths(whole).values()) > 0


def test_the_shell_shows_the_picture_and_keeps_the_png(book_style):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    use_book_style()
    data, metadata = shell.display_formatter.format(wide_plot())
    assert data["text/html"].startswith("<picture") and "image/png" in data and "width" in metadata["image/png"]


def test_nbval_compares_the_picture_as_one_token():
    """book/sanitize.cfg maps a <picture> (two base64 PNGs that differ by a pixel between machines) to
    one word, as nbval skips image/png; the text around it is still compared."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "book" / "sanitize.cfg")
    html = '<picture class="companion-figure"><source srcset="data:image/png;base64,AAAA"><img src="x"></picture>'
    out = "before " + html + " after"
    for section in cfg.sections():
        out = re.sub(cfg[section]["regex"], cfg[section].get("replace", ""), out)
    assert out == "before FIGURE after"


def test_planted_phone_failure_leaves_the_desktop_figure(book_style, monkeypatch):
    """A figure the narrowing cannot draw (matplotlib failed on one at the narrow size) is shown as before:
    book_html gives no picture and the PNG formatter still gets the desktop PNG; the cell does not fail."""
    fig = wide_plot()

    def fails(_fig):
        raise ZeroDivisionError("a layout matplotlib cannot solve")

    monkeypatch.setattr(pf, "phone_png", fails)
    assert pf.book_html(fig) is None and viz.book_png(fig) is not None


def test_a_legend_beside_the_panel_moves_below_it_on_the_phone(book_style):
    """A legend outside on the right leaves a 390 px figure's panel no width: on the phone it goes below
    (planted: it stays beside on the desktop figure), and the labels are >= 9 px."""
    fig, ax = plt.subplots(figsize=(7, 3))
    for k in range(5):
        ax.plot(range(10), [i * k for i in range(10)], label=f"scheme number {k}, fixed s = 8")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    phone = pf.phone_png(fig)[0]
    width, height = struct.unpack(">II", phone[16:24])
    assert phone_label(phone) >= pf.PHONE_MIN_LABEL_PX and height > 0.55 * width  # legend under the panel
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1 - 1


def test_a_legend_as_wide_as_the_panel_moves_below_it_on_the_phone(book_style):
    """A four-column legend above a 7.5-inch plot (ch07's dynamic-scaling figure) kept the phone figure
    528 px wide (labels 8.2 px): on the phone it goes below the panel in one column."""
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    for k in range(7):
        ax.plot(range(50), [k + i / 50 for i in range(50)], label=f"scheme {k}, fixed s = 8")
    ax.legend(ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    phone = pf.phone_png(fig)[0]
    width, height = struct.unpack(">II", phone[16:24])
    assert phone_label(phone) >= pf.PHONE_MIN_LABEL_PX and height > 0.6 * width  # legend under the panel



def test_a_grid_constrained_layout_cannot_solve_is_laid_out_by_tight_layout(book_style, monkeypatch):
    """Constrained layout raised ZeroDivisionError on ch13's surprisal figure narrowed (a zero width ratio
    in its grid): the copy is narrowed again with tight_layout, a phone rendition all the same, labels
    >= 9 px. Planted: when that fails too, book_html keeps the desktop PNG alone."""
    real = pf._narrowed_png

    def no_constrained(fig, text, constrained=True):
        if constrained:
            raise ZeroDivisionError("float division by zero")
        return real(fig, text, constrained=False)

    monkeypatch.setattr(pf, "_narrowed_png", no_constrained)
    phone = pf.phone_png(wide_plot())
    assert phone is not None and phone_label(phone[0]) >= pf.PHONE_MIN_LABEL_PX

    def always(fig, text, constrained=True):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(pf, "_narrowed_png", always)
    with pytest.raises(ZeroDivisionError):
        pf.phone_png(wide_plot())
    assert pf.book_html(wide_plot()) is None
