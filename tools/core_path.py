"""A chapter's core path: which sections are optional, how long the rest takes to read, and whether a
reader who skips the optional sections can still run every core cell.

The convention (CONTRIBUTING.md, "Core path"): an optional section is a ``##`` or ``###`` heading whose
text begins with ``Optional:`` and whose markdown cell carries the tag ``optional``. An optional ``##``
section runs to the next ``##`` heading; an optional ``###`` section to the next ``##`` or ``###``.
Every other cell is on the core path.

The reading time is an estimate, not a measurement: the core's prose at 120 words a minute plus 6 s a
line of code the page shows, up to the Exercises. The pace is calibrated on the fourth-pass reviewers'
report that the whole chapters took 2-3 hours to read with their exercises (at this pace the whole
chapters, exercises included, estimate at 1.1 to 2.1 hours). Cells tagged ``remove-cell``,
``remove-input``, ``hide-input`` or ``hide-cell`` are not shown, so they are not read; nor is the set-up
cell's list of imports. tools/chapterpage.py
prints it beside the run-time line; ``python tools/core_path.py book/ch02_positions.ipynb`` prints it here.

``core_problems`` is the static check tests/test_core_path.py runs: a core code cell must not read a
name that only an optional cell defines (a reader who skipped the optional section would meet a
NameError).
"""

from __future__ import annotations

import ast
import builtins
import json
import re
import sys
from pathlib import Path

OPTIONAL_TAG = "optional"
OPTIONAL_PREFIX = "Optional:"
WORDS_PER_MINUTE = 120
SECONDS_PER_CODE_LINE = 6
HIDDEN_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$", re.M)
EXERCISES = re.compile(r"^##\s+Exercises\s*$", re.M)
WORD = re.compile(r"[A-Za-z0-9][\w'’-]*")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []) or [])


def _heading(cell: dict) -> tuple[int, str] | None:
    """The first heading of a markdown cell (level, text), or None."""
    if cell.get("cell_type") != "markdown":
        return None
    in_fence = False
    for line in _source(cell).splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            return len(m.group(1)), m.group(2)
    return None


def optional_flags(cells: list[dict]) -> list[bool]:
    """For each cell, whether it lies in an optional section (the convention above)."""
    flags, opened_at = [], None  # opened_at: the level of the optional heading in force, if any
    for cell in cells:
        head = _heading(cell)
        if head is not None:
            level, text = head
            if opened_at is not None and level <= opened_at:
                opened_at = None
            if opened_at is None and level in (2, 3) and is_optional_heading(cell):
                opened_at = level
        flags.append(opened_at is not None)
    return flags


def is_optional_heading(cell: dict) -> bool:
    head = _heading(cell)
    return head is not None and head[1].startswith(OPTIONAL_PREFIX) and OPTIONAL_TAG in _tags(cell)


def marker_problems(cells: list[dict]) -> list[str]:
    """Half-marked sections: an ``Optional:`` heading without the tag, or the tag on another heading."""
    out = []
    for i, cell in enumerate(cells):
        head = _heading(cell)
        tagged = OPTIONAL_TAG in _tags(cell)
        titled = head is not None and head[1].startswith(OPTIONAL_PREFIX)
        if titled and not tagged:
            out.append(f"cell {i}: heading {head[1]!r} says Optional but the cell lacks the tag {OPTIONAL_TAG!r}")
        if tagged and not titled:
            out.append(f"cell {i}: tagged {OPTIONAL_TAG!r} but its heading does not begin with {OPTIONAL_PREFIX!r}")
        if titled and head[0] not in (2, 3):
            out.append(f"cell {i}: an optional section must be a ## or ### heading, not level {head[0]}")
    return out


def reading_minutes(cells: list[dict], *, core_only: bool = True) -> float:
    """Estimated reading time of the core (or the whole chapter with its exercises):
    words / WORDS_PER_MINUTE + shown code lines x SECONDS_PER_CODE_LINE. The core stops at the
    ``## Exercises`` heading: the exercises are work after the reading, not part of it."""
    flags = optional_flags(cells)
    words = lines = 0
    for cell, optional in zip(cells, flags):
        if core_only and optional:
            continue
        if cell.get("cell_type") == "markdown":
            text = _source(cell)
            cut = EXERCISES.search(text)
            if core_only and cut:
                words += len(WORD.findall(text[: cut.start()]))
                break
            words += len(WORD.findall(text))
        elif cell.get("cell_type") == "code" and not (_tags(cell) & HIDDEN_TAGS) and not _is_setup(cell):
            lines += sum(1 for line in _source(cell).splitlines() if line.strip())
    return words / WORDS_PER_MINUTE + lines * SECONDS_PER_CODE_LINE / 60


def _is_setup(cell: dict) -> bool:
    """The set-up cell (imports and ``P = companion.profile()``): shown so that copied code runs, but a
    list of imports is looked up, not read line by line, so it is not counted."""
    return "companion.profile()" in _source(cell)


def optional_titles(cells: list[dict]) -> list[str]:
    return [_heading(c)[1][len(OPTIONAL_PREFIX):].strip() for c in cells if is_optional_heading(c)]


def core_text(cells: list[dict]) -> str | None:
    """The page's core-path sentence, or None for a chapter with no optional section."""
    titles = optional_titles(cells)
    if not titles:
        return None
    core, whole = reading_minutes(cells), reading_minutes(cells, core_only=False)
    n = len(titles)
    return (f"Core path: about {max(5, 5 * round(core / 5))} min of reading, skipping the {n} section"
            f"{'s' if n > 1 else ''} marked Optional ({max(5, 5 * round(whole / 5))} min with them and the "
            f"exercises, at {WORDS_PER_MINUTE} words and {round(60 / SECONDS_PER_CODE_LINE)} lines of code a "
            f"minute).")


def _python(cell: dict) -> ast.Module | None:
    # IPython magics and shell escapes are not Python; a cell that still does not parse is skipped
    lines = [("pass" if ln.lstrip().startswith(("%", "!")) else ln) for ln in _source(cell).splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names the cell binds at top level or anywhere, names it reads)."""
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if not isinstance(node, ast.ClassDef):
                bound.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Lambda):
            bound.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
    return bound, read


def core_problems(cells: list[dict]) -> list[str]:
    """Core code cells that read a name only an optional cell (so far) has defined."""
    flags = optional_flags(cells)
    core_defined, optional_defined, out = set(dir(builtins)), set(), []
    for i, (cell, optional) in enumerate(zip(cells, flags)):
        if cell.get("cell_type") != "code":
            continue
        tree = _python(cell)
        if tree is None:
            continue
        bound, read = _names(tree)
        if optional:
            optional_defined |= bound
            continue
        core_defined |= bound
        missing = sorted((read & optional_defined) - core_defined)
        if missing:
            out.append(f"cell {i}: the core reads {', '.join(missing)}, defined only in an optional section")
    return out


def load(path: str | Path) -> list[dict]:
    return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tools/core_path.py book/chNN_name.ipynb [...]", file=sys.stderr)
        return 2
    status = 0
    for path in argv:
        cells = load(path)
        problems = marker_problems(cells) + core_problems(cells)
        print(f"{path}: core {reading_minutes(cells):.0f} min, whole {reading_minutes(cells, core_only=False):.0f} "
              f"min; optional: {optional_titles(cells) or 'none'}")
        for p in problems:
            print(f"  {p}")
        status |= bool(problems)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
