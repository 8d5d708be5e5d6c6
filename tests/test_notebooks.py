"""The chapters' stored JSON against the rules of CONTRIBUTING.md ("A chapter notebook").

Each rule is a small checker over a notebook dict that returns a list of problems (empty: the rule
holds), so a failure names the cell and what is wrong. The first half of this file runs every
checker over every ``book/*.ipynb``; the second half runs each checker on small synthetic notebooks
to show that it accepts a good cell and rejects a bad one (a checker that cannot fail proves nothing).

Rules
- ``long_lines``: code lines at most ``MAX_LINE`` characters (what a code cell shows without a
  sideways scroll from a 1280 px window up; CONTRIBUTING.md, "Code width", says how it was measured).
- ``median_cell_lines``: the median code cell is shorter than ``MAX_MEDIAN_LINES`` lines.
- ``uncaptioned_figures``: every PNG a code cell shows belongs to a numbered figure with a caption
  and alt text: either the cell's ``mystnb.figure`` metadata (name + caption, and
  ``mystnb.image.alt``), or a glued figure (``glue(name, fig, display=False)``, or ``display=True``
  in a cell tagged ``remove-output``, so that Jupyter shows it and the page does not show it twice)
  pasted by a ``{glue:figure}`` directive with ``:name:``, ``:alt:`` and a caption.
- ``unguarded_results``: an output nbval compares must not come from training or timing. A code cell
  whose non-assert statements mention a training or timing result (``TIMING_OR_TRAINING``, or a name
  an earlier statement assigned from one) and that stores text output must be tagged
  ``nbval-ignore-output`` (or carry ``# NBVAL_IGNORE_OUTPUT``).
- ``exercise_problems``: at least ``MIN_EXERCISES`` exercises, each titled with its difficulty
  (the ``{exercise}`` directive's title ends with ``[1]``, ``[2]`` or ``[3]``), at least one ``[3]``.
"""

from __future__ import annotations

import ast
import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))

MAX_LINE = 88
MAX_MEDIAN_LINES = 10
MIN_EXERCISES = 5
IGNORE_TAG = "nbval-ignore-output"
IGNORE_COMMENT = "# NBVAL_IGNORE_OUTPUT"
GLUE_PREFIX = "application/papermill.record/"
# What a statement mentions when its value depends on how far training got or on the clock.
TIMING_OR_TRAINING = re.compile(
    r"\bHistory\b|\.history\b|\.last\(|\bTrainer\b|\.fit\(|\bperf_counter\b|\btime\.time\(|"
    r"\bprocess_time\b|\bmonotonic\b|\btokens_per_s\b|\btimeit\b"
)
# The exercise directive with its optional title: ```{exercise} Title [2]   (or a ::: fence).
EXERCISE = re.compile(r"^(`{3,}|:{3,})\{exercise\}[ \t]*(.*)$", re.M)
DIFFICULTY = re.compile(r"\[([1-3])\]\s*$")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _where(cell: dict, index: int) -> str:
    return f"cell {cell.get('id', index)}"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- line length


def long_lines(nb: dict, limit: int = MAX_LINE) -> list[str]:
    """Code lines longer than ``limit`` characters, as 'cell ID line N: L characters'."""
    problems = []
    for i, cell in enumerate(_code_cells(nb)):
        for n, line in enumerate(_source(cell).splitlines(), 1):
            if len(line) > limit:
                problems.append(f"{_where(cell, i)} line {n}: {len(line)} characters (limit {limit})")
    return problems


# ----------------------------------------------------------------------------- cell length


def cell_lines(cell: dict) -> int:
    """Lines a code cell shows on the page (trailing blank lines do not show)."""
    return len(_source(cell).rstrip().splitlines())


def median_cell_lines(nb: dict) -> float:
    """The median length of the notebook's code cells, in lines."""
    lengths = [cell_lines(c) for c in _code_cells(nb)]
    return float(statistics.median(lengths)) if lengths else 0.0


# ----------------------------------------------------------------------------- figures


def _directives(markdown: str, name: str) -> list[tuple[str, dict[str, str], str]]:
    """Every ```{name} ARG (or :::{name} ARG) block: (argument, options, body)."""
    found = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(`{3,}|:{3,})\{" + re.escape(name) + r"\}[ \t]*(.*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, argument = m.group(1), m.group(2).strip()
        options: dict[str, str] = {}
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            opt = re.match(r"^:([\w-]+):\s*(.*)$", lines[i])
            if opt and not body:
                options[opt.group(1)] = opt.group(2).strip()
            else:
                body.append(lines[i])
            i += 1
        found.append((argument, options, "\n".join(body).strip()))
        i += 1
    return found


def uncaptioned_figures(nb: dict) -> list[str]:
    """PNG outputs that are not a numbered figure with a caption and alt text (see the module docstring)."""
    problems = []
    glued: set[str] = set()
    for i, cell in enumerate(_code_cells(nb)):
        where = _where(cell, i)
        meta = cell.get("metadata", {}).get("mystnb", {})
        hidden = bool({"remove-output", "remove-cell"} & set(cell.get("metadata", {}).get("tags", [])))
        shown = 0
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            glue_name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            # a figure, or a frame player (HTML: companion.notebook.widgets.glue_player)
            if glue_name and (GLUE_PREFIX + "image/png" in data or "image/png" in data or "text/html" in data):
                glued.add(glue_name)
            if "image/png" in data and not hidden:
                shown += 1
                if glue_name:
                    problems.append(f"{where}: glue({glue_name!r}, ..., display=True) also puts an uncaptioned copy on "
                                    "the page; tag the cell 'remove-output' (Jupyter still shows it) or glue with "
                                    "display=False")
        if not shown or any(p.startswith(f"{where}: glue(") for p in problems):
            continue
        figure, image = meta.get("figure", {}), meta.get("image", {})
        if not (figure.get("name") and str(figure.get("caption", "")).strip()):
            problems.append(f"{where}: shows a PNG figure without a number and caption "
                            "(mystnb.figure name + caption, or glue it into a {glue:figure})")
        elif not str(image.get("alt", "")).strip():
            problems.append(f"{where}: figure {figure['name']!r} has no alt text (mystnb.image.alt)")
        if shown > 1:
            problems.append(f"{where}: shows {shown} PNG figures; one captioned figure per cell")
    pasted = set()
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for name, options, caption in _directives(_source(cell), "glue:figure"):
            pasted.add(name)
            if not options.get("name"):
                problems.append(f"{{glue:figure}} {name}: no :name: (the figure gets no number to refer to)")
            if not options.get("alt"):
                problems.append(f"{{glue:figure}} {name}: no :alt: text")
            if not caption:
                problems.append(f"{{glue:figure}} {name}: no caption")
            if name not in glued and "doc" not in options:
                problems.append(f"{{glue:figure}} {name}: nothing glued under that name in this notebook")
        for argument, options, caption in _directives(_source(cell), "figure"):
            if not (options.get("name") and options.get("alt") and caption):
                problems.append(f"{{figure}} {argument}: needs :name:, :alt: and a caption")
    for name in sorted(glued - pasted):
        problems.append(f"glued figure {name!r} is never pasted by a {{glue:figure}}")
    return problems


# ----------------------------------------------------------------------------- determinism


def _is_ignored(cell: dict) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return IGNORE_TAG in tags or "nbval-skip" in tags or any(
        line.strip().upper() in (IGNORE_COMMENT, "# NBVAL_SKIP") for line in _source(cell).splitlines()
    )


def _text_output(cell: dict) -> bool:
    """True when the cell stores an output that nbval compares as text (a figure's repr aside)."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and "".join(out.get("text", "")).strip():
            return True
        data = out.get("data", {})
        if "text/plain" in data and not any(k.startswith("image/") for k in data):
            if "application/vnd.jupyter.widget-view+json" not in data:
                return True
    return False


def _python(cell: dict) -> ast.Module | None:
    """The cell's code as an AST (IPython magics and shell lines blanked); None if it does not parse."""
    lines = [("" if line.lstrip().startswith(("%", "!")) else line) for line in _source(cell).splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


_COMPOUND = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try, ast.Match)
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _reads(tree: ast.AST):
    """(statement, what it reads) for every statement that runs at the cell's top level, in order.

    An assignment reads its right-hand side; a compound statement reads its header (the loop's
    iterable, the test, the context managers) and then its body's statements are visited; function
    and class definitions run nothing until called, so they are skipped.
    """
    for node in getattr(tree, "body", []):
        yield from _visit(node)


def _visit(node: ast.stmt):
    if isinstance(node, _DEFINITIONS):
        return
    if isinstance(node, _COMPOUND):
        for field in ("test", "iter", "items", "subject"):
            header = getattr(node, field, None)
            if header:
                yield node, header
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, None) or []:
                for grandchild in getattr(child, "body", None) if not isinstance(child, ast.stmt) else [child]:
                    yield from _visit(grandchild)
        return
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        yield node, node.value
    else:
        yield node, node


def _names(node) -> set[str]:
    nodes = node if isinstance(node, list) else [node]
    return {n.id for x in nodes if x is not None for n in ast.walk(x) if isinstance(n, ast.Name)}


def _targets(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.Assign):
        return _names(stmt.targets)
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        return _names(stmt.target)
    return set()


def unguarded_results(nb: dict) -> list[str]:
    """Untagged code cells with text output whose statements use a training or timing result.

    A statement uses one when what it reads matches ``TIMING_OR_TRAINING`` or names a variable that
    an earlier statement (in this cell or an earlier one) assigned from such a result; reassigning
    the variable from something else clears it. Imports and ``assert`` statements do not count: an
    assert prints nothing when it holds.
    """
    problems = []
    tainted: set[str] = set()
    for i, cell in enumerate(_code_cells(nb)):
        tree = _python(cell)
        if tree is None:
            continue
        source = "\n".join(("" if l.lstrip().startswith(("%", "!")) else l) for l in _source(cell).splitlines())
        reasons = []
        for stmt, read in _reads(tree):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            hit = TIMING_OR_TRAINING.search(ast.get_source_segment(source, read) or "")
            used = sorted(_names(read) & tainted)
            depends = bool(hit or used)
            targets = _targets(stmt)
            if depends:
                tainted |= targets
            elif read is not stmt:
                tainted -= targets  # reassigned from something else: clean again
            if depends and not isinstance(stmt, ast.Assert):
                reasons.append(hit.group(0) if hit else used[0])
        if reasons and _text_output(cell) and not _is_ignored(cell):
            problems.append(f"{_where(cell, i)}: prints output that depends on {reasons[0]!r} but is not tagged "
                            f"{IGNORE_TAG!r} (tag it and assert the claim in the next cell)")
    return problems


# ----------------------------------------------------------------------------- exercises


def exercises(nb: dict) -> list[tuple[str, int | None]]:
    """(title, difficulty or None) of every {exercise} directive in the notebook's markdown."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for m in EXERCISE.finditer(_source(cell)):
                title = m.group(2).strip()
                d = DIFFICULTY.search(title)
                found.append((title, int(d.group(1)) if d else None))
    return found


def exercise_problems(nb: dict, minimum: int = MIN_EXERCISES) -> list[str]:
    """Fewer than ``minimum`` exercises, an exercise without a difficulty, or none of difficulty 3."""
    found = exercises(nb)
    problems = [f"exercise {title or '(untitled)'!r}: its title must end with a difficulty [1], [2] or [3]"
                for title, level in found if level is None]
    if len(found) < minimum:
        problems.append(f"{len(found)} exercises; a chapter needs at least {minimum}")
    if not any(level == 3 for _, level in found):
        problems.append("no exercise of difficulty [3]")
    return problems


# ============================================================================= the chapters


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.name)
def chapter(request):
    return _load(request.param)


def test_code_lines_fit_the_page(chapter):
    problems = long_lines(chapter)
    assert not problems, f"{len(problems)} code lines over {MAX_LINE} characters:\n" + "\n".join(problems)


def test_median_code_cell_is_short(chapter):
    median = median_cell_lines(chapter)
    assert median < MAX_MEDIAN_LINES, f"median code cell is {median} lines (must be under {MAX_MEDIAN_LINES})"


def test_every_figure_is_numbered_and_captioned(chapter):
    problems = uncaptioned_figures(chapter)
    assert not problems, "\n".join(problems)


def test_training_and_timing_outputs_are_not_compared(chapter):
    problems = unguarded_results(chapter)
    assert not problems, "\n".join(problems)


def test_exercises_carry_difficulties(chapter):
    problems = exercise_problems(chapter)
    assert not problems, "\n".join(problems)


# ============================================================================= the checkers


def _nb(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _code(source: str, outputs=(), *, cell_id: str = "x", tags=(), mystnb=None) -> dict:
    meta = {"tags": list(tags)} if tags else {}
    if mystnb is not None:
        meta["mystnb"] = mystnb
    return {"cell_type": "code", "id": cell_id, "metadata": meta, "source": source, "outputs": list(outputs),
            "execution_count": 1}


def _md(source: str) -> dict:
    return {"cell_type": "markdown", "id": "m", "metadata": {}, "source": source}


def _stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def _png(glue: str | None = None, display: bool = True) -> dict:
    prefix = "" if display else GLUE_PREFIX
    out = {"output_type": "display_data", "data": {prefix + "image/png": "iVBOR", prefix + "text/plain": "<Figure>"},
           "metadata": {}}
    if glue:
        out["metadata"]["scrapbook"] = {"name": glue, "mime_prefix": prefix}
    return out


def test_long_lines_names_the_cell_and_the_length():
    nb = _nb(_code("x = 1\n" + "y" * 89, cell_id="c7"), _code("z" * 88))
    assert long_lines(nb) == ["cell c7 line 2: 89 characters (limit 88)"]


def test_median_counts_lines_as_shown():
    nb = _nb(_code("a\nb\n\n"), _code("\n".join("x" * 12)), _code("1\n2\n3"))
    assert [cell_lines(c) for c in _code_cells(nb)] == [2, 12, 3]
    assert median_cell_lines(nb) == 3.0
    assert median_cell_lines(_nb(_code("\n".join("x" * 10)), _code("\n".join("x" * 11)))) == 10.5


def test_bare_plot_is_an_uncaptioned_figure():
    problems = uncaptioned_figures(_nb(_code("plt.show()", [_png()], cell_id="c3")))
    assert len(problems) == 1 and "cell c3" in problems[0] and "caption" in problems[0]


def test_cell_metadata_figure_needs_name_caption_and_alt():
    good = {"figure": {"name": "fig-a", "caption": "What it shows."}, "image": {"alt": "A curve rising."}}
    assert uncaptioned_figures(_nb(_code("plt.show()", [_png()], mystnb=good))) == []
    no_alt = {"figure": {"name": "fig-a", "caption": "What it shows."}}
    assert "alt" in uncaptioned_figures(_nb(_code("plt.show()", [_png()], mystnb=no_alt)))[0]
    no_caption = {"figure": {"name": "fig-a", "caption": " "}, "image": {"alt": "x"}}
    assert uncaptioned_figures(_nb(_code("plt.show()", [_png()], mystnb=no_caption)))
    two = uncaptioned_figures(_nb(_code("plt.show()", [_png(), _png()], mystnb=good)))
    assert len(two) == 1 and "2 PNG figures" in two[0]


def test_glued_figure_must_be_pasted_with_name_alt_and_caption():
    code = _code('glue("fig-w", fig, display=False)', [_png("fig-w", display=False)])
    good = _md("```{glue:figure} fig-w\n:name: fig-w\n:alt: Two heat maps.\n\nThe weights, row by row.\n```")
    assert uncaptioned_figures(_nb(code, good)) == []
    colon_fence = _md(":::{glue:figure} fig-w\n:name: fig-w\n:alt: Two heat maps.\n\nThe weights.\n:::")
    assert uncaptioned_figures(_nb(code, colon_fence)) == []
    bare = _md("```{glue:figure} fig-w\n```")
    problems = uncaptioned_figures(_nb(code, bare))
    assert any(":name:" in p for p in problems) and any(":alt:" in p for p in problems)
    assert any("no caption" in p for p in problems)
    assert uncaptioned_figures(_nb(code)) == ["glued figure 'fig-w' is never pasted by a {glue:figure}"]
    typo = _md("```{glue:figure} fig-v\n:name: fig-v\n:alt: x\n\ncaption\n```")
    assert any("nothing glued" in p for p in uncaptioned_figures(_nb(code, typo)))


def test_glue_with_display_shows_an_uncaptioned_copy_unless_the_output_is_removed():
    code = _code('glue("fig-w", fig)', [_png("fig-w", display=True)], cell_id="c5")
    paste = _md("```{glue:figure} fig-w\n:name: fig-w\n:alt: x\n\ncaption\n```")
    problems = uncaptioned_figures(_nb(code, paste))
    assert len(problems) == 1 and problems[0].startswith("cell c5: glue('fig-w', ..., display=True)")
    removed = _code('glue("fig-w", fig)', [_png("fig-w", display=True)], tags=["remove-output"])
    assert uncaptioned_figures(_nb(removed, paste)) == []
    assert uncaptioned_figures(_nb(removed)) == ["glued figure 'fig-w' is never pasted by a {glue:figure}"]


def test_markdown_figure_directive_needs_name_alt_and_caption():
    good = _md("```{figure} diagram.svg\n:name: fig-d\n:alt: Boxes and arrows.\n\nThe encoder-decoder.\n```")
    assert uncaptioned_figures(_nb(good)) == []
    assert uncaptioned_figures(_nb(_md("```{figure} diagram.svg\n:name: fig-d\n```")))


def test_printed_training_result_must_be_tagged():
    cell = _code('print(history.last("val_loss"))', [_stream("3.35\n")], cell_id="c25")
    problems = unguarded_results(_nb(cell))
    assert len(problems) == 1 and "cell c25" in problems[0] and ".last(" in problems[0]
    tagged = _code('print(history.last("val_loss"))', [_stream("3.35\n")], tags=[IGNORE_TAG])
    assert unguarded_results(_nb(tagged)) == []
    commented = _code('# NBVAL_IGNORE_OUTPUT\nprint(history.last("val_loss"))', [_stream("3.35\n")])
    assert unguarded_results(_nb(commented)) == []


def test_timing_printed_through_a_variable_is_caught_across_cells():
    start = _code("start = time.perf_counter()\nrun()\nelapsed = time.perf_counter() - start", tags=[IGNORE_TAG])
    show = _code('print(f"{elapsed:.1f} s")', [_stream("1.2 s\n")], cell_id="c9")
    assert unguarded_results(_nb(start, show)) == [
        "cell c9: prints output that depends on 'elapsed' but is not tagged 'nbval-ignore-output' "
        "(tag it and assert the claim in the next cell)"]
    reassigned = _code("elapsed = 3", cell_id="c8")
    assert unguarded_results(_nb(start, reassigned, show)) == []


def test_asserts_imports_and_silent_cells_pass():
    asserted = _code('assert history.last("val_loss") < 4\nprint("loss below 4")', [_stream("loss below 4\n")])
    assert unguarded_results(_nb(asserted)) == []
    imported = _code("from companion.training.trainer import Trainer\nprint(P)", [_stream("profile=quick\n")])
    assert unguarded_results(_nb(imported)) == []
    silent = _code("history = trainer.fit()")
    figure_only = _code("history.plot()\nplt.show()", [_png()])
    assert unguarded_results(_nb(silent, figure_only)) == []
    in_a_loop = _code("for name in ('loss', 'val_loss'):\n    print(history.last(name))", [_stream("3\n")])
    assert len(unguarded_results(_nb(in_a_loop))) == 1


def test_exercise_titles_carry_difficulties():
    def chapter(*titles):
        return _nb(*[_md(f"```{{exercise}} {t}\n:label: ex-{n}\n\nDo it.\n```") for n, t in enumerate(titles)])

    good = chapter("Shift invariance [1]", "Temperature [2]", "Batched heads [2]", "Memory [1]", "Head ablation [3]")
    assert exercise_problems(good) == []
    assert [level for _, level in exercises(good)] == [1, 2, 2, 1, 3]
    untagged = exercise_problems(chapter("Shift invariance", "b [2]", "c [2]", "d [1]", "e [3]"))
    assert untagged == ["exercise 'Shift invariance': its title must end with a difficulty [1], [2] or [3]"]
    assert exercise_problems(chapter("a [1]", "b [2]", "c [2]", "d [1]", "e [2]")) == ["no exercise of difficulty [3]"]
    assert exercise_problems(chapter("a [1]", "b [3]")) == ["2 exercises; a chapter needs at least 5"]
    assert exercise_problems(chapter("a [4]", "b [2]", "c [2]", "d [1]", "e [3]"))[0].startswith("exercise 'a [4]'")
