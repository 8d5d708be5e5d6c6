"""tools/check_layout.py measures what a reader sees, proven by planted failures on small synthetic pages
(no book build needed): a display equation too wide for the column, an equation whose number covers it,
an output line and a code line too long for the column, a figure wider than its column or scrolling in its own box
(with two hints, or no link to its full-size image), a set-up cell before a chapter's first section, a long
equation cut at 400 px or its number above it, an identifier split in a table cell; and tools/check_browser.py's screenshots put
every element where the page lays it out at 1280 and 400 px (issue 25, item 2). The command ``make book``
runs exits 1 on a site with a planted problem, so the build fails (issue 25: enforced).

The pages copy the structure Sphinx and MyST-NB write (``div.math > span.eqno + mjx-container``,
``div.cell > div.cell_input / div.cell_output > pre``) inside an ``article.bd-article`` column and link
the book's own _static/companion.css; MathJax's output is stood in for by an ``mjx-math`` box of a
chosen width (a test with the real MathJax runs where ``make book`` has vendored it). Needs a Chromium.
"""

from __future__ import annotations

import base64
import io
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import check_browser  # noqa: E402
import check_layout  # noqa: E402
from companion.notebook.phone_figures import PHONE_MEDIA  # noqa: E402
from companion.notebook.viz import (MIN_LABEL_PX, PIXEL_RATIO, RECORD_KEY, book_png,  # noqa: E402
                                    read_figure_record)

CHROME = check_browser.find_chrome()
pytestmark = pytest.mark.skipif(CHROME is None, reason="no Chromium: apt-get install chromium-headless-shell")
CSS = (ROOT / "_static" / "companion.css").resolve().as_uri()
MATHJAX = ROOT / "_vendor" / "site" / "vendor" / "mathjax" / "tex-chtml.js"
COLUMN = 739  # the synthetic column at 1280 px, as wide as the book's
JS = (ROOT / "_static" / "companion.js").resolve().as_uri()

# Enough of the theme and of MathJax's own CSS that the boxes behave as on the book's pages.
THEME = f"""
body {{ margin: 0; font: 16px/1.5 sans-serif; }}
article.bd-article {{ width: min({COLUMN}px, calc(100vw - 32px)); margin: 0 16px; }}
div.cell pre {{ overflow-x: auto; margin: 0; padding: 8px; font: 13px/1.3 monospace; }}
mjx-container[display="true"] {{ display: block; text-align: center; margin: 1em 0; }}
mjx-math {{ display: inline-block; height: 1.2em; background: #ddd; }}
span.eqno {{ float: right; }}
"""


def page(body: str, stylesheet: bool = True) -> str:
    link = f'<link rel="stylesheet" href="{CSS}">' if stylesheet else ""
    return (f'<!doctype html><html><head><meta charset="utf-8"><style>{THEME}</style>{link}</head><body>'
            f'<article class="bd-article"><section id="s"><h2>1.1. A section</h2>{body}</section></article>'
            "</body></html>")


def equation(number: str, width: int, label: str) -> str:
    return (f'<div class="math notranslate nohighlight" id="equation-{label}"><span class="eqno">({number})'
            f'<a class="headerlink" href="#equation-{label}">#</a></span><mjx-container class="MathJax" '
            f'display="true"><mjx-math style="width: {width}px"></mjx-math></mjx-container></div>')


def cell(code: str, output: str) -> str:
    return (f'<div class="cell docutils container"><div class="cell_input docutils container"><pre>{code}</pre>'
            f'</div><div class="cell_output docutils container"><div class="output stream highlight-myst-ansi">'
            f'<pre>{output}</pre></div></div></div>')


GOOD = page(equation("1.1", 300, "short") + cell("x = 1", "a short line"))
WIDE_EQUATION = page(equation("1.1", 300, "short") + equation("1.2", 1100, "wide"))
LONG_OUTPUT = page(cell("print(report)", "check: all 5 cases pass " + "(a case that passes) " * 8))
LONG_CODE = page(cell("y = f(" + ", ".join(f"argument_{i}" for i in range(12)) + ")", "ok"))


def with_js(html: str) -> str:
    """The page with the book's script (_static/companion.js), as every page of the book loads it."""
    return html.replace("</body>", f'<script src="{JS}"></script></body>')


@pytest.fixture(scope="module")
def browser():
    with check_browser.Browser(CHROME) as b:
        yield b


def measured(browser, tmp_path, html: str, width: int) -> tuple[dict, list[str]]:
    path = tmp_path / f"p{width}.html"
    path.write_text(html)
    report = check_layout.measure(browser, path, width)
    return report, check_layout.problems_of(report)


@pytest.mark.parametrize("width", [1280, 400])
def test_a_page_that_fits_passes(browser, tmp_path, width):
    report, problems = measured(browser, tmp_path, GOOD, width)
    assert problems == [], problems
    assert len(report["math"]) == 1 and report["math"][0]["number"] == "(1.1)"
    assert {b["kind"] for b in report["blocks"]} == {"code", "output"}


def test_planted_too_wide_equation_is_reported_at_1280(browser, tmp_path):
    report, problems = measured(browser, tmp_path, WIDE_EQUATION, 1280)
    wide = next(m for m in report["math"] if m["id"] == "equation-wide")
    assert wide["math"] == 1100 and wide["column"] == COLUMN
    assert wide["needed"] > 1100 + wide["number_px"]  # the number and the gap count
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"equation (1.2) #equation-wide in '1.1. A section' is {wide['needed']} px "
                                  f"wide with its number (1100 px + {wide['number_px']} px) in a {COLUMN} px column")


def test_at_400_px_a_wide_equation_scrolls_in_its_own_box_beside_its_number(browser, tmp_path):
    report, problems = measured(browser, tmp_path, with_js(WIDE_EQUATION), 400)
    assert problems == [], problems  # not too wide for a phone: scaled, it scrolls, and nothing covers it
    wide = next(m for m in report["math"] if m["id"] == "equation-wide")
    assert wide["overflows"] and wide["overflow_x"] == "auto" and not wide["overlap"] and wide["beside"]
    assert wide["scale"] == 0.7
    assert wide["box_right"] <= wide["column_right"]


def test_planted_number_over_an_equation_that_does_not_scroll(browser, tmp_path):
    """Without companion.css (the theme's float and no scrolling box), what issue 25 saw: the number sits
    on the equation and the right-hand part is cut or past the column. The check says so."""
    html = page(equation("1.2", 1100, "wide"), stylesheet=False).replace(
        "<article", "<style>mjx-container { overflow: hidden; }</style><article")
    _, problems = measured(browser, tmp_path, html, 400)
    assert any("equation (1.2) #equation-wide" in p and "does not scroll" in p for p in problems), problems
    assert any("its number covers the equation" in p for p in problems), problems


def test_planted_too_long_output_line_is_reported(browser, tmp_path):
    report, problems = measured(browser, tmp_path, LONG_OUTPUT, 1280)
    out = next(b for b in report["blocks"] if b["kind"] == "output")
    assert out["content"] > COLUMN and out["chars"] == len("check: all 5 cases pass " + "(a case that passes) " * 8)
    assert problems == [f"output of cell 1 (pre) in '1.1. A section': longest line {out['chars']} characters "
                        f"'check: all 5 cases pass (a case that pas...' is {out['content']} px wide in a "
                        f"{COLUMN} px column"]
    # At 400 px the same output scrolls inside its own box: no problem there.
    assert measured(browser, tmp_path, LONG_OUTPUT, 400)[1] == []


def test_planted_too_long_code_line_is_reported(browser, tmp_path):
    _, problems = measured(browser, tmp_path, LONG_CODE, 1280)
    assert len(problems) == 1 and problems[0].startswith("code cell 1 (pre) in '1.1. A section': longest line")


def test_a_box_that_does_not_scroll_is_reported_at_400(browser, tmp_path):
    html = LONG_OUTPUT.replace("</style>", "div.cell pre { overflow-x: visible; white-space: pre; }</style>")
    _, problems = measured(browser, tmp_path, html, 400)
    assert any(p.startswith("output of cell 1 (pre)") and ("does not scroll" in p or "past the column" in p)
               for p in problems), problems


def figure_page(tmp_path: Path, stylesheet: bool = True, record: str | None = "text=12.50 ratio=2.5;") -> str:
    """A two-panel figure as MyST-NB writes a glued one: a 1800 px PNG (2.5x) designed for 720 px, with
    the record of its smallest label that viz.book_png writes (``record``; None: no record)."""
    Image = pytest.importorskip("PIL.Image")
    PngImagePlugin = pytest.importorskip("PIL.PngImagePlugin")
    info = PngImagePlugin.PngInfo()
    if record is not None:
        info.add_text(RECORD_KEY, record)
    Image.new("RGB", (1800, 600), (230, 230, 230)).save(tmp_path / "two-panels.png", pnginfo=info)
    return page('<figure class="align-default" id="fig-two"><a class="reference internal image-reference" '
                'href="two-panels.png"><img alt="two panels" src="two-panels.png" style="width: 720px;" /></a>'
                '<figcaption><p><span class="caption-number">Fig. 1.1 </span>Two panels.</p></figcaption></figure>',
                stylesheet=stylesheet).replace("</style>", "img { max-width: 100%; height: auto; }</style>")


@pytest.mark.parametrize("width", [1280, 400])
def test_a_figure_is_scaled_to_the_column_and_opens_full_size(browser, tmp_path, width):
    """Issue 39, item 1: with the book's CSS and script a 720 px two-panel figure fits the column at any
    width, in a link to its image, with at most one line saying a tap opens it full size."""
    report, problems = measured(browser, tmp_path, with_js(figure_page(tmp_path)), width)
    (fig,) = report["figures"]
    problems = [p for p in problems if "on a phone" not in p]  # its labels: test_planted_small_label_on_a_phone
    assert problems == [] and fig["shown"] <= fig["column"] and not fig["scrolls"] and fig["linked"], (fig, problems)
    assert fig["hints"] == (1 if width == 400 else 0), fig


def test_planted_figure_wider_than_the_column_at_400(browser, tmp_path):
    """Without a max-width the figure is shown at its designed 720 px in a 368 px column: reported."""
    html = figure_page(tmp_path, stylesheet=False).replace("img { max-width: 100%; height: auto; }", "")
    report, problems = measured(browser, tmp_path, html, 400)
    (fig,) = report["figures"]
    assert fig["shown"] == 720 and fig["column"] < 400, fig
    assert any(p.startswith(f"figure Fig. 1.1 in '1.1. A section' is shown 720 px wide in a {fig['column']} px column")
               for p in problems), problems


def test_planted_scrolling_figure_with_two_hints_at_400(browser, tmp_path):
    """What issue 39 saw on 9 figures: the figure kept its width in a sideways-scrolling box, and the
    'wider than the screen' line appeared twice. Both are reported, and an image with no link too."""
    html = figure_page(tmp_path, stylesheet=False).replace(
        "img { max-width: 100%; height: auto; }",
        "figure > a { display: block; overflow-x: auto; } figure img { max-width: none; }"
        " figcaption::before, figure::after { content: 'wider than the screen: scroll sideways'; }")
    _, problems = measured(browser, tmp_path, html, 400)
    assert any("scrolls sideways in its own box" in p for p in problems), problems
    assert any("carries 2 lines telling the reader to scroll or tap" in p for p in problems), problems
    unlinked = figure_page(tmp_path).replace('<a class="reference internal image-reference" href="two-panels.png">',
                                             "<span>").replace("</a><figcaption>", "</span><figcaption>")
    _, problems = measured(browser, tmp_path, unlinked, 1280)
    assert problems == ["figure Fig. 1.1 in '1.1. A section' does not open full size on a tap (no link to the image)"]


def test_a_figure_label_is_measured_as_shown(browser, tmp_path):
    """Issue 39, item 3: the recorded 12.5 px smallest label of a 720 px figure, scaled with the figure as shown."""
    report, problems = measured(browser, tmp_path, with_js(figure_page(tmp_path)), 1280)
    (fig,) = report["figures"]
    assert problems == [] and fig["label_px"] == pytest.approx(12.5 * fig["shown_exact"] / 720, abs=0.01), fig


def test_planted_small_label_and_missing_record_at_1280(browser, tmp_path):
    """What issue 39 saw in 11 diagrams (about 9 px labels) is reported, and so is a PNG whose labels
    cannot be measured; at 400 px the phone rule asks for 9 px instead (test_planted_small_label_on_a_phone)."""
    small = with_js(figure_page(tmp_path, record="text=9.10 ratio=2.5;"))
    report, problems = measured(browser, tmp_path, small, 1280)
    (fig,) = report["figures"]
    assert problems == [f"figure Fig. 1.1 in '1.1. A section': its smallest label is {fig['label_px']:.1f} px as "
                        f"shown ({fig['shown']} px wide); at least 11 px at 1280 px"], problems
    assert [p for p in measured(browser, tmp_path, small, 400)[1] if "on a phone" not in p] == []
    bare = with_js(figure_page(tmp_path, record=None))
    assert measured(browser, tmp_path, bare, 1280)[1] == [
        "figure Fig. 1.1 in '1.1. A section': its PNG carries no record of its smallest label, so its label size "
        "cannot be measured (draw it through companion.notebook.viz.book_png)"]


def phone_page(tmp_path: Path, record: str = "text=11.11 ratio=2;") -> str:
    """A figure as phone_figures.book_html writes it inside a glued figure: a <picture> whose phone source (an 800 px
    PNG at 2x, designed for 400 px, with ``record``) the browser shows below 720 px, and the desktop
    PNG of figure_page above; data URLs, no link (myst-nb writes the HTML as it is)."""
    Image = pytest.importorskip("PIL.Image")
    PngImagePlugin = pytest.importorskip("PIL.PngImagePlugin")

    def data_url(size: tuple[int, int], text: str) -> str:
        info = PngImagePlugin.PngInfo()
        info.add_text(RECORD_KEY, text)
        buffer = io.BytesIO()
        Image.new("RGB", size, (230, 230, 230)).save(buffer, format="PNG", pnginfo=info)
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()

    picture = (f'<div class="output text_html"><picture class="companion-figure"><source media="{PHONE_MEDIA}" '
               f'srcset="{data_url((800, 700), record)}" width="400" height="350">'
               f'<img src="{data_url((1800, 600), "text=12.50 ratio=2.5;")}" width="720" height="240" alt=""></picture>'
               "</div>")
    return with_js(page(f'<figure class="align-default" id="fig-two" style="margin: 0">{picture}<figcaption><p>'
                        '<span class="caption-number">Fig. 1.1 </span>Two panels.</p></figcaption></figure>'))


def test_the_phone_rendition_is_measured_at_400_and_the_desktop_png_at_1280(browser, tmp_path):
    """Issue 49, item 2: the browser shows the phone source at 400 px (its 11.1 px labels at 368/400 of
    their size: 10.2 px) and the desktop PNG at 1280 px (12.5 px); no tap is asked for."""
    for width, text, designed in ((400, 11.11, 400), (1280, 12.5, 720)):
        report, problems = measured(browser, tmp_path, phone_page(tmp_path), width)
        (fig,) = report["figures"]
        assert problems == [] and fig["phone"] and not fig["linked"], (fig, problems)
        assert fig["label_px"] == pytest.approx(text * fig["shown_exact"] / designed, abs=0.01), fig


def test_planted_small_label_on_a_phone(browser, tmp_path):
    """What issue 49 saw on 37 of 49 figures: drawn for 1280 px only, a 720 px figure shows its 12.5 px
    labels at 6.4 px in the 368 px column; and a phone rendition still too small (7 px labels)."""
    report, problems = measured(browser, tmp_path, with_js(figure_page(tmp_path)), 400)
    (fig,) = report["figures"]
    assert problems == [f"figure Fig. 1.1 in '1.1. A section': its smallest label is {fig['label_px']:.1f} px as "
                        f"shown ({fig['shown']} px wide) at 400 px; at least 9 px on a phone: draw it for a narrow "
                        "column too (companion.notebook.phone_figures.book_html)"], problems
    assert fig["label_px"] < 7
    report, problems = measured(browser, tmp_path, phone_page(tmp_path, record="text=7.00 ratio=2;"), 400)
    assert len(problems) == 1 and "at least 9 px on a phone" in problems[0], problems
    assert measured(browser, tmp_path, phone_page(tmp_path, record="text=7.00 ratio=2;"), 1280)[1] == []


def test_the_record_is_what_book_png_writes(tmp_path):
    """The record the tests plant is the one the book's figures carry, read back from a real figure."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from companion.notebook.diagrams_ch01 import attention_steps

    data, meta = book_png(attention_steps())
    text, ratio = read_figure_record(data)
    assert ratio == PIXEL_RATIO and text * min(1, 717 / meta["width"]) >= MIN_LABEL_PX - 0.01


def chapter_top(before: str) -> str:
    """A chapter page's top section: the title, what comes before the first section, the first section."""
    return (f'<!doctype html><html><head><meta charset="utf-8"><style>{THEME}</style>'
            f'<link rel="stylesheet" href="{CSS}"></head><body><article class="bd-article"><section id="ch-x">'
            f"<h1>1. A chapter</h1><p>Opening.</p><div class=\"admonition tip\"><p class=\"admonition-title\">"
            f"Learning objectives</p><ol><li>one</li></ol></div>{before}"
            f'<section id="s"><h2>1.1. A section</h2><p>Text.</p></section></section></article></body></html>')


RUNTIME = '<p class="chapter-runtime">Runs in about 15 s on a CPU (quick profile).</p>'


def test_the_first_screen_holds_only_text_objectives_and_the_time_line(browser, tmp_path):
    report, problems = measured(browser, tmp_path, chapter_top(RUNTIME), 1280)
    assert problems == [] and [i["runtime"] for i in report["intro"]] == [False, False, False, True], report["intro"]
    report["chapter"] = True
    assert check_layout.problems_of(report) == []


def test_planted_setup_cell_before_the_first_section(browser, tmp_path):
    """Issue 39, item 4: the set-up cell's toggle and its grey profile line under the objectives."""
    setup = ('<div class="cell tag_hide-input docutils container"><details><summary>Show code cell source</summary>'
             '<div class="cell_input"><pre>P = companion.profile()</pre></div></details><div class="cell_output">'
             "<pre>profile=quick device=cpu seed=0</pre></div></div>")
    report, problems = measured(browser, tmp_path, chapter_top(setup), 400)
    assert len(problems) == 1 and problems[0].startswith(
        "before the first section: div.cell.tag_hide-input.docutils.container 'Show code cell source"), problems
    report["chapter"] = True
    assert "no run-time line before the first section (tools/chapterpage.py)" in check_layout.problems_of(report)


def test_the_shown_setup_cell_after_the_objectives_belongs(browser, tmp_path):
    """Issue 49, item 3: the imports and P are shown so copied code runs; after the objectives they are
    no problem, and the same cell before the objectives still is (planted)."""
    setup = ('<div class="cell docutils container"><div class="cell_input"><pre>import companion\n'
             "P = companion.profile()</pre></div><div class=\"cell_output\"><pre>profile=quick</pre></div></div>")
    report, problems = measured(browser, tmp_path, chapter_top(RUNTIME + setup), 1280)
    assert problems == [], problems
    early = chapter_top(RUNTIME).replace("<p>Opening.</p>", "<p>Opening.</p>" + setup)
    report, problems = measured(browser, tmp_path, early, 1280)
    assert len(problems) == 1 and problems[0].startswith("before the first section: div.cell"), problems


def em_equation(number: str, ems: float, label: str) -> str:
    """An equation whose typeset width scales with its font size, as MathJax's does (widths in em)."""
    return equation(number, 0, label).replace("width: 0px", f"width: {ems}em")


def test_a_long_equation_at_400_px_is_scaled_with_its_number_beside_it(browser, tmp_path):
    """Issue 39, item 7: with the book's script a formula a little wider than its room is scaled to fit,
    one far wider is scaled to 70% and scrolls; the number stays beside both."""
    html = with_js(page(em_equation("1.1", 22, "little") + em_equation("1.2", 60, "far")))
    report, problems = measured(browser, tmp_path, html, 400)
    assert problems == [], problems
    little, far = report["math"]
    assert little["beside"] and far["beside"], report["math"]
    assert little["hidden"] <= 1 and 0.7 < little["scale"] < 1, little
    assert far["scale"] == 0.7 and far["overflows"], far


def test_planted_cut_equation_and_number_above_at_400(browser, tmp_path):
    """Without the script the long formula is cut at the right edge; with the number put above it (the
    layout before issue 39) that is reported too."""
    html = page(em_equation("1.2", 40, "cut")).replace(
        "</head>", "<style>div.math { flex-direction: column !important; }</style></head>")
    _, problems = measured(browser, tmp_path, html, 400)
    assert any("equation (1.2) #equation-cut" in p and "is cut at the right edge" in p for p in problems), problems
    assert any("its number sits above or below the equation" in p for p in problems), problems


TABLE = ('<div class="pst-scrollable-table-container"><table class="table"><thead><tr><th>name</th><th>what</th>'
         "<th>more</th><th>more</th></tr></thead><tbody><tr><td><code class=\"docutils literal notranslate\">"
         '<span class="pre">continuous_batching_scheduler</span></code></td><td>' + "words " * 12 + "</td><td>"
         + "words " * 12 + "</td><td>" + "words " * 12 + "</td></tr></tbody></table></div>")


def test_a_table_keeps_inline_code_whole_and_scrolls_at_400(browser, tmp_path):
    report, problems = measured(browser, tmp_path, page(TABLE), 400)
    (t,) = report["tables"]
    assert problems == [] and t["split"] == [], (t, problems)


def test_planted_split_identifier_in_a_table_cell(browser, tmp_path):
    html = page(TABLE, stylesheet=False).replace("</style>", "td code { word-break: break-all; } "
                                                 "table { table-layout: fixed; width: 100%; }</style>")
    _, problems = measured(browser, tmp_path, html, 400)
    assert any("inline code 'continuous_batching_scheduler' is split over two lines" in p for p in problems), problems


@pytest.mark.skipif(not MATHJAX.exists(), reason="MathJax not vendored (python tools/vendor_assets.py _vendor)")
def test_real_mathjax_equation_is_measured(browser, tmp_path):
    tex = r"\mathrm{softmax}" + "".join(rf"\left(\frac{{q_{i} k_{i}^T}}{{\sqrt{{d}}}}\right) + " for i in range(8)) + "c"
    html = page(f'<div class="math notranslate nohighlight" id="equation-real"><span class="eqno">(2.1)</span>'
                f"\\[{tex}\\]</div>").replace("</head>", f'<script defer src="{MATHJAX.resolve().as_uri()}"></script></head>')
    report, problems = measured(browser, tmp_path, html, 1280)
    (m,) = report["math"]
    assert m["math"] > COLUMN and any("equation (2.1) #equation-real" in p for p in problems), (m, problems)
    report, problems = measured(browser, tmp_path, with_js(html), 400)
    assert problems == [] and report["math"][0]["overflows"] and report["math"][0]["beside"], problems


@pytest.mark.parametrize("width", [1280, 400])
def test_screenshot_shows_each_element_where_the_page_lays_it_out(browser, tmp_path, width):
    """A sticky header and sidebar and coloured blocks far down the page: in the saved screenshot each block
    is at the x and y the page reports (no shift), and the header is drawn once at the top."""
    Image = pytest.importorskip("PIL.Image")
    blocks = "".join(f'<div id="b{i}" style="margin-top: 1400px; height: 60px; width: 120px; background: '
                     f'rgb({40 * i}, 200, 0)"></div>' for i in range(1, 5))
    html = ('<!doctype html><html><head><style>body { margin: 0 } header { position: sticky; top: 0; height: 50px;'
            ' background: rgb(0, 0, 255); z-index: 2 } .side { position: sticky; top: 50px; float: left; width: 25vw;'
            ' height: 100vh; background: rgb(250, 250, 0) } main { margin-left: 25vw; padding-left: 100px }</style>'
            f'</head><body><header></header><div class="side"></div><main>{blocks}</main></body></html>')
    path = tmp_path / "shot.html"
    path.write_text(html)
    browser.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
    mark = len(browser.events)
    browser.call("Page.navigate", url=path.as_uri())
    browser.wait_for("Page.loadEventFired", since=mark)
    boxes = browser.call("Runtime.evaluate", returnByValue=True, expression=(
        "JSON.stringify(Array.from(document.querySelectorAll('main div')).map((d) => {"
        " const r = d.getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY]; }))"))["result"]["value"]
    shot = Image.open(io.BytesIO(check_browser.screenshot(browser, width))).convert("RGB")
    assert shot.width == width
    import json

    for i, (x, y) in enumerate(json.loads(boxes), start=1):
        assert shot.getpixel((int(x) + 60, int(y) + 30)) == (40 * i, 200, 0), (i, x, y)
        assert shot.getpixel((int(x) - 5, int(y) + 30)) == (255, 255, 255)
        assert shot.getpixel((5, int(y) + 30)) == (250, 250, 0)  # the sidebar beside it, as a reader sees
    assert shot.getpixel((width // 2, 10)) == (0, 0, 255)  # the header at the top
    assert shot.getpixel((width - 5, 2000)) == (255, 255, 255)  # and drawn only there


def planted_site(tmp_path: Path, html: str) -> Path:
    (tmp_path / "index.html").write_text('<html><head><meta http-equiv="Refresh" content="0; url=p.html"></head></html>')
    (tmp_path / "p.html").write_text(html)
    return tmp_path


def test_main_skips_a_redirect_page_and_fails_on_a_problem_unless_report_only(tmp_path, capsys):
    site = planted_site(tmp_path, LONG_OUTPUT)
    assert check_layout.ENFORCED
    assert check_layout.main([str(site), "--widths", "1280"]) == 1
    out = capsys.readouterr().out
    assert "index.html" not in out and "p.html @ 1280 px" in out and "longest line" in out and "FAILED" in out
    assert check_layout.main([str(site), "--widths", "1280", "--report-only"]) == 0
    (site / "p.html").write_text(GOOD)
    assert check_layout.main([str(site)]) == 0


def book_recipe_line(tool: str) -> str:
    """The line of the Makefile's ``book`` recipe that runs ``tools/<tool>``."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nbook:", 1)[1].split("\n\n", 1)[0]
    (line,) = [ln.strip() for ln in recipe.splitlines() if f"tools/{tool}" in ln]
    return line


@pytest.mark.parametrize("planted, status", [(WIDE_EQUATION, 1), (LONG_OUTPUT, 1), (GOOD, 0)],
                         ids=["wide-equation", "long-output", "fits"])
def test_make_book_fails_on_a_planted_layout_problem(tmp_path, planted, status):
    """The command ``make book`` runs, as the Makefile writes it, on a site with one planted problem: its
    exit status is 1 (make stops there), and 0 on a page that fits. No '-' prefix or '|| true' hides it."""
    line = book_recipe_line("check_layout.py")
    assert not line.startswith("-") and "||" not in line and ";" not in line.split("#")[0], line
    argv = shlex.split(line.split("#")[0].replace("$(BIN)/python", sys.executable))
    assert argv[1:3] == ["tools/check_layout.py", "_build/html"], argv
    argv[2] = str(planted_site(tmp_path, planted))
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CHROME": CHROME})
    assert done.returncode == status, done.stdout[-3000:] + done.stderr[-2000:]
    if status:
        assert "FAILED" in done.stdout and "p.html @ " in done.stdout
