"""Check the built site works offline: every script and stylesheet is local and present.

Run after `jupyter-book build` (``make book`` does): python tools/check_site.py _build/html

For every HTML page it checks that
- no <script src> or <link rel=stylesheet> points off the machine (a CDN would fail offline);
- every local script, stylesheet and image it references exists in the build;
and for chapter pages (built from notebooks) that
- MathJax comes from the vendored copy, and pages with widgets carry their saved widget state and
  the vendored widget manager;
- exercises' solutions are collapsed (a dropdown) and equations are numbered;
- the book's own stylesheet (_static/companion.css) is linked and holds the layout rules that
  tools/check_layout.py measures in a browser: display maths scrolls sideways inside its own box
  beside its number, and code cells fit an 88-character line at 1280 px;
- a chapter page has its run-time line under the objectives, and its Exercises section opens with the
  difficulty legend (both written by tools/chapterpage.py).
"""

from __future__ import annotations

import sys
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse


class Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.styles: list[str] = []
        self.images: list[str] = []
        self.widget_state = False
        self.solution_dropdowns = 0
        self.equation_numbers = 0
        self.runtime_lines = 0
        self.exercises_sections = 0
        self.legends = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "script":
            if a.get("src"):
                self.scripts.append(a["src"])
            if a.get("type") == "application/vnd.jupyter.widget-state+json":
                self.widget_state = True
        elif tag == "link" and "stylesheet" in (a.get("rel") or ""):
            self.styles.append(a.get("href", ""))
        elif tag == "img" and a.get("src"):
            self.images.append(a["src"])
        if "solution" in classes and "dropdown" in classes:
            self.solution_dropdowns += 1
        if tag == "span" and "eqno" in classes:
            self.equation_numbers += 1
        if tag == "p" and "chapter-runtime" in classes:
            self.runtime_lines += 1
        if tag == "section" and a.get("id") == "exercises" or (tag == "section" and (a.get("id") or "").endswith("-exercises")):
            self.exercises_sections += 1
        if tag == "p" and "exercise-legend" in classes:
            self.legends += 1


# (selector, declaration) pairs that _static/companion.css must contain; see that file for the reasons.
REQUIRED_CSS = [
    ('div.math > mjx-container[display="true"]', "overflow-x: auto"),
    ('div.math > mjx-container[display="true"]', "min-width: 0"),
    ("div.math", "flex-direction: row-reverse"),
    ("div.math > span.eqno", "flex: none"),
    ("span.math > mjx-container", "overflow-x: auto"),
    ("div.cell div.cell_input pre", "font-size: 0.8125rem"),
    ("article figure img", "max-width: 100%"),  # a figure is scaled to its column (issue 39, item 1)
    ("article div.cell_output img", "max-width: 100%"),
    ("table td code", "white-space: nowrap !important"),  # no identifier split in a table cell (item 7)
]


def css_problems(css: str) -> list[str]:
    """Required rules missing from the book's stylesheet (comments ignored, whitespace normalised)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        declarations = {" ".join(d.split()) for d in body.split(";") if d.strip()}
        for selector in selectors.split(","):
            rules.setdefault(" ".join(selector.split()), set()).update(declarations)
    return [f"_static/companion.css: {selector} lacks '{declaration}'"
            for selector, declaration in REQUIRED_CSS if declaration not in rules.get(selector, set())]


def local_target(page: Path, ref: str) -> Path | None:
    parsed = urlparse(ref)
    if parsed.scheme in ("http", "https") or ref.startswith("//"):
        return None
    if parsed.scheme == "data":
        return page  # inline data exists by definition
    return (page.parent / unquote(parsed.path)).resolve()


def main(site: Path) -> int:
    problems: list[str] = []
    pages = sorted(site.rglob("*.html"))
    if not pages:
        print(f"check_site: no HTML under {site}; build the book first")
        return 1
    notebook_pages = 0
    for page in pages:
        if "_static" in page.parts or "vendor" in page.parts:
            continue
        refs = Refs()
        refs.feed(page.read_text(errors="replace"))
        rel = page.relative_to(site)
        for ref in refs.scripts + refs.styles + refs.images:
            target = local_target(page, ref)
            if target is None:
                problems.append(f"{rel}: loads {ref} from the network")
            elif not target.exists():
                problems.append(f"{rel}: {ref} is missing from the build")
        is_notebook = (site / "_sources" / rel.with_suffix(".ipynb")).exists()
        if is_notebook:
            notebook_pages += 1
            if not any("vendor/mathjax/" in s for s in refs.scripts):
                problems.append(f"{rel}: MathJax is not loaded from the vendored copy")
            if refs.widget_state and not any("vendor/widgets/embed-amd.js" in s for s in refs.scripts):
                problems.append(f"{rel}: has widget state but not the vendored widget manager")
            if "exercise" in page.read_text(errors="replace") and refs.solution_dropdowns == 0:
                problems.append(f"{rel}: has exercises but no collapsed (dropdown) solution")
            if refs.runtime_lines != 1:  # tools/chapterpage.py, from book/chapter_times.json (issue 39, item 4)
                problems.append(f"{rel}: {refs.runtime_lines} run-time lines under the objectives (want 1)")
            text = page.read_text(errors="replace")
            if 'id="exercises"' in text and refs.legends == 0 and not re.search(
                    r'id="exercises".{0,3000}?difficulty', text, re.S):
                problems.append(f"{rel}: its Exercises section has no difficulty legend (tools/chapterpage.py)")
            if refs.equation_numbers == 0:
                problems.append(f"{rel}: no numbered equation found")
            if not any(s.split("?")[0].endswith("_static/companion.css") for s in refs.styles):
                problems.append(f"{rel}: does not link the book's stylesheet _static/companion.css")
    stylesheet = site / "_static" / "companion.css"
    if stylesheet.exists():
        problems += css_problems(stylesheet.read_text())
    else:
        problems.append("_static/companion.css is missing from the build")
    for p in problems:
        print("check_site:", p)
    print(f"check_site: {len(pages)} pages, {notebook_pages} from notebooks, {len(problems)} problems")
    return 1 if problems or notebook_pages == 0 else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html")))
