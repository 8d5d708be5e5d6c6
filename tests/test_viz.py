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
