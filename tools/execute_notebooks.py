"""Re-execute chapter notebooks in place, in the default (quick) profile, and store their outputs.

The committed outputs are what the rendered book shows and what nbval compares against, so run
this after editing a chapter (``make outputs``, or name notebooks: python tools/execute_notebooks.py
book/ch01_attention.ipynb). Widget state is stored so that the static site can draw widgets.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    env_profile = os.environ.get("COMPANION_PROFILE", "quick")
    if env_profile != "quick":
        sys.exit(f"refusing to store outputs from COMPANION_PROFILE={env_profile!r}: committed outputs come from 'quick'")
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nbformat.write(nb, path)
    return elapsed


def main(args: list[str]) -> None:
    os.environ.setdefault("COMPANION_PROFILE", "quick")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    paths = [Path(a) for a in args] or sorted(Path("book").glob("*.ipynb"))
    for p in paths:
        print(f"{execute(p):7.1f} s  {p}")


if __name__ == "__main__":
    main(sys.argv[1:])
