"""Checks shared by the diagram tests: every label readable, apart from the others and on the page."""

from __future__ import annotations

import itertools

from matplotlib.figure import Figure
from matplotlib.text import Text


def texts(fig: Figure) -> list[Text]:
    """The figure's visible, non-empty text objects."""
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def assert_readable_layout(fig: Figure, *, max_width_in: float = 9.0, min_fontsize: float = 9) -> None:
    """No two labels overlap, none runs off the figure, the figure fits the book's column (9 inches at
    80 dpi is 720 px) and no label is smaller than ``min_fontsize`` points."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig)]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), f"labels {a!r} and {b!r} overlap"
    for text, box in boxes:
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height, text
    assert fig.get_size_inches()[0] <= max_width_in
    assert min(t.get_fontsize() for t in texts(fig)) >= min_fontsize
