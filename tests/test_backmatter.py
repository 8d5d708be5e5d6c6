"""tools/backmatter.py: the generated exercises and claims indexes, and the claim-tag rule."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import backmatter  # noqa: E402
import sitefix  # noqa: E402


def _nb(*cells):
    return {"cells": [{"cell_type": t, "metadata": m, "source": s} for t, s, m in cells]}


def test_every_exercise_title_ends_with_its_difficulty():
    for path in backmatter.chapters(ROOT / "book"):
        text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        directives = re.findall(r"```\{exercise\}[^\n]*", text)
        parsed = backmatter.exercises(json.loads(path.read_text()))
        assert len(parsed) == len(directives), f"{path.name}: an exercise title lacks [1], [2] or [3]: {directives}"


def test_exercises_page_lists_every_exercise_with_difficulty_and_checker():
    page = backmatter.exercises_page(ROOT / "book")
    for path in backmatter.chapters(ROOT / "book"):
        for ex in backmatter.exercises(json.loads(path.read_text())):
            row = next(l for l in page.splitlines() if f"<{ex['label']}>`" in l)
            assert f"| {ex['level']} |" in row
            for c in ex["checkers"]:
                assert f"`{c}`" in row


def test_exercise_parser_reads_difficulty_and_solution_checker():
    nb = _nb(("markdown", "```{exercise} Masks [2]\n:label: ex-m\n\ntext\n```", {}),
             ("markdown", "````{solution-start} ex-m\n:class: dropdown\n````", {}),
             ("code", "def f(x):\n    return x\n\ncheck(\"ch09.masks\", f)", {}),
             ("markdown", "````{solution-end}\n````", {}),
             ("code", "check(\"ch09.other\", g)", {}))
    assert backmatter.exercises(nb) == [{"title": "Masks", "level": "2", "label": "ex-m", "checkers": ["ch09.masks"]}]


def test_a_tagged_claim_without_a_check_is_reported():
    nb = _nb(("code", "# softmax rows sum to one\nassert w.sum(-1).allclose(one)", {"tags": ["claim-rows"]}),
             ("code", "torch.testing.assert_close(a, b)", {"tags": ["claim-close"], "claim": "a equals b"}),
             ("code", "print(w.sum(-1))", {"tags": ["claim-printed"]}))
    found = backmatter.claims(nb, "ch09_x")
    assert [(c.name, c.text, c.checked) for c in found] == [
        ("claim-rows", "softmax rows sum to one", True), ("claim-close", "a equals b", True),
        ("claim-printed", "claim-printed", False)]


def test_every_tagged_claim_in_the_book_is_checked():
    bad = backmatter.unchecked(ROOT / "book")
    assert not bad, [f"{c.chapter}: {c.name}" for c in bad]


def test_claims_page_links_each_claim_to_its_cell(tmp_path):
    (tmp_path / "ch09_x.ipynb").write_text(json.dumps(_nb(
        ("markdown", "# Title", {}), ("code", "assert True  # trivially", {"tags": ["claim-t"], "claim": "It holds"}))))
    page = backmatter.claims_page(tmp_path)
    assert '- It holds <a class="claim-check" href="ch09_x.html#claim-t" title="claim-t">check</a>' in page


def test_sitefix_gives_tagged_cells_their_claim_id():
    from docutils import nodes
    from docutils.utils import new_document
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser

    doc = new_document("x", get_default_settings(Parser))
    cell = nodes.container(classes=["cell", "tag_claim-rows", "tag_other"])
    doc += cell
    sitefix._claim_ids(None, doc)
    assert cell["ids"] == ["claim-rows"]


@pytest.mark.parametrize("name, make", [("exercises_index.md", backmatter.exercises_page),
                                        ("claims.md", backmatter.claims_page)])
def test_committed_index_is_current(name, make):
    committed = (ROOT / "book" / name).read_text()
    assert committed == make(ROOT / "book"), f"book/{name} is stale: run python tools/backmatter.py"


def test_instructor_guide_tables_come_from_the_run_record_and_the_chapters(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    nb = _nb(("markdown", "# Chapter X\n", {}),
             ("markdown", "```{exercise} Easy [1]\n:label: ex-easy\n```\n", {}),
             ("markdown", "```{exercise} Project [3]\n:label: ex-proj\n```\n````{solution-start} ex-proj\n````", {}),
             ("code", 'check("ch09.proj", f)', {}),
             ("markdown", "````{solution-end}\n````", {}))
    (book / "ch09_x.ipynb").write_text(json.dumps(nb))
    (book / "ch10_y.ipynb").write_text(json.dumps(_nb(("markdown", "# Chapter Y\n", {}))))
    template = tmp_path / "t.md"
    template.write_text("A\n{{RUN_TIMES}}\nB\n{{HOMEWORK}}\n")
    times = book / "chapter_times.json"
    page = backmatter.instructor_page(book, template, times)
    assert "No full test run has been recorded yet" in page
    times.write_text(json.dumps({"date": "2026-12-01", "torch": "2.13.0", "workers": 2, "cores": 2, "cpu": "Some CPU",
                                 "seconds": {"ch09_x.ipynb": 41.26}}))
    page = backmatter.instructor_page(book, template, times)
    assert "| {doc}`ch09_x` | 41 |" in page and "| {doc}`ch10_y` | not measured |" in page
    assert "| all chapters | 41 |" in page and "2 cores of Some CPU" in page
    row = next(line for line in page.splitlines() if line.startswith("| {doc}`ch09_x` | {ref}"))
    assert "{ref}`Project <ex-proj>` (3) | {ref}`Project <ex-proj>`" in row and "ex-easy" not in row


# --- reader pages (issue 25, item 7) ---------------------------------------------------------------

@pytest.mark.parametrize("plain, typeset", [
    ("dividing by sqrt(d_k) brings it back to 1.", r"dividing by $\sqrt{d_k}$ brings it back to 1."),
    ("backward (dV = A^T dO, dA = dO V^T) equals autograd.",
     r"backward ($dV = A^\top dO$, $dA = dO V^\top$) equals autograd."),
    ("the rate lr * lambda, while Adam", r"the rate $\mathrm{lr} \cdot \lambda$, while Adam"),
    ("the last L(w - 1) + 1 inputs", "the last $L(w - 1) + 1$ inputs"),
    ("width (h + 2g) d_h gives", "width $(h + 2g) d_h$ gives"),
    ("maps it to (2, 4, 6, 8)/sqrt(30).", r"maps it to $(2, 4, 6, 8)/\sqrt{30}$."),
    ("logits within 1e-5, and", "logits within $10^{-5}$, and"),
    ("equals torch.softmax and adam_step.", "equals `torch.softmax` and `adam_step`."),
    ("A model at 8x its length, a cache of (1000, 1001) rows.", "A model at 8x its length, a cache of (1000, 1001) rows."),
    ("already $x^2$ typeset", "already $x^2$ typeset"),
])
def test_claims_are_typeset(plain, typeset):
    assert backmatter.typeset(plain) == typeset


def test_claims_page_groups_by_chapter_and_section_with_no_build_notes(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    nb = _nb(("markdown", "# Attention\n\nIntro.", {}),
             ("markdown", "## Scores", {}),
             ("code", "# Scores have variance d_k\nassert True", {"tags": ["claim-var"]}),
             ("code", "# Rows sum to one\nassert True", {"tags": ["claim-rows"]}),
             ("markdown", "## Masks", {}),
             ("code", "# Masked weights are 0\nassert True", {"tags": ["claim-mask"]}))
    (book / "ch01_x.ipynb").write_text(json.dumps(nb))
    page = backmatter.claims_page(book)
    body = [l for l in page.splitlines() if not l.startswith("%")]  # MyST comments are not rendered
    text = "\n".join(body)
    assert "Generated" not in text and "backmatter" not in text and "do not edit" not in text
    assert "## 1. Attention" in text
    assert text.index("**1.1 Scores**") < text.index("variance $d_k$") < text.index("**1.2 Masks**")
    assert text.index("**1.2 Masks**") < text.index("Masked weights")
    assert '<a class="claim-check" href="ch01_x.html#claim-mask" title="claim-mask">check</a>' in text
    for generated in (backmatter.exercises_page(book), backmatter.instructor_page(
            book, ROOT / "tools" / "instructor_template.md", book / "none.json")):
        shown = "\n".join(l for l in generated.splitlines() if not l.startswith("%"))
        assert "tools/backmatter.py" not in shown and "do not edit" not in shown


def test_glossary_is_alphabetical_and_links_every_chapter():
    text = (ROOT / "book" / "glossary.md").read_text()
    body = text.split("```{glossary}\n", 1)[1].rsplit("```", 1)[0]
    terms = [l for l in body.splitlines() if l and not l.startswith(" ")]
    assert terms == sorted(terms, key=str.lower) and len(terms) > 30
    assert not re.search(r"(?<![`<])\bChapters? \d+\b(?![^`]*>`)", body), "a chapter named without a link"
    stems = {p.stem for p in (ROOT / "book").glob("ch*.ipynb")}
    for target in re.findall(r"\{doc\}`Chapter \d+ <([^>]+)>`", body):
        assert target in stems
