"""Re-execute chapter notebooks in place, in the default (quick) profile, and store their outputs.

The committed outputs are what the rendered book shows and what nbval compares against, so run
this after editing a chapter (``make outputs``, or name notebooks: python tools/execute_notebooks.py
book/ch01_attention.ipynb). Widget state is stored so that the static site can draw widgets.

So that a commit of fresh outputs shows only real changes, the stored notebook is normalised:
each cell's timing metadata (``metadata.execution``, written by nbclient) is dropped, and
consecutive stream outputs of the same stream (stdout, stderr) are merged into one, as Jupyter
shows them (nbclient stores one output per flush, which varies from run to run).

The kernels run on the pinned CPU kernel path (AVX2 arithmetic, tools/kernel_path.py), whatever the
machine's widest instruction set, and torch on one thread: the stored outputs are then the ones that
`make test` reproduces everywhere.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from kernel_client import SlicedKernelManager
from kernel_path import describe, environ


def merge_streams(outputs: list) -> list:
    """Consecutive ``stream`` outputs with the same name joined into one (text concatenated)."""
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (out.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream"
                and prev.get("name") == out.get("name")):
            prev["text"] = "".join(prev["text"]) + "".join(out["text"])
        else:
            merged.append(out)
    return merged


def normalise(nb) -> None:
    """Drop per-cell timing metadata and merge split streams, in place."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    env_profile = os.environ.get("COMPANION_PROFILE", "quick")
    if env_profile != "quick":
        sys.exit(f"refusing to store outputs from COMPANION_PROFILE={env_profile!r}: committed outputs come from 'quick'")
    client = NotebookClient(
        nb,
        kernel_manager_class=SlicedKernelManager,  # polls in slices: tools/kernel_client.py
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    normalise(nb)
    nbformat.write(nb, path)
    return elapsed


def main(args: list[str]) -> None:
    os.environ.setdefault("COMPANION_PROFILE", "quick")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # The stored outputs come from the pinned kernel path, so that nbval reproduces them on any x86-64
    # machine with AVX2 (tools/kernel_path.py); the kernels inherit the environment.
    os.environ.update(environ("pinned"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(describe(), flush=True)
    paths = [Path(a) for a in args] or sorted(Path("book").glob("*.ipynb"))
    for p in paths:
        print(f"{execute(p):7.1f} s  {p}")


if __name__ == "__main__":
    main(sys.argv[1:])
