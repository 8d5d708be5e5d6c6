"""Chapter 6's diagram: post-LN beside pre-LN, labels readable and apart, norms where they belong."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure

from companion.notebook.diagrams import residual_streams
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts


def test_both_placements_show_their_sublayers_norms_and_jacobians():
    fig = residual_streams()
    assert isinstance(fig, Figure)
    shown = [t.get_text() for t in _texts(fig)]
    assert "post-LN (2017, GPT-1)" in shown and "pre-LN (GPT-2 onwards)" in shown
    assert shown.count("attention") == 2 and shown.count("FFN") == 2 and shown.count("+") == 4
    assert shown.count("LN") == 4          # two on the post-LN stream, two on the pre-LN branches
    joined = "\n".join(shown)
    assert "I + J_F J_{LN}" in joined and "J_{LN}(I + J_F)" in joined
    assert "final LN" in joined


def test_labels_do_not_overlap_fit_the_column_and_are_readable():
    fig = residual_streams()
    assert_readable_layout(fig)
