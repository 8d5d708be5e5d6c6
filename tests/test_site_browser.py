"""tools/check_browser.py: the browser check finds each kind of problem, and passes a clean page.

The pages here are small synthetic ones, so the test does not need a built book; ``make site-check``
(run by ``make book``) applies the same check to every page of _build/html. Needs a Chromium
(``apt-get install chromium-headless-shell``); skipped with that message otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import check_browser  # noqa: E402
import sitefix  # noqa: E402

PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8Dw"
         "HwAFBQIAX8jx0gAAAABJRU5ErkJggg==")

CLEAN = f"""<!doctype html><html><head><meta charset="utf-8"></head><body>
<p>A clean page.</p><img src="{PIXEL}" alt="one pixel">
<pre style="overflow-x: auto; max-width: 100%">{"x" * 400}</pre>
</body></html>"""

BROKEN = """<!doctype html><html><head><meta charset="utf-8"></head><body>
<p>Raw maths: $$a + b$$</p>
<img src="missing.png" alt="missing">
<div style="width: 900px">too wide</div>
<script>console.error("boom from the page");</script>
<script src="https://example.com/lib.js"></script>
</body></html>"""

needs_chrome = pytest.mark.skipif(check_browser.find_chrome() is None,
                                  reason="no Chromium: apt-get install chromium-headless-shell (or set $CHROME)")


def _check(tmp_path, capsys, page: str, html: str) -> tuple[int, str]:
    (tmp_path / page).write_text(html)
    rc = check_browser.main([str(tmp_path), "--pages", page, "--widths", "400", "--no-screenshots",
                             "--config", str(ROOT / "_config.yml")])
    return rc, capsys.readouterr().out


@needs_chrome
def test_clean_page_passes(tmp_path, capsys):
    rc, out = _check(tmp_path, capsys, "clean.html", CLEAN)
    assert rc == 0, out
    assert "clean.html @ 400 px" in out and ": ok" in out


@needs_chrome
def test_broken_page_reports_each_problem(tmp_path, capsys):
    rc, out = _check(tmp_path, capsys, "broken.html", BROKEN)
    assert rc == 1
    assert "raw TeX left in the text" in out
    assert "images that did not load: ['missing.png']" in out
    assert "wider than the 400 px window" in out
    assert "boom from the page" in out
    assert "network request refused" in out and "example.com/lib.js" in out


@needs_chrome
def test_screenshot_is_saved_per_page_and_width(tmp_path, capsys):
    site = tmp_path / "site"
    site.mkdir()
    (site / "clean.html").write_text(CLEAN)
    shots = tmp_path / "shots"
    assert check_browser.main([str(site), "--widths", "400", "--screenshots", str(shots),
                               "--config", str(ROOT / "_config.yml")]) == 0
    png = (shots / "clean-400.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == 400  # the PNG header's width


def test_problems_of_flags_solutions_that_do_not_toggle(tmp_path):
    report = {"mathjax": "done", "raw_tex": [], "math_errors": 0, "images": [], "widgets": {"views": 2, "drawn": 1},
              "solutions": [{"id": "s1", "collapsed_before": False, "open_after": True},
                            {"id": "s2", "collapsed_before": True, "open_after": False}],
              "links": {"launch": [], "download": []}, "page_width": 400, "client_width": 400, "wide": [],
              "console": []}
    (tmp_path / "p.html").write_text("")
    problems = check_browser.problems_of(report, tmp_path / "p.html", tmp_path, 400, "https://github.com/o/r")
    assert "solution s1 is open before its toggle is clicked" in problems
    assert "solution s2 does not open when its toggle is clicked" in problems
    assert "1 of 2 widgets were not drawn" in problems
    report["solutions"] = [{"id": "s3", "collapsed_before": True, "open_after": True, "cut": 2}]
    wide = check_browser.problems_of(report, tmp_path / "p.html", tmp_path, 1280, "https://github.com/o/r")
    assert "solution s3: 2 code block(s) wider than the solution box" in wide
    report["first_screen"] = {"runtime": 1042, "objectives": 400}  # ch01 at 1280 px before the move
    late = check_browser.problems_of(report, tmp_path / "p.html", tmp_path, 1280, "https://github.com/o/r")
    assert "the run-time line ends 1042 px down (want within 800 px)" in late
    assert not any("objectives" in p for p in late)
    assert not any("run-time" in p for p in check_browser.problems_of(
        report, tmp_path / "p.html", tmp_path, 400, "https://github.com/o/r"))  # two screens on a phone
    report["first_screen"] = None
    report.update(widget_js=3, widgets={"views": 0, "drawn": 0})
    assert "3 widget script(s) loaded on a page with no widget view" in check_browser.problems_of(
        report, tmp_path / "p.html", tmp_path, 1280, "https://github.com/o/r")
    assert not any("s3" in p for p in check_browser.problems_of(report, tmp_path / "p.html", tmp_path, 400,
                                                                  "https://github.com/o/r"))


def test_problems_of_checks_launch_and_download_links_of_a_chapter(tmp_path):
    (tmp_path / "_sources" / "book").mkdir(parents=True)
    (tmp_path / "_sources" / "book" / "ch09_x.ipynb").write_text("{}")
    (tmp_path / "book").mkdir()
    page = tmp_path / "book" / "ch09_x.html"
    page.write_text("")
    report = {"mathjax": "done", "raw_tex": [], "math_errors": 0, "images": [], "widgets": {"views": 0, "drawn": 0},
              "solutions": [], "page_width": 400, "client_width": 400, "wide": [], "console": [],
              "links": {"launch": ["https://colab.research.google.com/github/o/r/blob/main/book/ch09_x.ipynb",
                                   "https://mybinder.org/v2/gh/o/other/main?urlpath=tree/book/ch09_x.ipynb"],
                        "download": ["../_sources/book/ch09_x.ipynb"]}}
    problems = check_browser.problems_of(report, page, tmp_path, 400, "https://github.com/o/r")
    assert problems == ["the mybinder.org launch button does not open o/r/book/ch09_x.ipynb: "
                        "https://mybinder.org/v2/gh/o/other/main?urlpath=tree/book/ch09_x.ipynb"]


def test_repository_url_is_read_from_config():
    assert check_browser.repository_url(ROOT / "_config.yml").startswith("https://github.com/")


def test_sitefix_keeps_one_copy_of_each_inline_script():
    class JS(str):
        def __new__(cls, filename, body):
            obj = super().__new__(cls, filename or "")
            obj.filename, obj.attributes = filename, {"body": body}
            return obj

    scripts = [JS("a.js", ""), JS(None, "const X = 1"), JS("", "const X = 1"), JS(None, "const Y = 2")]
    context = {"script_files": scripts}
    sitefix._dedupe_scripts(None, "p", "page.html", context, None)
    assert [(s.filename, s.attributes["body"]) for s in context["script_files"]] == [
        ("a.js", ""), (None, "const X = 1"), (None, "const Y = 2")]


def test_sitefix_drops_widget_javascript_from_pages_without_a_widget_view():
    from types import SimpleNamespace

    from docutils import nodes
    from docutils.utils import new_document

    def page(*raw: str):
        doc = new_document("<page>")
        doc += nodes.paragraph("frames only", "frames only")
        for html in raw:
            doc += nodes.raw(html, html, format="html")
        js = {"ipywidgets_state": (None, {}), "ipywidgets_0": ("require.js", {}), "thebe": ("thebe.js", {})}
        env = SimpleNamespace(docname="ch", nb_metadata={"ch": {"js_files": js}})
        return SimpleNamespace(env=env), doc, js

    app, doc, js = page("<img src='frame.png'>")
    sitefix._drop_unused_widget_js(app, doc)
    assert list(js) == ["thebe"]
    app, doc, js = page(f'<script type="{sitefix.WIDGET_VIEW}">{{}}</script>')
    sitefix._drop_unused_widget_js(app, doc)
    assert list(js) == ["ipywidgets_state", "ipywidgets_0", "thebe"]  # a live widget keeps its manager


def test_a_load_event_that_came_before_the_navigate_reply_is_not_waited_for_again():
    browser = check_browser.Browser.__new__(check_browser.Browser)  # no Chromium: only the event logic

    class Silent:  # the tab: waiting on it is where new events would come in
        def wait_for_timeout(self, ms):
            raise AssertionError("waited for a second load event that will never come")

    browser.page, browser.events = Silent(), [{"method": "Page.frameNavigated"}, {"method": "Page.loadEventFired"}]
    browser.wait_for("Page.loadEventFired", since=0)  # already there: returns without waiting
    with pytest.raises(AssertionError, match="second load event"):
        browser.wait_for("Page.loadEventFired", since=2)  # only events after the mark count


@needs_chrome
def test_a_frame_player_moves_its_picture_and_a_dead_slider_is_reported(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    from companion.notebook.widgets import softmax_temperature_frames

    player = softmax_temperature_frames([2.0, 1.0, 0.0], ["a", "b", "c"], scales=(0.5, 1.0, 2.0))._repr_html_()
    page = f'<!doctype html><html><head><meta charset="utf-8"></head><body>{player}</body></html>'
    rc, out = _check(tmp_path, capsys, "frames.html", page)
    assert rc == 0, out
    # planted failures: a player whose frames are all one picture, and a live widget's slider
    frozen = player.replace('oninput="', 'data-off="')
    dead = '<div class="widget-slider">0.50</div>'
    rc, out = _check(tmp_path, capsys, "dead.html", page.replace(player, frozen + dead))
    assert rc == 1
    assert "1 of 1 pre-drawn frame players did not change their picture" in out
    assert "1 live widget slider(s)" in out


NAV = """<!doctype html><html><head><meta charset="utf-8"></head><body>
<button class="primary-toggle" aria-label="Site navigation" style="width:40px;height:30px"
        onclick="document.getElementById('menu').showModal()">=</button>
<button class="secondary-toggle" aria-label="On this page" style="width:40px;height:30px"
        onclick="{secondary}">#</button>
<dialog id="menu"><p>chapters</p></dialog><dialog id="toc"><p>contents</p></dialog>
</body></html>"""


@needs_chrome
def test_header_buttons_must_open_their_drawers(tmp_path, capsys):
    """The phone's menu and page-contents buttons are tapped; one that opens nothing is reported
    (sphinx-book-theme 1.3.0 on pydata-sphinx-theme 0.17.1 bound their handlers to hidden copies)."""
    rc, out = _check(tmp_path, capsys, "nav.html", NAV.format(secondary="document.getElementById('toc').showModal()"))
    assert rc == 0, out
    rc, out = _check(tmp_path, capsys, "dead_nav.html", NAV.format(secondary=""))  # planted: does nothing
    assert rc == 1
    assert "the header button 'On this page' (secondary sidebar) opens or hides nothing when tapped" in out
    assert "'Site navigation'" not in out
    hidden = NAV.format(secondary="").replace('class="primary-toggle"', 'class="primary-toggle" hidden')
    rc, out = _check(tmp_path, capsys, "no_menu.html", hidden)
    assert "no visible button opens the chapter list" in out


SIDEBAR = """<!doctype html><html><head><meta charset="utf-8"></head><body style="font: 16px sans-serif">
<div class="bd-sidebar-primary" style="width: 185px"><nav>
<a href="#" style="display: block">1. Attention</a>
<a href="#" style="display: block">{long}</a>
</nav></div></body></html>"""


@needs_chrome
def test_a_sidebar_entry_over_two_lines_is_reported(tmp_path, capsys):
    """At 1280 px each entry of the chapter list takes at most two lines (the 205 px sidebar wrapped
    ch06's and ch12's titles to four); on a phone the list is a drawer and is not measured."""
    long = "12. Paged KV caches, prefix sharing, quantisation and continuous batching"  # planted
    (tmp_path / "nav.html").write_text(SIDEBAR.format(long=long))
    args = ["--pages", "nav.html", "--no-screenshots", "--config", str(ROOT / "_config.yml")]
    rc = check_browser.main([str(tmp_path), "--widths", "1280", *args])
    out = capsys.readouterr().out
    assert rc == 1
    assert "1 sidebar entry takes more than 2 lines: '12. Paged KV caches, prefix sharing" in out
    assert "'1. Attention'" not in out
    assert check_browser.main([str(tmp_path), "--widths", "400", *args]) == 0, capsys.readouterr().out
    (tmp_path / "nav.html").write_text(SIDEBAR.format(long="12. Paged caches and batching"))
    assert check_browser.main([str(tmp_path), "--widths", "1280", *args]) == 0, capsys.readouterr().out


@needs_chrome
def test_the_landing_page_must_link_every_page_of_the_table_of_contents(tmp_path, capsys):
    """The landing page (the table of contents' root) links each listed page from its own text; a link
    in the sidebar does not count (the phone's sidebar is a drawer)."""
    (tmp_path / "book").mkdir()
    for name in ("ch01_a", "ch02_b"):
        (tmp_path / "book" / f"{name}.html").write_text("<p>a chapter</p>")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nparts:\n  - caption: Part I\n"
                                       "    chapters:\n      - file: book/ch01_a\n      - file: book/ch02_b\n"
                                       "        title: B\n")
    page = ('<!doctype html><html><head><meta charset="utf-8"></head><body>'
            '<nav><a href="ch02_b.html">B</a></nav><article>{links}</article></body></html>')
    args = [str(tmp_path), "--pages", "book/intro.html", "--widths", "400", "--no-screenshots",
            "--config", str(ROOT / "_config.yml"), "--toc", str(tmp_path / "_toc.yml")]
    (tmp_path / "book" / "intro.html").write_text(page.format(links='<a href="ch01_a.html#top">A</a>'))
    rc, out = check_browser.main(args), capsys.readouterr().out
    assert rc == 1
    assert "the landing page links 1 of the 2 pages of the table of contents; not: book/ch02_b" in out
    (tmp_path / "book" / "intro.html").write_text(page.format(links='<a href="ch01_a.html">A</a> '
                                                                    '<a href="./ch02_b.html">B</a>'))
    assert check_browser.main(args) == 0, capsys.readouterr().out


def _search_site(tmp_path: Path, name: str, fix: bool) -> Path:
    """A two-page Sphinx site whose search finds a formula: with ``fix``, it loads the book's
    _static/search_snippets.js as the book does."""
    import subprocess

    src, out = tmp_path / f"{name}-src", tmp_path / name
    (src / "_static").mkdir(parents=True)
    (src / "_static" / "search_snippets.js").write_text((ROOT / "_static" / "search_snippets.js").read_text())
    (src / "_static" / "nomath.js").write_text("")  # no MathJax from the network
    (src / "conf.py").write_text("extensions = ['sphinx.ext.mathjax']\nhtml_theme = 'basic'\n"
                                 "html_static_path = ['_static']\nmathjax_path = 'nomath.js'\n"
                                 + ("html_js_files = ['search_snippets.js']\n" if fix else ""))
    (src / "index.rst").write_text("Scores\n======\n\n.. toctree::\n\n   plain\n\nAttention divides by "
                                   ":math:`\\sqrt{d_k}` and by :math:`\\frac{1}{\\tau}` before the softmax.\n\n"
                                   ":math:`\\frac{\\hat m}{\\sqrt{\\hat v} + \\epsilon}` moves.\n\n"
                                   ".. math:: \\alpha_{ij} = \\mathrm{softmax}(s)_j\n")
    (src / "plain.rst").write_text("Plain\n=====\n\nA page without formulas.\n")
    subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src), str(out)], check=True)
    return out


@needs_chrome
def test_search_snippets_with_raw_tex_are_reported(tmp_path, capsys):
    """Sphinx builds a search result's snippet from the page's HTML, where MathJax has not run: a
    plain site shows `\\(\\sqrt{d_k}\\)` (planted); the book's search_snippets.js shows plain text."""
    args = ["--pages", "plain.html", "--widths", "400", "--no-screenshots", "--config", str(ROOT / "_config.yml"),
            "--search", "attention"]
    plain = _search_site(tmp_path, "plain", fix=False)
    rc, out = check_browser.main([str(plain), *args]), capsys.readouterr().out
    assert rc == 1
    assert "search 'attention': 1 results, 1 snippets: 1 of 1 snippets show raw TeX, e.g. '..." in out
    assert "Attention divides by \\(\\sqrt{d_k}\\) and by \\(\\frac{1}" in out
    fixed = _search_site(tmp_path, "fixed", fix=True)
    assert check_browser.main([str(fixed), *args]) == 0, capsys.readouterr().out
    with check_browser.Browser(check_browser.find_chrome()) as browser, check_browser.served(fixed) as base:
        browser.allow = (base,)
        state = check_browser.search_snippets(browser, base, "attention")
    assert state["results"] == 1
    assert "Attention divides by √d_k and by 1/τ before the softmax. m/(√v + ε) moves. α_ij = softmax(s)_j" in state["snippets"][0]


TABLE = """<!doctype html><html><head><meta charset="utf-8"></head><body><article>
<div style="overflow-x: auto; max-width: 100%"><table class="table" style="font-size: {size}px"><tr><th>Module</th>
<th>What it computes</th></tr><tr><td><code style="white-space: nowrap">mha.MultiHeadAttention.project_qkv</code></td>
<td>queries, keys and values</td></tr></table></div></article></body></html>"""


@needs_chrome
def test_a_text_table_that_scrolls_on_a_phone_is_reported(tmp_path, capsys):
    """A table of the text wider than the column scrolls, its right-hand columns out of sight (ch13's
    table at 16 px needed 519 px at 400 px); set smaller it fits."""
    rc, out = _check(tmp_path, capsys, "wide.html", TABLE.format(size=24))  # planted
    assert rc == 1
    assert "the table headed 'Module' needs" in out and "px box: it scrolls, its right-hand columns cut off" in out
    rc, out = _check(tmp_path, capsys, "fits.html", TABLE.format(size=12))
    assert rc == 0, out
