"""The book's structure: every chapter is listed, bootstrapped for Colab, executed and cited correctly."""

import json
import re
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
    exercises = re.findall(r"```\{exercise\}\s*\n:label: (\S+)", text)
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
