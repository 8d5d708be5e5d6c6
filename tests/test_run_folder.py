"""The run-folder rules of ``python -m companion train --out DIR`` (companion.training.resume): a new run
never replaces another run's checkpoints; --force keeps them unless --delete-old says otherwise."""

from __future__ import annotations

import hashlib
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
