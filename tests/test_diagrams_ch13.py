"""Chapter 13's pipeline diagram: one box and one check label a stage, arrows between, labels readable."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from companion.notebook.diagrams import CAPSTONE_STAGES, capstone_pipeline
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts


def test_pipeline_draws_one_box_per_stage_and_an_arrow_between_neighbours():
    fig = capstone_pipeline()
    assert isinstance(fig, Figure)
    assert len(fig.findobj(FancyBboxPatch)) == len(CAPSTONE_STAGES)
    assert len(fig.findobj(FancyArrowPatch)) == len(CAPSTONE_STAGES) - 1
    shown = [t.get_text() for t in _texts(fig)]
    for title, piece, check in CAPSTONE_STAGES:
        assert title in shown and piece in shown and check in shown


def test_pipeline_follows_the_stages_it_is_given():
    fig = capstone_pipeline([("a", "b", "c"), ("d", "e", "f")])
    assert len(fig.findobj(FancyBboxPatch)) == 2
    assert {"a", "b", "c", "d", "e", "f"} <= {t.get_text() for t in _texts(fig)}


@pytest.mark.parametrize("bad", [[("a", "b", "c")], [("a", "b", "c")] * 7, [("a", "b"), ("c", "d")],
                                 [("a", "b", "c"), ("d", "", "f")]])
def test_pipeline_rejects_malformed_stages(bad):
    with pytest.raises(ValueError, match="stages"):
        capstone_pipeline(bad)


def test_labels_do_not_overlap_fit_the_column_and_are_readable():
    assert_readable_layout(capstone_pipeline())
