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


def test_frames_are_drawn_at_twice_their_shown_size_and_readable_on_a_phone():
    """Each frame's PNG has FRAME_RATIO pixels per CSS px (sharp on a scale-2 screen), the <img> is given
    the CSS width, and every frame of every player shows its smallest label >= 9 px in a phone's 352 px
    column (the frames are drawn about 400 px wide, two panels stacked)."""
    import base64
    import struct

    from companion.notebook.phone_figures import PHONE_COLUMN_PX, PHONE_MIN_LABEL_PX
    from companion.notebook.viz import read_figure_record
    from companion.notebook.widgets import FRAME_RATIO, positional_encoding_frames, rope_frequency_frames

    players = [softmax_temperature_frames([2.0, 1.0, 0.1], ["a", "b", "c"], scales=(0.5, 4.0), scale=0.5),
               sampling_frames([3.0, 2.0, 1.0, 0.0] * 3, list("abcdefghijkl"), temperatures=(0.5, 1.5),
                               top_ps=(0.5, 1.0), temperature=0.5, top_p=0.5),
               positional_encoding_frames(d=64, max_len=128, positions=(0, 100), pairs=(0, 31), position=0, pair=0),
               rope_frequency_frames(head_dim=16, trained_len=64, max_len=512, schemes=("none", "yarn"),
                                     factors=(2.0, 8.0))]
    for player in players:
        for url in _data(player, "frames").values():
            png = base64.b64decode(url.split(",", 1)[1])
            text, ratio = read_figure_record(png)
            width = struct.unpack(">I", png[16:20])[0] / ratio
            assert ratio == FRAME_RATIO and text * min(PHONE_COLUMN_PX, width) / width >= PHONE_MIN_LABEL_PX, player
        first = _data(player, "frames")[player.key(*player.start)]
        png = base64.b64decode(first.split(",", 1)[1])
        assert f'width="{round(struct.unpack(">I", png[16:20])[0] / FRAME_RATIO)}"' in player._repr_html_()


def test_glue_player_records_the_player_as_a_figure(monkeypatch):
    """glue_player shows the player with the scrapbook name a {glue:figure} directive numbers and captions."""
    import IPython.display

    from companion.notebook.widgets import glue_player

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda data, **kw: shown.append((data, kw)))
    player = softmax_temperature_frames([2.0, 1.0, 0.1], ["a", "b", "c"], scales=(0.5, 4.0), scale=0.5)
    glue_player("fig-softmax-player", player)
    ((data, kw),) = shown
    assert data["text/html"] == player._repr_html_() and kw["metadata"]["scrapbook"]["name"] == "fig-softmax-player"
    with pytest.raises(ValueError, match="name must be a figure label"):
        glue_player("softmax", player)
    with pytest.raises(ValueError, match="player must be a FramePlayer"):
        glue_player("fig-x", "not a player")
