"""The shared diagrams module: glue_figure, and the diagrams still kept there (chapters' own: test_diagrams_chNN)."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from companion.notebook import diagrams, diagrams_ch01
from figure_layout import assert_readable_layout


def _texts(fig: Figure) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@pytest.mark.parametrize("name", ["teacher_forcing_vs_generation"])
def test_diagram_is_readable_as_the_book_shows_it(name):
    """Labels apart, inside their boxes, clear of arrows and hatching, >= 11 px at 1280 px."""
    fig = getattr(diagrams, name)()
    assert len(_texts(fig)) >= 8
    assert_readable_layout(fig)


def test_glue_figure_validates_its_arguments():
    fig = diagrams_ch01.attention_steps()
    with pytest.raises(ValueError, match="fig must be a matplotlib Figure"):
        diagrams.glue_figure("fig-x", "not a figure")
    with pytest.raises(ValueError, match="name must be a figure label"):
        diagrams.glue_figure("attention", fig)


def test_glue_figure_records_the_figure_under_its_name(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda data, raw, metadata: shown.append((data, metadata)))
    diagrams.glue_figure("fig-steps", diagrams_ch01.attention_steps())
    (data, metadata), = shown
    assert metadata["scrapbook"] == {"name": "fig-steps", "mime_prefix": ""}  # what myst_nb reads
    assert data["text/plain"].startswith("<Figure size")
