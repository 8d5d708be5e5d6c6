"""Test-session glue shared by unit tests and notebooks.

- Prints the execution time of every notebook at the end of the run, slowest first, against the
  book's budget (120 s a chapter, 20 minutes for the whole book, on 2 CPU cores).
- Fails the run if --nbval was given but some notebook under book/ was not collected, so a
  renamed or mis-pathed chapter cannot drop out of testing silently.
- Prints the CPU model and torch's kernel capability at the start of every run (tools/kernel_path.py).
- After a run on the pinned kernel path that executed every chapter under nbval without a failure, writes each chapter's time
  and the machine to ``book/chapter_times.json``, from which ``tools/backmatter.py`` makes the
  instructor guide's run-time table (generated, never typed).
- Registers the ``dry_run`` marker (tests/test_gpu_dry_run.py: every chapter in the gpu profile's
  CPU dry run), so ``-m "not dry_run"`` leaves those out of a quick local run.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from datetime import date
from pathlib import Path

import pytest

from tools.kernel_path import cpu_model, describe, environ

CHAPTER_BUDGET_S = 120.0
BOOK_BUDGET_S = 20 * 60.0
ROOT = Path(__file__).parent

os.environ.setdefault("COMPANION_PROFILE", "quick")
# Under pytest-xdist several workers (and the notebook kernels they start) share the cores; with torch's
# default of one thread per core they oversubscribe them, and small models then run many times slower
# (CONTRIBUTING.md, "Threads and determinism"). One thread per worker keeps the run fast; the notebook
# kernels inherit the setting, and `companion.profile()` pins torch to one thread in the quick profile
# anyway, so `make test` runs the chapters in parallel, one per worker.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

_durations: dict[str, float] = defaultdict(float)
_failed: set[str] = set()
_slowest: dict[str, str] = {}  # a gpu dry run's slowest cells (tests/test_gpu_dry_run.py)
SLOW_DRY_RUN_S = 60.0
TIMES_FILE = ROOT / "book" / "chapter_times.json"


def pytest_report_header(config):
    """The machine and the kernel path, first thing in every run: a float result is only comparable
    with the machine and path it came from (tools/kernel_path.py)."""
    return describe()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "dry_run: a chapter executed in the gpu profile's CPU dry run (tests/test_gpu_dry_run.py)"
    )


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _durations[path] += report.duration  # setup + call + teardown
        if report.failed:
            _failed.add(path)
    elif path.endswith("test_gpu_dry_run.py") and "[" in report.nodeid and report.nodeid.endswith(".ipynb]"):
        name = f"{report.nodeid.rsplit('[', 1)[1][:-1]} (gpu dry run)"
        _durations[name] += report.duration
        _slowest.update({name: v for k, v in report.user_properties if k == "slowest_cells"})


def pytest_collection_finish(session):
    if not (session.config.getoption("nbval", default=False)
            or session.config.getoption("nbval_lax", default=False)):
        return
    if getattr(session.config, "workerinput", None) is None and session.config.getoption("numprocesses", default=None):
        return  # the pytest-xdist controller collects nothing; each worker runs this check on its own collection
    if session.config.getoption("collectonly", default=False) or not any(
        str(a).rstrip("/").endswith("book") or a in (".", str(ROOT)) for a in session.config.args
    ):
        return
    collected = {Path(item.nodeid.split("::", 1)[0]).name for item in session.items if item.nodeid.split("::", 1)[0].endswith(".ipynb")}
    expected = {p.name for p in (ROOT / "book").glob("*.ipynb")}
    missing = sorted(expected - collected)
    if missing:
        raise pytest.UsageError(f"notebooks under book/ that nbval did not collect: {missing}")


def _on_pinned_path():
    return all(os.environ.get(k) == v for k, v in environ("pinned").items())


def pytest_terminal_summary(terminalreporter):
    if not _durations:
        return
    tr = terminalreporter
    # The budget is the pinned (AVX2) path's; the alternate path's no-SIMD kernels are ~1.8x slower.
    budgeted = _on_pinned_path()
    tr.section("notebook execution time (slowest first)"
               + ("" if budgeted else "; budget not applied off the pinned kernel path"))
    total = 0.0
    for path, secs in sorted(_durations.items(), key=lambda kv: -kv[1]):
        flag = "  OVER BUDGET" if budgeted and secs > CHAPTER_BUDGET_S else ""
        tr.write_line(f"{secs:8.1f} s  {path}{flag}")
        if secs > SLOW_DRY_RUN_S and path in _slowest:  # a dry run costs seconds: say where this one's went
            tr.write_line(f"{'':12}slowest cells: {_slowest[path]}")
        if path.endswith(".ipynb"):
            total += secs
    if total:
        flag = "  OVER BUDGET" if budgeted and total > BOOK_BUDGET_S else ""
        tr.write_line(f"{total:8.1f} s  all notebooks, summed (budget {CHAPTER_BUDGET_S:.0f} s a chapter, "
                      f"{BOOK_BUDGET_S / 60:.0f} min in all){flag}")


def pytest_sessionfinish(session, exitstatus):
    """Record the chapters' nbval times when this run executed all of them and none failed."""
    if getattr(session.config, "workerinput", None) is not None:
        return  # an xdist worker: the controller has every report
    chapters = {p.name for p in (ROOT / "book").glob("ch[0-9][0-9]_*.ipynb")}
    timed = {Path(p).name: s for p, s in _durations.items() if p.endswith(".ipynb")}
    if not session.config.getoption("nbval", default=False) or not _on_pinned_path():
        return  # only the run on the pinned path that compares outputs is the book's reference run
    if not chapters or set(timed) != chapters or _failed or exitstatus != 0:
        return
    import torch

    record = {
        "note": "written by conftest.py after a full nbval run; tools/backmatter.py reads it",
        "date": date.today().isoformat(), "cpu": cpu_model(), "cores": os.cpu_count(),
        "workers": session.config.getoption("numprocesses", default=None) or 1, "torch": torch.__version__,
        "seconds": {name: round(timed[name], 1) for name in sorted(timed)},
    }
    TIMES_FILE.write_text(json.dumps(record, indent=1) + "\n")
