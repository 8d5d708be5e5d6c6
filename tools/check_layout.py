"""Measure the built chapters in a headless browser: code width, display math, sideways scrolling.

    python tools/check_layout.py _build/html                 # every chapter page at 1280 and 400 px
    python tools/check_layout.py _build/html --widths 1440   # other window widths

Needs a Chromium (``chromium-headless-shell`` or ``chromium`` on PATH, or $CHROME; on Debian
``apt-get install chromium-headless-shell``); without one it says so and exits 0, so ``make book``
works everywhere (tools/check_site.py checks the CSS rules statically on every build).

For each chapter page and window width it loads a copy of the page with a measuring script that
runs after MathJax has typeset, and reports
- how many monospace characters fit on one line of a code cell (the cell's content width divided by
  the width of one character of its font), which is where the book's line limit comes from;
- whether the page itself scrolls sideways (the document is wider than the window): a problem;
- for every display equation, whether it is wider than its box (then it must scroll inside the box:
  ``overflow-x`` auto or scroll) and whether its equation number overlaps it: both are problems.
- at windows of ``DESKTOP_PX`` and wider, whether a code line of ``CODE_LINE_LIMIT`` characters fits.
Exit status 1 when any page has a problem.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CODE_LINE_LIMIT = 88  # tests/test_notebooks.py MAX_LINE
DESKTOP_PX = 1280

MEASURE = r"""
<script>
function __measure() {
  const W = document.documentElement.clientWidth;
  const out = {width: window.innerWidth, client: W, page: document.documentElement.scrollWidth, math: [], wide: []};
  const pre = document.querySelector("div.cell_input pre");
  if (pre) {
    const cs = getComputedStyle(pre);
    const probe = document.createElement("span");
    probe.textContent = "x".repeat(100);
    pre.appendChild(probe);
    out.char_px = probe.getBoundingClientRect().width / 100;
    probe.remove();
    out.code_px = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    out.code_font = cs.fontSize + " " + cs.fontFamily.split(",")[0];
    out.code_chars = Math.floor(out.code_px / out.char_px + 1e-6);
  }
  document.querySelectorAll("div.math").forEach((div, i) => {
    const box = div.querySelector("mjx-container");
    if (!box) return;
    const no = div.querySelector("span.eqno");
    const b = box.getBoundingClientRect();
    const item = {id: div.id || String(i), overflows: box.scrollWidth > box.clientWidth + 1,
                  overflow_x: getComputedStyle(box).overflowX, right: b.right};
    if (no) {
      const n = no.getBoundingClientRect();
      item.overlap = n.width > 0 && b.width > 0 && n.left < b.right - 1 && b.left < n.right - 1 &&
                     n.top < b.bottom - 1 && b.top < n.bottom - 1;
    }
    out.math.push(item);
  });
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
  const pre2 = document.createElement("pre");
  pre2.textContent = "@@MEA" + "SURE" + JSON.stringify(out) + "@@END";  // split: the regex must not match this line
  document.body.appendChild(pre2);
}
window.addEventListener("load", () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) MathJax.startup.promise.then(__measure);
  else __measure();
});
</script>
"""


def find_chrome() -> str | None:
    candidates = [os.environ.get("CHROME", ""), "chromium-headless-shell", "chromium", "chromium-browser",
                  "google-chrome", "headless_shell"]
    for name in candidates:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def measure(chrome: str, page: Path, width: int, height: int = 900) -> dict:
    """Load ``page`` at ``width`` px in headless Chromium and return the measuring script's report."""
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=page.parent, delete=False) as f:
        f.write(page.read_text(errors="replace").replace("</body>", MEASURE + "</body>", 1))
        copy = Path(f.name)
    try:
        with tempfile.TemporaryDirectory() as profile_dir:
            r = subprocess.run(
                [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--user-data-dir={profile_dir}", f"--window-size={width},{height}",
                 "--virtual-time-budget=15000", "--dump-dom", copy.as_uri()],
                capture_output=True, text=True, timeout=120,
            )
    finally:
        copy.unlink()
    found = re.search(r"@@MEASURE(\{.*?\})@@END", html.unescape(r.stdout), re.S)
    if not found:
        raise RuntimeError(f"no measurement from {page.name} at {width} px: {r.stderr.strip()[-500:]}")
    return json.loads(found.group(1))


def problems_of(report: dict) -> list[str]:
    problems = []
    if report["page"] > report["client"] + 1:
        problems.append(f"the page scrolls sideways ({report['page']} px in a {report['client']} px window; "
                        f"too wide: {', '.join(report['wide']) or 'unknown'})")
    chars = report.get("code_chars")
    if chars is not None and report["width"] >= DESKTOP_PX and chars < CODE_LINE_LIMIT:
        problems.append(f"a code cell fits {chars} characters a line at {report['width']} px; "
                        f"the book's limit is {CODE_LINE_LIMIT} (see _static/companion.css)")
    for m in report["math"]:
        if m["overflows"] and m["overflow_x"] not in ("auto", "scroll"):
            problems.append(f"equation {m['id']} is wider than its box and does not scroll (overflow-x {m['overflow_x']})")
        if m.get("overlap"):
            problems.append(f"equation {m['id']}: its number overlaps the equation")
    return problems


def chapter_pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if (site / "_sources" / p.relative_to(site).with_suffix(".ipynb")).exists())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", nargs="?", default="_build/html", type=Path)
    ap.add_argument("--widths", type=int, nargs="+", default=[1280, 400])
    args = ap.parse_args(argv)
    chrome = find_chrome()
    if chrome is None:
        print("check_layout: no Chromium found (set $CHROME or install chromium-headless-shell); nothing measured")
        return 0
    pages = chapter_pages(args.site)
    if not pages:
        print(f"check_layout: no chapter pages under {args.site}; build the book first")
        return 1
    failed = 0
    print("| page | window (px) | code cell (px) | characters per code line | equations | scrolling in their box | problems |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for page in pages:
        for width in args.widths:
            report = measure(chrome, page, width)
            problems = problems_of(report)
            failed += bool(problems)
            scrolling = sum(m["overflows"] for m in report["math"])
            print(f"| {page.name} | {width} | {report.get('code_px', 0):.0f} | {report.get('code_chars', '-')} | "
                  f"{len(report['math'])} | {scrolling} | {'; '.join(problems) or 'none'} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
