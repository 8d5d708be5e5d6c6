"""companion.notebook.widgets' pre-drawn frames: what the static page shows in place of a live widget."""

from __future__ import annotations

import html
import json
import re

import matplotlib
import pytest

matplotlib.use("Agg")

from companion.notebook.widgets import frame_player, sampling_frames, softmax_temperature_frames  # noqa: E402


def _data(player, name):
    page = player._repr_html_()
    return json.loads(html.unescape(re.search(rf'data-{name}="([^"]*)"', page).group(1)))


def test_one_distinct_frame_per_slider_position():
    player = softmax_temperature_frames([2.0, 1.0, 0.1], ["a", "b", "c"], scales=(0.5, 1.0, 4.0))
    frames = _data(player, "frames")
    assert sorted(frames) == ["0", "1", "2"] and len(set(frames.values())) == 3  # each position draws its own plot
    assert player.start == [1] and f'src="{frames["1"]}"' in player._repr_html_()  # shows scale 1.0 first
    assert _data(player, "labels") == [["0.50", "1.00", "4.00"]]


def test_two_sliders_make_a_grid_keyed_by_both_positions():
    logits, labels = [3.0, 2.0, 1.0, 0.0], ["w", "x", "y", "z"]
    player = sampling_frames(logits, labels, temperatures=(0.5, 1.0), top_ps=(0.5, 1.0))
    frames = _data(player, "frames")
    assert sorted(frames) == ["0,0", "0,1", "1,0", "1,1"] and len(set(frames.values())) == 4
    page = player._repr_html_()
    assert page.count('type="range"') == 2 and "oninput=" in page  # switched in the browser, no kernel


def test_bad_grids_are_refused_naming_the_argument():
    draw = lambda a: None  # noqa: E731  (never called: the checks come first)
    with pytest.raises(ValueError, match="grid must give every slider at least 2 positions"):
        frame_player(draw, {"a": [1.0]}, {"a": 1.0})
    with pytest.raises(ValueError, match="start must be a position"):
        frame_player(draw, {"a": [1.0, 2.0]}, {"a": 1.5})
    with pytest.raises(ValueError, match="start must name"):
        frame_player(draw, {"a": [1.0, 2.0]}, {"b": 1.0})


def test_the_other_explorers_have_frames_too():
    from companion.notebook.widgets import positional_encoding_frames, rope_frequency_frames

    pe = positional_encoding_frames(d=16, max_len=32, positions=(0, 5), pairs=(0, 7), position=0, pair=0)
    assert sorted(_data(pe, "frames")) == ["0,0", "0,1", "1,0", "1,1"]
    rope = rope_frequency_frames(head_dim=8, trained_len=16, max_len=64, schemes=("none", "pi"), factors=(2.0, 4.0))
    assert _data(rope, "labels") == [["none", "pi"], ["2", "4"]]
    assert len(set(_data(rope, "frames").values())) == 4
