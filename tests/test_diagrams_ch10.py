"""Chapter 10's diagram: prefill beside one decode step, labels readable and apart."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure

from companion.notebook.diagrams import prefill_decode
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts


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
    assert_readable_layout(fig)


@pytest.mark.parametrize("prompt, new, message", [(("a",), "b", "prompt must be 2 to 6"),
                                                  (tuple("abcdefg"), "b", "prompt must be 2 to 6"),
                                                  (("a", "b"), "", "new must be")])
def test_bad_arguments_raise(prompt, new, message):
    with pytest.raises(ValueError, match=message):
        prefill_decode(prompt, new)
