"""Chapter 11's diagrams: the tiling step and the memory-traffic bars, labels readable and apart."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from companion.kernels.flash import dense_traffic_bytes, tiled_traffic_bytes
from companion.notebook.diagrams import flash_tiling, memory_traffic
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
