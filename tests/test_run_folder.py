"""The run-folder rules of ``python -m companion train --out DIR`` (companion.training.resume): a new run
never replaces another run's checkpoints; --force keeps them unless --delete-old says otherwise."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from companion.__main__ import main
from companion.training import checkpoint as ckpt
from companion.training.resume import prepare_out_dir, run_in

pytestmark = pytest.mark.usefixtures("one_thread")


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def train(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 20)

    def run(*extra: str, seed: int = 0) -> list[str]:
        return ["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8", "--steps", "2",
                "--no-progress", "--seed", str(seed), *extra]

    return run


def test_a_new_run_into_a_folder_holding_a_run_is_refused(tmp_path, train, capsys):
    out = tmp_path / "run"
    assert main(train("--out", str(out))) == 0
    before = digests(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(train("--out", str(out), seed=1))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert (f"error: --out {out} already holds a run (checkpoint step-00000002): a new run "
            f"there would replace its checkpoints. Continue it with --resume {out}; choose another --out; or pass "
            "--force") in err
    assert digests(out) == before  # nothing touched
    # resuming the run in the folder is allowed
    assert main(train("--out", str(out), "--resume", str(out), "--steps", "3", "--override")) == 0
    assert ckpt.resolve(out).name == "step-00000003"


def test_force_keeps_the_old_run_unless_told_to_delete_it(tmp_path, train, capsys):
    out = tmp_path / "run"
    assert main(train("--out", str(out))) == 0
    before = digests(out)
    capsys.readouterr()
    assert main(train("--out", str(out), "--force", seed=1)) == 0
    err = capsys.readouterr().err
    assert f"train: --force: the run that was in {out} (checkpoint step-00000002) is kept in " \
           f"{out / 'previous-1'}" in err
    assert digests(out / "previous-1") == before  # the old run, byte for byte, and still loadable
    assert ckpt.load_model(out / "previous-1") is not None
    assert run_in(out) == ["step-00000002", "latest"]
    assert digests(out)["step-00000002/model.safetensors"] != before["step-00000002/model.safetensors"]
    assert main(train("--out", str(out), "--force", "--delete-old", seed=2)) == 0
    assert "--force --delete-old: deleted the run that was in" in capsys.readouterr().err
    assert (out / "previous-1").is_dir() and not (out / "previous-2").exists()
    with pytest.raises(SystemExit):
        main(train("--out", str(tmp_path / "other"), "--delete-old"))
    assert "--delete-old only applies with --force" in capsys.readouterr().err


def test_a_forced_run_that_fails_its_checks_moves_nothing(tmp_path, train, capsys):
    out = tmp_path / "run"
    assert main(train("--out", str(out))) == 0
    before = digests(out)
    with pytest.raises(SystemExit):
        main(train("--out", str(out), "--force", "--set", "n_embd=abc"))
    capsys.readouterr()
    assert digests(out) == before


def test_resuming_another_run_into_a_folder_holding_a_run_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        run.mkdir()
        (run / "step-00000001").mkdir()
    with pytest.raises(ValueError, match=r"--resume .*a is another run's checkpoint"):
        prepare_out_dir(b, resume=a)
    assert prepare_out_dir(b, resume=b / "step-00000001") is None
    assert prepare_out_dir(tmp_path / "empty") is None


def test_the_trainer_module_keeps_every_public_name_of_its_parts():
    from companion.training import config, distributed, history, resume, trainer

    for name in trainer.__all__:
        assert hasattr(trainer, name), name
    assert trainer.TrainConfig is config.TrainConfig and trainer.History is history.History
    assert trainer.check_device is distributed.check_device and trainer.setup_distributed is distributed.setup_distributed
    assert trainer.HYPERPARAMETERS is config.HYPERPARAMETERS is resume.HYPERPARAMETERS


# --- runs that share a folder ---------------------------------------------------------------------


def holder(folder: Path):
    """A second process that holds ``folder``'s run lock until its stdin closes; returns it once it does."""
    import subprocess
    import sys

    code = ("import sys; from companion.training.runlock import run_lock\n"
            f"with run_lock({str(folder)!r}):\n    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_run_folder_locked_by_another_process_is_refused_naming_its_pid(tmp_path, train, capsys):
    out = tmp_path / "run"
    out.mkdir()
    proc = holder(out)
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(train("--out", str(out)))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "Traceback" not in err
        assert f"error: run folder {out} is in use: process {proc.pid} on " in err
        assert run_in(out) == []  # nothing written
        with pytest.raises(ValueError, match=f"process {proc.pid} on"):  # the Python API obeys the same lock
            ckpt.save_checkpoint(out, 1, tiny(0))
    finally:
        proc.stdin.close()
        proc.wait()
    assert main(train("--out", str(out))) == 0  # released when its holder ended
    assert not (out / ".run.lock").exists()


def test_train_holds_the_lock_for_the_whole_run(tmp_path, train, monkeypatch):
    import os

    from companion.training.trainer import Trainer

    out, seen = tmp_path / "run", []
    real = Trainer._fit

    def watched(self, target):
        seen.append(json.loads((out / ".run.lock").read_text())["pid"])
        return real(self, target)

    monkeypatch.setattr(Trainer, "_fit", watched)
    assert main(train("--out", str(out))) == 0
    assert seen == [os.getpid()] and not (out / ".run.lock").exists()


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path, train, capsys):
    import socket
    import subprocess
    import sys

    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / ".run.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "token": "x"}))
    assert main(train("--out", str(out))) == 0
    assert (f"note: took over the lock of run folder {out}: process {dead.pid} on {socket.gethostname()}, "
            "which held it, is no longer running") in capsys.readouterr().err
    assert not (out / ".run.lock").exists() and ckpt.resolve(out).name == "step-00000002"


def test_resuming_a_run_kept_in_previous_n_into_its_parent_is_refused(tmp_path, train, capsys):
    out = tmp_path / "run"
    assert main(train("--out", str(out))) == 0
    assert main(train("--out", str(out), "--force", seed=1)) == 0  # the first run is kept in run/previous-1
    before = digests(out)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(train("--out", str(out), "--resume", str(out / "previous-1"), "--steps", "4", "--checkpoint-every", "1"))
    err = capsys.readouterr().err
    assert (f"error: --out {out} already holds a run (checkpoint step-00000002): a new run there would replace its "
            f"checkpoints. --resume {out / 'previous-1'} is another run's checkpoint, not the run in {out}") in err
    assert digests(out) == before


@pytest.mark.parametrize("resume", [False, True], ids=["new-run", "resumed"])
def test_a_run_inside_a_step_directory_is_refused(tmp_path, train, capsys, resume):
    out = tmp_path / "run"
    assert main(train("--out", str(out))) == 0
    before = digests(out)
    capsys.readouterr()
    inside = out / "step-00000002"
    for target in (inside, inside / "sub"):
        with pytest.raises(SystemExit):
            main(train("--out", str(target), *(["--resume", str(out), "--steps", "3"] if resume else [])))
        assert (f"error: out_dir {target} is inside the checkpoint step directory {inside}: a run written there "
                "would add files its manifest.json does not list") in capsys.readouterr().err
    assert digests(out) == before
    ckpt.load_model(out)
    with pytest.raises(ValueError, match="is inside the checkpoint step directory"):
        ckpt.save_checkpoint(inside, 9, tiny(0))


def test_resuming_an_older_step_into_its_own_folder_is_refused_and_force_keeps_the_run(tmp_path, train, capsys):
    out = tmp_path / "run"
    assert main(train("--out", str(out), "--steps", "4", "--checkpoint-every", "2")) == 0
    assert run_in(out) == ["step-00000002", "step-00000004", "latest"]
    before = digests(out)
    capsys.readouterr()
    branch = ["--out", str(out), "--resume", str(out / "step-00000002"), "--steps", "4", "--lr", "0.01", "--override"]
    with pytest.raises(SystemExit):
        main(train(*branch))
    err = capsys.readouterr().err
    assert (f"--resume {out / 'step-00000002'} is older than that run's newest checkpoint (step-00000004): "
            "continuing it there would re-save steps in place of step-00000004. Branch from it into another "
            f"--out, or continue the run from its newest step with --resume {out}") in err
    assert digests(out) == before
    assert main(train(*branch, "--force")) == 0  # the branch, with the old run kept whole in previous-1
    assert digests(out / "previous-1") == before
    # the newest step resumes as always
    assert main(train("--out", str(out), "--resume", str(out / "step-00000004"), "--steps", "5", "--override")) == 0


def tiny(seed: int, n_layer: int = 1):
    import torch

    from companion.models import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=n_layer, n_head=2, n_embd=16))


def test_save_checkpoint_refuses_a_folder_holding_another_model_or_newer_steps(tmp_path):
    run = tmp_path / "run"
    model = tiny(0)
    ckpt.save_checkpoint(run, 1, model)
    before = digests(run)
    with pytest.raises(ValueError, match=rf"run folder {run} holds step-00000001 of another model \(n_layer: "
                                         r"checkpoint has 1, the model has 2\): saving this model there would "
                                         r"replace that run's checkpoints: save into another folder, or pass force=True"):
        ckpt.save_checkpoint(run, 2, tiny(0, n_layer=2), keep=1)
    assert digests(run) == before
    ckpt.save_checkpoint(run, 5, model, keep=1)  # the same model, a later step: the run continued
    before = digests(run)
    with pytest.raises(ValueError, match=rf"run folder {run} holds step-00000005, newer than step 3: saving step 3 "
                                         "there would move 'latest' back"):
        ckpt.save_checkpoint(run, 3, model, keep=1)
    assert digests(run) == before
    ckpt.save_checkpoint(run, 3, model, keep=1, force=True)  # asked for: the run is kept, not deleted
    assert digests(run / "previous-1") == before and run_in(run) == ["step-00000003", "latest"]
    with pytest.raises(ValueError, match="newer than this trainer's|holds step-00000003, newer than step 0"):
        from companion.training.trainer import TrainConfig, Trainer

        Trainer(tiny(0), None, TrainConfig(steps=1, out_dir=str(run), progress=False)).fit()
