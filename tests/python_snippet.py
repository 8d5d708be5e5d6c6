"""Run a Python snippet in a fresh interpreter, the way the Triton tests need it.

Triton reads ``TRITON_INTERPRET`` once, at import, so a test that wants the CPU interpreter (or wants
it off, or wants triton hidden) must run in a new process. ``run_snippet`` starts one with the
repository on ``PYTHONPATH`` and ``TRITON_INTERPRET`` set to 1 or removed; ``missing_triton_message``
runs a kernel entry point with triton hidden and returns the ImportError it raised.
"""

from __future__ import annotations

import os
import textwrap
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


def missing_triton_message(module: str, call: str) -> str:
    """Import ``companion.kernels.<module>`` with triton hidden, check it says triton is unavailable, pretend the
    device is fine (INTERPRET) so that ``call`` reaches the missing-package check, and return the text
    of the ImportError that ``call`` raises ("" if it raised none)."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["triton"] = None  # makes 'import triton' raise ImportError
        import torch
        import companion, companion.kernels.attend, companion.inference.paged  # the modules that reach the kernels
        from companion.kernels import {module} as m
        assert m.triton is None and not m.triton_available()
        m.INTERPRET = True
        try:
            {call}
        except ImportError as e:
            print("IMPORT-ERROR:", e)
        """
    )
    res = run_snippet(code, interpret=False)
    assert res.returncode == 0, res.stderr
    return res.stdout.partition("IMPORT-ERROR:")[2]
