"""Chapter 3's diagram of shifted decoder inputs: its labels, its layout, and its argument check."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from companion.notebook.diagrams_ch03 import shifted_input
from figure_layout import assert_readable_layout

EXPECTED = ["<bos>", "<eos>", "le", "chat", "dort", "= target + <eos>", "= <bos> + target",
            "teacher forcing", "position 3"]


def _texts(fig: Figure) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_shifted_input_is_a_figure_with_its_labels():
    fig = shifted_input()
    assert isinstance(fig, Figure)
    shown = "\n".join(t.get_text() for t in _texts(fig))
    missing = [label for label in EXPECTED if label not in shown]
    assert not missing, f"shifted_input lacks the labels {missing}"


def test_shifted_input_is_readable_as_the_book_shows_it():
    fig = shifted_input()
    assert len(_texts(fig)) >= 8
    assert_readable_layout(fig)


def test_shifted_input_follows_the_target_and_rejects_an_empty_one():
    fig = shifted_input(("ich", "bin"))
    shown = [t.get_text() for t in _texts(fig)]
    assert shown.count("ich") == 2 and shown.count("bin") == 2  # once as input, once as label
    assert "position 2" in shown and "position 3" not in shown
    with pytest.raises(ValueError, match="target"):
        shifted_input(())
