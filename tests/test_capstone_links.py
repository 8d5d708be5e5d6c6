"""Chapter 13's links into the other chapters cannot rot: every claim anchor it links
(``chNN_name.html#claim-...``) is a claim tag of a cell of that chapter's notebook, every
``{doc}`` target exists, and the summary table keeps one demonstrating link per row."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
CHAPTER = BOOK / "ch13_capstone.ipynb"
# a Markdown link [text](page.html#claim-...) or, as the chapter writes them (MyST would treat the Markdown
# form as a cross-reference it cannot resolve), an HTML <a href="page.html#claim-...">
ANCHOR = re.compile(r"(?:\]\(|href=\")(ch\d\d_[a-z0-9_]+)\.html#(claim-ch\d\d-[a-z0-9-]+)(?:\)|\")")
# {doc}`ch04_gpt` or, with a short text (the chapter's number in the compact tables), {doc}`4 <ch04_gpt>`
DOC = re.compile(r"\{doc\}`(?:[^`<>]*<([^`<>]+)>|([^`<>]+?))`")


def doc_targets(text: str) -> list[str]:
    return [bracketed or plain for bracketed, plain in DOC.findall(text)]


def markdown(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def claim_tags(path: Path) -> set[str]:
    cells = json.loads(path.read_text())["cells"]
    return {t for c in cells for t in c.get("metadata", {}).get("tags", []) if t.startswith("claim-")}


def dangling(text: str, book: Path) -> list[str]:
    """The links of ``text`` whose notebook is missing or holds no cell tagged with the anchor."""
    bad = []
    for page, anchor in ANCHOR.findall(text):
        nb = book / f"{page}.ipynb"
        if not nb.exists() or anchor not in claim_tags(nb):
            bad.append(f"{page}.html#{anchor}")
    return bad


def test_every_linked_claim_anchor_exists():
    text = markdown(CHAPTER)
    links = ANCHOR.findall(text)
    assert len(links) >= 12, "the summary table should link one demonstrating cell per row"
    assert dangling(text, BOOK) == []


def test_every_doc_link_names_an_existing_page():
    targets = doc_targets(markdown(CHAPTER))
    assert "ch04_gpt" in targets and "ch11_flash" in targets
    missing = [d for d in targets
               if not any((BOOK / f"{d}{ext}").exists() for ext in (".ipynb", ".md"))]
    assert missing == []


def test_summary_table_rows_each_link_a_claim():
    text = markdown(CHAPTER)
    table = text[text.index("| Change |"):]
    rows = [r for r in table.splitlines()[2:] if r.startswith("|")]
    assert len(rows) == 12                                 # the seeds' twelve changes
    assert all(ANCHOR.search(r) and DOC.search(r) for r in rows)


def test_a_dangling_anchor_is_reported(tmp_path):
    (tmp_path / "ch99_demo.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "code", "metadata": {"tags": ["claim-ch99-real"]}, "source": []}]}))
    text = ("[ok](ch99_demo.html#claim-ch99-real) [gone](ch99_demo.html#claim-ch99-renamed) "
            "[no page](ch98_none.html#claim-ch98-x)")
    assert dangling(text, tmp_path) == ["ch99_demo.html#claim-ch99-renamed",
                                        "ch98_none.html#claim-ch98-x"]


@pytest.mark.parametrize("anchor", sorted({a for _, a in ANCHOR.findall(markdown(CHAPTER))}))
def test_claim_anchor_belongs_to_its_chapter(anchor):
    page = next(p for p, a in ANCHOR.findall(markdown(CHAPTER)) if a == anchor)
    assert anchor.split("-")[1] == page[:4]      # claim-ch06-... lives in ch06_*.ipynb


def test_tables_name_chapters_by_number():
    """The two tables link chapters by number ({doc}`4 <ch04_gpt>`): a chapter's full title in a
    narrow column wrapped over four or five lines."""
    text = markdown(CHAPTER)
    for header in ("| Eq. |", "| Change |"):
        table = text[text.index(header):].split("\n\n")[0]
        links = DOC.findall(table)
        assert links and all(bracketed for bracketed, _ in links), header
        assert all(re.search(r"\{doc\}`\d{1,2} <", row) for row in table.splitlines()[2:])
