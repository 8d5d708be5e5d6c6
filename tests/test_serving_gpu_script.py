"""benchmarks/serving_gpu.py: its whole flow on a tiny model on the CPU (--device cpu --tiny), the
exit status 2 without CUDA, and its table of peak bandwidths."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "serving_gpu.py"


def _load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import serving_gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return serving_gpu


def test_tiny_smoke_run_on_cpu():
    pytest.importorskip("transformers")
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "| float32 | 6/6 |" in out  # engine == alone, exactly, in float32
    for heading in ("### Correctness", "### Against transformers", "### Decode bandwidth utilisation"):
        assert heading in out
    assert out.count("| eager |") == 2  # batches 1 and 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: the script would run for minutes")
def test_exits_2_without_cuda():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr


def test_peak_bandwidth_table():
    g = _load()
    assert g.peak_bandwidth("NVIDIA H200") == 4.8
    assert g.peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35
    assert g.peak_bandwidth("NVIDIA H100 PCIe") == 2.0
    assert g.peak_bandwidth("NVIDIA A100-SXM4-80GB") == 2.039
    assert g.peak_bandwidth("NVIDIA A100-SXM4-40GB") == 1.555
    assert g.peak_bandwidth("NVIDIA L40S") == 0.864 and g.peak_bandwidth("NVIDIA L4") == 0.3
    assert g.peak_bandwidth("NVIDIA GH200 480GB") == 4.0
    assert g.peak_bandwidth("Some Other GPU") is None
