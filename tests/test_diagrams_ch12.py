"""Chapter 12's block-table diagram: drawn from the tables it is given, labels readable and apart."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from companion.notebook.diagrams_ch12 import SEQ_COLOURS, SHARED, block_tables
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts

TABLES = {0: ([0, 1, 5], 11), 1: ([0, 2], 7), 2: ([3, 4, 6, 7], 14)}


def _faces(fig, colour, hatch=None):
    want = matplotlib.colors.to_rgba(colour)
    edge = matplotlib.colors.to_rgba("#444444")  # drawn cells (not the figure's background)
    return sum(1 for p in fig.findobj(Rectangle)
               if p.get_facecolor() == want and p.get_hatch() == hatch and p.get_edgecolor() == edge)


def test_pool_cells_are_coloured_by_owner_and_shared_pages_hatched():
    fig = block_tables(TABLES, n_pages=16, page_size=4)
    assert isinstance(fig, Figure)
    assert _faces(fig, SHARED, "//") == 2  # pool page 0 (held by seq 0 and seq 1) and its swatch
    assert _faces(fig, "white") == 16 - 8 + 1  # the free pool pages and the legend swatch
    assert _faces(fig, SEQ_COLOURS[2]) == 4  # seq 2 holds pool pages 3, 4, 6, 7 alone
    shown = [t.get_text() for t in _texts(fig)]
    assert {"seq 0, T=11", "seq 1, T=7", "seq 2, T=14", "page pool"} <= set(shown)


def test_fill_of_each_logical_page_is_tokens_in_that_page_over_p():
    fig = block_tables({7: ([2, 0], 5)}, n_pages=4, page_size=4)
    fills = sorted(p.get_width() for p in fig.findobj(Rectangle)
                   if p.get_facecolor() == matplotlib.colors.to_rgba(SEQ_COLOURS[0]) and p.get_linewidth() == 0)
    cell = 0.32
    assert fills == pytest.approx([cell * 1 / 4, cell])  # page 1 holds token 4 only: offset 0 of 4


def test_inconsistent_tables_are_refused():
    with pytest.raises(ValueError, match="ceil"):
        block_tables({0: ([0], 5)}, 8, 4)
    with pytest.raises(ValueError, match="outside the pool"):
        block_tables({0: ([9], 3)}, 8, 4)
    with pytest.raises(ValueError, match="n_pages"):
        block_tables({0: ([0], 3)}, 40, 4)
    with pytest.raises(ValueError, match="page_size"):
        block_tables({0: ([0], 3)}, 8, 0)


@pytest.mark.parametrize("n_pages", [8, 16, 32])
def test_labels_do_not_overlap_fit_the_column_and_are_readable(n_pages):
    assert_readable_layout(block_tables(TABLES, n_pages=n_pages, page_size=4))


# --- pages -> block tables -> seats, and the batching schedule (companion.notebook.diagrams_ch12) ---
from companion.notebook.diagrams_ch12 import (SCHEDULE_COLOURS, batching_schedule, continuous_grid,
                                              pages_to_seats, static_grid)
from companion.notebook.viz import MIN_LABEL_PX, text_px


def test_pages_to_seats_labels_every_seat_run_with_its_page():
    fig = pages_to_seats(TABLES, {0: 0, 1: 2, 2: 1}, n_pages=8, page_size=4)
    shown = [t.get_text() for t in _texts(fig)]
    runs = sum(len(table) for table, _ in TABLES.values())
    assert sum(s.startswith("page ") and s[5:].isdigit() for s in shown) == runs
    assert "seat 2: seq 1" in shown and "seat 1: seq 2" in shown
    assert text_px(fig) >= MIN_LABEL_PX
    assert_readable_layout(fig, min_fontsize=9)
    with pytest.raises(ValueError, match="seats"):
        pages_to_seats(TABLES, {0: 0, 1: 1}, n_pages=8, page_size=4)


def test_static_and_continuous_grids():
    grid = static_grid([2, 3, 1], 2)
    assert grid == ["pdx.", "pdd.", "wwwp"]
    decisions = [[(0, 8, "prefill"), (1, 8, "prefill")], [(1, 1, "decode"), (2, 8, "prefill")]]
    assert continuous_grid(decisions, 3) == ["p.", "pd", "wp"]
    fig = batching_schedule(grid, ["pd..", "pdd.", "wpww"[:2] + ".."])
    coloured = [p for p in fig.findobj(Rectangle) if p.get_facecolor() == matplotlib.colors.to_rgba(
        SCHEDULE_COLOURS["x"])]
    assert len(coloured) == 1 + 1          # the static batch's idle row-step, and its swatch
    assert text_px(fig) >= MIN_LABEL_PX
    assert_readable_layout(fig, min_fontsize=9)
