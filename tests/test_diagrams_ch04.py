"""Chapter 4's diagram: teacher forcing beside generation, labels readable and apart."""

import itertools

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from companion.notebook.diagrams import teacher_forcing_vs_generation


def _texts(fig):
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_both_halves_show_inputs_labels_and_passes():
    fig = teacher_forcing_vs_generation(("a", "b", "c", "d"))
    assert isinstance(fig, Figure)
    shown = [t.get_text() for t in _texts(fig)]
    # training: inputs a b c, labels b c d; generation: inputs a b c, samples b c d
    assert shown.count("a") == 2 and shown.count("b") == 4 and shown.count("d") == 2
    assert [s for s in shown if s.startswith("pass ")] == ["pass 1", "pass 2", "pass 3"]
    assert "training: teacher forcing" in shown and "generation: one pass per token" in shown


def test_labels_do_not_overlap_fit_the_column_and_are_readable():
    fig = teacher_forcing_vs_generation()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig)]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), f"labels {a!r} and {b!r} overlap"
    for text, box in boxes:
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height, text
    assert fig.get_size_inches()[0] <= 9.0
    assert min(t.get_fontsize() for t in _texts(fig)) >= 9


def test_too_few_tokens_raise():
    with pytest.raises(ValueError, match="tokens must be at least 3"):
        teacher_forcing_vs_generation(("a", "b"))
