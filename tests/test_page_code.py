"""The code on the page runs when copied (issue 49, item 3): every name a visible code cell reads is
defined by a visible cell, so a reader who copies the page's cells in order into a fresh kernel (with the
package installed) gets no NameError; in particular the imports and ``P = companion.profile()`` are shown.

Two checks. A static one (the names each cell binds and reads, tools/core_path.py's reading of a cell), and
the copy itself: each chapter's visible code cells, in order and nothing else, run in a fresh kernel in the
quick profile, in an empty folder, with the package installed (``test_the_page_code_runs_in_a_fresh_kernel``,
marked slow: it costs about what the chapter's own run costs: 18-131 s a chapter, 705 s for the 13 in one
pytest worker, measured on a shared 2-core machine under load). Cells tagged
``remove-cell``, ``remove-input`` or ``hide-cell`` are not shown as code on the page; ``hide-input`` cells
are (folded, one click away: a reader who copies the page copies them too), so both checks count them as
shown; the Colab bootstrap cell is removed and defines nothing the chapter reads.

Also (item 4): no shown cell builds a live widget (a static page has no kernel: the chapters show
pre-drawn frames and keep the live explorers off the page), and no text asks the reader to move a
control the page lacks or speaks of the test suite."""

from __future__ import annotations

import builtins
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import core_path  # noqa: E402
from notebook_runner import execute_notebook  # noqa: E402

CHAPTERS = sorted((ROOT / "book").glob("ch[0-9][0-9]_*.ipynb"))
NOT_SHOWN = {"remove-cell", "remove-input", "hide-cell"}


def code(text: str, *tags: str) -> dict:
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text, "outputs": []}


def hidden_names(cells: list[dict]) -> list[str]:
    """Visible cells that read a name only a cell the page does not show has defined."""
    shown, hidden, out = set(dir(builtins)), set(), []
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        tree = core_path._python(cell)
        if tree is None:
            continue
        bound, read = core_path._names(tree)
        if set(cell.get("metadata", {}).get("tags", [])) & NOT_SHOWN:
            hidden |= bound
            continue
        shown |= bound
        missing = sorted((read & hidden) - shown)
        if missing:
            out.append(f"cell {i} ({cell.get('id', '?')}): reads {', '.join(missing)}, defined only in a cell the "
                       "page does not show")
    return out


def test_a_name_from_a_removed_cell_is_reported():
    cells = [code("import torch\nP = make()", "remove-cell"), code("x = P.steps(quick=3)")]
    assert hidden_names(cells) == ["cell 1 (?): reads P, defined only in a cell the page does not show"]
    cells[0]["metadata"]["tags"] = []  # the set-up cell shown: fine
    assert hidden_names(cells) == []
    assert hidden_names([code("y = 1", "hide-input"), code("print(y)")]) == []  # folded, still on the page


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_the_page_shows_every_name_its_code_reads(path):
    problems = hidden_names(core_path.load(path))
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def visible_code(cells: list[dict]) -> list[str]:
    """The sources of the code cells the page shows, in order (``hide-input`` ones included)."""
    return [core_path._source(c) for c in cells
            if c.get("cell_type") == "code" and not set(c.get("metadata", {}).get("tags", [])) & NOT_SHOWN]


def run_visible_code(cells: list[dict], folder: Path, timeout: int = 600) -> str | None:
    """Run the visible code cells of ``cells`` in a fresh kernel whose working folder is ``folder``
    (empty: nothing beside the book's notebooks is at hand), in the quick profile. Returns None when every
    cell ran, else what failed: the cell (its number among the visible cells) and the error."""
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(src) for src in visible_code(cells)]
    src, out = folder / "page_code.ipynb", folder / "page_code.out.ipynb"
    nbformat.write(nb, src)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPANION_")}
    env.update(COMPANION_PROFILE="quick", OMP_NUM_THREADS="1")
    status, err = execute_notebook(src, out, env, cell_timeout=timeout, total_timeout=timeout, attempts=1)
    if status == 0:
        return None
    if out.exists():
        for i, cell in enumerate(nbformat.read(out, as_version=4).cells):
            for o in cell.get("outputs", []):
                if o.get("output_type") == "error":
                    return f"visible code cell {i} ({cell.source.splitlines()[0][:60]!r}): {o['ename']}: {o['evalue']}"
    return f"the run did not finish (status {status}): {err.strip()[-500:]}"


def test_a_visible_cell_that_needs_a_removed_cell_fails_the_run(tmp_path):
    planted = [code("answer = 41", "remove-cell"), code("x = 1", "hide-input"), code("print(answer + x)")]
    found = run_visible_code(planted, tmp_path, timeout=120)
    assert found is not None and "visible code cell 1 ('print(answer + x)'): NameError" in found, found
    planted[0]["metadata"]["tags"] = []  # shown: the copy runs
    assert run_visible_code(planted, tmp_path, timeout=120) is None


@pytest.mark.slow
@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_the_page_code_runs_in_a_fresh_kernel(path, tmp_path):
    problem = run_visible_code(core_path.load(path), tmp_path)
    assert problem is None, f"{path.name}: the code the page shows, copied into a fresh kernel: {problem}"


LIVE_WIDGET = re.compile(r"\b\w+_explorer\(")  # companion.notebook.widgets' live explorers
ABSENT_CONTROLS = re.compile(r"run the notebook to move|drag the slider|move the (two )?sliders|test suite", re.I)


def absent_things(cells: list[dict]) -> list[str]:
    """What the page refers to without having it: a shown cell that builds a live widget (its output is
    removed or dead on a static page), and text that asks the reader to move controls the page lacks."""
    out = []
    for i, cell in enumerate(cells):
        text = core_path._source(cell)
        shown = not set(cell.get("metadata", {}).get("tags", [])) & NOT_SHOWN
        if cell.get("cell_type") == "code" and shown and LIVE_WIDGET.search(text):
            out.append(f"cell {i}: a shown cell builds a live widget, which a static page cannot run")
        if cell.get("cell_type") == "markdown" and ABSENT_CONTROLS.search(text):
            out.append(f"cell {i}: the text refers to {ABSENT_CONTROLS.search(text).group(0)!r}, which the page lacks")
    return out


def test_live_widgets_and_absent_controls_are_reported():
    md = {"cell_type": "markdown", "metadata": {}, "source": "Drag the slider; run the notebook to move it."}
    planted = [code("sampling_explorer(logits, labels)", "nbval-ignore-output"), md]
    found = absent_things(planted)
    assert found[0] == "cell 0: a shown cell builds a live widget, which a static page cannot run"
    assert "cell 1: the text refers to 'Drag the slider'" in found[1]
    assert absent_things([code("sampling_explorer(logits, labels)", "remove-cell")]) == []


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_nothing_on_the_page_refers_to_what_is_not_there(path):
    problems = absent_things(core_path.load(path))
    assert not problems, f"{path.name}:\n" + "\n".join(problems)
