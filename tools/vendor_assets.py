"""Put local copies of the JavaScript the rendered book needs under _vendor/site/vendor/.

Why: by default the site loads MathJax and the ipywidgets manager from CDNs, so math and widgets
vanish for a reader without a network. The build copies them next to the HTML instead:

- MathJax 3 from the installed PyPI package ``django-static-mathjax`` (a book extra);
- ``@jupyter-widgets/html-manager@1`` and ``requirejs`` from the npm registry, pinned by version
  and checked against their published sha512 integrity; downloaded once, then reused.

It also writes ``widgets/book-shims.js``, loaded before the widget manager (see SHIMS): it tells the
manager where its fonts are and lets its MathJax 2 call reach MathJax 3.

_config.yml points Sphinx at these files; ``html_extra_path`` copies _vendor/site into the HTML
output. They are kept out of _static/ because Sphinx copies all of _static into every build and
themes may inject what is there.

Usage: python tools/vendor_assets.py _vendor
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

NPM = {
    "html-manager": (
        "https://registry.npmjs.org/@jupyter-widgets/html-manager/-/html-manager-1.0.7.tgz",
        "sha512-2xGwS7vVd2RGlKMiSqj1vYv2X59V73ygefUodhzy9Bho0mswWT/yo3Cg7MaYOqwozQjNo5k3rbJ3cETXWUwJ/g==",
        "package/dist/",
    ),
    "requirejs": (
        "https://registry.npmjs.org/requirejs/-/requirejs-2.3.8.tgz",
        "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
        "package/require.js",
    ),
}


# Two errors tools/check_browser.py saw on every page with a widget, and their fixes:
# - the manager loads its icon fonts from "<page>/@jupyter-widgets/html-manager/dist/...", which does
#   not exist: its AMD build takes the base URL of its assets from its own requirejs module name, so
#   map that name to the folder this file (and the fonts) are in;
# - the manager typesets widget labels with MathJax 2's MathJax.Hub.Queue, and the book loads
#   MathJax 3, which has no Hub ("Cannot read properties of undefined (reading 'Queue')"): give it a
#   Hub whose Queue(["Typeset", hub, element]) asks MathJax 3 to typeset that element.
SHIMS = """// Written by tools/vendor_assets.py; loaded by _config.yml after require.js, before embed-amd.js.
(function () {
  const here = document.currentScript.src.replace(/[^/]*$/, "");
  window.__jupyter_widgets_assets_path__ = here;
  // The AMD build finds its assets relative to its own module URI: map that module name here.
  if (window.require && window.require.config)
    window.require.config({paths: {"@jupyter-widgets/html-manager/dist": here.slice(0, -1)}});
  const hub = {
    Queue: function () {
      for (const job of arguments) {
        const element = Array.isArray(job) ? job[2] : null;
        const mj = window.MathJax;
        if (!element || !mj || !mj.startup || !mj.startup.promise) continue;
        mj.startup.promise.then(() => mj.typesetPromise([element])).catch((e) => console.warn(e));
      }
    },
  };
  // MathJax 3 replaces the window.MathJax configuration object when it loads (a deferred script,
  // before DOMContentLoaded), so add the Hub now and again once the document is parsed.
  const install = () => { window.MathJax = window.MathJax || {}; window.MathJax.Hub = window.MathJax.Hub || hub; };
  install();
  document.addEventListener("DOMContentLoaded", install);
})();
"""


def fetch(url: str, integrity: str, cache: Path) -> bytes:
    algo, _, expected = integrity.partition("-")
    target = cache / url.rsplit("/", 1)[1]
    if target.exists():
        data = target.read_bytes()
    else:
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:
                data = resp.read()
        except OSError as e:
            sys.exit(f"vendor_assets: could not download {url} ({e}); the book needs it once, with network access")
        cache.mkdir(parents=True, exist_ok=True)
    digest = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if digest != expected:
        target.unlink(missing_ok=True)
        sys.exit(f"vendor_assets: {url} does not match its published {algo} integrity; refusing to use it")
    target.write_bytes(data)
    return data


def extract(data: bytes, member_prefix: str, dest: Path) -> int:
    n = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.startswith(member_prefix):
                rel = m.name[len(member_prefix):] or Path(m.name).name
                out = dest / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(tar.extractfile(m).read())
                n += 1
    return n


def main(root: Path) -> None:
    site = root / "site" / "vendor"
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("vendor_assets: the package django-static-mathjax is missing; install the book extras: pip install -e '.[book]'")
    es5 = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    if not (es5 / "tex-chtml.js").exists():
        sys.exit(f"vendor_assets: no MathJax 3 build found at {es5}")
    shutil.rmtree(site / "mathjax", ignore_errors=True)
    shutil.copytree(es5, site / "mathjax")

    cache = root / "downloads"
    url, integ, prefix = NPM["html-manager"]
    widgets = site / "widgets"
    shutil.rmtree(widgets, ignore_errors=True)
    if extract(fetch(url, integ, cache), prefix, widgets) == 0:
        sys.exit("vendor_assets: html-manager tarball had no dist/ files")
    url, integ, prefix = NPM["requirejs"]
    extract(fetch(url, integ, cache), prefix, widgets / "require.js")
    (widgets / "book-shims.js").write_text(SHIMS)
    (root / ".complete").write_text("ok\n")
    print(f"vendor_assets: MathJax and widget JavaScript ready under {site}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "_vendor"))
