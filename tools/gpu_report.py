"""Turn the output of benchmarks/gpu_check.sh's pieces into JSON and markdown.

    python tools/gpu_report.py piece OUT_DIR NAME EXIT_STATUS SECONDS EXPECTED -- COMMAND...
    python tools/gpu_report.py summary OUT_DIR

``piece`` reads ``OUT_DIR/NAME.out`` (the piece's standard output; the benchmarks print markdown
tables) and, when present, ``OUT_DIR/NAME.junit.xml`` (pytest's report), and writes
``OUT_DIR/NAME.json``: the command, exit status, seconds, a status word, every markdown table as
{"columns": [...], "rows": [{column: cell}]}, and pytest's counts and failures. ``EXPECTED`` is the
exit status that counts as success (0, or 2 for a GPU script's "no CUDA" exit in the CPU smoke run).

``summary`` writes ``OUT_DIR/summary.json`` and ``OUT_DIR/summary.md``: the machine (device name,
torch and triton versions), one row per piece, then each piece's tables, ready to paste into
benchmarks/README.md. It exits 1 when a piece did not end as expected.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TIMEOUT_STATUSES = (124, 137)


def markdown_tables(text: str) -> list[dict]:
    """Every pipe table in ``text``: a header row, a |---| rule, then rows until a non-table line."""
    lines = text.splitlines()
    tables, i = [], 0
    rule = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
    while i + 1 < len(lines):
        if lines[i].strip().startswith("|") and rule.match(lines[i + 1].strip()):
            columns = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows, j = [], i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                cells = [c.strip() for c in lines[j].strip().strip("|").split("|")]
                rows.append(dict(zip(columns, cells)))
                j += 1
            heading = next((lines[k].lstrip("# ").strip() for k in range(i - 1, max(i - 4, -1), -1)
                            if lines[k].startswith("#")), None)
            tables.append({"heading": heading, "columns": columns, "rows": rows})
            i = j
        else:
            i += 1
    return tables


def junit_summary(path: Path) -> dict:
    """Counts and failed test ids from a pytest JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"counts": counts, "failed": failed}


def status_word(exit_status: int, expected: int, output: str = "") -> str:
    """"ok", "timed out" or "failed (...)". An expected non-zero exit (a GPU script on a machine
    without CUDA) counts only if the output says why: argparse also exits with status 2."""
    if exit_status in TIMEOUT_STATUSES:
        return "timed out"
    if exit_status == expected == 0:
        return "ok"
    if exit_status == expected:
        if "CUDA" in output:
            return f"ok (exit {expected}: no CUDA, as designed)"
        return f"failed (exit {exit_status} without a word about CUDA)"
    return f"failed (exit {exit_status})"


def piece(out_dir: Path, name: str, exit_status: int, seconds: float, expected: int, command: list[str]) -> dict:
    stdout, stderr = out_dir / f"{name}.out", out_dir / f"{name}.err"
    text = stdout.read_text(errors="replace") if stdout.exists() else ""
    errors = stderr.read_text(errors="replace") if stderr.exists() else ""
    record = {
        "piece": name,
        "command": command,
        "exit_status": exit_status,
        "expected_exit_status": expected,
        "status": status_word(exit_status, expected, text + errors),
        "seconds": round(seconds, 1),
        "tables": markdown_tables(text),
    }
    junit = out_dir / f"{name}.junit.xml"
    if junit.exists():
        record["pytest"] = junit_summary(junit)
    collected = re.search(r"^(\d+)(?:/\d+)? tests? collected", text, re.M)
    if collected:  # pytest --collect-only (the CPU smoke run)
        record["collected"] = int(collected.group(1))
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def machine() -> dict:
    info: dict = {"python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.is_available()
        if info["cuda"]:
            info["device"] = torch.cuda.get_device_name()
            info["cuda_version"] = torch.version.cuda
    except ImportError:
        info["torch"] = None
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def summary(out_dir: Path) -> int:
    records = [json.loads(p.read_text()) for p in sorted(out_dir.glob("[0-9]-*.json"))]
    info = machine()
    ok = all(r["status"].startswith("ok") for r in records) and bool(records)
    (out_dir / "summary.json").write_text(json.dumps({"machine": info, "ok": ok, "pieces": records}, indent=2) + "\n")
    lines = [f"# GPU check: {info.get('device', 'no CUDA device')}", "",
             f"torch {info.get('torch')}, triton {info.get('triton')}, CUDA {info.get('cuda_version', '-')}, "
             f"Python {info['python']}", "",
             "| piece | status | seconds | result |", "|---|---|---:|---|"]
    for r in records:
        result = ""
        if "collected" in r:
            result = f"{r['collected']} CUDA tests collected (not run)"
        elif "pytest" in r:
            c = r["pytest"]["counts"]
            result = f"{c['passed']} passed, {c['failures'] + c['errors']} failed, {c['skipped']} skipped"
        elif r["tables"]:
            result = f"{len(r['tables'])} table(s) below"
        lines.append(f"| {r['piece']} | {r['status']} | {r['seconds']:.0f} | {result} |")
    for r in records:
        for t in r["tables"]:
            lines += ["", f"### {r['piece']}" + (f": {t['heading']}" if t.get("heading") else ""), "",
                      "| " + " | ".join(t["columns"]) + " |", "|" + "---|" * len(t["columns"])]
            lines += ["| " + " | ".join(row.get(c, "") for c in t["columns"]) + " |" for row in t["rows"]]
        if r.get("pytest", {}).get("failed"):
            lines += ["", f"{r['piece']}: failed tests", ""] + [f"- `{f}`" for f in r["pytest"]["failed"]]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "summary":
        return summary(Path(argv[1]))
    if len(argv) >= 7 and argv[0] == "piece" and "--" in argv:
        cut = argv.index("--")
        out_dir, name, exit_status, seconds, expected = argv[1:cut]
        record = piece(Path(out_dir), name, int(exit_status), float(seconds), int(expected), argv[cut + 1:])
        print(f"gpu_check: {name}: {record['status']} in {record['seconds']:.0f} s")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
