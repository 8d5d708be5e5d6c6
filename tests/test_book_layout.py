"""The book's structure: every chapter is listed, bootstrapped for Colab, executed and cited correctly."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))


def toc_files():
    files = re.findall(r"file:\s*(\S+)", (ROOT / "_toc.yml").read_text())
    root = re.search(r"^root:\s*(\S+)", (ROOT / "_toc.yml").read_text(), re.M).group(1)
    return [root, *files]


def test_there_are_chapters():
    assert NOTEBOOKS, "book/ holds no chapter notebooks"


def test_toc_lists_every_notebook_and_every_entry_exists():
    listed = toc_files()
    for entry in listed:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), f"_toc.yml lists missing {entry}"
    for nb in NOTEBOOKS:
        assert str(nb.relative_to(ROOT).with_suffix("")) in listed, f"{nb.name} is not in _toc.yml"


def _cells(nb_path):
    return json.loads(nb_path.read_text())["cells"]


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_conventions(nb_path):
    cells = _cells(nb_path)
    code = [c for c in cells if c["cell_type"] == "code"]
    assert "google.colab" in "".join(code[0]["source"]), "the first code cell must be the Colab bootstrap"
    assert "companion.profile()" in "".join("".join(c["source"]) for c in code[:3]), "setup must call companion.profile()"
    executed = [c for c in code if c.get("execution_count")]
    assert len(executed) == len(code), "commit notebooks executed, with outputs (tools/execute_notebooks.py)"
    counts = [c["execution_count"] for c in code]
    assert counts == sorted(counts), "outputs must come from one top-to-bottom run"
    for c in code:
        for out in c.get("outputs", []):
            assert out.get("output_type") != "error", f"stored error output in cell {c.get('id')}"
            assert "image/svg+xml" not in out.get("data", {}), "use PNG figures (nbval compares SVG text)"
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "Learning objectives" in text and "## Summary" in text and "## Exercises" in text
    exercises = re.findall(r"```\{exercise\}[^\n]*\n:label: (\S+)", text)  # title: difficulty
    assert len(exercises) >= 4, "a chapter needs at least four exercises"
    solutions = re.findall(r"\{solution-start\} (\S+)", text)
    assert set(exercises) <= set(solutions), f"exercises without worked solutions: {set(exercises) - set(solutions)}"
    assert text.count("{solution-start}") == text.count("{solution-end}")


def test_citations_resolve():
    keys = set(re.findall(r"@\w+\{([^,]+),", (BOOK / "references.bib").read_text()))
    for source in [*NOTEBOOKS, *BOOK.glob("*.md")]:
        text = source.read_text()
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", text):
            for key in group.split(","):
                assert key.strip() in keys, f"{source.name} cites unknown key {key.strip()!r}"


def test_metadata_names_the_project_not_anonymous_authors():
    yaml = pytest.importorskip("yaml")
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    title = "Attention, from Translation to Serving"
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [config["author"], *(a["name"] for a in citation["authors"]), *(a["name"] for a in project["authors"])]
    for name in names:
        assert title in name and "book's authors" not in name, name


def test_bibliography_lists_cited_works_first_in_author_year_form():
    yaml = pytest.importorskip("yaml")
    page = (BOOK / "bibliography.md").read_text()
    assert ":all:" not in page and ":filter: cited" in page
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]
    assert config["config"]["bibtex_reference_style"] == "author_year"
    assert config["config"]["bibtex_default_style"] == "authoryear" and "bibstyle" in config["local_extensions"]


def test_bibliography_labels_read_like_the_citations():
    pybtex = pytest.importorskip("pybtex.database")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import bibstyle
    finally:
        sys.path.remove(str(ROOT / "tools"))
    db = pybtex.parse_string(
        "@misc{a, author={Ashish Vaswani and Noam Shazeer and Niki Parmar}, title={X}, year={2017}}"
        "@misc{b, author={Jimmy Ba and Geoffrey Hinton}, title={Y}, year={2016}}"
        "@misc{c, author={Hugo Touvron}, title={L1}, year={2023}}"
        "@misc{d, author={Hugo Touvron}, title={L2}, year={2023}}"
        "@misc{e, author={Laurens van der Maaten}, title={Z}, year={2008}}",
        "bibtex",
    )
    labels = [e.label for e in bibstyle.AuthorYearStyle().format_bibliography(db)]
    assert labels == ["Ba and Hinton, 2016", "Touvron, 2023a", "Touvron, 2023b", "van der Maaten, 2008",
                      "Vaswani et al., 2017"]


def _tool(name):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "tools"))


def test_stylesheet_holds_the_layout_rules_check_site_requires():
    check_site = _tool("check_site")
    assert check_site.css_problems((ROOT / "_static" / "companion.css").read_text()) == []
    broken = "div.math > mjx-container[display=\"true\"] { min-width: 0; }\n/* overflow-x: auto */"
    missing = check_site.css_problems(broken)
    assert "_static/companion.css: div.math > mjx-container[display=\"true\"] lacks 'overflow-x: auto'" in missing
    assert len(missing) == len(check_site.REQUIRED_CSS) - 1


def test_layout_problems_from_a_browser_measurement():
    check_layout = _tool("check_layout")
    good = {"width": 1280, "client": 1280, "page": 1280, "code_chars": 89, "wide": [],
            "math": [{"id": "eq-a", "overflows": True, "overflow_x": "auto", "overlap": False}]}
    assert check_layout.problems_of(good) == []
    bad = {"width": 1280, "client": 1280, "page": 1400, "code_chars": 77, "wide": ["code.docutils (1400 px)"],
           "math": [{"id": "eq-b", "overflows": True, "overflow_x": "visible", "overlap": True}]}
    problems = check_layout.problems_of(bad)
    assert len(problems) == 4
    assert problems[0].startswith("the page scrolls sideways (1400 px in a 1280 px window")
    assert "fits 77 characters" in problems[1] and "eq-b is wider than its box" in problems[2]
    assert problems[3] == "an unnumbered equation #eq-b: its number covers the equation"


def _shown_text(out: dict) -> str:
    """The text a stored output shows on the page: a stream, or a plain-text result with no richer form
    (a widget, an image, HTML or Markdown is drawn instead of its text/plain)."""
    if out.get("output_type") == "stream":
        return "".join(out["text"])
    data = out.get("data", {})
    if set(data) - {"text/plain"}:
        return ""
    return "".join(data.get("text/plain", ""))


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_fit_the_column(nb_path):
    """Every printed line the book shows fits the 88 characters of a code cell's output at 1280 px
    (tools/check_layout.py measures the rendered page; this catches it before a build). Print a small table,
    not a dict or a repr; wrap text with companion.exercises.wrap_lines (issue 25, item 5)."""
    from companion.exercises import WIDTH

    long = []
    for c in _cells(nb_path):
        tags = c.get("metadata", {}).get("tags", [])
        if c["cell_type"] != "code" or {"remove-output", "remove-cell"} & set(tags):
            continue
        for out in c.get("outputs", []):
            long += [f"cell {c.get('id')}: {len(line)} characters: {line[:60]!r}"
                     for line in _shown_text(out).splitlines() if len(line) > WIDTH]
    assert not long, "output lines wider than the column:\n" + "\n".join(long)


def test_a_printed_failure_and_wrapped_text_fit_the_column():
    from companion.exercises import WIDTH, ExerciseFailed, wrap_lines

    message = ("2-D scores (4, 6), random mask: 9 masked entries (keys the query may not read) are non-zero, "
               "first at index (0, 1) (value 0.1515, expected 0) -- your result equals a plain softmax")
    failure = ExerciseFailed(message)
    assert str(failure) == message  # what tests match against, unchanged
    lines = failure.wrapped().splitlines()
    assert len(lines) == 3 and all(len(line) <= WIDTH for line in lines)
    assert lines[0].endswith("are") and lines[1].startswith("  non-zero")  # no break inside a hyphenated word
    assert " ".join(line.strip() for line in lines) == message
    table = "a  b\n1  2\n" + "x" * 40
    assert wrap_lines(table) == table  # short lines (a table, text wrapped before) are left as they are
