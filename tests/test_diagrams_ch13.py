"""Chapter 13's diagrams: the pipeline (one box and one check label a stage, arrows between) and one
layer of the recurrence (one box a step, each with its equation and module); labels readable."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from companion.notebook.diagrams_ch13 import CAPSTONE_STAGES, LAYER_STEPS, capstone_layer, capstone_pipeline
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


def test_layer_labels_every_step_with_its_equation_and_module():
    fig = capstone_layer()
    shown = [t.get_text() for t in _texts(fig)]
    steps = [s for row in LAYER_STEPS for s in row]
    assert len(fig.findobj(FancyBboxPatch)) == len(steps)
    for what, eq, module in steps:
        assert f"{what}\n{eq}" in shown and module in shown
    # every equation of one layer, (13.2) to (13.7), appears; the embedding and output do not
    assert {eq for _, eq, _ in steps} == {f"(13.{k})" for k in range(2, 8)}
    # per sublayer: a branch off the stream, one arrow between neighbours, one back to the add
    # (the stream itself is drawn as an arrow without a head)
    assert len(fig.findobj(FancyArrowPatch)) == len(steps) + 2 * len(LAYER_STEPS)


def test_layer_follows_the_steps_it_is_given():
    fig = capstone_layer([(("a", "b", "c"), ("d", "e", "f")), (("g", "h", "i"), ("j", "k", "l"))])
    assert len(fig.findobj(FancyBboxPatch)) == 4
    assert {"a\nb", "c", "j\nk", "l"} <= {t.get_text() for t in _texts(fig)}


@pytest.mark.parametrize("bad", [[(("a", "b", "c"), ("d", "e", "f"))],
                                 [(("a", "b", "c"),), (("a", "b", "c"), ("d", "e", "f"))],
                                 [(("a", "b", "c"), ("d", "e")), (("a", "b", "c"), ("d", "e", "f"))]])
def test_layer_rejects_malformed_steps(bad):
    with pytest.raises(ValueError, match="steps"):
        capstone_layer(bad)


@pytest.mark.parametrize("draw", [capstone_pipeline, capstone_layer])
def test_labels_do_not_overlap_fit_the_column_and_are_readable(draw):
    assert_readable_layout(draw())
