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
import json
import shutil
import sys
import tempfile
from pathlib import Path

from companion.course.editions import END, START, book_chapters, parse_chapters, solution_stub, student_edition
from companion.course.editions import _source  # noqa: F401  (tests read pages with it)
from companion.course.folder import RECORD, SOURCES, Kept, check_out, merge_course, read_record
from companion.training.runlock import LOCK_NAME, folder_lock
from companion.course.references import (  # noqa: F401  (the course's public names, importable from here)
    _CARD_LINK, _EXPLICIT, _XREF, _page_text, degrade_references, page_labels, plain_references)
from companion.course.site import (
    INSTALL_NOTE, REPOSITORY, VENDORED, _vendored, course_config, course_toc, local_extensions)
from companion.course.slides import SLIDE_TYPES, myst_to_markdown, slides_notebook, write_slides

__all__ = ["main", "parse_chapters", "book_chapters", "student_edition", "solution_stub", "myst_to_markdown",
           "slides_notebook", "write_slides", "course_toc", "course_config", "local_extensions", "page_labels",
           "plain_references", "degrade_references", "check_out", "merge_course", "read_record", "Kept", "RECORD", "SOURCES",
           "REPOSITORY", "INSTALL_NOTE", "VENDORED", "SLIDE_TYPES", "START", "END", "ROOT"]

ROOT = Path(__file__).resolve().parent.parent.parent  # the repository, in a source checkout


def _folder(text: str) -> Path:
    """``--out``: a folder's name; '' names none (the same meaning as ``train --out ''``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("'' names no folder: name the folder to write the course into, e.g. "
                                         "--out course/ (--out . for the current folder)")
    return Path(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m companion course", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chapters", required=True, metavar="LIST",
                    help="which chapters: numbers and ranges, e.g. 1,3 or 1-3, or 'all'")
    ap.add_argument("--out", required=True, type=_folder, metavar="DIR",
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
        read_record(out)  # a record that names anything but a plain path inside OUT: refused before any work
    except ValueError as e:
        ap.error(str(e))
    if out.exists() and any(p.name != LOCK_NAME for p in out.iterdir()) and not args.force:
        ap.error(f"--out {out} is not empty (add --force to write into it)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # one cut at a time: a second one into the same folder is refused, not interleaved with this one
        with folder_lock(out, "course folder", "so another cut writing there would mix its files with this one's"):
            message, kept = _cut_and_merge(args, chapters, out, ap)
    except ValueError as e:
        ap.error(str(e))
    except OSError as e:  # a full or read-only disk, a quota: OUT is as it was before the merge
        where = f" ({e.filename})" if e.filename else ""
        ap.error(f"--out {out}: the course could not be written: {e.strerror or e}{where}. Free some space or "
                 "choose a writable folder, then cut again")
    print(message)
    if kept is not None:
        print(f"course: --force kept {len(kept.files)} file(s) edited since they were written (or not written by "
              f"a course cut) in {kept.folder}: {', '.join(kept.files)}")
    return 0



def _cut_and_merge(args, chapters: list[Path], final: Path, ap: argparse.ArgumentParser) -> tuple[str, Kept | None]:
    """Cut the course into a fresh folder beside ``final`` and only then merge it in (``merge_course``):
    a failure half-way leaves ``final`` as it was, and a file someone edited there is kept, not replaced."""
    out = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".course.tmp"))
    try:
        message = _cut(args, chapters, out, final, ap)
        return message, merge_course(out, final)
    finally:
        shutil.rmtree(out, ignore_errors=True)


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
