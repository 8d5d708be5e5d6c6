"""sample, translate and bench-serve on the command line: options that would be ignored are refused,
crashes are one line naming the argument, sample streams, translate has its own name."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from companion.__main__ import main
from companion.training import checkpoint as ckpt
from test_cli_arguments import fails, train as train_args

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def decoder_run(tmp_path):
    """A gpt2-tiny checkpoint without a tokenizer (prompts are token ids)."""
    from companion.models import from_preset

    torch.manual_seed(0)
    run = tmp_path / "decoder"
    ckpt.save_checkpoint(run, 1, from_preset("gpt2-tiny").eval())
    return run


@pytest.fixture
def seq2seq_run(tmp_path):
    from companion.models import from_preset

    torch.manual_seed(0)
    run = tmp_path / "seq2seq"
    ckpt.save_checkpoint(run, 1, from_preset("tiny", src_vocab_size=16, tgt_vocab_size=16, pad_id=0).eval())
    return run


# item 10: options that were ignored without a word


def test_generate_refuses_prompt_with_ids_and_preset_with_checkpoint(tmp_path, capsys):
    fails(["generate", "--prompt", "Once", "--ids", "1 2"],
          "error: --prompt and --ids: pass one of them (--prompt is text, --ids token ids)", capsys)
    fails(["generate", "--preset", "mistral-like", "--checkpoint", str(tmp_path / "run")],
          f"error: --preset mistral-like and --checkpoint {tmp_path / 'run'}: pass one of them", capsys)


def test_beam_settings_on_a_decoder_checkpoint_are_refused(decoder_run, capsys):
    fails(["sample", "--checkpoint", str(decoder_run), "--prompt", "1 2", "--beam-size", "16"],
          "error: --beam-size apply to encoder-decoder checkpoints (translate); ", capsys)
    fails(["translate", "--checkpoint", str(decoder_run), "--prompt", "1 2"],
          "error: translate needs an encoder-decoder (seq2seq) checkpoint", capsys)


def test_a_wide_beam_prints_the_best_non_empty_translation(seq2seq_run, capsys, monkeypatch):
    """--beam-size >= the vocabulary keeps the end token as a first token: its empty hypothesis can
    score best (measured on a 60-step copy model at beam 15, 16 and 32); it printed an empty line."""
    from companion.inference import translate
    from companion.inference.translate import Hypothesis

    monkeypatch.setattr(translate, "beam_search_one", lambda *a, **k: [
        Hypothesis([], -2.48, -2.48, True), Hypothesis([4, 5], -2.65, -2.65, True)])
    assert main(["sample", "--checkpoint", str(seq2seq_run), "--prompt", "4 5", "--beam-size", "16"]) == 0
    out, err = capsys.readouterr()
    assert out == "4 5\n"
    assert "note: the best-scoring hypothesis of --beam-size 16 is empty (the end token first); the best " \
           "non-empty one is printed" in err


def test_bench_serve_says_when_requests_stop_at_the_context(capsys):
    assert main(["bench-serve", "--requests", "1", "--new-tokens", "500", "--d-model", "16", "--n-layers", "1"]) == 0
    out, err = capsys.readouterr()
    assert "note: the model's context is 512 tokens and the prompts have 16 to 64: a request stops at the " \
           "context before its --new-tokens 500" in err
    assert json.loads(out)["stopped_at_context"] == 1


def test_a_resumed_run_records_the_seed_it_was_started_with(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(tmp_path, "--out", str(run), "--seed", "3", "--schedule", "constant")) == 0
    args = train_args(tmp_path, "--out", str(run), "--resume", str(run), "--schedule", "constant")
    args[args.index("--steps") + 1] = "2"
    assert main(args) == 0
    assert ckpt.load_state(run)["train_config"]["seed"] == 3  # was the resuming command's default, 0
    args[args.index("--steps") + 1] = "3"
    fails(args + ["--seed", "4"], f"error: --seed 4: the run in {run} was started with --seed 3", capsys)


# item 11: crashes


def test_generate_into_a_closed_pipe_exits_quietly():
    process = subprocess.Popen([sys.executable, "-m", "companion", "generate", "--max-new-tokens", "3000",
                                "--temperature", "1", "--seed", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    process.stdout.read(50)  # as `| head -c 50`
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141  # 128 + SIGPIPE, what a shell reports for `yes | head`
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_ctrl_c_during_train_says_where_the_run_stands(tmp_path, capsys, monkeypatch):
    from companion.training.trainer import Trainer

    real, calls = Trainer._step, []

    def step(self):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Trainer, "_step", step)
    run = tmp_path / "run"
    args = train_args(tmp_path, "--out", str(run), "--checkpoint-every", "2")
    args[args.index("--steps") + 1] = "5"
    try:
        code = main(args)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped train as a traceback")
    err = capsys.readouterr().err
    assert code == 130
    assert (f"train: interrupted at step 2; the last checkpoint is step-00000002 in {run}: resume with python -m "
            f"companion train ... --resume {run} --out {run}") in err, err
    monkeypatch.setattr(Trainer, "_step", real)
    args += ["--resume", str(run)]
    assert main(args) == 0 and ckpt.load_state(run)["step"] == 5  # the line's advice works


def test_a_model_beyond_the_loading_caps_is_refused_naming_the_cap(tmp_path, capsys):
    fails(train_args(tmp_path, "--set", "n_embd=1000000000", "--set", "n_head=1"),
          "error: --set field n_embd = 1000000000 is outside [0, 65536] (the cap "
          "companion.training.checkpoint.FIELD_LIMITS['n_embd']", capsys)
    fails(train_args(tmp_path, "--set", "n_layer=100000"), "error: --set field n_layer = 100000 is outside [0, 1024]",
          capsys)  # before: 400 s of silence building the layers


def test_bench_serve_estimates_its_memory_before_allocating(capsys, monkeypatch):
    from companion.training import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 8 * 10**9)
    fails(["bench-serve", "--d-model", "1600", "--n-layers", "48", "--requests", "256"],
          "error: --d-model 1600 --n-layers 48 --requests 256: serving needs about 86.0 GB of memory (float32 "
          "weights and the engine's KV pages, 512 tokens per request), more than the 8.0 GB available here", capsys)
    fails(["bench-serve", "--d-model", "100000"], "error: --d-model must be in [1, 1600]", capsys)  # a width it never serves


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_weights_give_an_error_naming_the_non_finite_logits(temperature):
    from companion.inference.generate import generate
    from companion.models import from_preset

    model = from_preset("gpt2-tiny").eval()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan")) if hasattr(model, "lm_head") else \
            next(model.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match=r"the model.s (logits|weights) are not finite \(NaN or \+inf\)"):
        generate(model, [1, 2, 3], max_new_tokens=2, temperature=temperature, seed=0)


def test_companion_data_naming_a_file_or_an_unwritable_folder(tmp_path, monkeypatch, capsys):
    from companion.data import derived

    file = tmp_path / "file"
    file.write_text("x")
    monkeypatch.setenv("COMPANION_DATA", str(file))
    with pytest.raises(ValueError, match=r"^\$COMPANION_DATA must name a folder \(it holds derived/\); got '.*file', "
                                         "which is a file$"):
        derived.ensure("shakespeare")

    def denied(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setenv("COMPANION_DATA", str(tmp_path / "ro"))
    monkeypatch.setattr(derived, "_rows", lambda name: [{"text": "x"}])
    monkeypatch.setattr(derived, "atomic_write_bytes", denied)
    with pytest.raises(ValueError, match=r"cannot write the derived corpus .*shakespeare.jsonl: Permission denied; "
                                         r"\$COMPANION_DATA \(.*ro\) must name a folder you can write to"):
        derived.ensure("shakespeare")
    from companion.data.__main__ import main as data_main

    with pytest.raises(SystemExit) as exit_info:  # python -m companion.data: the same line, no traceback
        data_main(["shakespeare", "--force"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: cannot write the derived corpus ")


def test_companion_threads_is_capped_like_threads(monkeypatch):
    from companion.notebook import profile

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # 7f80ed3 set 100000 threads: a segfault
    monkeypatch.setenv("COMPANION_THREADS", "100000")
    most = 4 * (os.cpu_count() or 1)
    with pytest.raises(ValueError, match=rf"^\$COMPANION_THREADS must be at most {most} \(4 per CPU core of this "
                                         r"machine\); got 100000$"):
        profile.profile("quick")


@pytest.mark.parametrize("preset", ["gpt2-tiny", "gpt2"])
def test_bench_serve_builds_every_gpt_preset(preset, capsys):
    assert main(["bench-serve", "--preset", preset, "--requests", "1", "--new-tokens", "2", "--n-layers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"] is True


# item 12: sample streams


def test_sample_streams_each_token_as_it_is_drawn(decoder_run, monkeypatch):
    writes = []

    class Terminal(io.StringIO):
        def write(self, text):
            writes.append(text)
            return super().write(text)

    out = Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["sample", "--checkpoint", str(decoder_run), "--prompt", "1 2", "--max-new-tokens", "20",
                 "--temperature", "0"]) == 0
    text = out.getvalue()
    ids = text.split()
    assert len(ids) == 22 and ids[:2] == ["1", "2"] and text.endswith("\n")
    assert len(writes) >= 21  # the prompt, then every token on its own (was one write at the end)


# item 16: one name for each thing


def test_translate_is_the_command_that_translates(seq2seq_run, capsys):
    assert main(["translate", "--checkpoint", str(seq2seq_run), "--prompt", "4 5", "--beam-size", "1",
                 "--max-new-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert all(t.isdigit() for t in out.split())
    assert main(["sample", "--checkpoint", str(seq2seq_run), "--prompt", "4 5", "--beam-size", "1",
                 "--max-new-tokens", "3"]) == 0  # sample still translates, and says what the command is called
    out2, err = capsys.readouterr()
    assert out2 == out and "as python -m companion translate does" in err
    help_text = subprocess.run([sys.executable, "-m", "companion", "--help"], capture_output=True, text=True,
                               cwd=ROOT).stdout
    assert "translate  translate a sentence with a trained encoder-decoder" in help_text


def test_seq2seq_presets_have_one_name(tmp_path, capsys):
    fails(["generate", "--preset", "seq2seq-tiny"], "error: --preset seq2seq-tiny is an encoder-decoder "
          "(translation) preset; generate continues a prompt", capsys)
    err = fails(["generate", "--preset", "tiny"], "error: --preset tiny is an encoder-decoder", capsys)
    assert "train --preset seq2seq-tiny" in err and "companion translate --checkpoint" in err
    assert main(["train", "--preset", "tiny", "--data", "copy", "--steps", "1", "--batch-size", "2",
                 "--no-progress", "--no-compile", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "note: --preset tiny is called seq2seq-tiny on the command line; using seq2seq-tiny" in err
    assert f"(translate with: python -m companion translate --checkpoint {tmp_path / 'r'}" in err


def test_train_reads_the_same_profile_variable_as_the_notebooks():
    # training.cli names $COMPANION_PROFILE itself (it may not import companion.notebook, a layer above)
    from companion.notebook.profile import ENV_VAR

    assert ENV_VAR == "COMPANION_PROFILE"
    assert 'ENV_VAR = "COMPANION_PROFILE"' in Path(__file__).resolve().parents[1].joinpath(
        "companion", "training", "cli.py").read_text()
