"""The book's diagrams: each is a Figure, carries the labels a reader needs, and no two labels collide."""

import itertools

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from companion.notebook import diagrams

# Labels (raw strings, mathtext included) that each diagram must show.
EXPECTED = {
    "attention_steps": ["1. score", "2. scale", "3. mask +", "4. weighted", "QK^{\\top}",
                        "1/\\sqrt{d_k}", "softmax", "$(T, S)$", "$(T, d_v)$", "$(S, d_k)$",
                        "$(S, d_v)$", "-\\infty"],
    "multihead_split": ["1. project", "2. split", "3. attention", "4. concat", "5. $W_O$",
                        "$(B, h, T, d_k)$", "$(B, T, h\\,d_k)$", "one batched", "heads of $d_k$"],
    "encoder_decoder": ["encoder (x N)", "decoder (x N)", "self-attention\n(all source tokens)",
                        "masked self-attention\n(causal)", "cross-attention", "queries from decoder",
                        "keys, values\nfrom the encoder", "S x S", "T x T", "T x S"],
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


@pytest.mark.parametrize("name", diagrams.DIAGRAMS)
def test_diagram_labels_do_not_overlap_and_stay_on_the_page(name):
    fig = getattr(diagrams, name)()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig)]
    assert len(boxes) >= 8
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), f"{name}: labels {a!r} and {b!r} overlap"
    for text, box in boxes:
        inside = 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height
        assert inside, f"{name}: label {text!r} runs off the figure"


@pytest.mark.parametrize("name", diagrams.DIAGRAMS)
def test_diagram_fits_the_text_column_with_readable_labels(name):
    fig = getattr(diagrams, name)()
    width, _ = fig.get_size_inches()
    assert width <= 9.0, "wider than the book's column at 80 dpi (720 px)"
    assert min(t.get_fontsize() for t in _texts(fig)) >= 9


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
