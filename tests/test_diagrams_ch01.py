"""Chapter 1's diagrams: each is a Figure, carries the labels a reader needs, and no two labels collide."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from companion.notebook import diagrams_ch01
from figure_layout import assert_readable_layout

# Labels (raw strings, mathtext included) that each diagram must show.
EXPECTED = {
    "attention_steps": ["1. score", "2. scale", "3. mask +", "4. weighted", "QK^{\\top}",
                        "1/\\sqrt{d_k}", "softmax", "$(T, S)$", "$(T, d_v)$", "$(S, d_k)$",
                        "$(S, d_v)$", "-\\infty"],
    "multihead_split": ["1. project", "2. split", "3. attention", "4. concat", "5. $W_O$",
                        "$(B, h, T, d_k)$", "$(B, T, h\\,d_k)$", "one batched", "heads of $d_k$"],
    "encoder_decoder": ["encoder ($\\times N$)", "decoder ($\\times N$)", "self-attention\n(all source tokens)",
                        "masked self-attention\n(causal)", "cross-attention", "queries from decoder",
                        "keys, values\nfrom the encoder", "$S \\times S$", "$T \\times T$",
                        "$T \\times S$"],
}


def _texts(fig: Figure) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@pytest.mark.parametrize("name", diagrams_ch01.__all__)
def test_diagram_is_a_figure_with_its_labels(name):
    fig = getattr(diagrams_ch01, name)()
    assert isinstance(fig, Figure)
    shown = "\n".join(t.get_text() for t in _texts(fig))
    missing = [label for label in EXPECTED[name] if label not in shown]
    assert not missing, f"{name} lacks the labels {missing}"


@pytest.mark.parametrize("name", diagrams_ch01.__all__)
def test_diagram_is_readable_as_the_book_shows_it(name):
    """Labels apart, inside their boxes, clear of arrows and hatching, >= 11 px at 1280 px."""
    fig = getattr(diagrams_ch01, name)()
    assert len(_texts(fig)) >= 8
    assert_readable_layout(fig)
