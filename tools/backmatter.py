"""Generate the book's back-matter indexes from the chapter notebooks.

    python tools/backmatter.py           # write book/exercises_index.md, book/claims.md, book/instructor.md
    python tools/backmatter.py --check   # exit 1 when a tagged claim has no check (writes nothing)

``make book`` runs it before the build, so the indexes always list what the chapters hold.

**Exercises.** Every ``{exercise}`` directive of every ``book/chNN_*.ipynb``, by chapter, with its
difficulty, read from the ``[1]``/``[2]``/``[3]`` at the end of its title (CONTRIBUTING.md,
"Exercises"), and whether the package has a checker for it (a ``check("chNN.name", ...)`` call in
its worked solution).

**Checked claims.** The convention: the code cell that checks a claim of the text carries a cell tag
``claim-<name>`` (for example ``claim-softmax-shift``), and optionally cell metadata
``"claim": "<the claim in one sentence>"``; without it, the cell's first comment line is the claim.
The tagged cell must check: it holds an ``assert`` statement or an ``assert_close``/``assert_allclose``
call (``--check`` and tests/test_backmatter.py fail otherwise). tools/sitefix.py gives the rendered
cell the HTML id ``<name>`` (the tag itself), so the index links straight to the cell.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXERCISE = re.compile(r"```\{exercise\}\s*(?P<title>[^\n]*?)\s*\[(?P<level>[123])\]\s*\n:label:\s*(?P<label>\S+)")
CHECK = re.compile(r"""check\(\s*["'](ch\d\d\.[\w.]+)["']""")
LEVELS = {"1": "1 (applies the text)", "2": "2 (combines ideas)", "3": "3 (harder, or open)"}


@dataclass
class Claim:
    chapter: str
    name: str
    text: str
    checked: bool
    section: str = ""  # "10.3 Positions, the (T,S) mask and RoPE": where the checking cell sits


def chapters(book: Path) -> list[Path]:
    """The chapter notebooks of ``book``, only those the table of contents lists when there is one
    (a chapter still being written is not in the book yet, and a link to it would break the build)."""
    found = sorted(book.glob("ch[0-9][0-9]_*.ipynb"))
    toc = book.parent / "_toc.yml"
    if toc.exists():
        listed = set(re.findall(r"file:\s*(\S+)", toc.read_text()))
        found = [p for p in found if f"{book.name}/{p.stem}" in listed]
    return found


def _source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def chapter_title(nb: dict) -> str:
    for line in _source(nb["cells"][0]).splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return "?"


def exercises(nb: dict) -> list[dict]:
    """Every exercise of a notebook: title, difficulty, label and the checker its solution calls."""
    found, checkers, current = [], {}, None
    for cell in nb["cells"]:
        text = _source(cell)
        for m in EXERCISE.finditer(text):
            found.append({"title": m["title"], "level": m["level"], "label": m["label"]})
        start = re.search(r"\{solution-start\}\s+(\S+)", text)
        if start:
            current = start.group(1)
        if current and cell["cell_type"] == "code":
            checkers.setdefault(current, []).extend(CHECK.findall(text))
        if "{solution-end}" in text:
            current = None
    for ex in found:
        ex["checkers"] = sorted(set(checkers.get(ex["label"], [])))
    return found


def _checks(code: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("assert_close", "assert_allclose"):
                return True
    return False


def chapter_number(chapter: str) -> int | None:
    m = re.match(r"ch(\d\d)_", chapter)
    return int(m.group(1)) if m else None


def sections(nb: dict, chapter: str) -> list[str]:
    """For each cell, the numbered section it sits in, as the rendered book numbers it ("10.3 Title"):
    the chapter's ``##`` headings counted in order (Summary and Exercises included)."""
    number, count, current, out = chapter_number(chapter), 0, "", []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in _source(cell).splitlines():
                if line.startswith("## "):
                    count += 1
                    current = f"{number}.{count} {line[3:].strip()}" if number else line[3:].strip()
        out.append(current)
    return out


def claims(nb: dict, chapter: str) -> list[Claim]:
    out = []
    where = sections(nb, chapter)
    for cell, section in zip(nb["cells"], where):
        for tag in cell.get("metadata", {}).get("tags", []):
            if not tag.startswith("claim-"):
                continue
            code = _source(cell)
            text = cell.get("metadata", {}).get("claim")
            if not text:
                comment = next((l.strip("# ").strip() for l in code.splitlines() if l.strip().startswith("#")), "")
                text = comment or tag
            out.append(Claim(chapter, tag, text, cell["cell_type"] == "code" and _checks(code), section))
    return out


# --- claims in the chapters' plain-text notation, typeset for the page --------------------------------
# A claim is written once, in a cell's metadata or first comment, in the plain notation of code comments
# ("dV = A^T dO", "sqrt(d_k)", "(1 - eps) one-hot + eps/K"). ``typeset`` turns its runs of notation
# into MyST maths ($...$) and its code names into code; a claim that already holds $...$ is kept as is.
GREEK = {"alpha": r"\alpha", "beta": r"\beta", "beta1": r"\beta_1", "beta2": r"\beta_2", "gamma": r"\gamma",
         "eps": r"\varepsilon", "epsilon": r"\varepsilon", "lambda": r"\lambda", "pi": r"\pi", "theta": r"\theta",
         "omega": r"\omega", "sigma": r"\sigma", "mu": r"\mu", "tau": r"\tau", "eta": r"\eta"}
SYMBOLS = {"lr": r"\mathrm{lr}", "x": r"\times", "*": r"\cdot", "->": r"\to", "<=": r"\le", ">=": r"\ge"}
OPERATORS = {"=", "+", "-", "*", "/", "x", "->", "<=", ">=", "<", ">", "~", ":"}
_CODE = re.compile(r"^(?:[A-Za-z]\w*\.)+[A-Za-z_]\w*(?:\(\))?$|^[a-z]{3,}_[a-z_0-9]+$")
GENERATED = "% Generated by tools/backmatter.py from the chapters: do not edit by hand."
_KEEP = {"sqrt", "sum", "hat", "top", "times", "cdot", "mathrm", "frac", *GREEK}


def _tex_atom(w: str) -> str:
    """One token of plain notation as TeX: sqrt(.), sum_j, x_y, x^y, A^T, 1e-5, Greek names, lr, words."""
    if w in SYMBOLS:
        return SYMBOLS[w]
    w = re.sub(r"\b([a-z]{3,})\b", lambda m: m[1] if m[1] in _KEEP else r"\mathrm{" + m[1] + "}", w)
    w = re.sub(r"sqrt\(([^()]*)\)", r"\\sqrt{\1}", w)
    w = re.sub(r"\bsum_", r"\\sum_", w)
    w = re.sub(r"(-?\d+(?:\.\d+)?)e(-?\d+)\b",
               lambda m: (m[1] + r" \times " if m[1].lstrip("-") != "1" else m[1][:-1]) + "10^{" + m[2] + "}", w)
    w = re.sub(r"\^T\b", r"^\\top", w)
    w = re.sub(r"\^\(([^()]*)\)", r"^{\1}", w)
    w = re.sub(r"\^(-?[\w/]+)", lambda m: "^{" + m[1] + "}", w)
    w = re.sub(r"\b([A-Za-z]+)_hat\b", r"\\hat{\1}", w)
    w = re.sub(r"_([A-Za-z0-9]{2,})", lambda m: "_{" + (m[1] if len(m[1]) <= 2 else r"\mathrm{" + m[1] + "}") + "}", w)
    w = re.sub(r"\b(beta1|beta2|lr)\b|(?<!\\)\b([a-z]{2,7})\b",
               lambda m: GREEK.get(m[0], SYMBOLS.get(m[0], m[0])) if (m[1] or m[0] in GREEK) else m[0], w)
    return w


def _kind(core: str) -> str:
    """'code', 'math' (surely notation), 'op', 'maybe' (a number or a tuple: notation only beside
    notation) or 'text'."""
    if not core:
        return "text"
    if core.startswith("sum_"):
        return "math"
    if _CODE.match(core) and not re.match(r"^[A-Za-z]_", core):
        return "code"
    if core in OPERATORS:
        return "op"
    if (core in GREEK or core == "lr" or re.match(r"^\(?d[A-Z]\w*\)?$", core) or re.search(r"[_^=]|sqrt\(", core)
            or re.match(r"^-?\d+(?:\.\d+)?e-?\d+$", core) or re.match(r"^[A-Za-z]\(", core)
            or re.match(r"^\(?\d+[a-wyz](/\d+)?\)?$", core)  # 8d/3, 2g (not 8x: "eight times")
            or re.match(r"^\(?[b-zB-HJ-Z]\)?$", core)):  # one letter (not the words "a", "A", "I")
        return "math"
    if re.match(r"^\(?-?[\w.]+(?:,\x00-?[\w.]+)*\)?$", core) and all(
            part.strip("()-").replace(".", "").isdigit() or re.match(r"^\(?-?[b-zB-HJ-Z]\)?$", part)
            for part in core.split(",\x00")):
        return "maybe"
    return "text"


def typeset(text: str) -> str:
    """``text`` with its runs of plain notation set as MyST maths ($...$) and its code names as code."""
    if "$" in text or "`" in text:
        return text
    # a tuple "(2, 4, 6, 8)" is one token
    text = re.sub(r"\((?:-?[\w.]+, )+-?[\w.]+\)", lambda m: m[0].replace(", ", ",\x00"), text)
    tokens = text.split(" ")
    cores = [re.match(r"^(.*?)([,;:.]*)$", tok).groups() for tok in tokens]
    kinds = [_kind(core) for core, _ in cores]
    out, i = [], 0
    while i < len(tokens):
        core, tail = cores[i]
        if kinds[i] == "code":
            out.append(f"`{core}`{tail}")
            i += 1
            continue
        if kinds[i] in ("math", "op", "maybe"):
            j = i
            while j + 1 < len(tokens) and kinds[j + 1] in ("math", "op", "maybe") and not cores[j][1]:
                j += 1
            while j > i and kinds[j] == "op":  # a run ends on notation, not on an operator
                j -= 1
            run = [c for c, _ in cores[i:j + 1]]
            ops_inside = any(k == "op" for k in kinds[i:j + 1])
            if kinds[i] != "op" and ("math" in kinds[i:j + 1] or (ops_inside and j > i)):
                joined = " ".join(run)
                lead = trail = ""
                if joined.startswith("(") and joined.count("(") > joined.count(")"):
                    lead, joined = "(", joined[1:]
                if joined.endswith(")") and joined.count(")") > joined.count("("):
                    trail, joined = ")", joined[:-1]
                tex = " ".join(_tex_atom(c) for c in joined.split(" "))
                out.append(f"{lead}${tex}${trail}{cores[j][1]}".replace("\x00", " "))
                i = j + 1
                continue
        out.append(tokens[i].replace("\x00", " "))
        i += 1
    return " ".join(out)


def exercises_page(book: Path) -> str:
    lines = ["(exercises-index)=", "# Exercises by chapter", GENERATED, "",
             "Difficulty: "
             "**1** applies the text in a few lines, **2** combines ideas or needs a derivation, "
             "**3** is a new implementation or an experiment to design. A *checker* is the name to pass "
             "to `companion.exercises.check` to test your answer.", ""]
    total = {"1": 0, "2": 0, "3": 0}
    for path in chapters(book):
        nb = json.loads(path.read_text())
        lines += [f"## {chapter_number(path.stem)}. {chapter_title(nb)}", "", f"In {{doc}}`{path.stem}`:", "",
                  "| exercise | difficulty | checker |", "|---|---|---|"]
        for ex in exercises(nb):
            total[ex["level"]] += 1
            check = ", ".join(f"`{c}`" for c in ex["checkers"]) or "-"
            lines.append(f"| {{ref}}`{ex['title']} <{ex['label']}>` | {ex['level']} | {check} |")
        lines.append("")
    lines.append(f"In all: {total['1']} of difficulty 1, {total['2']} of difficulty 2, {total['3']} of difficulty 3.")
    return "\n".join(lines) + "\n"


def claims_page(book: Path) -> str:
    lines = ["(claims-index)=", "# Index of checked claims", GENERATED, "",
             "Every claim below is checked by a code cell of its chapter: the cell computes it and asserts it, "
             "and the chapter's tests run that cell. The claims are grouped by chapter and section; "
             "*check* opens the cell.", ""]
    n = 0
    for path in chapters(book):
        nb = json.loads(path.read_text())
        found = claims(nb, path.stem)
        if not found:
            continue
        number = chapter_number(path.stem)
        lines += [f"## {number}. {chapter_title(nb)}", "", f"In {{doc}}`{path.stem}`:", ""]
        section = None
        for k, c in enumerate(found):
            if c.section != section:
                section = c.section
                if section:
                    lines += [f"**{typeset(section)}**", ""]
            n += 1
            nxt = found[k + 1] if k + 1 < len(found) else None
            lines.append(f"- {typeset(c.text)} "
                         f"<a class=\"claim-check\" href=\"{path.stem}.html#{c.name}\" title=\"{c.name}\">check</a>")
            if nxt is None or nxt.section != section:
                lines.append("")
    if n == 0:
        lines.append("No chapter tags its checking cells yet.")
    return "\n".join(lines) + "\n"


def run_times_table(times_file: Path, listed: list[Path]) -> str:
    """The run-time table of the instructor guide, from the last full nbval run's record."""
    if not times_file.exists():
        return ("No full test run has been recorded yet: `make test` writes `book/chapter_times.json` "
                "after it has executed every chapter without a failure.")
    rec = json.loads(times_file.read_text())
    secs = rec["seconds"]
    lines = [f"Measured by the last full `make test` ({rec['date']}, torch {rec['torch']}): each chapter "
             f"executed top to bottom under nbval in the default (quick) profile, on one torch thread, "
             f"{rec['workers']} chapter(s) at a time on {rec['cores']} cores of {rec['cpu']}. The book's "
             "budget is 120 s a chapter on such a machine; a laptop is usually faster. No GPU run of the "
             "gpu profile has been recorded yet (`benchmarks/gpu_check.sh` is the prepared one).", "",
             "| chapter | seconds (wall clock, CPU only) |", "|---|---:|"]
    total = 0.0
    for path in listed:
        s = secs.get(path.name)
        total += s or 0.0
        lines.append(f"| {{doc}}`{path.stem}` | {s:.0f} |" if s is not None else f"| {{doc}}`{path.stem}` | not measured |")
    lines.append(f"| all chapters | {total:.0f} |")
    return "\n".join(lines)


def homework_table(book: Path) -> str:
    """Exercises with a checker (they grade themselves) and the open-ended ones, by chapter."""
    lines = ["Exercises with a checker grade themselves (the student calls `check(...)`); difficulty 3 ones "
             "suit projects. Full list with difficulties: {ref}`exercises-index`.", "",
             "| chapter | self-checking (difficulty) | projects (difficulty 3) |", "|---|---|---|"]
    for path in chapters(book):
        found = exercises(json.loads(path.read_text()))
        checked = [f"{{ref}}`{e['title']} <{e['label']}>` ({e['level']})" for e in found if e["checkers"]]
        projects = [f"{{ref}}`{e['title']} <{e['label']}>`" for e in found if e["level"] == "3"]
        lines.append(f"| {{doc}}`{path.stem}` | {'; '.join(checked) or '-'} | {'; '.join(projects) or '-'} |")
    return "\n".join(lines)


def instructor_page(book: Path, template: Path, times_file: Path) -> str:
    text = template.read_text()
    text = text.replace("{{RUN_TIMES}}", run_times_table(times_file, chapters(book)))
    return text.replace("{{HOMEWORK}}", homework_table(book))


def unchecked(book: Path) -> list[Claim]:
    return [c for p in chapters(book) for c in claims(json.loads(p.read_text()), p.stem) if not c.checked]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--book", type=Path, default=ROOT / "book", help="the folder of the chapters (default: book/)")
    ap.add_argument("--check", action="store_true", help="only check that every tagged claim is checked")
    args = ap.parse_args(argv)
    bad = unchecked(args.book)
    for c in bad:
        print(f"backmatter: {c.chapter}: the cell tagged {c.name} checks nothing (no assert, no assert_close)")
    if args.check:
        return 1 if bad else 0
    (args.book / "exercises_index.md").write_text(exercises_page(args.book))
    (args.book / "claims.md").write_text(claims_page(args.book))
    (args.book / "instructor.md").write_text(
        instructor_page(args.book, ROOT / "tools" / "instructor_template.md", args.book / "chapter_times.json"))
    print(f"backmatter: wrote {args.book / 'exercises_index.md'}, {args.book / 'claims.md'} and "
          f"{args.book / 'instructor.md'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
