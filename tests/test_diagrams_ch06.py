"""Chapter 6's diagram: post-LN beside pre-LN, labels readable and apart, norms where they belong."""

import itertools

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.text import Text

from companion.notebook.diagrams import residual_streams


def _texts(fig):
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_both_placements_show_their_sublayers_norms_and_jacobians():
    fig = residual_streams()
    assert isinstance(fig, Figure)
    shown = [t.get_text() for t in _texts(fig)]
    assert "post-LN (2017, GPT-1)" in shown and "pre-LN (GPT-2 onwards)" in shown
    assert shown.count("attention") == 2 and shown.count("FFN") == 2 and shown.count("+") == 4
    assert shown.count("LN") == 4          # two on the post-LN stream, two on the pre-LN branches
    joined = "\n".join(shown)
    assert "I + J_F J_{LN}" in joined and "J_{LN}(I + J_F)" in joined
    assert "final LN" in joined


def test_labels_do_not_overlap_fit_the_column_and_are_readable():
    fig = residual_streams()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig)]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), f"labels {a!r} and {b!r} overlap"
    for text, box in boxes:
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height, text
    assert fig.get_size_inches()[0] <= 9.0
    assert min(t.get_fontsize() for t in _texts(fig)) >= 9
