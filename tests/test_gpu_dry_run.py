"""The gpu profile's code paths, run on the CPU: every chapter top to bottom under
``COMPANION_PROFILE=gpu COMPANION_DRY_RUN=1`` (outputs are not compared, nor are the chapter's asserts
enforced: three training steps make no claim true; any other error fails), and the
profile's own rules for the dry run (``companion.notebook.profile``).

In a dry run a chapter takes the gpu branch of everything it decides with ``P.pick`` / ``P.is_gpu``
(bf16 autocast, torch.compile, the attention backend, the larger schedule's code) at the quick sizes
(or the ``dry=`` size it names), and ``P.steps`` caps every training run at ``DRY_RUN_STEPS`` steps,
so a chapter costs seconds. A chapter added to book/ is picked up here without a change.

The dry run also checks device placement (``COMPANION_DEVICE_CHECK=1``,
``companion.notebook.device_check``): ``P.device`` is a pretend device of its own, and an operation
that would mix it with a tensor left on the CPU fails, naming the operation, as it would on a GPU.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import nbformat
import pytest
import torch
from notebook_runner import execute_notebook

from companion.notebook.profile import (
    DEVICE_CHECK_VAR,
    DRY_RUN_STEPS,
    DRY_RUN_VAR,
    ENV_VAR,
    THREADS_VAR,
    Profile,
    profile,
)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def clean_env(monkeypatch, restore_threads):
    for var in (ENV_VAR, DRY_RUN_VAR, THREADS_VAR, DEVICE_CHECK_VAR):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# ----------------------------------------------------------------------------- every chapter


def _is_claim(out) -> bool:
    """A failed ``assert`` about an outcome; not one that compared tensors on two devices
    (``assert_close``: "The values for attribute 'device' do not match"), a placement defect."""
    return out.get("ename") == "AssertionError" and "attribute 'device' do not match" not in out.get("evalue", "")


def dry_run_crashes(nb) -> list[str]:
    """Every error the executed notebook holds except a failed ``assert``: the dry run's three training
    steps make no claim come true, so a chapter's asserts about outcomes are not enforced here (the quick
    profile enforces them on two kernel paths), while any other exception is a broken gpu code path."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error" and not _is_claim(out):
                found.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}\n{cell.source[:300]}")
    return found


def test_the_dry_run_tolerates_a_failed_claim_and_reports_a_crash():
    nb = nbformat.v4.new_notebook()
    claim, crash = nbformat.v4.new_code_cell("assert loss < 1"), nbformat.v4.new_code_cell("model.fit()")
    claim.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[])]
    crash.outputs = [nbformat.v4.new_output("error", ename="AttributeError", evalue="no fit", traceback=[])]
    nb.cells = [claim, crash]
    assert dry_run_crashes(nb) == ["cell 1: AttributeError: no fit\nmodel.fit()"]


def test_an_assert_close_across_devices_is_a_crash_not_a_claim():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("assert_close(logits, expected)")
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", traceback=[],
                                           evalue="The values for attribute 'device' do not match: cpu:0 != cpu.")]
    nb.cells = [cell]
    assert dry_run_crashes(nb) == ["cell 0: AssertionError: The values for attribute 'device' do not match: "
                                   "cpu:0 != cpu.\nassert_close(logits, expected)"]


def _stamp(cell, key: str):
    from datetime import datetime

    value = cell.get("metadata", {}).get("execution", {}).get(key)
    return datetime.fromisoformat(value.rstrip("Z")) if value else None


def slowest_cells(nb, n: int = 3) -> list[tuple[int, float]]:
    """The n code cells that took longest, (index, seconds), from the timings nbclient records in
    each cell's metadata (``execution``: input received by the kernel -> its reply)."""
    timed = []
    for i, cell in enumerate(nb.cells):
        start, end = _stamp(cell, "iopub.execute_input"), _stamp(cell, "shell.execute_reply")
        if start and end:
            timed.append((i, (end - start).total_seconds()))
    return sorted(timed, key=lambda t: -t[1])[:n]


def longest_wait(nb) -> tuple[int, float] | None:
    """(index, seconds) of the cell that started longest after the previous cell's reply: time in
    no cell, e.g. the client waiting on a message that had already arrived (tools/kernel_client.py)."""
    waits, last_reply = [], None
    for i, cell in enumerate(nb.cells):
        busy = _stamp(cell, "iopub.status.busy")
        if busy and last_reply:
            waits.append((i, (busy - last_reply).total_seconds()))
        last_reply = _stamp(cell, "shell.execute_reply") or last_reply
    return max(waits, key=lambda t: t[1], default=None)


def test_slowest_cells_and_longest_wait_read_the_recorded_timings():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("a"), nbformat.v4.new_markdown_cell("b"), nbformat.v4.new_code_cell("c")]
    nb.cells[0].metadata["execution"] = {"iopub.execute_input": "2026-12-02T01:00:00.000000Z",
                                         "shell.execute_reply": "2026-12-02T01:00:02.500000Z"}
    nb.cells[2].metadata["execution"] = {"iopub.status.busy": "2026-12-02T01:00:03.000000Z",
                                         "iopub.execute_input": "2026-12-02T01:00:03.000000Z",
                                         "shell.execute_reply": "2026-12-02T01:05:03.000000Z"}
    assert slowest_cells(nb) == [(2, 300.0), (0, 2.5)]
    assert longest_wait(nb) == (2, 0.5)


@pytest.mark.dry_run
@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_runs_its_gpu_branch_on_the_cpu(nb_path, tmp_path, record_property):
    pytest.importorskip("nbclient")
    env = {k: v for k, v in os.environ.items() if k != THREADS_VAR}  # the dry run pins one thread itself
    env.update({ENV_VAR: "gpu", DRY_RUN_VAR: "1", DEVICE_CHECK_VAR: "1", "OMP_NUM_THREADS": "1",
                "COMPANION_PROGRESS": "0"})
    executed = tmp_path / nb_path.name
    status, err = execute_notebook(nb_path, executed, env, cell_timeout=CELL_TIMEOUT_S, allow_errors=True)
    if status != 0:
        err = re.sub(r"\x1b\[[0-9;]*m", "", err)  # the kernel's traceback comes coloured
        pytest.fail(f"{nb_path.name} fails in the gpu dry run (executed copy: {executed}):\n{err[-4000:]}",
                    pytrace=False)
    nb = nbformat.read(executed, as_version=4)
    # where the time went (the terminal summary prints it for a slow run: conftest.py)
    wait = longest_wait(nb)
    record_property("slowest_cells", "; ".join(f"cell {i} {s:.1f} s" for i, s in slowest_cells(nb))
                    + ("" if wait is None else f"; longest wait between cells: {wait[1]:.1f} s before cell {wait[0]}"))
    crashes = dry_run_crashes(nb)
    if crashes:
        pytest.fail(f"{nb_path.name} fails in the gpu dry run (executed copy: {executed}):\n" + "\n".join(crashes),
                    pytrace=False)
    setup = "".join(
        out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
        if out.get("output_type") == "stream"
    )
    assert "profile=gpu (dry run)" in setup, "the chapter did not print its profile; is companion.profile() called?"


# ----------------------------------------------------------------------------- the profile's rules


def test_dry_run_takes_the_gpu_branch_on_the_cpu_at_quick_sizes(clean_env):
    clean_env.setenv(ENV_VAR, "gpu")
    clean_env.setenv(DRY_RUN_VAR, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "CUDA is absent" warning: the dry run means to be on the CPU
        p = profile()
    assert p.is_gpu and p.dry_run and p.device.type == "cpu"
    assert p.pick(quick=64, gpu=512) == 64
    assert p.pick(quick=64, gpu=512, dry=32) == 32
    assert str(p) == "profile=gpu (dry run) device=cpu seed=0"


def test_dry_run_caps_training_steps():
    dry = Profile(name="gpu", device=torch.device("cpu"), dry_run=True)
    assert dry.steps(quick=1600, gpu=20_000) == DRY_RUN_STEPS == 3
    assert dry.steps(quick=2, gpu=20_000) == 2          # never more than the quick budget
    assert Profile(name="gpu", device=torch.device("cpu")).steps(quick=1600, gpu=20_000) == 20_000
    assert Profile(name="quick", device=torch.device("cpu")).steps(quick=1600, gpu=20_000) == 1600


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "100"])
def test_steps_must_be_positive_ints(bad):
    p = Profile(name="quick", device=torch.device("cpu"))
    with pytest.raises(ValueError, match="quick must be a positive int"):
        p.steps(quick=bad, gpu=10)
    with pytest.raises(ValueError, match="gpu must be a positive int"):
        p.steps(quick=10, gpu=bad)


def test_pick_ignores_dry_outside_the_dry_run():
    assert Profile(name="quick", device=torch.device("cpu")).pick(quick=1, gpu=2, dry=3) == 1
    assert Profile(name="gpu", device=torch.device("cpu")).pick(quick=1, gpu=2, dry=3) == 2


def test_dry_run_needs_the_gpu_profile(clean_env):
    clean_env.setenv(DRY_RUN_VAR, "1")
    with pytest.raises(ValueError, match="needs \\$COMPANION_PROFILE=gpu"):
        profile()


@pytest.mark.parametrize("value", ["yes", "2", "on"])
def test_dry_run_flag_is_0_or_1(clean_env, value):
    clean_env.setenv(ENV_VAR, "gpu")
    clean_env.setenv(DRY_RUN_VAR, value)
    with pytest.raises(ValueError, match="must be 0 or 1"):
        profile()


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_thread_override_must_be_a_positive_integer(clean_env, value):
    clean_env.setenv(THREADS_VAR, value)
    with pytest.raises(ValueError, match="COMPANION_THREADS must be a positive integer"):
        profile()


def test_quick_profile_pins_one_thread_and_the_override_wins(clean_env):
    torch.set_num_threads(2)
    profile("quick")
    assert torch.get_num_threads() == 1
    clean_env.setenv(THREADS_VAR, "2")
    profile("quick")
    assert torch.get_num_threads() == 2


def test_dry_run_pins_one_thread_and_the_real_gpu_profile_keeps_torchs_count(clean_env):
    clean_env.setenv(DRY_RUN_VAR, "1")
    torch.set_num_threads(2)
    profile("gpu")
    assert torch.get_num_threads() == 1              # the dry run shares CI's cores like the quick profile
    clean_env.setenv(DRY_RUN_VAR, "0")
    torch.set_num_threads(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # "CUDA is absent" on a machine without a GPU
        profile("gpu")
    assert torch.get_num_threads() == 2


def test_dry_run_is_deterministic(clean_env):
    clean_env.setenv(ENV_VAR, "gpu")
    clean_env.setenv(DRY_RUN_VAR, "1")
    profile(seed=3)
    a = torch.rand(4)
    profile(seed=3)
    assert torch.equal(a, torch.rand(4))
