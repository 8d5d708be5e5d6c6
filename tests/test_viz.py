import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from companion.notebook.viz import attention_heatmap
from companion.notebook.widgets import softmax_temperature_explorer


def test_heatmap_draws_weights_and_labels():
    w = torch.softmax(torch.randn(3, 4), -1)
    ax = attention_heatmap(w, ["a", "b", "c"], ["w", "x", "y", "z"], title="t")
    image = ax.get_images()[0].get_array()
    torch.testing.assert_close(torch.as_tensor(image), w.double())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    with pytest.raises(ValueError, match="query_labels"):
        attention_heatmap(w, ["a"])
    with pytest.raises(ValueError, match=r"\(T, S\)"):
        attention_heatmap(torch.ones(2, 2, 2))


def test_temperature_explorer_validates_and_builds():
    widget = softmax_temperature_explorer([0.0, 1.0, 2.0])
    assert widget.children[0].description == "scale"
    with pytest.raises(ValueError, match="scores"):
        softmax_temperature_explorer([1.0])
    with pytest.raises(ValueError, match="scale_range"):
        softmax_temperature_explorer([0.0, 1.0], scale=10.0)
    with pytest.raises(ValueError, match="labels"):
        softmax_temperature_explorer([0.0, 1.0], labels=["only one"])


def test_positional_encoding_explorer():
    from companion.notebook.widgets import positional_encoding_explorer

    widget = positional_encoding_explorer(16, 32)
    assert [c.description for c in widget.children[:2]] == ["position", "pair i"]
    assert widget.children[1].max == 7 and widget.children[0].max == 31
    with pytest.raises(ValueError, match="even"):
        positional_encoding_explorer(7)
    with pytest.raises(ValueError, match="max_len"):
        positional_encoding_explorer(8, 1)


# --- the book's figure style (issue 25, item 3) ---------------------------------------------------

import io  # noqa: E402
import struct  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402

from companion.notebook import viz
from companion.notebook.style import use_book_style  # noqa: E402


@pytest.fixture
def book_style():
    saved = dict(plt.rcParams)
    use_book_style()
    yield
    plt.close("all")
    plt.rcParams.update(saved)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_figures_are_png_at_twice_their_display_size(book_style):
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [0, 1, 4], label="y")
    data, meta = viz.book_png(fig)
    width, height = _png_size(data)
    assert meta["width"] == round(width / viz.PIXEL_RATIO) and "height" not in meta  # the page keeps the aspect
    assert viz.DPI * 6.0 * 0.8 < meta["width"] <= viz.COLUMN_PX  # designed size, fits the column at 1280 px
    assert plt.rcParams["savefig.dpi"] == viz.PIXEL_RATIO * plt.rcParams["figure.dpi"] == 200
    assert str(fig) == "Figure(480x288)"  # the size nbval sees in the stored outputs is unchanged


def test_default_text_is_at_least_11_px_at_1280(book_style):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set_xlabel("x")
    ax.set_title("t")
    ax.legend()
    assert viz.text_px(fig) >= viz.MIN_LABEL_PX


def test_planted_small_labels_are_lifted_to_11_px(book_style):
    """A chapter's ``fontsize=7`` legend and a figure wider than the column (shown scaled down): both
    would render under 11 px; after book_png no text does."""
    fig, ax = plt.subplots(figsize=(12, 3))  # 960 px wide: shown at 717/960 of its size
    ax.plot([0, 1], [0, 1], label="small")
    ax.legend(fontsize=7)
    ax.set_xlabel("x", fontsize=8)
    assert viz.text_px(fig) < viz.MIN_LABEL_PX  # the planted failure
    viz.book_png(fig)
    assert viz.text_px(fig) >= viz.MIN_LABEL_PX - 1e-6


def test_planted_legend_on_the_data_moves_below_the_axes(book_style):
    fig, ax = plt.subplots()
    x = torch.linspace(0, 1, 50)
    for k in range(3):
        ax.plot(x, x * 0 + 0.9 - 0.01 * k, label=f"series {k}")  # lines along the top...
    ax.plot(x, x * 0 + 0.05, label="bottom")                  # ...and along the bottom
    ax.legend(loc="upper left")                               # a legend on the lines
    assert viz.legend_off_data(ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend()
    assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0 + 1
    assert [t.get_text() for t in legend.get_texts()] == ["series 0", "series 1", "series 2", "bottom"]
    assert not viz.legend_off_data(ax)  # off the data now: left where it is


def test_a_legend_clear_of_the_data_stays(book_style):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 0.1], label="low line")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right")
    assert not viz.legend_off_data(ax)


def test_book_png_handles_bare_figures_and_heatmaps(book_style):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    fig.add_subplot().plot([0, 1])
    assert viz.book_png(fig)[1]["width"] > 0
    assert viz.book_png(Figure()) is None  # nothing drawn, nothing shown
    ax = attention_heatmap(torch.softmax(torch.randn(3, 3), -1))
    assert viz.text_px(ax.figure) >= viz.MIN_LABEL_PX


def test_use_book_style_registers_the_png_formatter(book_style):
    IPython = pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    use_book_style()
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    data, metadata = shell.display_formatter.format(fig)
    assert "image/svg+xml" not in data and metadata["image/png"]["width"] == viz.book_png(fig)[1]["width"]


def test_widget_controls_show_their_whole_label_and_bars_fill_the_plot(book_style, monkeypatch):
    """Issue 25, item 7: "temperat..." and bars in the bottom eighth of a 0..1 axis."""
    from companion.notebook import widgets as W

    drawn = []
    monkeypatch.setattr(plt, "show", lambda: drawn.append(plt.gcf()))
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0, -4.0])
    widget = W.sampling_explorer(logits, [f"t{i}" for i in range(8)], temperature=2.0)
    for control in widget.children[:2]:
        assert control.style.description_width == "initial"
    widget.update()  # draws once
    ax = drawn[-1].axes[0]
    tallest = max(p.get_height() for p in ax.patches)
    assert tallest / ax.get_ylim()[1] > 0.8  # the tallest bar reaches near the top
    widget = W.softmax_temperature_explorer([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], scale=0.05)
    widget.update()
    ax = drawn[-1].axes[0]
    assert max(p.get_height() for p in ax.patches) / ax.get_ylim()[1] > 0.8
    assert all(c.style.description_width == "initial" for c in W.rope_frequency_explorer().children[:3])
