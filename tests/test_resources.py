"""Runs that cannot fit are refused before they allocate (companion.training.memory), a full disk during a
save is a message that says nothing partial was left, and a model refuses an input with no tokens."""

from __future__ import annotations

import errno

import pytest
import torch

from companion.__main__ import main
from companion.models import from_preset
from companion.training import checkpoint as ckpt
from companion.training import memory

pytestmark = pytest.mark.usefixtures("one_thread")


def one_line_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    return err


def test_a_context_that_cannot_fit_is_refused_before_allocating(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("abcdefghij" * 11_200)  # 90% of it (the training split) holds a 100,000-token window
    err = one_line_error(["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "100000", "--steps", "1",
                          "--no-progress"], capsys)
    assert err.startswith("error: this run needs about ") and "(attention scores " in err
    assert "batch 32 x context 100,000), more than the " in err and "lower --context or --batch-size" in err


def test_a_model_too_big_for_the_machine_is_refused_before_allocating(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    err = one_line_error(["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8",
                          "--set", "n_embd=65536", "--steps", "1", "--no-progress"], capsys)
    # 65,536 is within the loading caps (FIELD_LIMITS), so the memory estimate is what refuses it
    assert "error: this run needs about " in err and "TB of memory (optimizer state " in err
    assert "--set a smaller model (--no-memory-check skips this estimate)" in err


def test_the_estimate_counts_every_part_and_warns_when_close():
    with torch.device("meta"):
        model = from_preset("gpt2-tiny")
    parts = memory.estimate(model, batch_size=4, context=64, device="cpu")
    n = sum(p.numel() for p in model.parameters())
    assert parts["weights"] == 4 * n and parts["optimizer state"] == 8 * n
    assert parts["attention scores"] == 4 * 2 * 4 * 4 * 64 * 64 * 2  # B h T^2, scores and probabilities, 2 layers
    assert "attention scores" not in memory.estimate(model, 4, 64, device="cuda")  # SDPA does not keep them
    total = sum(parts.values())
    assert memory.check(model, 4, 64, "cpu", available=10 * total) is None
    assert memory.check(model, 4, 64, "cpu", available=int(1.2 * total)).startswith("note: this run needs about ")
    with pytest.raises(ValueError, match="more than the .* available here"):
        memory.check(model, 4, 64, "cpu", available=total - 1)


def tiny():
    torch.manual_seed(0)
    return from_preset("gpt2-tiny", vocab_size=16, block_size=8)


def test_a_full_disk_during_a_save_says_nothing_partial_was_left(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 1, tiny())
    before = sorted(p.name for p in tmp_path.iterdir())
    real = ckpt._write_file

    def full(path, data):
        if path.name == "model.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(ckpt, "_write_file", full)
    with pytest.raises(ckpt.CheckpointNotWritten) as failure:
        ckpt.save_checkpoint(tmp_path, 2, tiny())
    assert str(failure.value) == (
        f"checkpoint of step 2 not written to {tmp_path}: No space left on device (nothing of it was left behind; "
        f"'latest' still names step-00000001). Free some space, then continue with --resume {tmp_path}")
    assert failure.value.errno == errno.ENOSPC and isinstance(failure.value, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_train_reports_a_full_disk_in_one_line(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 20)

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "_write_file", full)
    run = tmp_path / "run"
    code = main(["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8", "--steps", "1",
                 "--no-progress", "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err == (f"error: checkpoint of step 1 not written to {run}: No space left on device (nothing of it was "
                   f"left behind; the run has no earlier checkpoint). Free some space, then continue with --resume "
                   f"{run}\n")


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-like"])
def test_a_model_refuses_an_input_without_tokens(preset):
    model = from_preset(preset).eval()
    with pytest.raises(ValueError, match=r"idx must hold at least one token per sequence \(T >= 1\); got shape \(1, 0\)"):
        model(torch.zeros(1, 0, dtype=torch.long))
