"""A chapter's cells tagged ``slide`` / ``slide-continue`` as a reveal.js deck, the book's MyST turned
into the plain Markdown a deck renders (see ``companion.course``, "Slides")."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from companion.course.editions import _source

SLIDE_TYPES = {"slide": "slide", "slide-continue": "-"}  # cell tag -> reveal.js slide type
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
