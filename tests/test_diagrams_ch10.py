"""Chapter 10's diagram: prefill beside one decode step, labels readable and apart."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure

from companion.notebook.diagrams_ch10 import prefill_decode
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts


def test_prefill_writes_every_prompt_row_and_decode_appends_one():
    fig = prefill_decode(("a", "b", "c"), new="d")
    assert isinstance(fig, Figure)
    shown = [t.get_text() for t in _texts(fig)]
    # prefill caches rows 0..2; the decode panel shows those 3 rows again plus the appended row 3
    assert [s for s in shown if s.startswith("k,v")] == ["k,v\n0", "k,v\n1", "k,v\n2",
                                                          "k,v\n0", "k,v\n1", "k,v\n2", "k,v\n3"]
    assert "decode: one row at position 3" in shown and "3 x 3" in shown
    assert "q reads all S keys (1 x 4)" in shown and "d" in shown


@pytest.mark.parametrize("prompt", [("the", "cat"), ("the", "cat", "sat", "on"), tuple("abcdef")])
def test_labels_do_not_overlap_fit_the_column_and_are_readable(prompt):
    fig = prefill_decode(prompt)
    assert_readable_layout(fig)


@pytest.mark.parametrize("prompt, new, message", [(("a",), "b", "prompt must be 2 to 6"),
                                                  (tuple("abcdefg"), "b", "prompt must be 2 to 6"),
                                                  (("a", "b"), "", "new must be")])
def test_bad_arguments_raise(prompt, new, message):
    with pytest.raises(ValueError, match=message):
        prefill_decode(prompt, new)


# --- the (T, S) mask with absolute positions, and the cache size against context --------------------

from matplotlib.patches import Rectangle  # noqa: E402

from companion.notebook.diagrams_ch10 import cache_growth, chunk_masks  # noqa: E402


def _filled(fig):
    """Lower-left corners of the filled (readable) mask cells, per panel (split at x = 4.5 inches)."""
    cells = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_fill()
             and p.get_facecolor()[:3] != (1.0, 1.0, 1.0)]
    return [sum(1 for p in cells if (p.get_x() < 4.5) == left) for left in (True, False)]


@pytest.mark.parametrize("n, T, window", [(5, 3, 4), (4, 1, 2), (2, 4, 6)])
def test_mask_cells_follow_equation_10_3(n, T, window):
    fig = chunk_masks(n, T, window)
    causal = sum(n + i + 1 for i in range(T))
    windowed = sum(min(n + i + 1, window) for i in range(T))
    assert _filled(fig) == [causal, windowed]
    shown = [t.get_text() for t in _texts(fig)]
    assert [s for s in shown if s.startswith("q ")] == [f"q {n + i}" for i in range(T)] * 2
    assert_readable_layout(fig)


def test_mask_bad_arguments_raise():
    with pytest.raises(ValueError, match="window must be"):
        chunk_masks(3, 2, window=6)
    with pytest.raises(ValueError, match="n must be"):
        chunk_masks(0, 2, window=1)


def test_cache_growth_plots_bytes_times_context():
    fig = cache_growth({"MHA": 2**19, "MQA": 2**14}, contexts=(1024, 4096), budget=("80 GB", 80e9))
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["MHA"].get_ydata()) == [0.5, 2.0]
    assert list(lines["MQA"].get_ydata()) == [2**14 * 1024 / 2**30, 2**14 * 4096 / 2**30]
    assert lines["80 GB"].get_ydata()[0] == pytest.approx(80e9 / 2**30)
    with pytest.raises(ValueError, match="curves must map"):
        cache_growth({"MHA": 0})
