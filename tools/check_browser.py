"""Load every page of the built book in headless Chromium, offline, and check what a reader sees.

    python tools/check_browser.py _build/html                  # every page, 1280 and 400 px
    python tools/check_browser.py _build/html --pages book/ch01_attention.html --no-screenshots

tools/check_site.py parses the HTML; this script asks the live page. Chromium is launched by
Playwright for Python (the ``book`` extra; the system's Chromium, no browser download) with a fresh
profile and no network (--disable-background-networking, --disable-component-update, ...; every
http(s) request is intercepted, refused and reported) and driven over the DevTools protocol. For every page
and window width (1280 and 400 px) it asserts that

- MathJax finished typesetting, left no raw TeX (``$$``, ``\\(``, ``\\begin{``) in the text and no
  MathJax error box;
- every image loaded (``naturalWidth > 0``);
- every saved ipywidget view was drawn by the widget manager, and a page with no view loads no
  widget JavaScript;
- every exercise solution is collapsed until its toggle is clicked, and open after the click, and at
  1280 px its code fits the solution box (as wide as an ordinary cell's) without scrolling;
- the launch buttons (Colab, Binder) point at this page's notebook in the repository named in
  _config.yml, and the download button at the page's own source file, which exists;
- a chapter's run-time line and the start of its learning objectives are within the first 800 px at
  1280 px and the first two screens (1600 px) at 400 px;
- at 400 px, nothing is wider than the window except inside a box that scrolls (code, maths);
- at 1280 px, no entry of the sidebar's chapter list takes more than two lines;
- no table of the text scrolls sideways (its right-hand columns cut off; _static/companion.css sets
  tables smaller on a phone);
- the landing page (the table of contents' root) links every page the table of contents lists
  (``--toc``, default _toc.yml);
- every header button that shows or hides a sidebar (the chapter list, the page contents) does
  something when tapped: a drawer opens on a phone, the sidebar hides on a desktop (``tap_toggles``:
  real mouse events at the button's centre, the page's state compared before and after);
- the console shows no error and no page requested the network.

Then it runs a few searches on the site's own search page (``--search``; the site served from
127.0.0.1, the only address let through, since Sphinx fetches each result's page to build its snippet
and Chromium fetches no ``file://`` URL) and reports a result snippet that shows raw TeX (``\\(``,
``\\[``, ``$$``, ``\\frac``-like commands): _static/search_snippets.js turns a formula in a snippet
into plain text.

It saves a screenshot of the whole page per page and width under ``--screenshots`` (default
``_build/screenshots``, ``<page>-<width>.png``), stitched from captures of the window as a reader
scrolls it (``screenshot``). Display equations, code and output widths are measured by
tools/check_layout.py, with the same browser. Every Chromium started here is ended with all its
helpers, its profile folder removed, on every path, SIGKILL of this script included (``Browser``;
tests/test_browser_cleanup.py). Without a Chromium (``chromium-headless-shell`` or
``chromium`` on PATH, or $CHROME) it says so and exits 0, so ``make book`` works everywhere;
``--require-browser`` makes that an error (CI). Exit status 1 when any page has a problem.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

WIDTHS = (1280, 400)
HEIGHT = 900
HEIGHT_FIRST = 800  # the first screen a chapter's title, run-time line and objectives must start on
MAX_SHOT_PX = 60_000  # a full-page screenshot taller than this is cut
MARK = "CHECK_BROWSER_PROFILE"  # in the environment of each Chromium: tells which Browser started it
SIDEBAR_MAX_LINES = 2  # lines a sidebar entry may take at 1280 px
SEARCH_QUERIES = ("attention", "softmax", "variance", "rotary", "cache", "roofline")  # words near maths
# Raw TeX in a search snippet: a delimiter, or a command a formula uses (\frac, \sqrt, \mathbf, ...).
TEX = re.compile(r"\\[()\[\]]|\$\$|\\(?:[dt]?frac|sqrt|math[a-z]+|text[a-z]*|operatorname|begin|end|left|right|sum|"
                 r"prod|cdot|times|top|ell|infty|odot|alpha|beta|theta|lambda|sigma|leq?|geq?|in)(?![A-Za-z])")

# On top of Playwright's own (headless, a fresh profile, the DevTools pipe, no sandbox, ...), some the same.
CHROME_FLAGS = [
    "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run",
    "--disable-sync", "--hide-scrollbars", "--disable-extensions", "--disable-default-apps", "--mute-audio",
]
# The DevTools events the checks read (Browser.events), and the one a refused request is recorded as.
EVENTS = ("Page.loadEventFired", "Runtime.exceptionThrown", "Runtime.consoleAPICalled", "Log.entryAdded")
REFUSED = "request refused"
# A default flag of Playwright's that makes Page.captureScreenshot draw a new surface: with it ``screenshot``
# takes twice as long (ch01 at 400 px: 46-49 s against 25-26 s, the old own client's 26 s).
SCREENSHOT_SURFACE = "--enable-features=CDPScreenshotNewSurface,SkipListAccountsWithoutGaiaCookies"

# Runs in the page once it has loaded: waits for MathJax and the widget manager, then reports.
INSPECT = r"""
(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const out = {mathjax: "absent", raw_tex: [], math_errors: 0, images: [], widgets: {views: 0, drawn: 0},
               solutions: [], wide: [], page_width: 0, client_width: 0, links: {}};
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    try { await MathJax.startup.promise; out.mathjax = "done"; }
    catch (e) { out.mathjax = "failed: " + e; }
  }
  // Images: lazy ones load only near the viewport, so ask for all of them now.
  const imgs = Array.from(document.images);
  imgs.forEach((img) => { img.loading = "eager"; });
  await Promise.all(imgs.map((img) => img.decode().catch(() => null)));
  for (const img of imgs)
    if (!(img.complete && img.naturalWidth > 0)) out.images.push(img.getAttribute("src"));
  // Widgets: html-manager replaces each saved view <script> with the drawn widget beside it.
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]');
  out.widgets.views = views.length;
  for (let t = 0; t < 100; t++) {
    let drawn = 0;
    views.forEach((s) => { if (s.parentElement.querySelector(".jupyter-widgets, .lm-Widget, .p-Widget")) drawn++; });
    out.widgets.drawn = drawn;
    if (drawn === views.length) break;
    await sleep(100);
  }
  // Pre-drawn frames (companion.notebook.widgets.FramePlayer): moving a slider must change the picture.
  // A live widget's slider on a static page (no kernel) moves its number but never its plot: a dead control.
  out.frames = {players: 0, changed: 0};
  for (const player of document.querySelectorAll(".companion-frames")) {
    out.frames.players++;
    const input = player.querySelector('input[type="range"]'), img = player.querySelector("img");
    const before = img.getAttribute("src");
    input.value = String((Number(input.value) + 1) % (Number(input.max) + 1));
    input.dispatchEvent(new Event("input", {bubbles: true}));
    if (img.getAttribute("src") !== before) out.frames.changed++;
  }
  // The widget manager's scripts on a page with no widget view: megabytes loaded for nothing.
  out.widget_js = Array.from(document.scripts).filter((s) => /vendor\/widgets\/|embed-amd|html-manager/.test(s.src || "")).length;
  out.dead_sliders = document.querySelectorAll(".widget-slider, .jupyter-widget-slider, .widget-hslider").length;
  // Raw TeX left in the text outside code, and MathJax's own error boxes.
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {acceptNode: (n) => {
    for (let a = n.parentElement; a; a = a.parentElement)
      if (/^(PRE|CODE|SCRIPT|STYLE|TEXTAREA|MJX-CONTAINER|MJX-ASSISTIVE-MML)$/.test(a.tagName)) return NodeFilter.FILTER_REJECT;
    return NodeFilter.FILTER_ACCEPT; }});
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const m = n.textContent.match(/\$\$|\\\(|\\\[|\\begin\{|\\frac\{|\\mathbf\{/);
    if (m && out.raw_tex.length < 5) out.raw_tex.push(n.textContent.trim().slice(0, 80));
  }
  out.math_errors = document.querySelectorAll("mjx-merror, [data-mjx-error]").length;
  // Solutions: collapsed until the toggle is clicked, open after.
  const visible = (el) => !!el && el.getClientRects().length > 0 && getComputedStyle(el).visibility !== "hidden";
  for (const sol of document.querySelectorAll("div.solution.dropdown, details.solution")) {
    const item = {id: sol.id || "", collapsed_before: null, open_after: null};
    if (sol.tagName === "DETAILS") {
      const body = Array.from(sol.children).find((c) => c.tagName !== "SUMMARY");
      item.collapsed_before = !sol.open && !visible(body);
      sol.querySelector("summary").click();
      await sleep(50);
      item.open_after = sol.open && visible(body);
    } else {
      const body = sol.querySelector(".solution-content, .section, section");
      const button = sol.querySelector("button.toggle-button, .toggle-button");
      item.collapsed_before = !visible(body);
      if (button) { button.click(); await sleep(400); }
      item.open_after = visible(body);
    }
    // Open, its code must fit: a block that scrolls sideways inside a solution hides part of a line.
    item.cut = Array.from(sol.querySelectorAll("pre")).filter((p) => p.scrollWidth > p.clientWidth + 1).length;
    out.solutions.push(item);
  }
  // The first screen of a chapter: where its run-time line and its objectives are (page y, px).
  const runtime = document.querySelector("p.chapter-runtime");
  const objectives = Array.from(document.querySelectorAll("article .admonition"))
    .find((a) => /objectives/i.test((a.querySelector(".admonition-title") || a).textContent));
  out.first_screen = runtime ? {runtime: Math.round(runtime.getBoundingClientRect().bottom + scrollY),
    objectives: objectives ? Math.round(objectives.getBoundingClientRect().top + scrollY) : null} : null;
  // Launch and download links.
  out.links.launch = Array.from(document.querySelectorAll("a[href]")).map((a) => a.href)
    .filter((h) => /colab\.research\.google\.com|mybinder\.org|\/v2\/gh\//.test(h));
  out.links.download = Array.from(document.querySelectorAll("a[href]")).map((a) => a.getAttribute("href"))
    .filter((h) => /_sources\//.test(h));
  // The sidebar's chapter list: how many lines each shown entry takes (distinct line tops of its text).
  out.sidebar = [];
  for (const a of document.querySelectorAll(".bd-sidebar-primary nav a, #pst-primary-sidebar nav a")) {
    const range = document.createRange();
    range.selectNodeContents(a);
    const tops = new Set(Array.from(range.getClientRects()).filter((q) => q.width > 0).map((q) => Math.round(q.top)));
    if (tops.size && a.getBoundingClientRect().width > 0)
      out.sidebar.push({lines: tops.size, text: a.textContent.replace(/\s+/g, " ").trim().slice(0, 70)});
  }
  // The text's tables (a markdown table; not a cell's output): one that scrolls hides its right-hand columns.
  out.text_tables = [];
  document.querySelectorAll("article table.table").forEach((t) => {
    let box = t.parentElement;
    while (box && box.tagName !== "ARTICLE" && getComputedStyle(box).overflowX === "visible") box = box.parentElement;
    if (box && box.tagName !== "ARTICLE" && box.scrollWidth > box.clientWidth + 1 && t.getBoundingClientRect().width > 0)
      out.text_tables.push({head: (t.querySelector("th") || t).textContent.replace(/\s+/g, " ").trim().slice(0, 40),
                            need: box.scrollWidth, have: box.clientWidth});
  });
  // The links of the page's own text (not the sidebars'), as absolute URLs without their fragment.
  out.article_links = Array.from(document.querySelectorAll("article a[href], [role='main'] a[href]"))
    .map((a) => a.href.split("#")[0]);
  // Elements wider than the window that no scrolling ancestor contains.
  const W = document.documentElement.clientWidth;
  out.client_width = W;
  out.page_width = document.documentElement.scrollWidth;
  // Contained: some ancestor clips or scrolls sideways (overflow-x not visible) and itself ends inside
  // the window, e.g. a code cell, a display equation's box or a table's scrolling container.
  const inScroller = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement)
      if (getComputedStyle(a).overflowX !== "visible" && a.getBoundingClientRect().right <= W + 1) return true;
    return false;
  };
  // An off-canvas drawer (a phone's closed sidebar) is hidden as a whole even where a child sets
  // visibility: visible again (pydata's "ul.visible"): nothing in it is on the page.
  const inHidden = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement)
      if (getComputedStyle(a).visibility === "hidden") return true;
    return false;
  };
  for (const el of document.querySelectorAll("body *")) {
    const cs = getComputedStyle(el);
    if (cs.position === "fixed" || cs.visibility === "hidden" || cs.display === "none" || inHidden(el)) continue;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > W + 1 && !inScroller(el) && out.wide.length < 5)
      out.wide.push(el.tagName.toLowerCase() + "." + String(el.getAttribute("class") || "").split(" ")[0] +
                    (el.id ? "#" + el.id : "") + " (" + Math.round(r.right) + " px)");
  }
  return JSON.stringify(out);
})()
"""


# The sidebars' state as a reader sees it: which drawers (dialogs) are open and which sidebars show.
SIDEBARS = r"""
(() => {
  const shown = (el) => { if (!el) return false; const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return s.display !== "none" && s.visibility !== "hidden" && r.width > 0 && r.right > 0 && r.left < innerWidth; };
  const dialogs = Array.from(document.querySelectorAll("dialog")).filter((d) => d.open && shown(d)).map((d) => d.id);
  return JSON.stringify({dialogs, primary: shown(document.querySelector("#pst-primary-sidebar, .bd-sidebar-primary")),
                         secondary: shown(document.querySelector("#pst-secondary-sidebar, .bd-sidebar-secondary"))});
})()
"""
# The visible sidebar toggles: where to tap, and what they are called.
TOGGLES = r"""
JSON.stringify(Array.from(document.querySelectorAll(".primary-toggle, .secondary-toggle")).map((b) => {
  const r = b.getBoundingClientRect(), s = getComputedStyle(b);
  const seen = r.width > 0 && r.height > 0 && s.visibility !== "hidden" && s.display !== "none";
  return {kind: b.classList.contains("primary-toggle") ? "primary" : "secondary", seen,
          label: b.getAttribute("aria-label") || b.getAttribute("title") || b.className,
          x: r.x + r.width / 2, y: r.y + r.height / 2};
}))
"""


def _value(browser: "Browser", expression: str):
    return json.loads(browser.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"]["value"])


def tap_toggles(browser: "Browser") -> dict:
    """Tap every visible sidebar toggle of the loaded page, one at a time, with real mouse events, and
    say whether the sidebars' state changed; each is undone (drawers closed, a hidden sidebar shown again
    by a second tap) before the next. Returns {"present": any toggle in the page, "tapped": [...]}."""
    toggles = _value(browser, TOGGLES)
    tapped = []
    for t in [t for t in toggles if t["seen"]]:
        before = _value(browser, SIDEBARS)
        for kind in ("mousePressed", "mouseReleased"):
            browser.call("Input.dispatchMouseEvent", type=kind, x=t["x"], y=t["y"], button="left", clickCount=1)
        browser.call("Runtime.evaluate", expression="new Promise((r) => setTimeout(r, 400))", awaitPromise=True)
        after = _value(browser, SIDEBARS)
        tapped.append({"kind": t["kind"], "label": t["label"], "works": after != before})
        if after["dialogs"]:
            browser.call("Runtime.evaluate", expression="document.querySelectorAll('dialog[open]').forEach((d) => d.close())")
        elif after != before:
            for kind in ("mousePressed", "mouseReleased"):
                browser.call("Input.dispatchMouseEvent", type=kind, x=t["x"], y=t["y"], button="left", clickCount=1)
        browser.call("Runtime.evaluate", expression="new Promise((r) => setTimeout(r, 300))", awaitPromise=True)
    return {"present": bool(toggles), "tapped": tapped}


def find_chrome() -> str | None:
    for name in (os.environ.get("CHROME", ""), "chromium-headless-shell", "chromium", "chromium-browser",
                 "google-chrome", "headless_shell"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def repository_url(config: Path) -> str:
    """The ``repository: url:`` of _config.yml, without a trailing slash (no YAML library needed)."""
    found = re.search(r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", config.read_text(), re.M)
    if not found:
        raise ValueError(f"{config}: no repository url")
    return found.group(1).rstrip("/")


class Browser:
    """One headless Chromium and one tab, launched by Playwright and driven over the DevTools protocol
    (a CDP session on the tab: ``call``, ``events``, ``wait_for``).

    Playwright's driver (a Node process, the child of this one) starts Chromium in a session of its own
    with a fresh profile folder in the temporary directory, and ends it, its helpers and the folder with
    it, when ``close`` runs or when this process ends in any way, SIGKILL included (the driver sees its
    pipe close; tests/test_browser_cleanup.py). Use it as a context manager, or call ``close`` in a
    ``finally``; ``close`` may be called more than once. Every http(s) request is refused and recorded
    (``REFUSED``) except those starting with a prefix in ``allow``."""

    timeout = 60.0  # s a DevTools command may take: a renderer that stops answering is a TimeoutError
    driver = {"playwright": None, "users": 0}  # Playwright's sync API runs one driver a thread: shared

    def __init__(self, chrome: str) -> None:
        self.playwright = self.browser = None
        self.events: list[dict] = []
        self.allow: tuple[str, ...] = ()  # URL prefixes let through (the search check's local server)
        mark = f"{os.getpid()}-{time.time_ns()}"  # tells this Chromium apart (``leftovers``)
        STARTED.append({"session": None, "profile": None})
        try:
            if not self.driver["users"]:
                from playwright.sync_api import sync_playwright  # the `book` extra

                self.driver["playwright"] = sync_playwright().start()
            self.driver["users"] += 1
            self.playwright = self.driver["playwright"]
            self.browser = self.playwright.chromium.launch(
                executable_path=chrome, args=CHROME_FLAGS, env={**os.environ, MARK: mark}, timeout=30_000,
                ignore_default_args=[SCREENSHOT_SURFACE])
            marked = [p for p in processes() if f"{MARK}={mark}".encode() in p["environ"]]
            profile = re.search(r"--user-data-dir=(\S+)", " ".join(p["cmd"] for p in marked))
            STARTED[-1].update(session=marked[0]["session"] if marked else None,
                               profile=profile.group(1) if profile else None)
            context = self.browser.new_context(no_viewport=True)  # the window: Emulation.setDeviceMetricsOverride
            context.route(re.compile(r"^https?://"), self._route)
            self.page = context.new_page()
            self.cdp = context.new_cdp_session(self.page)
            for method in EVENTS:
                self.cdp.on(method, lambda params, method=method: self.events.append({"method": method, "params": params}))
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _route(self, route) -> None:
        """Let through a request to an ``allow`` prefix; refuse and record every other one."""
        if self.allow and route.request.url.startswith(self.allow):
            route.continue_()
        else:
            self.events.append({"method": REFUSED, "params": {"request": {"url": route.request.url}}})
            route.abort("internetdisconnected")

    def call(self, method: str, **params) -> dict:
        """The DevTools command ``method``'s result. No answer within ``timeout`` is a TimeoutError, a tab
        or browser gone a ConnectionError (both retried by ``inspect_with_retry``), any other error a
        RuntimeError."""
        from playwright.sync_api import Error
        from playwright.sync_api import TimeoutError as Silent

        try:
            return self.cdp.send(method, params, timeout=self.timeout * 1000)
        except Silent as e:
            raise TimeoutError(f"{method}: Chromium did not answer within {self.timeout:.0f} s") from e
        except Error as e:
            raise (ConnectionError if "closed" in e.message else RuntimeError)(f"{method}: {e.message}") from e

    def wait_for(self, method: str, timeout: float = 60, since: int | None = None) -> None:
        """Wait for the event ``method``. With ``since`` (a length of ``self.events`` taken before the
        command that causes it), an event that already arrived while ``call`` waited for that
        command's reply counts too: a small page can fire its load event before Chromium answers
        ``Page.navigate``, and waiting for a second one would hang."""
        from playwright.sync_api import Error

        since = len(self.events) if since is None else since
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events[since:]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            try:
                self.page.wait_for_timeout(50)  # Playwright delivers events while it waits
            except Error as e:  # the tab or the browser gone
                raise ConnectionError(f"waiting for {method}: {e.message}") from e

    def close(self) -> None:
        """End Chromium (its helpers and profile folder go with it), and Playwright's driver when no other
        Browser uses it. Idempotent."""
        browser, self.browser = getattr(self, "browser", None), None
        playwright, self.playwright = getattr(self, "playwright", None), None
        try:
            if browser is not None:
                browser.close()
        except Exception:  # a browser already gone: stopping the driver ends whatever is left
            pass
        finally:
            if playwright is not None:
                self.driver["users"] -= 1
                if not self.driver["users"]:
                    self.driver["playwright"] = None
                    playwright.stop()


STARTED: list[dict] = []  # every Browser this process started: its Chromium's session id and profile folder


def processes() -> list[dict]:
    """Live Chromium processes and marked launchers on this machine: pid, session id, command line.
    A process counts when it carries the ``CHECK_BROWSER_PROFILE`` mark in its environment (the launcher
    and Chromium) or runs a Chromium binary (its helpers: zygotes, renderers, the GPU and network
    processes, which Chromium starts with a clean environment, in the launcher's session)."""
    found = []
    proc_root = Path("/proc")
    for entry in proc_root.iterdir() if proc_root.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            exe = os.path.basename(os.readlink(entry / "exe"))
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if stat[0] == "Z":
            continue
        if MARK.encode() + b"=" in environ or "chrom" in exe or "headless_shell" in exe:
            found.append({"pid": int(entry.name), "session": int(stat[3]), "cmd": cmd, "environ": environ})
    return found


def leftovers(started: list[dict] | None = None) -> dict[str, list[str]]:
    """What the browsers in ``started`` (default: every one this process started, ``STARTED``) left
    behind: live processes in their sessions, and their profile folders if they still exist.
    tests/test_browser_cleanup.py checks that this is empty after every kind of ending."""
    started = STARTED if started is None else started
    sessions = {b["session"] for b in started if b["session"]}
    procs = [f"{p['pid']} {p['cmd'][:120]}" for p in processes() if p["session"] in sessions]
    folders = [b["profile"] for b in started if b["profile"] and os.path.exists(b["profile"])]
    return {"processes": sorted(procs), "profiles": sorted(folders)}


def console_errors(events: list[dict]) -> list[str]:
    """Errors from the console, uncaught exceptions, failed loads and refused network requests."""
    errors = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            errors.append("uncaught: " + (d.get("exception", {}).get("description") or d.get("text", "")).split("\n")[0])
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                      for a in p.get("args", []))[:200])
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            entry = p["entry"]
            errors.append(f"{entry['source']}: {entry['text']} {entry.get('url', '')}".strip()[:200])
        elif m == REFUSED:
            errors.append("network request refused (the site must work offline): " + p["request"]["url"][:150])
    return list(dict.fromkeys(errors))


def inspect(browser: Browser, page: Path, width: int, shots: Path | None, site: Path) -> dict:
    browser.events.clear()
    browser.call("Emulation.setDeviceMetricsOverride", width=width, height=HEIGHT, deviceScaleFactor=1, mobile=False)
    mark = len(browser.events)
    browser.call("Page.navigate", url=page.resolve().as_uri())
    browser.wait_for("Page.loadEventFired", since=mark)
    result = browser.call("Runtime.evaluate", expression=INSPECT, awaitPromise=True, returnByValue=True, timeout=60_000)
    if "exceptionDetails" in result:
        raise RuntimeError(f"{page.name}: the inspecting script failed: {result['exceptionDetails']}")
    report = json.loads(result["result"]["value"])
    # Let late errors (fonts, widget callbacks) arrive before reading the console.
    browser.call("Runtime.evaluate", expression="new Promise((r) => setTimeout(r, 300))", awaitPromise=True)
    report["console"] = console_errors(browser.events)
    report["nav"] = tap_toggles(browser)
    if shots is not None:
        # Collapse the solutions again so that the screenshot shows the page as a reader first sees it.
        mark = len(browser.events)
        browser.call("Page.reload", ignoreCache=False)
        browser.wait_for("Page.loadEventFired", since=mark)
        browser.call("Runtime.evaluate", awaitPromise=True, expression=(
            "(async () => { if (window.MathJax && MathJax.startup) await MathJax.startup.promise;"
            " await Promise.all(Array.from(document.images).map((i) => { i.loading = 'eager';"
            " return i.decode().catch(() => null); })); await new Promise((r) => setTimeout(r, 500)); })()"))
        png = screenshot(browser, width)
        name = str(page.relative_to(site).with_suffix("")).replace(os.sep, "__")
        shots.mkdir(parents=True, exist_ok=True)
        (shots / f"{name}-{width}.png").write_bytes(png)
    return report


def inspect_with_retry(browser: Browser, chrome: str, page: Path, width: int, shots: Path | None,
                       site: Path) -> tuple[dict | None, Browser]:
    """``inspect``; a renderer that stops answering (a loaded machine) gets one more try in a fresh
    Chromium. Returns the report (None when the second try failed too, said on stdout) and the
    browser to go on with; every browser given up is closed here."""
    name = page.relative_to(site)
    for attempt in (1, 2):
        try:
            return inspect(browser, page, width, shots, site), browser
        except (TimeoutError, OSError) as e:
            browser.close()
            browser = Browser(chrome)
            if attempt == 1:
                print(f"check_browser: {name} @ {width} px: no answer ({e!r}); "
                      "restarting Chromium and trying the page once more", flush=True)
            else:
                print(f"check_browser: {name} @ {width} px: no answer again ({e!r}): a problem", flush=True)
    return None, browser


class ended_on_sigterm:
    """Within it, SIGTERM (``timeout``, ``kill``, a CI runner giving up) raises SystemExit, so that the
    ``finally`` blocks that close the browsers run; outside the main thread it does nothing."""

    def __enter__(self):
        import signal
        import threading

        self.previous = None
        if threading.current_thread() is threading.main_thread():
            def stop(signum, frame):
                raise SystemExit(128 + signum)
            self.previous = signal.signal(signal.SIGTERM, stop)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def screenshot(browser: Browser, width: int, height: int = HEIGHT) -> bytes:
    """The whole page as a reader scrolling through it sees it, as one PNG ``width`` px wide.

    It is stitched from viewport captures at successive scroll positions, the window kept at
    ``width`` x ``height``: a single ``captureBeyondViewport`` capture instead stretches the window to
    the page's full height, which lays the page out for a window no reader has (``100vh`` boxes,
    sticky sidebars and the header computed for a 20,000 px tall window). Rows hidden under a sticky
    header are taken from the next capture, so every row of the page appears once, under the header
    and beside the sidebars a reader sees at that point. Pages taller than ``MAX_SHOT_PX`` are cut. Every scroll is
    ``behavior: instant``: the theme scrolls smoothly, and a smooth scroll is still moving when the
    capture is taken (two runs of one page differed in half their rows)."""
    import io

    from PIL import Image  # Pillow comes with matplotlib (the companion's dependency)

    geometry = json.loads(browser.call("Runtime.evaluate", returnByValue=True, expression="""JSON.stringify((() => {
        // The bars that stay at the top while the page scrolls (the site header, the article's
        // button bar): sticky or fixed, short, starting near the top. Sidebars are tall: not bars.
        window.scrollTo({top: Math.min(2000, document.documentElement.scrollHeight), behavior: "instant"});
        let top = 0;
        for (const el of document.querySelectorAll("body *")) {
          const cs = getComputedStyle(el);
          if (cs.position !== "sticky" && cs.position !== "fixed") continue;
          const r = el.getBoundingClientRect();
          if (r.height > 0 && r.height < 150 && r.top < 200 && r.width > window.innerWidth / 3) top = Math.max(top, r.bottom);
        }
        window.scrollTo({top: 0, behavior: "instant"});
        return {total: document.documentElement.scrollHeight, header: Math.max(0, Math.round(top))};
      })())""")["result"]["value"])
    total = min(int(geometry["total"]), MAX_SHOT_PX)
    header = min(int(geometry["header"]), height // 2)
    sheet = Image.new("RGB", (width, max(total, 1)), "white")
    y = 0  # the first page row not yet on the sheet
    while y < total:
        target = 0 if y == 0 else y - header
        scrolled = browser.call("Runtime.evaluate", returnByValue=True, awaitPromise=True, expression=(
            f"(async () => {{ window.scrollTo({{top: {target}, behavior: 'instant'}}); await new Promise((r) => requestAnimationFrame("
            "() => requestAnimationFrame(r))); return window.scrollY; })()"))["result"]["value"]
        shot = Image.open(io.BytesIO(base64.b64decode(
            browser.call("Page.captureScreenshot", format="png")["data"]))).convert("RGB")
        top = y - int(scrolled)  # the viewport row that shows page row y
        rows = min(shot.height - top, total - y)
        if rows <= 0:
            break
        sheet.paste(shot.crop((0, top, width, top + rows)), (0, y))
        y += rows
    browser.call("Runtime.evaluate", expression="window.scrollTo({top: 0, behavior: 'instant'})")
    out = io.BytesIO()
    sheet.save(out, format="PNG", optimize=False)
    return out.getvalue()


def read_toc(toc: Path) -> tuple[str, list[str]]:
    """The root and every listed page (``file:`` entries, in order) of a Jupyter Book _toc.yml."""
    text = toc.read_text()
    root = re.search(r"^root:\s*(\S+)", text, re.M)
    if not root:
        raise ValueError(f"{toc}: no root")
    return root.group(1), re.findall(r"^[\s-]*file:\s*(\S+)", text, re.M)


def problems_of(report: dict, page: Path, site: Path, width: int, repo: str,
                toc: tuple[str, list[str]] | None = None) -> list[str]:
    problems = []
    if width >= 1000:  # on a phone the chapter list is a drawer as wide as the screen
        long = [f"'{s['text']}' ({s['lines']} lines)" for s in report.get("sidebar", []) if s["lines"] > SIDEBAR_MAX_LINES]
        if long:
            problems.append(f"{len(long)} sidebar entr{'y takes' if len(long) == 1 else 'ies take'} more than "
                            f"{SIDEBAR_MAX_LINES} lines: {'; '.join(long)}")
    for tb in report.get("text_tables", []):
        problems.append(f"the table headed '{tb['head']}' needs {tb['need']} px in its {tb['have']} px box: it scrolls, "
                        "its right-hand columns cut off")
    if toc and page.resolve() == (site / f"{toc[0]}.html").resolve():
        linked = {Path(unquote(urlparse(h).path)).resolve() for h in report.get("article_links", [])}
        missing = [f for f in toc[1] if (site / f"{f}.html").resolve() not in linked]
        if missing:
            problems.append(f"the landing page links {len(toc[1]) - len(missing)} of the {len(toc[1])} pages of the "
                            f"table of contents; not: {', '.join(missing)}")
    if report["mathjax"] not in ("done", "absent"):
        problems.append(f"MathJax did not finish: {report['mathjax']}")
    if report["raw_tex"]:
        problems.append(f"raw TeX left in the text: {report['raw_tex']}")
    if report["math_errors"]:
        problems.append(f"{report['math_errors']} MathJax error box(es)")
    if report["images"]:
        problems.append(f"images that did not load: {report['images'][:5]}")
    w = report["widgets"]
    if w["drawn"] < w["views"]:
        problems.append(f"{w['views'] - w['drawn']} of {w['views']} widgets were not drawn")
    frames = report.get("frames", {"players": 0, "changed": 0})
    if frames["changed"] < frames["players"]:
        problems.append(f"{frames['players'] - frames['changed']} of {frames['players']} pre-drawn frame players did "
                        "not change their picture when a slider moved")
    if report.get("widget_js") and not w["views"]:
        problems.append(f"{report['widget_js']} widget script(s) loaded on a page with no widget view")
    if report.get("dead_sliders"):
        problems.append(f"{report['dead_sliders']} live widget slider(s): on the static page they cannot redraw their "
                        "plot (show pre-drawn frames instead: companion.notebook.widgets, *_frames)")
    for s in report["solutions"]:
        if not s["collapsed_before"]:
            problems.append(f"solution {s['id']} is open before its toggle is clicked")
        if not s["open_after"]:
            problems.append(f"solution {s['id']} does not open when its toggle is clicked")
        if width >= 1000 and s.get("cut"):  # on a phone every code block scrolls; on a desktop none should
            problems.append(f"solution {s['id']}: {s['cut']} code block(s) wider than the solution box")
    rel = page.relative_to(site)
    source = site / "_sources" / rel.with_suffix(".ipynb")
    if source.exists():  # a chapter: launch buttons and the notebook download
        nb_path = rel.with_suffix(".ipynb").as_posix()
        owner_repo = repo.split("github.com/", 1)[-1]
        launch = report["links"]["launch"]
        for service in ("colab.research.google.com", "mybinder.org"):
            hits = [h for h in launch if service in h]
            if not hits:
                problems.append(f"no {service} launch button")
            elif not all(owner_repo in h and nb_path in h for h in hits):
                problems.append(f"the {service} launch button does not open {owner_repo}/{nb_path}: {hits[0]}")
        downloads = [d for d in report["links"]["download"] if d.split("?")[0].endswith(".ipynb")]
        if not downloads:
            problems.append("no download link to the page's .ipynb")
        for d in downloads:
            target = (page.parent / d.split("?")[0]).resolve()
            if target != source.resolve() or not target.exists():
                problems.append(f"the download link {d} does not point at {source.relative_to(site)}")
    first = report.get("first_screen")
    if first:  # a chapter: title, run-time line and the objectives' start on the first screen (two on a phone)
        limit = HEIGHT_FIRST * (1 if width >= 1000 else 2)
        if first["runtime"] > limit:
            problems.append(f"the run-time line ends {first['runtime']} px down (want within {limit} px)")
        if first["objectives"] is None or first["objectives"] > limit:
            problems.append(f"the learning objectives start {first['objectives']} px down (want within {limit} px)")
    nav = report.get("nav", {"present": False, "tapped": []})
    for t in nav["tapped"]:
        if not t["works"]:
            problems.append(f"the header button '{t['label']}' ({t['kind']} sidebar) opens or hides nothing when tapped")
    if nav["present"] and width < 600 and not any(t["kind"] == "primary" for t in nav["tapped"]):
        problems.append("no visible button opens the chapter list")
    if report["page_width"] > report["client_width"] + 1 or report["wide"]:
        problems.append(f"wider than the {width} px window ({report['page_width']} px): {', '.join(report['wide'])}")
    problems += [f"console: {c}" for c in report["console"]]
    return problems


# The search page's state: finished or not, its results and their snippets' text.
SNIPPETS = r"""JSON.stringify({
  finished: /finished/i.test((document.querySelector("#search-results p.search-summary") || {}).textContent || ""),
  results: document.querySelectorAll("ul.search > li").length,
  snippets: Array.from(document.querySelectorAll("ul.search > li p.context")).map((p) => p.textContent.replace(/\s+/g, " ").trim())})"""


@contextlib.contextmanager
def served(site: Path):
    """The site over HTTP on 127.0.0.1 (a port of its own) while the block runs; yields its base URL."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def search_snippets(browser: Browser, base: str, query: str, timeout: float = 30) -> dict:
    """Search for ``query`` on the search page at ``base`` and wait until its snippets stop coming
    (Sphinx fetches each result's page after it says it has finished). Returns SNIPPETS' state."""
    browser.events.clear()
    mark = len(browser.events)
    browser.call("Page.navigate", url=f"{base}search.html?q={quote(query)}")
    browser.wait_for("Page.loadEventFired", since=mark)
    deadline, state, steady = time.monotonic() + timeout, {}, 0
    while time.monotonic() < deadline:
        browser.call("Runtime.evaluate", expression="new Promise((r) => setTimeout(r, 250))", awaitPromise=True)
        new = _value(browser, SNIPPETS)
        steady = steady + 1 if new == state else 0
        state = new
        if state["finished"] and (len(state["snippets"]) >= state["results"] or steady >= 8):
            break
    return state


def search_problems(state: dict) -> list[str]:
    if not state.get("finished"):
        return ["the search did not finish"]
    if not state["results"]:
        return ["the search found nothing"]
    if not state["snippets"]:
        return [f"none of its {state['results']} results has a snippet"]
    tex = [(s, TEX.search(s)) for s in state["snippets"] if TEX.search(s)]
    if not tex:
        return []
    s, m = tex[0]
    return [f"{len(tex)} of {len(state['snippets'])} snippets show raw TeX, e.g. "
            f"'...{s[max(0, m.start() - 30):m.end() + 30]}...'"]


def site_pages(site: Path) -> list[Path]:
    skip = {"_static", "_sources", "vendor", "_images"}
    return sorted(p for p in site.rglob("*.html") if not skip & set(p.relative_to(site).parts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("site", nargs="?", default="_build/html", type=Path, help="the built site (default: _build/html)")
    ap.add_argument("--pages", nargs="+", help="only these pages, relative to SITE (default: every page)")
    ap.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS), help="window widths in px (default: 1280 400)")
    ap.add_argument("--screenshots", type=Path, default=Path("_build/screenshots"),
                    help="folder for <page>-<width>.png (default: _build/screenshots)")
    ap.add_argument("--no-screenshots", action="store_true", help="check only, save no screenshots")
    ap.add_argument("--config", type=Path, default=Path("_config.yml"), help="where the repository URL is read")
    ap.add_argument("--toc", type=Path, default=Path("_toc.yml"),
                    help="the table of contents whose every page the landing page must link (default: _toc.yml)")
    ap.add_argument("--search", nargs="*", metavar="WORD",
                    help=f"search the site for these words and check the snippets (default, for the whole site: "
                         f"{' '.join(SEARCH_QUERIES)}; with --pages only when given)")
    ap.add_argument("--require-browser", action="store_true", help="fail, instead of skipping, without a Chromium")
    args = ap.parse_args(argv)
    chrome = find_chrome()
    if chrome is None:
        msg = "check_browser: no Chromium found (set $CHROME or apt-get install chromium-headless-shell)"
        print(msg + ("" if args.require_browser else "; the browser check is SKIPPED"))
        return 1 if args.require_browser else 0
    pages = [args.site / p for p in args.pages] if args.pages else site_pages(args.site)
    if not pages:
        print(f"check_browser: no pages under {args.site}; build the book first")
        return 1
    repo = repository_url(args.config)
    toc = read_toc(args.toc) if args.toc.exists() else None
    queries = args.search or (SEARCH_QUERIES if args.search is not None or not args.pages else ())
    if not (args.site / "search.html").exists():
        queries = ()
    shots = None if args.no_screenshots else args.screenshots
    failed = 0
    with ended_on_sigterm():
        browser = Browser(chrome)
        try:
            for page in pages:
                redirect = re.search(r'http-equiv="refresh"[^>]*url=([^"\'>]+)', page.read_text(errors="replace"), re.I)
                if redirect:  # a bare redirect (index.html): its target must exist; nothing to render
                    target = (page.parent / redirect.group(1)).resolve()
                    ok = target.exists()
                    failed += not ok
                    print(f"check_browser: {page.relative_to(args.site)} redirects to {redirect.group(1)}: "
                          f"{'ok' if ok else 'the target is missing'}")
                    continue
                for width in args.widths:
                    start = time.perf_counter()
                    report, browser = inspect_with_retry(browser, chrome, page, width, shots, args.site)
                    if report is None:
                        failed += 1
                        continue
                    problems = problems_of(report, page, args.site, width, repo, toc)
                    failed += bool(problems)
                    w = report["widgets"]
                    print(f"check_browser: {page.relative_to(args.site)} @ {width} px: mathjax {report['mathjax']}, "
                          f"{w['drawn']}/{w['views']} widgets, {len(report['solutions'])} solutions, "
                          f"{time.perf_counter() - start:.1f} s: {'; '.join(problems) or 'ok'}", flush=True)
            if queries:
                with served(args.site) as base:
                    browser.allow = (base,)
                    for query in queries:
                        state = search_snippets(browser, base, query)
                        problems = search_problems(state)
                        failed += bool(problems)
                        print(f"check_browser: search '{query}': {state.get('results', 0)} results, "
                              f"{len(state.get('snippets', []))} snippets: {'; '.join(problems) or 'ok'}", flush=True)
                    browser.allow = ()
        finally:
            browser.close()
    print(f"check_browser: {len(pages)} pages x {len(args.widths)} widths"
          + (f" and {len(queries)} searches" if queries else "") + f", {failed} with problems"
          + (f"; screenshots in {shots}" if shots else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
