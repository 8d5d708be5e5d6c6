"""tools/chapterpage.py: each chapter's run-time line, the book's run time and the difficulty legend come from
what the repository holds (book/chapter_times.json, the Exercises sections), not typed by hand (issue 39)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import chapterpage  # noqa: E402

nodes = pytest.importorskip("docutils.nodes")
from docutils.utils import new_document  # noqa: E402

RECORD = {"date": "2026-12-01", "cpu": "AMD EPYC", "cores": 2,
          "seconds": {"ch01_attention.ipynb": 16.5, "ch04_gpt.ipynb": 86.1, "ch09_x.ipynb": 131.0}}


def test_times_are_rounded_as_the_text_says_them():
    assert chapterpage.about_seconds(16.5) == "about 15 s"
    assert chapterpage.about_seconds(86.8) == "about 85 s"
    assert chapterpage.about_seconds(1.2) == "about 5 s"
    assert chapterpage.about_seconds(131) == "about 2 min"


def test_the_line_comes_from_the_measured_time():
    assert chapterpage.runtime_text("book/ch04_gpt", RECORD) == "Runs in about 85 s on a CPU (quick profile)."
    assert chapterpage.runtime_text("book/ch02_positions", RECORD) == "Runs in under 2 min on a CPU (quick profile)."
    assert chapterpage.runtime_text("book/intro", RECORD) is None


def test_a_gpu_run_adds_its_time_with_the_device_named():
    """benchmarks/chapters_gpu.py --times writes the record; side by side (jobs > 1) is an upper bound."""
    side_by_side = {"device": "NVIDIA H200", "jobs": 7, "seconds": {"ch04_gpt.ipynb": 71.2}}
    assert chapterpage.runtime_text("book/ch04_gpt", RECORD, side_by_side) == (
        "Runs in about 85 s on a CPU (quick profile); in under 2 min on an NVIDIA H200 (gpu profile).")
    alone = {"device": "Tesla T4", "jobs": 1, "seconds": {"ch04_gpt.ipynb": 44.0}}
    assert chapterpage.runtime_text("book/ch04_gpt", RECORD, alone) == (
        "Runs in about 85 s on a CPU (quick profile); about 45 s on a Tesla T4 (gpu profile).")
    # a chapter the GPU run has no time for (it failed there), and a CPU dry run's record: no GPU half
    assert chapterpage.runtime_text("book/ch01_attention", RECORD, alone).endswith("(quick profile).")
    dry = {**alone, "dry_run": True}
    assert chapterpage.runtime_text("book/ch04_gpt", RECORD, dry) == "Runs in about 85 s on a CPU (quick profile)."


def test_chapters_gpu_writes_the_record_chapterpage_reads(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import chapters_gpu

    results = [{"chapter": "ch04_gpt.ipynb", "status": "passed", "seconds": 71.24},
               {"chapter": "ch09_x.ipynb", "status": "timed out", "seconds": 160.0}]
    path = tmp_path / "chapter_times_gpu.json"
    path.write_text(json.dumps(chapters_gpu.times_record(results, "NVIDIA H200", "2.11.0", 7)))
    rec = chapterpage.load_times(path)
    assert rec["seconds"] == {"ch04_gpt.ipynb": 71.2} and rec["dry_run"] is False
    assert chapterpage.runtime_text("book/ch04_gpt", RECORD, rec).endswith("in under 2 min on an NVIDIA H200 (gpu profile).")


def test_the_book_time_is_the_sum():
    text = chapterpage.book_time_text(RECORD)
    assert text == ("Run one after another on a 2-core CPU in the quick profile, the 3 chapters take about 4 min "
                    "in all, from 15 s to 2 min a chapter (measured on an AMD EPYC, 2026-12-01).")
    assert "no full run has been measured" in chapterpage.book_time_text({})


def test_the_repository_record_gives_every_listed_chapter_a_time():
    record = chapterpage.load_times(ROOT / chapterpage.TIMES)
    listed = {p.name for p in (ROOT / "book").glob("ch[0-9][0-9]_*.ipynb")}
    assert listed <= set(record["seconds"]), listed - set(record["seconds"])
    total = sum(record["seconds"].values())
    assert f"about {round(total / 60)} min in all" in chapterpage.book_time_text(record)


def chapter(exercises_intro: str | None = None) -> nodes.document:
    """A chapter's doctree as MyST-NB reads it: a top section, its opening, two sections, Exercises last."""
    doc = new_document("<test>")
    top = nodes.section(ids=["ch-x"])
    top += nodes.title("", "A chapter")
    top += nodes.paragraph("", "Opening.")
    top += nodes.admonition("", nodes.paragraph("", "Learning objectives"))
    first = nodes.section(ids=["first"])
    first += nodes.title("", "First")
    first += nodes.paragraph("", "Text.")
    ex = nodes.section(ids=["exercises"])
    ex += nodes.title("", "Exercises")
    if exercises_intro:
        ex += nodes.paragraph("", exercises_intro)
    ex += nodes.container("", nodes.paragraph("", "An exercise [1]"))
    top += first
    top += ex
    doc += top
    return doc


def test_the_time_line_goes_right_under_the_title_once():
    doc = chapter()
    assert chapterpage.add_runtime(doc, "Runs in about 15 s on a CPU (quick profile).")
    top = doc[0]
    line = top[1]
    assert isinstance(top[0], nodes.title)
    assert line.astext() == "Runs in about 15 s on a CPU (quick profile)." and "chapter-runtime" in line["classes"]
    assert isinstance(top[2], nodes.paragraph)  # the opening text follows, then the objectives
    assert not chapterpage.add_runtime(doc, "again")  # a second read adds nothing


def test_the_legend_opens_exercises_unless_the_chapter_writes_its_own():
    doc = chapter()
    assert chapterpage.add_legend(doc)
    ex = doc[0][-1]
    assert ex[1].astext() == chapterpage.LEGEND and "exercise-legend" in ex[1]["classes"]
    assert not chapterpage.add_legend(doc)
    own = chapter("Each exercise is marked with its difficulty: [1] applies the chapter directly.")
    assert not chapterpage.add_legend(own)
    assert not chapterpage.add_legend(new_document("<empty>"))


def test_chapter_ones_legend_is_the_generated_one():
    """The wording chapter 1 wrote by hand is the legend every other chapter gets."""
    nb = json.loads((ROOT / "book" / "ch01_attention.ipynb").read_text())
    text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert chapterpage.LEGEND in text


def test_config_names_the_extension():
    config = (ROOT / "_config.yml").read_text()
    assert "chapterpage: tools/" in config
    assert "{{ book_run_time }}" in (ROOT / "book" / "intro.md").read_text()
