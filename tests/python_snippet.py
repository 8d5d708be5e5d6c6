"""Run a Python snippet in a fresh interpreter, the way the Triton tests need it.

Triton reads ``TRITON_INTERPRET`` once, at import, so a test that wants the CPU interpreter (or wants
it off, or wants triton hidden) must run in a new process. ``run_snippet`` starts one with the
repository on ``PYTHONPATH`` and ``TRITON_INTERPRET`` set to 1 or removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_snippet(code: str, *, interpret: bool, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
