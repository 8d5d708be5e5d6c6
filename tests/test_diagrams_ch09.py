"""Chapter 9's diagrams: the window mask and its reach through depth, and one token's MoE routing."""

import matplotlib

matplotlib.use("Agg")

import pytest
from figure_layout import assert_readable_layout, texts
from matplotlib.patches import Rectangle

from companion.notebook.diagrams_ch09 import moe_routing, window_reach


@pytest.mark.parametrize("T, w, L", [(12, 3, 3), (10, 4, 2), (8, 2, 1)])
def test_mask_cells_and_reach_follow_the_formulas(T, w, L):
    fig = window_reach(T, w, L)
    filled = [p for p in fig.findobj(Rectangle) if p.get_facecolor()[:3] != (1.0, 1.0, 1.0)]
    mask_cells = [p for p in filled if p.get_x() < 3.0]  # left panel
    # the mask: every row reads min(i + 1, w) keys
    assert len(mask_cells) == sum(min(i + 1, w) for i in range(T))
    reach = min(T, L * (w - 1) + 1)
    shown = [t.get_text() for t in texts(fig)]
    assert f"reach of the last position: L(w - 1) + 1 = {reach} tokens" in shown
    # the input row of the right panel marks exactly the reach
    inputs = [p for p in filled if p.get_x() > 3.0 and abs(p.get_y() - 0.35) < 1e-9]
    assert len(inputs) == reach


def test_window_reach_isassert_readable_layout():
    assert_readable_layout(window_reach())


def test_window_reach_rejects_bad_sizes():
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        window_reach(window=0)
    with pytest.raises(ValueError, match="T must be <= 24"):
        window_reach(T=40)


def test_moe_routing_highlights_the_chosen_experts_with_their_gates():
    fig = moe_routing(5, 2, chosen=(0, 3), gates=(0.6, 0.4))
    shown = [t.get_text() for t in texts(fig)]
    assert "expert 0: $g_0 = 0.6$" in shown and "expert 3: $g_3 = 0.4$" in shown
    assert {"expert 1", "expert 2", "expert 4"} <= set(shown)
    assert_readable_layout(moe_routing())


def test_moe_routing_rejects_inconsistent_choices():
    with pytest.raises(ValueError, match="chosen must hold top_k=2"):
        moe_routing(4, 2, chosen=(1, 1), gates=(0.5, 0.5))
    with pytest.raises(ValueError, match="gates must hold"):
        moe_routing(4, 2, chosen=(0, 1), gates=(0.5, 0.6))
    with pytest.raises(ValueError, match="n_experts must be an int in"):
        moe_routing(12, 2)
