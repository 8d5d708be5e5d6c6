"""tools/kernel_path.py: the named CPU kernel paths that CI and the stored outputs run on."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tools.kernel_path import PATHS, environ

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "kernel_path.py"


def test_the_two_paths_pin_torch_and_mkl():
    pinned, alternate = environ("pinned"), environ("alternate")
    assert {k: pinned[k] for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")} == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
    assert alternate["ATEN_CPU_CAPABILITY"] == "default"
    # torch.compile's cache is not keyed by the capability: one folder per path
    assert pinned["TORCHINDUCTOR_CACHE_DIR"] != alternate["TORCHINDUCTOR_CACHE_DIR"]
    assert set(PATHS) == {"pinned", "alternate"}


def test_an_unknown_path_is_refused_by_name():
    with pytest.raises(ValueError, match="kernel path must be one of"):
        environ("avx512")
    run = subprocess.run([sys.executable, str(SCRIPT), "fast", "--", "true"], capture_output=True, text=True)
    assert run.returncode == 2 and "kernel path must be one of" in run.stderr


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the variables act on x86-64 only")
@pytest.mark.parametrize("name, capability", [("pinned", "AVX2"), ("alternate", "DEFAULT")])
def test_the_command_runs_on_the_named_path(name, capability):
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    run = subprocess.run([sys.executable, str(SCRIPT), name, "--", sys.executable, "-c", probe],
                         capture_output=True, text=True, check=True)
    first, last = run.stdout.strip().splitlines()[0], run.stdout.strip().splitlines()[-1]
    assert first.startswith(f"kernel path '{name}': CPU: ") and f"capability {capability}" in first
    assert last == capability
