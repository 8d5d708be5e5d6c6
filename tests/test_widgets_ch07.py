"""Chapter 7's RoPE frequency explorer: its controls, and the curves it draws are the companion's."""

import math

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from companion.notebook import widgets
from companion.positions import ntk_base, rope_inverse_frequencies, yarn_temperature


def drawn_by(monkeypatch, **kwargs):
    figures = []
    monkeypatch.setattr(widgets.plt, "show", lambda: figures.append(widgets.plt.gcf()))
    box = widgets.rope_frequency_explorer(**kwargs)
    return box, figures


def test_explorer_has_base_scheme_and_factor_controls(monkeypatch):
    box, figures = drawn_by(monkeypatch)
    assert [c.description for c in box.children[:3]] == ["log10 base", "scheme", "factor s"]
    assert list(box.children[1].options) == ["none", "pi", "ntk", "yarn", "llama3"]
    assert len(figures) == 1


def test_explorer_draws_the_ntk_frequencies_and_the_plain_ones(monkeypatch):
    _, figures = drawn_by(monkeypatch, head_dim=16, trained_len=64, scheme="ntk", factor=8.0)
    plain_line, scaled_line = figures[-1].axes[0].get_lines()[:2]
    expected = [ntk_base(10000.0, 8.0, 16) ** (-2 * i / 16) for i in range(8)]
    assert list(scaled_line.get_ydata()) == pytest.approx(expected, rel=1e-5)
    assert list(plain_line.get_ydata()) == pytest.approx([1e4 ** (-2 * i / 16) for i in range(8)], rel=1e-5)


def test_explorer_score_curve_carries_the_yarn_temperature(monkeypatch):
    _, figures = drawn_by(monkeypatch, head_dim=16, trained_len=64, max_len=256, scheme="yarn", factor=4.0)
    curve = figures[-1].axes[1].get_lines()[0].get_ydata()
    theta, _ = rope_inverse_frequencies(16, 10000.0, "yarn", 4.0, 64)
    assert len(curve) == 256
    assert curve[0] == pytest.approx(yarn_temperature(4.0) ** 2)            # offset 0: cos = 1
    n = 100
    assert curve[n] == pytest.approx(yarn_temperature(4.0) ** 2 * torch.cos(n * theta.double()).mean().item(),
                                     rel=1e-5)


def test_explorer_title_counts_the_pairs_that_turn_within_the_trained_length(monkeypatch):
    _, figures = drawn_by(monkeypatch, head_dim=16, trained_len=64)
    turning = sum(64 * 1e4 ** (-2 * i / 16) >= 2 * math.pi for i in range(8))
    assert f"{turning} of 8 pairs turn within 64" in figures[-1].axes[0].get_title()


@pytest.mark.parametrize("kwargs, message", [
    (dict(head_dim=7), "head_dim"),
    (dict(trained_len=600, max_len=512), "trained_len"),
    (dict(scheme="rope"), "scheme"),
    (dict(factor=0.5), "factor"),
])
def test_explorer_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        widgets.rope_frequency_explorer(**kwargs)
