"""The core path (tools/core_path.py): every chapter marks its optional sections the same way, its core
reads in about an hour by the stated estimate, and a reader who skips the optional sections can still
run every core cell. The page shows both (tools/chapterpage.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import chapterpage  # noqa: E402
import core_path  # noqa: E402

CHAPTERS = sorted((ROOT / "book").glob("ch[0-9][0-9]_*.ipynb"))
CORE_MINUTES = 65  # "about an hour" (issue 45, item 2), by core_path's stated pace


def md(text: str, *tags: str) -> dict:
    return {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": text}


def code(text: str, *tags: str) -> dict:
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text, "outputs": []}


def chapter() -> list[dict]:
    return [
        md("# Title\n\nSome words here."),
        code("import math\nx = 1"),
        md("## Optional: a tangent", "optional"),
        code("y = x + 1"),
        md("### still optional"),
        code("z = y * 2"),
        md("## Back in the core"),
        code("w = x + 3"),
        md("## Summary\n\nDone.\n\n## Exercises\n\n1. Many words in the exercises " + "word " * 600),
    ]


def test_optional_sections_run_to_the_next_heading_of_their_level():
    flags = core_path.optional_flags(chapter())
    assert flags == [False, False, True, True, True, True, False, False, False]
    nested = [md("## Core"), md("### Optional: inner", "optional"), code("a = 1"), md("### next"), code("b = 2")]
    assert core_path.optional_flags(nested) == [False, True, True, False, False]


def test_a_core_cell_that_reads_an_optional_name_is_reported():
    assert core_path.core_problems(chapter()) == []
    planted = chapter() + [code("print(z)")]  # z is defined only in the optional section
    assert core_path.core_problems(planted) == ["cell 9: the core reads z, defined only in an optional section"]
    redefined = chapter() + [code("z = 0\nprint(z)")]  # the core defines it itself: fine
    assert core_path.core_problems(redefined) == []


def test_half_marked_sections_are_reported():
    assert core_path.marker_problems(chapter()) == []
    untagged = [md("## Optional: no tag")]
    assert "lacks the tag" in core_path.marker_problems(untagged)[0]
    untitled = [md("## A title", "optional")]
    assert "does not begin with" in core_path.marker_problems(untitled)[0]


def test_the_reading_time_follows_the_stated_pace():
    cells = chapter()
    core_words = sum(len(core_path.WORD.findall(c["source"])) for i, c in enumerate(cells) if i in (0, 6))
    core_words += len(core_path.WORD.findall("## Summary\n\nDone.\n\n"))
    core_lines = 2 + 1  # the shown code lines of cells 1 and 7
    expected = core_words / core_path.WORDS_PER_MINUTE + core_lines * core_path.SECONDS_PER_CODE_LINE / 60
    assert core_path.reading_minutes(cells) == pytest.approx(expected)
    assert core_path.reading_minutes(cells, core_only=False) > expected + 5  # the 600 exercise words
    hidden = [code("a = 1\nb = 2", "remove-cell")]
    assert core_path.reading_minutes(hidden) == 0


def test_the_page_line_and_the_marked_section():
    text = core_path.core_text(chapter())
    assert text.startswith("Core path: about 5 min of reading, skipping the 1 section marked Optional")
    assert core_path.core_text([md("# T"), code("x = 1")]) is None
    nodes = pytest.importorskip("docutils.nodes")
    from docutils.utils import new_document

    doc = new_document("<chapter>")
    top = nodes.section(ids=["t"])
    top += nodes.title("T", "T")
    opt = nodes.section(ids=["o"])
    opt += nodes.title("Optional: a tangent", "Optional: a tangent")
    opt += nodes.paragraph("body", "body")
    core = nodes.section(ids=["c"])
    core += nodes.title("Core", "Core")
    top += opt
    top += core
    doc += top
    assert chapterpage.mark_optional(doc) == 1
    assert chapterpage.OPTIONAL_CLASS in opt["classes"] and chapterpage.OPTIONAL_CLASS not in core["classes"]
    assert opt[1].astext() == chapterpage.OPTIONAL_NOTE
    assert chapterpage.mark_optional(doc) == 0  # a second read marks nothing twice


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_chapter_marks_a_core_that_reads_in_about_an_hour(path):
    cells = core_path.load(path)
    assert core_path.optional_titles(cells), f"{path.name}: no section marked Optional"
    assert core_path.marker_problems(cells) == []
    assert core_path.core_problems(cells) == []
    minutes = core_path.reading_minutes(cells)
    assert minutes <= CORE_MINUTES, f"{path.name}: the core reads in about {minutes:.0f} min (> {CORE_MINUTES})"
