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

It also gives each code cell tagged ``claim-<name>`` the HTML id ``claim-<name>``, so that the
generated index of checked claims (tools/backmatter.py, book/claims.md) links to the cell itself.
"""

from __future__ import annotations


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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
