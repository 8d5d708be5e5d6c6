"""The chapters a course takes and its student edition: ``parse_chapters`` reads ``--chapters``,
``student_edition`` replaces every worked solution by a stub (``solution_stub``) that keeps the names
the solution defined and reports "not done yet" (see ``companion.course``)."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

START = re.compile(r"\{solution-start\}\s+(\S+)")
END = "{solution-end}"
# the fence that opens a solution (its label line) and the whole fence that closes one: what a
# Markdown cell holds before the first or after the second is not solution text and is kept
_START_FENCE = re.compile(r"^(`{3,}|:{3,})\{solution-start\}", re.M)
_END_FENCE = re.compile(r"^(?P<f>`{3,}|:{3,})\{solution-end\}[^\n]*(?:\n(?:.*?\n)??(?P=f)[ \t]*$)?", re.M | re.S)


def parse_chapters(spec: str, available: dict[int, Path]) -> list[Path]:
    """``"1,3"`` or ``"1-3"`` or ``"all"`` -> the chapter notebooks, in book order."""
    if spec.strip() == "all":
        return [available[n] for n in sorted(available)]
    numbers: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
            else:
                lo = hi = int(part)
        except ValueError:
            raise ValueError(f"chapters must be numbers, ranges or 'all' (e.g. 1,3 or 1-3); got {spec!r}") from None
        if lo > hi:
            raise ValueError(f"chapters: a range must run from the lower number to the higher (e.g. {hi}-{lo}); "
                             f"got {part!r}")
        numbers += range(lo, hi + 1)
    if not numbers:
        raise ValueError(f"chapters must name at least one chapter; got {spec!r}")
    missing = sorted(set(numbers) - set(available))
    if missing:
        raise ValueError(f"chapters must exist in book/; no chapter {missing} (there are {sorted(available)})")
    return [available[n] for n in sorted(set(numbers))]


def book_chapters(book: Path) -> dict[int, Path]:
    return {int(p.name[2:4]): p for p in sorted(book.glob("ch[0-9][0-9]_*.ipynb"))}


def _source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def solution_stub(label: str, code_cells: list[dict]) -> str:
    """The code a student edition shows in place of a worked solution.

    Keeps the names the solution defined (so that later cells still find them) and the checker calls
    (so that the student sees which check to pass), and reports "not done yet" instead of crashing.
    """
    defs: list[str] = []
    checks: list[str] = []
    for cell in code_cells:
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:
            continue  # IPython magics: nothing to keep
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                args = ast.unparse(node.args)
                defs.append(f"def {node.name}({args}):\n"
                            f"    raise NotImplementedError(\"{label}: not done yet\")")
            elif isinstance(node, ast.ClassDef):
                defs.append(f"class {node.name}:\n    def __init__(self, *args, **kwargs):\n"
                            f"        raise NotImplementedError(\"{label}: not done yet\")")
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "check"
                        and sub.args and isinstance(sub.args[0], ast.Constant)):
                    checks.append(ast.unparse(sub))
    blocks = [f"# Exercise {label}: your answer here, in place of the stub(s)."]
    blocks += defs
    if checks:
        blocks.append("\n".join(["try:", *(f"    {c}" for c in checks),
                                  "except (NotImplementedError, AssertionError) as error:  # reported, not raised",
                                  f"    print(\"{label}: not done yet:\", error)"]))
    else:
        blocks.append(f"print(\"{label}: not done yet\")")
    return blocks[0] + "\n" + "\n\n".join(blocks[1:])


def _markdown_part(cell: dict, text: str, suffix: str) -> dict | None:
    """A Markdown cell holding ``text`` (None when it is blank), its id ``cell``'s plus ``suffix``."""
    if not text.strip():
        return None
    return {"cell_type": "markdown", "id": f"{cell.get('id', 'cell')}{suffix}", "metadata": {},
            "source": text.strip("\n")}


def student_edition(nb: dict) -> tuple[dict, int]:
    """A copy of ``nb`` with every solution replaced by a stub; returns it and the number replaced.

    Only what lies between a ``{solution-start}`` fence and the end of the ``{solution-end}`` fence
    goes: text before the first in its cell (an exercise statement) and after the second (the next
    exercise) is kept as a Markdown cell of its own."""
    out = copy.deepcopy(nb)
    cells, kept, i, n = out["cells"], [], 0, 0
    while i < len(cells):
        found = START.search(_source(cells[i])) if cells[i]["cell_type"] == "markdown" else None
        if not found:
            kept.append(cells[i])
            i += 1
            continue
        label = found.group(1)
        opening = _START_FENCE.search(_source(cells[i]))
        before = _markdown_part(cells[i], _source(cells[i])[: opening.start() if opening else 0], "-before")
        if before is not None:
            kept.append(before)
        j = i
        while j < len(cells) and not (cells[j]["cell_type"] == "markdown" and END in _source(cells[j])):
            j += 1
        if j == len(cells):
            raise ValueError(f"solution {label} has no {END}")
        code = [c for c in cells[i:j + 1] if c["cell_type"] == "code"]
        base = cells[i].get("id", f"sol{i}")
        kept.append({"cell_type": "markdown", "id": f"{base}-student", "metadata": {},
                     "source": f"**Your answer** to {{ref}}`{label}`. The worked solution is in the "
                               "instructor edition."})
        kept.append({"cell_type": "code", "id": f"{base}-stub", "metadata": {}, "execution_count": None,
                     "outputs": [], "source": solution_stub(label, code)})
        n += 1
        closing = _END_FENCE.search(_source(cells[j]))
        after = _markdown_part(cells[j], _source(cells[j])[closing.end():], "-after") if closing else None
        if after is not None:  # e.g. the next exercise's statement: looked at again, it may open a solution too
            cells[j] = after
            i = j
        else:
            i = j + 1
    out["cells"] = kept
    return out, n
