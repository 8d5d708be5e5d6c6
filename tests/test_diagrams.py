"""The book's diagrams: each is a Figure, carries the labels a reader needs, and no two labels collide."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from companion.notebook import diagrams
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
    "shifted_input": ["<bos>", "<eos>", "le", "chat", "dort", "= target + <eos>",
                      "= <bos> + target", "teacher forcing", "position 3"],
}


def _texts(fig: Figure) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@pytest.mark.parametrize("name", diagrams.DIAGRAMS)
def test_diagram_is_a_figure_with_its_labels(name):
    fig = getattr(diagrams, name)()
    assert isinstance(fig, Figure)
    shown = "\n".join(t.get_text() for t in _texts(fig))
    missing = [label for label in EXPECTED[name] if label not in shown]
    assert not missing, f"{name} lacks the labels {missing}"


@pytest.mark.parametrize("name", [*diagrams.DIAGRAMS, "teacher_forcing_vs_generation"])
def test_diagram_is_readable_as_the_book_shows_it(name):
    """Labels apart, inside their boxes, clear of arrows and hatching, >= 11 px at 1280 px."""
    fig = getattr(diagrams, name)()
    assert len(_texts(fig)) >= 8
    assert_readable_layout(fig)


def test_shifted_input_follows_the_target_and_rejects_an_empty_one():
    fig = diagrams.shifted_input(("ich", "bin"))
    shown = [t.get_text() for t in _texts(fig)]
    assert shown.count("ich") == 2 and shown.count("bin") == 2  # once as input, once as label
    assert "position 2" in shown and "position 3" not in shown
    with pytest.raises(ValueError, match="target"):
        diagrams.shifted_input(())


def test_glue_figure_validates_its_arguments():
    fig = diagrams.attention_steps()
    with pytest.raises(ValueError, match="fig must be a matplotlib Figure"):
        diagrams.glue_figure("fig-x", "not a figure")
    with pytest.raises(ValueError, match="name must be a figure label"):
        diagrams.glue_figure("attention", fig)


def test_glue_figure_records_the_figure_under_its_name(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda data, raw, metadata: shown.append((data, metadata)))
    diagrams.glue_figure("fig-steps", diagrams.attention_steps())
    (data, metadata), = shown
    assert metadata["scrapbook"] == {"name": "fig-steps", "mime_prefix": ""}  # what myst_nb reads
    assert data["text/plain"].startswith("<Figure size")
