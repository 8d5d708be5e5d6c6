"""A Sphinx extension (loaded by _config.yml's ``local_extensions``): pages that load without console errors.

tools/check_browser.py found two errors on every page of a plain Jupyter Book 1 build, both caused
by the build, not by the browser:

- ``SyntaxError: Identifier 'THEBE_JS_URL' has already been declared``: the inline scripts that
  sphinx-thebe and sphinx-togglebutton add are registered twice (once by Jupyter Book, once by the
  theme), and a second ``const`` declaration stops the second script. Each page keeps the first copy
  of every script with the same source file and the same inline body.
- ``Got invalid theme mode: . Resetting to auto.`` on a reader's first visit: pydata-sphinx-theme
  writes the page context's ``default_mode`` into the page, and it is empty unless set. It is set to
  "auto" (follow the reader's system setting), which the theme would fall back to anyway.

- The widget JavaScript (require.js, the shims and the HTML widget manager, 4.4 MB with its
  dependencies) is loaded by myst-nb on every page whose notebook saved a widget state, even when no
  widget view is left on the page (the chapters' explorers show pre-drawn frames instead, and their
  live cells are kept off the page): such a page loads it for nothing and logs two console warnings.
  A page keeps those scripts only when its body holds a widget view.

It also gives each code cell tagged ``claim-<name>`` the HTML id ``claim-<name>``, so that the
generated index of checked claims (tools/backmatter.py, book/claims.md) links to the cell itself.

- A glued figure with a phone rendition is an HTML ``<picture>`` (companion.notebook.phone_figures), and
  myst-nb applies a ``{glue:figure}``'s ``:alt:`` only to a PNG output, so the figure would show the
  alt text generated from its labels instead of the one the chapter wrote. The chapter's own ``:alt:``
  is put on the picture's ``<img>``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path


def _default_mode(app, pagename, templatename, context, doctree) -> None:
    # pydata-sphinx-theme reads it from the page context (html_context), not from a theme option.
    if not context.get("default_mode"):
        context["default_mode"] = "auto"


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        attrs = getattr(js, "attributes", {}) or {}
        # An inline script's filename is None from one extension and "" from another: the same.
        filename = getattr(js, "filename", js) or ""
        key = (str(filename), str(attrs.get("body", "")), str(attrs.get("src", "")))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    scripts[:] = kept


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_KEYS = ("ipywidgets_state", "ipywidgets_")  # myst-nb's keys for the state and the manager's scripts


def _drop_unused_widget_js(app, doctree) -> None:
    """myst-nb registers the widget state and scripts per page (env.nb_metadata[docname]["js_files"]);
    a page whose doctree holds no widget view gets none of them."""
    from docutils import nodes

    meta = getattr(app.env, "nb_metadata", {}).get(app.env.docname, {})
    js_files = meta.get("js_files")
    if not js_files or any(WIDGET_VIEW in n.astext() for n in doctree.findall(nodes.raw)):
        return
    for key in [k for k in js_files if k.startswith(WIDGET_KEYS)]:
        del js_files[key]


GLUE_ALT = re.compile(r"```\{glue:figure\}\s*(\S+)\s*\n((?::[a-z]+:.*\n)*)")
IMG_ALT = re.compile(r'(<picture class="companion-figure">.*?<img [^>]*?alt=")[^"]*(")', re.S)


def authored_alts(path: Path) -> dict[str, str]:
    """{glued name: its ``:alt:``} of every ``{glue:figure}`` in a notebook's markdown cells (or a
    page's text)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    alts = {}
    for name, options in GLUE_ALT.findall(text):
        found = re.search(r"^:alt:[ \t]*(.*)$", options, re.M)
        if found:
            alts[name] = found.group(1).strip()
    return alts


def with_alt(raw_html: str, alt: str) -> str:
    """``raw_html`` with ``alt`` on its companion picture's ``<img>`` (unchanged without one)."""
    return IMG_ALT.sub(lambda m: m.group(1) + html.escape(alt, quote=True) + m.group(2), raw_html, count=1)


def _figure_alts(app, doctree) -> None:
    from docutils import nodes

    try:
        alts = authored_alts(Path(app.env.doc2path(app.env.docname)))
    except (OSError, ValueError, KeyError):  # not a page this can read: its figures keep the generated alt
        return
    for figure in doctree.findall(nodes.figure):
        alt = next((alts[n] for n in figure.get("names", []) if n in alts), None)
        if alt is None:
            continue
        for raw in figure.findall(nodes.raw):
            if "companion-figure" in raw.astext():
                new = with_alt(raw.astext(), alt)
                raw.replace_self(nodes.raw("", new, format=raw.get("format", "html")))


def _claim_ids(app, doctree) -> None:
    from docutils import nodes

    for node in doctree.findall(nodes.container):
        for cls in node.get("classes", []):
            if cls.startswith("tag_claim-") and cls[4:] not in node["ids"]:
                node["ids"].append(cls[4:])


def setup(app):
    app.connect("doctree-read", _claim_ids)
    app.connect("html-page-context", _default_mode, priority=100)
    # Early: html-page-context is emitted with emit_firstresult, so a handler after one that returns
    # a template name never runs.
    app.connect("html-page-context", _dedupe_scripts, priority=100)
    app.connect("doctree-read", _drop_unused_widget_js)
    app.connect("doctree-read", _figure_alts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
