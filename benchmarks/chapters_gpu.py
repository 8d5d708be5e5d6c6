"""Every chapter in the gpu profile, side by side, each one's time reported: the book as a GPU reader runs it.

    python benchmarks/chapters_gpu.py                       # all chapters, COMPANION_PROFILE=gpu, on CUDA
    python benchmarks/chapters_gpu.py --jobs 4 book/ch03_transformer.ipynb
    python benchmarks/chapters_gpu.py --dry-run book/ch01_attention.ipynb   # the gpu code paths on a CPU

Each chapter runs in its own ``pytest --nbval-lax`` process (every cell executed, every assert enforced,
stored outputs not compared: a GPU's numbers differ from the stored CPU ones), ``--jobs`` at a time,
with ``COMPANION_PROFILE=gpu`` (and ``COMPANION_DRY_RUN=1`` with ``--dry-run``: the gpu profile's code
paths at the quick sizes on the CPU, as tests/test_gpu_dry_run.py runs them). A chapter that passes
the per-chapter ``--timeout`` is stopped and reported as timed out, so the table is complete even when
the whole run has a limit (benchmarks/gpu_check.sh gives this piece one).

Prints one markdown table, slowest first: chapter, status, wall seconds, cells passed and failed, and
the first failing cell. Exit status 0 when every chapter passed, 1 otherwise, 2 without CUDA (unless
--dry-run). Times measured with ``--jobs`` > 1 include the other chapters' share of the GPU and CPU:
they are upper bounds on a chapter alone (run it alone for its own time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_chapter(path: Path, env: dict, timeout: float) -> dict:
    """One chapter under nbval-lax in a fresh process: status, seconds, cells passed/failed."""
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider", "-q",
           "-o", "addopts=", str(path)]
    start = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        out, status = r.stdout + r.stderr, ("passed" if r.returncode == 0 else "failed")
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        status = "timed out"
    seconds = time.perf_counter() - start
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error)", out)}
    first = re.search(r"::Cell (\d+)", out) if status == "failed" else None
    return {"chapter": path.name, "status": status, "seconds": seconds, "passed": counts.get("passed", 0),
            "failed": counts.get("failed", 0) + counts.get("error", 0),
            "first_failure": f"cell {first.group(1)}" if first else "", "output": out}


def times_record(results: list[dict], device: str, torch_version: str, jobs: int, dry_run: bool = False) -> dict:
    """What ``--times`` writes: the seconds of every chapter that passed (one that failed or timed out has
    no time a reader could go by), with the device, torch and how many chapters ran at once."""
    return {"note": "written by benchmarks/chapters_gpu.py --times; tools/chapterpage.py reads it",
            "date": time.strftime("%Y-%m-%d"), "device": device, "torch": torch_version, "jobs": jobs,
            "dry_run": dry_run,  # a CPU dry run's times are no GPU's: tools/chapterpage.py ignores them
            "seconds": {r["chapter"]: round(r["seconds"], 1) for r in results if r["status"] == "passed"}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("chapters", nargs="*", help="notebooks (default: every book/ch*.ipynb)")
    ap.add_argument("--jobs", type=int, default=4, help="chapters at once (default 4)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per chapter before it is stopped")
    ap.add_argument("--dry-run", action="store_true", help="COMPANION_DRY_RUN=1: the gpu code paths on a CPU")
    ap.add_argument("--log", type=Path, help="write each failed chapter's pytest output here")
    ap.add_argument("--times", type=Path, help="write the passing chapters' times here as JSON (copy it to "
                    "book/chapter_times_gpu.json for the chapters' time line, tools/chapterpage.py)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1; got {args.jobs}")
    if args.timeout <= 0:
        ap.error(f"--timeout must be positive; got {args.timeout}")
    chapters = [Path(c) for c in args.chapters] or sorted((ROOT / "book").glob("ch*.ipynb"))
    missing = [str(c) for c in chapters if not c.is_file()]
    if missing:
        ap.error(f"no such notebook: {', '.join(missing)}")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("chapters_gpu.py: needs a CUDA GPU (the gpu profile on a CPU would take hours); "
              "--dry-run runs the gpu code paths at the quick sizes instead", file=sys.stderr)
        return 2
    env = {**os.environ, "COMPANION_PROFILE": "gpu", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if args.dry_run:
        env["COMPANION_DRY_RUN"] = "1"
    else:
        env.pop("COMPANION_DRY_RUN", None)
    device = "dry run on the CPU" if args.dry_run else torch.cuda.get_device_name()
    start = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: run_chapter(c, env, args.timeout), chapters))
    wall = time.perf_counter() - start
    print(f"### Chapters in the gpu profile: {device}, torch {torch.__version__}, {args.jobs} at a time, "
          f"{wall:.0f} s in all\n")
    print("| chapter | status | seconds | cells passed | cells failed | first failure |")
    print("|---|---|---:|---:|---:|---|")
    for r in sorted(results, key=lambda r: -r["seconds"]):
        print(f"| {r['chapter']} | {r['status']} | {r['seconds']:.0f} | {r['passed']} | {r['failed']} | "
              f"{r['first_failure']} |")
    bad = [r for r in results if r["status"] != "passed"]
    if args.times is not None:
        args.times.write_text(json.dumps(times_record(results, device, torch.__version__, args.jobs,
                                                    args.dry_run), indent=1) + "\n")
    if args.log is not None and bad:
        args.log.write_text("\n\n".join(f"===== {r['chapter']} ({r['status']})\n{r['output']}" for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
