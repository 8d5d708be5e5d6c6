"""tests/figure_layout.py's checks report what they exist to catch: each problem planted in a small
diagram built with the diagrams' own helpers, and the same diagram without it passing."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.patches import Rectangle

from companion.notebook import viz
from companion.notebook.diagrams import FONT, OP, _arrow, _box, _canvas
from figure_layout import assert_readable_layout, layout_problems


def _two_boxes(label: str = "sum", *, arrow_to=(3.0, 0.75), hatch=False, background=False,
               font=FONT):
    fig, ax = _canvas(5.0, 1.5)
    _box(ax, 0.2, 0.5, 1.0, 0.5, label, OP, size=font)
    _box(ax, 3.0, 0.5, 1.0, 0.5, "out", OP)
    _arrow(ax, (1.2, 0.75), arrow_to)
    if hatch:
        ax.add_patch(Rectangle((2.2, 0.1), 0.3, 0.3, facecolor="none", hatch="//"))
        ax.text(2.35, 0.25, "7", ha="center", va="center", fontsize=FONT,
                bbox=dict(facecolor="white", edgecolor="none") if background else None)
    return fig


def test_a_clean_diagram_passes():
    fig = _two_boxes(hatch=True, background=True)
    assert layout_problems(fig) == []
    assert_readable_layout(fig)


def test_a_label_wider_than_its_box_is_reported():
    problems = layout_problems(_two_boxes("y = sum over the chosen experts"))
    assert any("spills out of its box" in p for p in problems), problems


def test_an_arrow_across_a_label_is_reported():
    # the arrow leaves the first box and ends in the middle of the second box's label
    problems = layout_problems(_two_boxes(arrow_to=(3.5, 0.75)))
    assert problems == ["an arrow crosses label 'out'"]


def test_hatching_under_a_bare_label_is_reported():
    assert layout_problems(_two_boxes(hatch=True)) == [
        "hatching runs under label '7' (give the label a background)"]


def test_overlapping_labels_are_reported():
    fig = _two_boxes()
    fig.axes[0].text(0.7, 0.75, "sum", ha="center", va="center", fontsize=FONT)
    assert any("overlap" in p for p in layout_problems(fig))


def test_small_text_is_lifted_for_the_page_and_its_growth_is_checked():
    """book_png lifts 7 pt labels to MIN_LABEL_PX; a label that fitted its box at 7 pt may not."""
    fig = _two_boxes("one longer label", font=7)  # 0.79 in of a 1 in box at 7 pt
    assert viz.text_px(fig) < viz.MIN_LABEL_PX
    assert layout_problems(fig) == []          # as drawn, it fits
    with pytest.raises(AssertionError, match="spills out of its box"):
        assert_readable_layout(fig, min_fontsize=7)   # as the book shows it, it does not
    assert viz.text_px(fig) >= viz.MIN_LABEL_PX - 1e-6
