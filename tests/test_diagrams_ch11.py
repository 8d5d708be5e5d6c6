"""Chapter 11's diagrams: the tiling step and the memory-traffic bars, labels readable and apart."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from companion.kernels.flash import dense_traffic_bytes, tiled_traffic_bytes
from companion.notebook.diagrams_ch11 import flash_tiling, memory_traffic
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts


def _faces(fig, colour):
    want = matplotlib.colors.to_rgba(colour)
    return sum(1 for p in fig.findobj(Rectangle) if p.get_facecolor() == want)


def test_tiling_lights_one_tile_and_hatches_the_causal_upper_triangle():
    fig = flash_tiling(n_blocks=4, step=(2, 1))
    assert isinstance(fig, Figure)
    assert _faces(fig, "#fd8d3c") == 2  # the tile computed now, and its legend swatch
    assert _faces(fig, "#fdd0a2") == 2  # tile (2, 0), done, and its swatch
    hatched = [p for p in fig.findobj(Rectangle) if p.get_hatch() == "//"]
    assert len(hatched) == 4 * 3 // 2 + 1  # the 6 tiles above the diagonal, plus the swatch
    shown = [t.get_text() for t in _texts(fig)]
    assert "step (2, 1):" in shown and "skipped (causal)" in shown
    assert not [p for p in flash_tiling(4, (1, 3), causal=False).findobj(Rectangle) if p.get_hatch() == "//"]


def test_tiling_rejects_a_step_outside_the_grid_or_above_the_diagonal():
    with pytest.raises(ValueError, match="step"):
        flash_tiling(4, (1, 2))
    with pytest.raises(ValueError, match="step"):
        flash_tiling(4, (4, 0))
    with pytest.raises(ValueError, match="n_blocks"):
        flash_tiling(1)


def test_traffic_bars_are_labelled_with_the_model_totals():
    fig = memory_traffic(T=2048, d=64, heads=8, bytes_per_value=2, block_q=64)
    shown = [t.get_text() for t in _texts(fig)]
    for total in (dense_traffic_bytes(2048, 2048, 64, 8, 2), tiled_traffic_bytes(2048, 2048, 64, 8, 2, 64),
                  tiled_traffic_bytes(2048, 2048, 64, 8, 2, 64, kv_cached=True)):
        assert f"{total / 1e9:.2f} GB" in shown


@pytest.mark.parametrize("make", [flash_tiling, memory_traffic])
def test_labels_do_not_overlap_fit_the_column_and_are_readable(make):
    assert_readable_layout(make())


# --- the online-softmax row and the recorded GPU speeds (companion.notebook.diagrams_ch11) -----------
import math as _math

from matplotlib.lines import Line2D as _Line2D

from companion.notebook.diagrams_ch11 import flash_speed, online_softmax_row, running_stats
from companion.notebook.viz import MIN_LABEL_PX, text_px

ROW = [-2.0, -0.5, -1.0, 1.5, 0.0, 3.0, 2.0, -1.0]


def test_running_stats_rescale_only_when_the_maximum_rises_and_end_at_logsumexp():
    stats = running_stats(ROW, 2)
    assert [m for m, _, _ in stats] == [-0.5, 1.5, 3.0, 3.0]
    assert [f for _, f, _ in stats] == [1.0, _math.exp(-2.0), _math.exp(-1.5), 1.0]
    m, _, ell = stats[-1]
    assert m + _math.log(ell) == pytest.approx(_math.log(sum(_math.exp(x) for x in ROW)))
    with pytest.raises(ValueError, match="block"):
        running_stats(ROW, 0)
    with pytest.raises(ValueError, match="finite"):
        running_stats([0.0, float("-inf")], 1)


def test_online_softmax_row_draws_the_scores_the_maximum_and_the_factors():
    fig = online_softmax_row(ROW, 2)
    top, bottom = fig.axes
    dots = [ln for ln in top.get_lines() if ln.get_marker() == "o"]
    assert list(dots[0].get_ydata()) == ROW
    heights = sorted(round(p.get_height(), 6) for p in bottom.containers[0])
    assert heights == sorted(round(f, 6) for _, f, _ in running_stats(ROW, 2))
    assert text_px(fig) >= MIN_LABEL_PX


def test_flash_speed_plots_every_rate_of_the_table():
    table = {(64, False, 1024): (3.0, 2.0, 1.5, 1.0), (64, False, 4096): (4.0, 3.0, 2.5, 2.0),
             (128, True, 1024): (1.0, 2.0, 0.5, 0.8), (128, True, 4096): (2.0, 2.5, 1.5, 1.9)}
    fig = flash_speed(table, "a GPU")
    drawn = sorted(y for ax in fig.axes for ln in ax.get_lines() if len(ln.get_xdata()) == 2
                   for y in ln.get_ydata())
    assert drawn == sorted(x for row in table.values() for x in row)
    assert text_px(fig) >= MIN_LABEL_PX
    assert any(isinstance(h, _Line2D) for h in fig.axes[1].get_legend().legend_handles)
    with pytest.raises(ValueError, match="positive"):
        flash_speed({(64, False, 1024): (1.0, 0.0, 1.0, 1.0)}, "x")
