"""Measure what a reader sees on every page of the built book: display equations, code and outputs.

    python tools/check_layout.py _build/html                  # every page at 1280 and 400 px
    python tools/check_layout.py _build/html --pages book/ch10_kv_cache.html --widths 1280
    python tools/check_layout.py _build/html --report-only    # print the problems, exit 0 anyway

Needs a Chromium (``chromium-headless-shell`` or ``chromium`` on PATH, or $CHROME; on Debian
``apt-get install chromium-headless-shell``); without one it says so and exits 0, so ``make book``
works everywhere (tools/check_site.py checks the CSS rules statically on every build);
``--require-browser`` makes that an error (CI). The browser
is tools/check_browser.py's (offline, launched by Playwright, ended and its profile removed on every
path).

For each page and window width it loads the page, waits for MathJax and the images, and measures
the rendered boxes, not the source:

- **display equations**: the typeset equation's full width (what scrolls inside its box included),
  plus its number and the gap between them, against the content column it sits in. At ``DESKTOP_PX``
  and wider it must fit the column (a reader should not have to scroll a formula on a laptop). At
  every width: the equation's box must not be wider than the column, an equation wider than its box
  must scroll inside it (``overflow-x`` auto or scroll), and the number must not cover the equation.
- **code cells and outputs**: every ``pre`` of a cell's input and output and every output table and
  image, its content width (``scrollWidth``) against the column. At ``DESKTOP_PX`` and wider the
  content must fit (no hidden right-hand part); at every width the box must stay inside the column
  and content wider than the box must scroll inside it.
- **figures** (issue 39, item 1): every image in a figure or a cell's output, its width as shown
  against its column: at every width it is scaled to the column, never wider and never in a sideways-
  scrolling box (_static/companion.css), it opens full size on a tap (it sits in a link to the image;
  _static/companion.js links a cell output's image), and it carries at most one line telling the reader
  to scroll or tap (text, or CSS-generated content on the figure, its caption or its output).
- **figure labels** (item 3): at ``DESKTOP_PX`` and wider, every figure's smallest label as shown must be
  at least ``MIN_LABEL_PX`` (11 px): its size at the designed width, recorded in the PNG by
  ``companion.notebook.viz.book_png``, times the scale the page shows it at; a PNG without that record
  is a problem too (its labels cannot be measured).
- **figure labels on a phone** (issue 49, item 2): at ``PHONE_PX`` and narrower, every figure's smallest
  label as shown must be at least ``PHONE_MIN_LABEL_PX`` (9 px), measured the same way from the PNG the
  browser shows (``currentSrc``: a figure drawn by ``companion.notebook.phone_figures.book_html`` is a
  ``<picture>`` whose phone source, drawn narrower with the same point sizes, is shown there). A
  figure with such a phone rendition is drawn for the column at each width and does not need to open
  full size on a tap (its PNGs are data URLs, which Chromium does not open from a link anyway).
- **the first screen** (item 4): what a chapter's top section shows before its first section: only
  paragraphs, lists and admonitions (the opening text and the learning objectives), with no code cell,
  output, toggle or image in them, and the run-time line (``p.chapter-runtime``, tools/chapterpage.py)
  on every chapter page (tools/tag_cells.py keeps the set-up cells off the page).
- **display equations on a narrow window** (item 7): the number beside its equation (their boxes share
  a line), and an equation wider than its room scaled down (by _static/companion.js, to at most
  ``MIN_EQUATION_SCALE``) before any of it is left to scroll; an unscaled equation with more than
  ``EQUATION_HIDDEN`` of its width out of view is cut.
- **tables**: inside the column, scrolling when wider than their box, and no inline code in a table
  cell split over two lines.
- the page itself must not scroll sideways, and at ``DESKTOP_PX`` a code line of ``CODE_LINE_LIMIT``
  characters must fit a code cell.

Every problem names the page, the width, the element (equation number and label, or the section,
cell and first characters of the line) and the measured widths. Exit status 1 when any page has a
problem at any width: ``make book`` runs this check and fails with it (``ENFORCED``; issue 25).
``--report-only`` prints the same report and exits 0, for looking at a build in progress.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_browser  # noqa: E402  (tools/check_browser.py: the browser and the page list)
import tag_cells  # noqa: E402  (tools/tag_cells.py: the chapters whose set-up cells are not tagged yet)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from companion.notebook.phone_figures import PHONE_MIN_LABEL_PX  # noqa: E402
from companion.notebook.viz import MIN_LABEL_PX, read_figure_record  # noqa: E402

CODE_LINE_LIMIT = 88  # tests/test_notebooks.py MAX_LINE
DESKTOP_PX = 1280
PHONE_PX = 400  # a phone's window: the figure-label rule for phones applies at this width and below
WIDTHS = (1280, 400)
# Display equations on a narrow window: _static/companion.js scales a formula wider than its room down to
# MIN_EQUATION_SCALE of its size; one that is still cut by more than EQUATION_HIDDEN of its width without
# having been scaled is a problem (issue 39, item 7).
MIN_EQUATION_SCALE = 0.7
FIRST_SCREEN = "before the first section"  # the words every first-screen problem carries
LABEL_SLACK = 0.05  # px: the shown width is measured to a pixel; not a relaxation of MIN_LABEL_PX
EQUATION_HIDDEN = 0.05
# A layout problem on any page at any width fails the check (exit status 1), and so `make book`
# (issue 25: every page passed at 1280 and 400 px when this was switched on). --report-only overrides.
ENFORCED = True

MEASURE = r"""
(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    try { await MathJax.startup.promise; } catch (e) {}
  }
  const imgs = Array.from(document.images);
  imgs.forEach((img) => { img.loading = "eager"; });
  await Promise.all(imgs.map((img) => img.decode().catch(() => null)));
  await sleep(50);
  const W = document.documentElement.clientWidth;
  const out = {width: window.innerWidth, client: W, page: document.documentElement.scrollWidth,
               math: [], blocks: [], wide: []};
  const px = (v) => parseFloat(v) || 0;
  // The column an element has to fit: the content box of the block it sits in (the article, or an
  // admonition, a solution or a list item inside it), never wider than the article's.
  const contentBox = (el) => {
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    return {left: r.left + px(cs.paddingLeft) + px(cs.borderLeftWidth),
            right: r.right - px(cs.paddingRight) - px(cs.borderRightWidth)};
  };
  const columnOf = (el, holder) => {
    const article = contentBox(el.closest("article.bd-article, article, main, [role=main]") || document.body);
    if (!holder || !holder.closest("article, main, [role=main]")) return article;
    // A worked solution's cells take the solution box's full width (_static/companion.css)
    const sol = el.closest("div.cell") && holder.closest("div.solution.dropdown");
    const own = sol && innerWidth >= 768 ? sol.getBoundingClientRect() : contentBox(holder);
    return {left: Math.max(own.left, article.left), right: Math.min(own.right, article.right)};
  };
  const sectionOf = (el) => {
    const sol = el.closest(".solution, .exercise");
    const title = sol && sol.querySelector(".admonition-title, summary");
    if (title) return title.textContent.replace(/\s+/g, " ").trim().slice(0, 60);
    const sec = el.closest("section");
    const h = sec && sec.querySelector(":scope > h1, :scope > h2, :scope > h3, :scope > h4");
    return h ? h.textContent.replace(/#$/, "").trim().slice(0, 60) : "";
  };
  const clipsX = (cs) => cs.overflowX === "auto" || cs.overflowX === "scroll";
  // Display equations.
  document.querySelectorAll("div.math, mjx-container[display='true']").forEach((el, i) => {
    if (el.tagName === "MJX-CONTAINER" && el.closest("div.math")) return;  // counted with its div
    const div = el.tagName === "DIV" ? el : el.parentElement;
    const box = el.tagName === "DIV" ? div.querySelector("mjx-container") : el;
    if (!box) return;
    const col = columnOf(div, div.parentElement);
    const b = box.getBoundingClientRect(), d = div.getBoundingClientRect();
    const no = div.querySelector(":scope > span.eqno");
    const n = no ? no.getBoundingClientRect() : null;
    const cs = getComputedStyle(box);
    // The typeset formula itself (mjx-math), however much of it is scrolled out of view.
    const math = box.querySelector("mjx-math");
    const mathW = math ? math.getBoundingClientRect().width : box.scrollWidth;
    const gap = n ? Math.max(0, Math.min(Math.abs(n.left - b.right), Math.abs(b.left - n.right))) : 0;
    const item = {id: div.id || "", number: no ? no.textContent.replace(/#$/, "").trim() : "",
                  section: sectionOf(div), column: Math.round(col.right - col.left),
                  math: Math.round(mathW), number_px: n ? Math.round(n.width) : 0,
                  needed: Math.round(mathW + (n ? n.width + Math.max(gap, 4) : 0)),
                  box: Math.round(b.width), box_right: Math.round(Math.max(b.right, d.right, n ? n.right : 0)),
                  column_right: Math.round(col.right), overflows: box.scrollWidth > box.clientWidth + 1,
                  overflow_x: cs.overflowX, overlap: false,
                  tex: (div.querySelector("mjx-assistive-mml math") || {}).textContent || "",
                  hidden: Math.max(0, Math.round(mathW - box.clientWidth)),
                  scale: parseFloat(box.dataset.fitScale || "1"),
                  // The number beside the equation: their boxes share a line (not above or below it).
                  beside: !n || n.height === 0 || (n.top < b.bottom - 1 && b.top < n.bottom - 1)};
    item.tex = item.tex.replace(/\s+/g, " ").trim().slice(0, 50);
    if (n && n.width > 0 && b.width > 0) {
      // The number covers the formula when their boxes cross where the formula is drawn: the
      // visible part of the container, or the formula's own box where it is not clipped.
      const m = math ? math.getBoundingClientRect() : b;
      const visRight = clipsX(cs) ? Math.min(b.right, m.right) : m.right;
      const visLeft = clipsX(cs) ? Math.max(b.left, m.left) : m.left;
      item.overlap = n.left < visRight - 1 && visLeft < n.right - 1 && n.top < b.bottom - 1 && b.top < n.bottom - 1;
    }
    out.math.push(item);
  });
  // Code cells and their outputs: every pre, output table and output image.
  const cells = Array.from(document.querySelectorAll("div.cell"));
  const seen = new Set();
  const blocks = document.querySelectorAll(
    "div.cell_input pre, div.cell_output pre, div.cell_output table, div.cell_output img, div.cell_output .output.text_html > *");
  for (const el of blocks) {
    if (seen.has(el)) continue;
    seen.add(el);
    const cs = getComputedStyle(el);
    if (cs.display === "none" || el.getClientRects().length === 0) continue;
    // Behind a toggle (a solution, a hide-input cell): the reader sees it once it is opened.
    const hiddenBy = el.closest("details:not([open]), .toggle-hidden, .solution, .tag_hide-input, .tag_hide-cell, .tag_hide-output");
    const r = el.getBoundingClientRect();
    if (r.width === 0) continue;
    const cell = el.closest("div.cell");
    const col = columnOf(el, cell ? cell.parentElement : el.parentElement);
    const kind = el.closest("div.cell_input") ? "code" : "output";
    // The nearest ancestor (the element itself included) that scrolls sideways.
    let scroller = null;
    for (let a = el; a && a !== cell; a = a.parentElement)
      if (clipsX(getComputedStyle(a))) { scroller = a; break; }
    let content = el.scrollWidth;
    if (el.tagName === "IMG") content = r.width;
    let longest = "";
    if (el.tagName === "PRE") {
      for (const line of el.textContent.split("\n")) if (line.length > longest.length) longest = line;
    }
    const s = scroller ? scroller.getBoundingClientRect() : r;
    out.blocks.push({kind, tag: el.tagName.toLowerCase(), cell: cells.indexOf(cell) + 1, section: sectionOf(el),
                     content: Math.round(content), box: Math.round(r.width), visible: Math.round(s.width),
                     box_right: Math.round(scroller ? s.right : r.right),
                     column: Math.round(col.right - col.left), column_left: Math.round(col.left),
                     column_right: Math.round(col.right), scrolls: !!scroller,
                     collapsed: !!hiddenBy, chars: longest.length, line: longest.trim().slice(0, 40)});
  }
  // Figures: each image's width as shown, and the width it is designed for (its inline style, its
  // width attribute (a widget's figure), or its natural width for an image saved with neither).
  out.figures = [];
  const figNo = (el) => {
    const fig = el.closest("figure");
    const num = fig && fig.querySelector(".caption-number");
    return num ? num.textContent.trim() : (fig && fig.id ? "#" + fig.id : "");
  };
  for (const img of document.querySelectorAll("article figure img, article div.cell_output img")) {
    const r = img.getBoundingClientRect();
    if (r.width === 0 || getComputedStyle(img).display === "none") continue;
    let scroller = null;
    for (let a = img.parentElement; a && a.tagName !== "ARTICLE"; a = a.parentElement)
      if (clipsX(getComputedStyle(a))) { scroller = a; break; }
    const col = columnOf(img, (scroller || img).parentElement);
    const s = scroller ? scroller.getBoundingClientRect() : r;
    // What a figure says about itself: lines that tell the reader to scroll or tap (a text line, or
    // CSS-generated content before or after the figure, its caption or its output box).
    const holder = img.closest("figure") || img.closest("div.cell_output") || img.parentElement;
    let hints = holder.querySelectorAll(".figure-hint").length;
    const hintRe = /screen|full size|scroll sideways/i;
    for (const el of [holder, ...holder.querySelectorAll("figcaption, a, div.cell_output, div.output")]) {
      for (const pseudo of ["::before", "::after"]) {
        const c = getComputedStyle(el, pseudo).content;
        if (c && c !== "none" && c !== "normal" && hintRe.test(c)) hints += 1;
      }
    }
    const outer = holder.parentElement && holder.parentElement.closest("div.cell_output");
    if (outer && outer !== holder) {
      for (const pseudo of ["::before", "::after"]) {
        const c = getComputedStyle(outer, pseudo).content;
        if (c && c !== "none" && c !== "normal" && hintRe.test(c)) hints += 1;
      }
    }
    const widget = !!img.closest(".widget-subarea, .companion-frames");  // interactive: its picture changes, no link
    const picture = img.closest("picture");  // a figure drawn for phones too (phone_figures.book_html)
    const phone = !!(picture && picture.querySelector("source[media]"));
    out.figures.push({figure: figNo(img), section: sectionOf(img), shown: Math.round(r.width),
                      column: Math.round(col.right - col.left), hints, widget, visible: Math.round(s.width),
                      linked: !!(img.closest("a[href]")), phone,
                      designed: Math.round(parseFloat(img.style.width) || parseFloat(img.getAttribute("width")) || img.naturalWidth),
                      natural: img.naturalWidth, shown_exact: r.width,
                      // where the PNG is (its record of its smallest text is read in Python: measure());
                      // a data URL's record sits near its start, after the header
                      // (the source the browser shows: a <picture>'s phone source on a narrow window)
                      src: (img.currentSrc || img.src).startsWith("data:") ? (img.currentSrc || img.src).slice(0, 6000)
                           : (img.currentSrc || img.src),
                      box_right: Math.round(s.right), column_right: Math.round(col.right),
                      scrolls: !!scroller, alt: (img.alt || "").slice(0, 40)});
  }
  // The first screen: what the chapter's top section shows before its first section. Text (paragraphs,
  // lists), admonitions (the learning objectives) and the run-time line are what belongs there.
  // After the objectives, the set-up cell is shown as it is (imports and the profile: the code on the page
  // runs when copied, tools/tag_cells.py rule 2); folded behind a toggle or before the objectives it is not.
  out.intro = [];
  const topSection = document.querySelector("article section");
  if (topSection && topSection.querySelector(":scope > h1")) {
    let objectivesSeen = false;
    for (const el of topSection.children) {
      if (el.tagName === "SECTION") break;
      const r = el.getBoundingClientRect();
      if (r.height === 0 || getComputedStyle(el).display === "none") continue;
      const text = ["P", "H1", "UL", "OL", "DL", "BLOCKQUOTE", "SPAN", "A"].includes(el.tagName);
      const admonition = el.tagName === "DIV" && el.classList.contains("admonition");
      const setup = objectivesSeen && el.tagName === "DIV" && el.classList.contains("cell") &&
        /companion\.profile\(/.test(el.textContent) && !el.querySelector("details, .toggle-button");
      objectivesSeen = objectivesSeen || admonition;
      const bad = !setup && !((text || admonition) && !el.querySelector("div.cell, details, button, pre, img"));
      out.intro.push({tag: el.tagName.toLowerCase() + (el.className ? "." + String(el.className).split(" ").join(".") : ""),
                      text: el.textContent.replace(/\s+/g, " ").trim().slice(0, 50), ok: !bad,
                      runtime: el.classList.contains("chapter-runtime")});
    }
  }
  // Tables in the text and in outputs: inside the column, scrolling when wider than their box, and
  // inline code in a cell on one line (a name split over two lines reads as two names).
  out.tables = [];
  document.querySelectorAll("article table").forEach((t, i) => {
    const r = t.getBoundingClientRect();
    if (r.width === 0) return;
    let scroller = null;
    for (let a = t; a && a.tagName !== "ARTICLE"; a = a.parentElement)
      if (clipsX(getComputedStyle(a))) { scroller = a; break; }
    const col = columnOf(t, (scroller || t).parentElement);
    const s = scroller ? scroller.getBoundingClientRect() : r;
    const split = [];
    t.querySelectorAll("td code, th code").forEach((c) => {
      const tops = new Set(Array.from(c.getClientRects()).filter((q) => q.width > 0).map((q) => Math.round(q.top)));
      if (tops.size > 1) split.push(c.textContent.trim().slice(0, 30));
    });
    const caption = t.querySelector("caption");
    out.tables.push({table: i + 1, section: sectionOf(t), caption: caption ? caption.textContent.trim().slice(0, 40) : "",
                     content: Math.round(t.scrollWidth > r.width ? t.scrollWidth : r.width),
                     visible: Math.round(s.width), scrolls: !!scroller, box_right: Math.round(s.right),
                     column_right: Math.round(col.right), split});
  });
  // Characters per code line: a code cell a reader sees open (not behind a hide-input toggle).
  const pre = document.querySelector(
    "div.cell:not(.tag_hide-cell):not(.tag_hide-input):not(.tag_remove-input) div.cell_input pre");
  if (pre) {
    const cs = getComputedStyle(pre);
    const probe = document.createElement("span");
    probe.textContent = "x".repeat(100);
    pre.appendChild(probe);
    out.char_px = probe.getBoundingClientRect().width / 100;
    probe.remove();
    out.code_px = pre.clientWidth - px(cs.paddingLeft) - px(cs.paddingRight);
    out.code_chars = Math.floor(out.code_px / out.char_px + 1e-6);
  }
  // What makes the page wider than the window: elements past its right edge that no ancestor clips.
  const clipped = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement)
      if (getComputedStyle(a).overflowX !== "visible") return a.getBoundingClientRect().right <= W + 1;
    return false;
  };
  for (const el of document.querySelectorAll("body *")) {
    const r = el.getBoundingClientRect();
    const cs = getComputedStyle(el);
    if (cs.position === "fixed" || cs.visibility === "hidden") continue;
    if (r.right > W + 1 && r.width > 0 && out.wide.length < 5 && !clipped(el))
      out.wide.push(el.tagName.toLowerCase() + "." + String(el.getAttribute("class") || "").split(" ")[0] +
                    (el.id ? "#" + el.id : "") + " (" + Math.round(r.right) + " px)");
  }
  return JSON.stringify(out);
})()
"""


def measure(browser: check_browser.Browser, page: Path, width: int, height: int = 900) -> dict:
    """Load ``page`` at ``width`` px in ``browser`` and return the measuring script's report."""
    browser.events.clear()
    browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
    mark = len(browser.events)
    browser.call("Page.navigate", url=page.resolve().as_uri())
    browser.wait_for("Page.loadEventFired", since=mark)
    result = browser.call("Runtime.evaluate", expression=MEASURE, awaitPromise=True, returnByValue=True,
                          timeout=60_000)
    if "exceptionDetails" in result:
        raise RuntimeError(f"{page.name}: the measuring script failed: {result['exceptionDetails']}")
    report = json.loads(result["result"]["value"])
    for f in report.get("figures", []):
        label_size(f)
    return report


def _png_head(src: str) -> bytes | None:
    """The first bytes of the PNG an image shows: a file next to the page, or a data URL's start."""
    if src.startswith("data:image/png;base64,"):
        b64 = src.split(",", 1)[1]
        return base64.b64decode(b64[: len(b64) // 4 * 4])
    if src.startswith("file:"):
        path = Path(unquote(urlparse(src).path))
        return path.read_bytes()[:65536] if path.is_file() else None
    return None


def label_size(f: dict) -> None:
    """Add to a figure's measurement the size of its smallest label as shown (``label_px``), from the
    record ``companion.notebook.viz.book_png`` writes into the PNG (its smallest text at the designed
    width, and PNG px per CSS px): text x shown width / (natural width / ratio). A PNG without the
    record gets ``label_px`` None (issue 39, item 3: labels must be measurable)."""
    head = _png_head(f.pop("src", ""))
    record = read_figure_record(head) if head else None
    f["label_px"] = None
    if record and f.get("natural"):
        text, ratio = record
        f["label_px"] = round(text * f["shown_exact"] / (f["natural"] / ratio), 2)


def _where(m: dict) -> str:
    name = f"equation {m['number']}" if m.get("number") else "an unnumbered equation"
    label = f" #{m['id']}" if m.get("id") else ""
    section = f" in '{m['section']}'" if m.get("section") else ""
    tex = f" [{m['tex']}...]" if m.get("tex") else ""
    return f"{name}{label}{section}{tex}"


def _block(b: dict) -> str:
    what = {"code": "code cell", "output": "output of cell"}[b["kind"]]
    section = f" in '{b['section']}'" if b.get("section") else ""
    line = f": longest line {b['chars']} characters '{b['line']}...'" if b.get("line") else ""
    toggle = " (behind a toggle)" if b.get("collapsed") else ""
    return f"{what} {b['cell']} ({b['tag']}){toggle}{section}{line}"


def problems_of(report: dict) -> list[str]:
    """The problems in one measurement (``measure``), each naming the element and its widths."""
    problems = []
    width = report["width"]
    desktop = width >= DESKTOP_PX
    if report["page"] > report["client"] + 1:
        problems.append(f"the page scrolls sideways ({report['page']} px in a {report['client']} px window; "
                        f"too wide: {', '.join(report['wide']) or 'unknown'})")
    chars = report.get("code_chars")
    if chars is not None and desktop and chars < CODE_LINE_LIMIT:
        problems.append(f"a code cell fits {chars} characters a line at {width} px; "
                        f"the book's limit is {CODE_LINE_LIMIT} (see _static/companion.css)")
    for m in report["math"]:
        if "needed" in m and desktop and m["needed"] > m["column"] + 1:
            problems.append(f"{_where(m)} is {m['needed']} px wide with its number "
                            f"({m['math']} px + {m['number_px']} px) in a {m['column']} px column: break it "
                            r"(\begin{aligned}, one relation per line)")
        if "box_right" in m and m["box_right"] > m["column_right"] + 1:
            problems.append(f"{_where(m)}: its box reaches {m['box_right']} px, past the column's right edge "
                            f"at {m['column_right']} px")
        if m["overflows"] and m["overflow_x"] not in ("auto", "scroll"):
            problems.append(f"{_where(m)} is wider than its box and does not scroll (overflow-x {m['overflow_x']})")
        if m.get("overlap"):
            problems.append(f"{_where(m)}: its number covers the equation")
        if not m.get("beside", True):
            problems.append(f"{_where(m)}: its number sits above or below the equation, not beside it")
        if not desktop and m.get("hidden", 0) > m.get("math", 0) * EQUATION_HIDDEN + 1 and m.get("scale", 1) > MIN_EQUATION_SCALE + 0.01:
            problems.append(f"{_where(m)} is cut at the right edge: {m['hidden']} px of its {m['math']} px out of "
                            f"view, not scaled to fit (_static/companion.js scales it to {MIN_EQUATION_SCALE:.0%})")
    for f in report.get("figures", []):
        name = f"figure {f['figure'] or '(unnumbered)'}" + (f" in '{f['section']}'" if f.get("section") else "")
        if f.get("scrolls") and "column" in f and f["shown"] > f.get("visible", 0) + 1:
            problems.append(f"{name} scrolls sideways in its own box: {f['shown']} px wide in a {f['column']} px "
                            "column, a reader sees part of it (scale it: _static/companion.css)")
        elif "column" in f and f["shown"] > f["column"] + 1:
            problems.append(f"{name} is shown {f['shown']} px wide in a {f['column']} px column: scale it to the "
                            "column (max-width: 100%, _static/companion.css)")
        if f["box_right"] > f["column_right"] + 1:
            problems.append(f"{name}: its box reaches {f['box_right']} px, past the column's right edge "
                            f"at {f['column_right']} px")
        if f.get("hints", 0) > 1:
            problems.append(f"{name} carries {f['hints']} lines telling the reader to scroll or tap; one at most")
        if desktop and "label_px" in f:  # issue 39, item 3: labels readable as shown on a laptop
            if f["label_px"] is None:
                problems.append(f"{name}: its PNG carries no record of its smallest label, so its label size "
                                "cannot be measured (draw it through companion.notebook.viz.book_png)")
            elif f["label_px"] < MIN_LABEL_PX - LABEL_SLACK:
                problems.append(f"{name}: its smallest label is {f['label_px']:.1f} px as shown ({f['shown']} px "
                                f"wide); at least {MIN_LABEL_PX} px at {DESKTOP_PX} px")
        if width <= PHONE_PX and f.get("label_px") is not None and f["label_px"] < PHONE_MIN_LABEL_PX - LABEL_SLACK:
            problems.append(f"{name}: its smallest label is {f['label_px']:.1f} px as shown ({f['shown']} px wide) "
                            f"at {width} px; at least {PHONE_MIN_LABEL_PX} px on a phone: draw it for a narrow "
                            "column too (companion.notebook.phone_figures.book_html)")
        if "linked" in f and not f["linked"] and not f.get("widget") and not f.get("phone"):
            problems.append(f"{name} does not open full size on a tap (no link to the image)")
    # The first screen of a chapter page (main() says which pages are chapters; a page measured on its own,
    # such as the tests' synthetic ones, counts as one).
    intro = report.get("intro", []) if report.get("chapter", True) else []
    for item in intro:
        if not item["ok"]:
            problems.append(f"before the first section: {item['tag']} '{item['text']}' (only the opening text, "
                            "the objectives, the run-time line and, after the objectives, the shown set-up cell belong "
                            "there: tools/tag_cells.py)")
    if report.get("chapter") and intro and not any(i.get("runtime") for i in intro):
        problems.append("no run-time line before the first section (tools/chapterpage.py)")
    for t in report.get("tables", []):
        name = f"table {t['table']}" + (f" '{t['caption']}'" if t.get("caption") else "") + (
            f" in '{t['section']}'" if t.get("section") else "")
        if t["box_right"] > t["column_right"] + 1:
            problems.append(f"{name}: its box reaches {t['box_right']} px, past the column's right edge "
                            f"at {t['column_right']} px")
        elif t["content"] > t["visible"] + 1 and not t["scrolls"]:
            problems.append(f"{name} is {t['content']} px wide in a {t['visible']} px box that does not scroll")
        for code in t.get("split", []):
            problems.append(f"{name}: inline code '{code}' is split over two lines")
    for b in report.get("blocks", []):
        if desktop and b["content"] > b["column"] + 1:
            problems.append(f"{_block(b)} is {b['content']} px wide in a {b['column']} px column")
        elif b["box_right"] > b["column_right"] + 1:
            problems.append(f"{_block(b)}: its box reaches {b['box_right']} px, past the column's right edge "
                            f"at {b['column_right']} px")
        elif b["content"] > b["visible"] + 1 and not b["scrolls"]:
            problems.append(f"{_block(b)} is {b['content']} px wide in a {b['visible']} px box that does not "
                            "scroll: its right-hand part is cut off")
    return problems


def chapter_pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if (site / "_sources" / p.relative_to(site).with_suffix(".ipynb")).exists())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", nargs="?", default="_build/html", type=Path)
    ap.add_argument("--pages", nargs="+", help="only these pages, relative to SITE (default: every page)")
    ap.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    ap.add_argument("--strict", action="store_true", help="exit 1 on any problem (the default: ENFORCED)")
    ap.add_argument("--report-only", action="store_true", help="print the problems but exit 0")
    ap.add_argument("--require-browser", action="store_true", help="exit 1 when no Chromium is found (CI)")
    ap.add_argument("--json", type=Path, help="also write every measurement to this file")
    args = ap.parse_args(argv)
    chrome = check_browser.find_chrome()
    if chrome is None:
        print("check_layout: no Chromium found (set $CHROME or install chromium-headless-shell); nothing measured")
        return 1 if args.require_browser else 0
    redirect = re.compile(r"http-equiv=[\"']?refresh", re.I)  # a bare redirect (index.html): nothing to measure
    pages = [args.site / p for p in args.pages] if args.pages else [
        p for p in check_browser.site_pages(args.site) if not redirect.search(p.read_text(errors="replace"))]
    if not pages:
        print(f"check_layout: no pages under {args.site}; build the book first")
        return 1
    chapters = {p.resolve() for p in chapter_pages(args.site)}
    failed, measurements, summary = [], [], []
    with check_browser.ended_on_sigterm():
        browser = check_browser.Browser(chrome)
        try:
            for page in pages:
                name = page.relative_to(args.site).as_posix()
                for width in args.widths:
                    start = time.perf_counter()
                    try:
                        report = measure(browser, page, width)
                    except (TimeoutError, OSError) as e:  # a renderer that stopped answering: once more
                        print(f"check_layout: {name} @ {width} px: no answer ({e!r}); trying once more", flush=True)
                        browser.close()
                        browser = check_browser.Browser(chrome)
                        report = measure(browser, page, width)
                    report["chapter"] = page.resolve() in chapters
                    problems = problems_of(report)
                    if page.stem in tag_cells.PENDING:  # not tagged yet (tools/tag_cells.py): noted, not failed
                        for p in [p for p in problems if FIRST_SCREEN in p]:
                            problems.remove(p)
                            print(f"  (pending) {name} @ {width} px: {p}", flush=True)
                    measurements.append({"page": name, "width": width, **report})
                    if problems:
                        failed.append((name, width))
                    summary.append((name, width, report, problems))
                    print(f"check_layout: {name} @ {width} px: {len(report['math'])} equations, "
                          f"{len(report.get('blocks', []))} code/output blocks, "
                          f"{len(report.get('figures', []))} figures, "
                          f"{sum(1 for m in report['math'] if m.get('overflows'))} scrolling, "
                          f"{report.get('code_chars', '-')} characters per code line, "
                          f"{time.perf_counter() - start:.1f} s: {len(problems)} problem(s)", flush=True)
                    for p in problems:
                        print(f"  - {name} @ {width} px: {p}", flush=True)
        finally:
            browser.close()
    if args.json:
        args.json.write_text(json.dumps(measurements, indent=1))
    print(f"check_layout: {len(pages)} pages x {len(args.widths)} widths, {len(failed)} with problems"
          + (": " + ", ".join(f"{n} @ {w}" for n, w in failed) if failed else ""))
    enforced = (ENFORCED or args.strict) and not args.report_only
    if failed:
        print("check_layout: FAILED: fix the elements named above (tools/check_layout.py's docstring says "
              "what each measurement means)" if enforced else "check_layout: --report-only: exit status 0")
    return 1 if failed and enforced else 0


if __name__ == "__main__":
    sys.exit(main())
