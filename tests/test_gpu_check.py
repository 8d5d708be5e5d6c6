"""benchmarks/gpu_check.sh: its CPU dry run end to end, and tools/gpu_report.py, which turns each
piece's output into JSON and the summary table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "tools"))
import gpu_report  # noqa: E402

PIECES = ["1-cuda-tests", "2-flash", "3-serving", "4-serving-compiled", "5-train", "6-chapters"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: the script would run its real pieces for minutes")
def test_cpu_dry_run_says_no_cuda_runs_the_smoke_modes_and_writes_every_result(tmp_path):
    pytest.importorskip("transformers")  # the serving smoke run compares against transformers
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=480, cwd=ROOT,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no CUDA" in r.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] and not summary["machine"]["cuda"]
    assert [p["piece"] for p in summary["pieces"]] == PIECES
    by_name = {p["piece"]: p for p in summary["pieces"]}
    for name in PIECES:
        assert json.loads((tmp_path / f"{name}.json").read_text()) == by_name[name]
    assert by_name["1-cuda-tests"]["collected"] > 0                       # the CUDA tests exist and collect
    assert by_name["2-flash"]["exit_status"] == by_name["5-train"]["exit_status"] == 2
    assert by_name["4-serving-compiled"]["exit_status"] == 2                 # CUDA only, says so
    serving = by_name["3-serving"]
    assert serving["exit_status"] == 0 and len(serving["tables"]) == 4    # correctness, timing, work, bandwidth
    float32 = next(row for row in serving["tables"][0]["rows"] if row["dtype"] == "float32")
    assert float32["engine greedy == each request alone"] == "6/6"
    assert float32["engine greedy == transformers"] == "6/6"              # float32: token identity
    assert "logits against a float32 reference" in (tmp_path / "3-serving.out").read_text()  # bf16: logits
    chapters = by_name["6-chapters"]                                        # the gpu profile's dry run
    assert chapters["exit_status"] == 0
    assert [(r["chapter"], r["status"]) for r in chapters["tables"][0]["rows"]] == [("ch01_attention.ipynb", "passed")]
    table = (tmp_path / "summary.md").read_text()
    assert "| 3-serving | ok |" in table and "### 3-serving: Correctness" in table


def test_markdown_tables_become_rows_keyed_by_column():
    text = ("noise\n### Timing\n\n| d | causal | ratio |\n|---:|:---:|---:|\n| 64 | no | 0.91 |\n| 128 | yes | 1.02 |\n"
            "after\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    tables = gpu_report.markdown_tables(text)
    assert tables[0] == {"heading": "Timing", "columns": ["d", "causal", "ratio"],
                         "rows": [{"d": "64", "causal": "no", "ratio": "0.91"},
                                  {"d": "128", "causal": "yes", "ratio": "1.02"}]}
    assert tables[1]["rows"] == [{"a": "1", "b": "2"}] and tables[1]["heading"] is None
    assert gpu_report.markdown_tables("| not | a table |\nno rule line\n") == []


def test_status_words():
    assert gpu_report.status_word(0, 0) == "ok"
    assert gpu_report.status_word(124, 0) == "timed out"
    assert gpu_report.status_word(1, 0) == "failed (exit 1)"
    assert gpu_report.status_word(2, 2, "flash_gpu.py: needs a CUDA GPU") == "ok (exit 2: no CUDA, as designed)"
    # argparse's usage error also exits 2: without the CUDA message it is a failure
    assert gpu_report.status_word(2, 2, "error: unrecognized arguments: --tiny").startswith("failed")
    assert gpu_report.status_word(0, 2, "").startswith("failed (exit 0)")


def test_junit_counts_and_failures(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_triton_flash" name="test_a"/>'
        '<testcase classname="tests.test_triton_flash" name="test_b"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_triton_paged" name="test_c"><skipped/></testcase>'
        '<testcase classname="tests.test_triton_paged" name="test_d"/>'
        "</testsuite></testsuites>"
    )
    assert gpu_report.junit_summary(xml) == {
        "counts": {"tests": 4, "failures": 1, "errors": 0, "skipped": 1, "passed": 2},
        "failed": ["tests.test_triton_flash::test_b"],
    }


def test_summary_fails_when_a_piece_failed(tmp_path, capsys):
    (tmp_path / "1-a.out").write_text("| x |\n|---|\n| 1 |\n")
    gpu_report.piece(tmp_path, "1-a", 0, 1.0, 0, ["true"])
    assert gpu_report.summary(tmp_path) == 0
    (tmp_path / "2-b.err").write_text("Traceback ...")
    gpu_report.piece(tmp_path, "2-b", 1, 2.0, 0, ["false"])
    assert gpu_report.summary(tmp_path) == 1
    table = (tmp_path / "summary.md").read_text()
    assert "| 1-a | ok | 1 | 1 table(s) below |" in table and "| 2-b | failed (exit 1) | 2 |" in table
    assert not json.loads((tmp_path / "summary.json").read_text())["ok"]
    capsys.readouterr()


def test_every_flag_the_gpu_run_passes_exists():
    """The GPU branch cannot run here, so check its command lines against each script's --help."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    calls = re.findall(r"benchmarks/(\w+\.py)([^\n]*)", text)
    scripts = {name for name, _ in calls}
    assert scripts == {"flash_gpu.py", "serving_gpu.py", "train_gpu.py", "chapters_gpu.py"}
    for name in scripts:
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), "--help"], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        for args in (a for n, a in calls if n == name):
            for flag in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", args):
                assert flag in r.stdout, f"gpu_check.sh passes {flag} to {name}, which has no such option"
    assert " -n 4 " in text
    pytest.importorskip("xdist")  # the CUDA tests run on 4 pytest-xdist workers
