"""Cross-references of a cut course: what each page defines (``page_labels``) and the references to
pages the cut leaves out made plain text (``plain_references``, ``degrade_references``), so that the
course builds without "undefined label" warnings."""

from __future__ import annotations

import json
import re
from pathlib import Path

from companion.course.editions import _source

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
