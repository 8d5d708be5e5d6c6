"""tools/simulate_reader.py runs with any python, not only the project's environment: it finds the
checkout's package itself (it builds its own environments for the chapters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_simulate_reader_needs_no_installed_package(tmp_path):
    # -S: no site-packages, so neither the editable install of companion nor torch is importable
    r = subprocess.run([sys.executable, "-S", str(ROOT / "tools" / "simulate_reader.py"), "colab", "--chapters", "99"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert "ModuleNotFoundError" not in r.stderr, r.stderr
    assert r.returncode == 2 and "error: --chapters: chapters must exist in book/; no chapter [99]" in r.stderr
