"""Checks shared by the diagram tests: every label readable, apart from the others and on the page."""

from __future__ import annotations

import itertools

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch
from matplotlib.text import Text

from companion.notebook import viz

SLACK = 1.0  # display px: anti-aliasing and rounding, not a layout decision


def texts(fig: Figure) -> list[Text]:
    """The figure's visible, non-empty text objects."""
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def _labelled_box(p: Patch) -> bool:
    """A box a label is written in: the diagrams' rounded boxes (``diagrams._box``), outlined."""
    return isinstance(p, FancyBboxPatch) and p.get_visible() and p.get_linewidth() > 0


def _crosses(polyline: np.ndarray, box) -> bool:
    """Whether a drawn polyline (curves already flattened) passes through ``box``: each segment
    sampled every pixel or so."""
    for (x0, y0), (x1, y1) in zip(polyline[:-1], polyline[1:]):
        n = max(2, int(np.hypot(x1 - x0, y1 - y0)))
        xs, ys = np.linspace(x0, x1, n), np.linspace(y0, y1, n)
        if np.any((xs > box.x0) & (xs < box.x1) & (ys > box.y0) & (ys < box.y1)):
            return True
    return False


def layout_problems(fig: Figure) -> list[str]:
    """What a reader would see wrong in ``fig`` as the book shows it (after ``viz.book_png``'s text
    rule has lifted small labels): labels that overlap, a label spilling out of the box it sits in,
    an arrow drawn across a label, hatching drawn under a label without a background, a label off the
    figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t, t.get_window_extent(renderer)) for t in texts(fig)]
    patches = [p for ax in fig.axes for p in ax.patches]
    problems = []
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        if box_a.x0 + SLACK < box_b.x1 and box_b.x0 + SLACK < box_a.x1 \
                and box_a.y0 + SLACK < box_b.y1 and box_b.y0 + SLACK < box_a.y1:
            problems.append(f"labels {a.get_text()!r} and {b.get_text()!r} overlap")
    for t, box in boxes:
        text = t.get_text()
        if box.x0 < -SLACK or box.x1 > fig.bbox.width + SLACK or box.y0 < -SLACK or box.y1 > fig.bbox.height + SLACK:
            problems.append(f"label {text!r} runs off the figure")
        cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
        holders = [p.get_window_extent(renderer) for p in patches if _labelled_box(p)]
        holders = [h for h in holders if h.x0 <= cx <= h.x1 and h.y0 <= cy <= h.y1]
        if holders:
            home = min(holders, key=lambda h: h.width * h.height)
            if box.x0 < home.x0 - SLACK or box.x1 > home.x1 + SLACK \
                    or box.y0 < home.y0 - SLACK or box.y1 > home.y1 + SLACK:
                problems.append(f"label {text!r} ({box.width:.0f} x {box.height:.0f} px) spills out of "
                                f"its box ({home.width:.0f} x {home.height:.0f} px)")
        inner = box.padded(-2 * SLACK)
        for p in patches:
            if isinstance(p, FancyArrowPatch) and p.get_visible():
                if any(_crosses(polyline, inner) for polyline in
                       p.get_path().transformed(p.get_transform()).to_polygons(closed_only=False)):
                    problems.append(f"an arrow crosses label {text!r}")
            elif p.get_hatch() and t.get_bbox_patch() is None \
                    and p.get_window_extent(renderer).overlaps(inner):
                problems.append(f"hatching runs under label {text!r} (give the label a background)")
    return problems


def assert_readable_layout(fig: Figure, *, max_width_in: float = 9.0, min_fontsize: float = 9) -> None:
    """The figure fits the book's column (9 inches at 80 dpi is 720 px); no label is smaller than
    ``min_fontsize`` points as drawn, nor smaller than ``viz.MIN_LABEL_PX`` as the book shows it at
    1280 px; and, as shown, ``layout_problems`` finds nothing."""
    assert fig.get_size_inches()[0] <= max_width_in
    assert min(t.get_fontsize() for t in texts(fig)) >= min_fontsize
    fig.set_dpi(viz.DPI)  # as in a chapter, after use_book_style(): the page's px per inch
    viz.book_png(fig)  # the page's text rule: what the reader sees is what is checked below
    assert viz.text_px(fig) >= viz.MIN_LABEL_PX - 1e-6, f"smallest label {viz.text_px(fig):.1f} px"
    problems = layout_problems(fig)
    assert not problems, "\n".join(problems)
