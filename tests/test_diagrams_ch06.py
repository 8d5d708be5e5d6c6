"""Chapter 6's diagrams: post-LN beside pre-LN, and one modern decoder layer; labels readable and apart,
norms and projections where they belong."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure

from companion.notebook.diagrams_ch06 import modern_decoder_layer, residual_streams
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


def test_the_modern_layer_shows_both_branches_in_the_order_of_its_equation():
    fig = modern_decoder_layer()
    assert isinstance(fig, Figure)
    shown = [t.get_text() for t in _texts(fig)]
    assert shown.count("RMSNorm") == 2 and shown.count("+") == 2       # two branches, two sums
    joined = "\n".join(shown)
    for part in ("fused QKV", "(h + 2g)", "RoPE", "causal GQA", "\\pi(r)", "W_O", "SiLU", "W_d",
                 "identity path", "final RMSNorm"):
        assert part in joined, part
    # the attention branch comes first (lower on the page): its norm below the SwiGLU branch's
    norms = sorted(t.get_position()[1] for t in _texts(fig) if t.get_text() == "RMSNorm")
    qkv = next(t for t in _texts(fig) if "fused QKV" in t.get_text()).get_position()[1]
    silu = next(t for t in _texts(fig) if "SiLU" in t.get_text()).get_position()[1]
    assert abs(qkv - norms[0]) < 1e-9 and abs(silu - norms[1]) < 1e-9 and norms[0] < norms[1]


def test_the_modern_layer_is_readable_at_the_column_width():
    assert_readable_layout(modern_decoder_layer())
