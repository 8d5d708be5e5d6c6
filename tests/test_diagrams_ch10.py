"""Chapter 10's diagram: prefill beside one decode step, labels readable and apart."""

import itertools

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from companion.notebook.diagrams import prefill_decode


def _texts(fig):
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_prefill_writes_every_prompt_row_and_decode_appends_one():
    fig = prefill_decode(("a", "b", "c"), new="d")
    assert isinstance(fig, Figure)
    shown = [t.get_text() for t in _texts(fig)]
    # prefill caches rows 0..2; the decode panel shows those 3 rows again plus the appended row 3
    assert [s for s in shown if s.startswith("k,v")] == ["k,v\n0", "k,v\n1", "k,v\n2",
                                                          "k,v\n0", "k,v\n1", "k,v\n2", "k,v\n3"]
    assert "decode: one row at position 3" in shown and "3 x 3" in shown
    assert "q reads all S keys (1 x 4)" in shown and "d" in shown


@pytest.mark.parametrize("prompt", [("the", "cat"), ("the", "cat", "sat", "on"), tuple("abcdef")])
def test_labels_do_not_overlap_fit_the_column_and_are_readable(prompt):
    fig = prefill_decode(prompt)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig)]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), f"labels {a!r} and {b!r} overlap"
    for text, box in boxes:
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height, text
    assert fig.get_size_inches()[0] <= 9.0
    assert min(t.get_fontsize() for t in _texts(fig)) >= 9


@pytest.mark.parametrize("prompt, new, message", [(("a",), "b", "prompt must be 2 to 6"),
                                                  (tuple("abcdefg"), "b", "prompt must be 2 to 6"),
                                                  (("a", "b"), "", "new must be")])
def test_bad_arguments_raise(prompt, new, message):
    with pytest.raises(ValueError, match=message):
        prefill_decode(prompt, new)
