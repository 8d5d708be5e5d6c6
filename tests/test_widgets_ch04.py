"""Chapter 4's sampling explorer: two sliders, and the drawn distribution is filter_logits'."""

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from companion.notebook import widgets


def test_sampling_explorer_has_temperature_and_top_p_sliders(monkeypatch):
    drawn = []
    monkeypatch.setattr(widgets.plt, "show", lambda: drawn.append(widgets.plt.gcf()))
    logits = torch.tensor([3.0, 1.0, 0.0, -1.0])
    box = widgets.sampling_explorer(logits, ["a", "b", "c", "d"], temperature=1.0, top_p=0.5)
    names = [child.description for child in box.children[:2]]
    assert names == ["temperature", "top-p"]
    # p(a) = 0.84 >= 0.5: the nucleus is one token, drawn with probability 1
    heights = [bar.get_height() for bar in drawn[-1].axes[0].patches]
    assert heights == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert "1 tokens can be drawn" in drawn[-1].axes[0].get_title()


@pytest.mark.parametrize("kwargs, message", [
    (dict(logits=[1.0], labels=["a"]), "at least 2"),
    (dict(logits=[1.0, 2.0], labels=["a"]), "one entry per logit"),
    (dict(logits=[1.0, 2.0], labels=["a", "b"], top_p=0.0), "top_p"),
])
def test_sampling_explorer_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        widgets.sampling_explorer(**kwargs)
