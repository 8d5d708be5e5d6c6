"""Chapter 4's diagram: teacher forcing beside generation, labels readable and apart."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure

from companion.notebook.diagrams import teacher_forcing_vs_generation
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts


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
    assert_readable_layout(fig)


def test_too_few_tokens_raise():
    with pytest.raises(ValueError, match="tokens must be at least 3"):
        teacher_forcing_vs_generation(("a", "b"))
