"""Chapter 8's diagrams: the head map of MHA / GQA / MQA and MLA's data flow, labels readable and apart."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from companion.notebook.diagrams_ch08 import kv_head_sharing, mla_flow
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts


def _readable_and_apart(fig):
    assert_readable_layout(fig, max_width_in=9.1)


def test_head_sharing_draws_one_line_per_query_head_to_its_group():
    fig = kv_head_sharing(8, (8, 2, 1))
    assert isinstance(fig, Figure)
    shown = [t.get_text() for t in _texts(fig)]
    assert [s for s in shown if s.endswith("$g = 8$") or s.endswith("$g = 2$") or s.endswith("$g = 1$")] == [
        "MHA: $h = 8$, $g = 8$", "GQA: $h = 8$, $g = 2$", "MQA: $h = 8$, $g = 1$"]
    # three panels x 8 query heads, each joined to exactly one key/value head
    lines = [p for p in fig.axes[0].patches if isinstance(p, FancyArrowPatch)]
    assert len(lines) == 3 * 8
    # numbered from 0 like the head map (8.1): "K, V 0", "K, V 1" in GQA, "K, V 0" in MQA
    assert shown.count("K, V 0") == 2 and shown.count("K, V 1") == 1
    assert "0" in shown and "8" not in shown
    assert "cache: $2 \\cdot 2\\, d_h$ per token" in shown


def test_head_sharing_lines_end_at_the_head_map():
    """The line from query head r (top row) ends at the centre of key/value box pi(r) = r // (h / g)."""
    fig = kv_head_sharing(6, (3,))
    lines = [p for p in fig.axes[0].patches if isinstance(p, FancyArrowPatch)]
    low = {t.get_text(): t.get_position()[0] for t in _texts(fig) if t.get_position()[1] < 1.5}
    high = {t.get_text(): t.get_position()[0] for t in _texts(fig) if 1.5 < t.get_position()[1] < 2.5}
    assert sorted(high) == ["0", "1", "2", "3", "4", "5"] and {"0", "1", "2"} <= set(low)
    for r, line in enumerate(lines):
        (start_x, _), (end_x, _) = line._posA_posB
        assert abs(start_x - high[str(r)]) < 1e-9
        assert abs(end_x - low[str(r // 2)]) < 1e-9, f"query head {r} is not joined to pi(r)"


@pytest.mark.parametrize("make", [lambda: kv_head_sharing(), lambda: kv_head_sharing(12, (12, 4, 1)), mla_flow])
def test_labels_do_not_overlap_fit_the_column_and_are_readable(make):
    _readable_and_apart(make())


def test_mla_flow_names_the_cache_and_both_paths():
    shown = " ".join(t.get_text() for t in _texts(mla_flow()))
    for needle in ("cache: $d_c + d_R$ per token", "$c_j$ latent $(d_c)$", "$k^R_j$ RoPE key $(d_R)$",
                   "absorbed", "expanded", "\\sqrt{d_h + d_R}"):
        assert needle in shown, needle


def test_head_sharing_rejects_bad_layouts():
    with pytest.raises(ValueError, match="kv_heads must be 1 to 3 ints that divide n_heads=8"):
        kv_head_sharing(8, (3,))
    with pytest.raises(ValueError, match="n_heads must be an int in \\[2, 12\\]"):
        kv_head_sharing(16, (4,))
