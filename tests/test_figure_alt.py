"""tools/sitefix.py: a glued figure shown as a <picture> (a phone rendition beside the desktop PNG) keeps the
alt text its chapter wrote in ``{glue:figure}``'s ``:alt:``, which myst-nb applies only to PNG outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import sitefix  # noqa: E402

PICTURE = ('<picture class="companion-figure"><source media="(max-width: 720px)" srcset="data:x">'
           '<img src="data:y" width="3" height="2" alt="generated from the labels" style="a"></picture>')


def notebook(tmp_path: Path, markdown: str) -> Path:
    path = tmp_path / "ch.ipynb"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": markdown.splitlines(keepends=True)},
             {"cell_type": "code", "metadata": {}, "source": [':alt: not markdown'], "outputs": [],
              "execution_count": None}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_authored_alt_of_each_glued_figure_is_read(tmp_path):
    path = notebook(tmp_path, "Text.\n\n```{glue:figure} fig-a\n:name: fig-a\n:alt: Two bars, the left one taller.\n\n"
                              "Caption.\n```\n\n```{glue:figure} fig-b\n:name: fig-b\n\nNo alt.\n```\n")
    assert sitefix.authored_alts(path) == {"fig-a": "Two bars, the left one taller."}


def test_the_picture_gets_the_authored_alt_escaped():
    out = sitefix.with_alt(PICTURE, 'Keys "k" & values')
    assert 'alt="Keys &quot;k&quot; &amp; values"' in out and "generated from the labels" not in out
    assert out.replace('alt="Keys &quot;k&quot; &amp; values"', 'alt="generated from the labels"') == PICTURE


def test_planted_other_html_is_left_alone():
    """Only the companion's picture is rewritten: an ordinary <img> in other HTML keeps its alt."""
    other = '<div><img src="z" alt="a table icon"></div>'
    assert sitefix.with_alt(other, "anything") == other


def test_every_chapter_figure_with_a_picture_has_an_authored_alt_to_give():
    """The chapters write an :alt: for their glued figures: the names read here are glued names."""
    for path in sorted((ROOT / "book").glob("ch*.ipynb")):
        for name, alt in sitefix.authored_alts(path).items():
            assert name.startswith("fig-") and len(alt) > 20, (path.name, name)
