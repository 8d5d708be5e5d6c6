"""What a user meets when things go wrong: nothing lost, nothing hung, and one line naming the argument
and its rule instead of a traceback. Each test fails on the code before these fixes (a second model
replaced a run's step, a PID-file lock, unbounded sizes, silent NaN weights, SIGTERM without a word)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from companion.__main__ import main
from companion.training import checkpoint as ckpt
from test_cli_arguments import fails, train as train_args

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(seed: int):
    from companion.models import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16))


def digests(folder: Path) -> dict:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def train(tmp_path, *extra):
    return train_args(tmp_path, "--steps", "2", *extra)  # the later --steps wins


# --- a run folder holds one model -------------------------------------------------------------------


def test_another_model_of_the_same_config_cannot_replace_a_runs_step(tmp_path):
    run, first, second = tmp_path / "run", tiny(0), tiny(1)
    ckpt.save_checkpoint(run, 100, first)
    before = digests(run)
    for step in (100, 200):  # the same step (replaced before) and a later one (pruned the rest before)
        with pytest.raises(ValueError, match=rf"run folder {run} holds step-00000100 of another model \(run \w+; this "
                                             r"model was not loaded from it and its weights differ\): saving step"):
            ckpt.save_checkpoint(run, step, second, keep=1)
        assert digests(run) == before
    ckpt.save_checkpoint(run, 100, second, force=True)  # forced: the first run is kept whole, aside
    assert digests(run / "previous-1") == before
    assert torch.equal(ckpt.load_model(run / "previous-1").lm_head.weight, first.lm_head.weight)


def test_a_model_loaded_from_a_run_or_holding_its_weights_continues_it(tmp_path):
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 1, tiny(0))
    loaded = tiny(1)
    ckpt.load_weights(loaded, run)  # loaded from the run: its later steps continue it
    with torch.no_grad():
        loaded.lm_head.weight.add_(1.0)
    ckpt.save_checkpoint(run, 2, loaded, keep=None)
    same = tiny(0)  # a new object with the newest step's very weights: the same model
    same.load_state_dict(ckpt.load_model(run).state_dict())
    ckpt.save_checkpoint(run, 3, same, keep=None)
    assert [p.name for _, _, p in ckpt._step_dirs(run)] == ["step-00000001", "step-00000002", "step-00000003"]
    ids = {json.loads((p / "manifest.json").read_text())["run"] for _, _, p in ckpt._step_dirs(run)}
    assert len(ids) == 1


def test_a_kill_before_latest_moved_names_the_resume_command_that_works(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train(tmp_path, "--out", str(run), "--steps", "4", "--checkpoint-every", "2")) == 0
    (run / "latest").write_text("step-00000002\n")  # killed between step-00000004's rename and `latest`
    capsys.readouterr()
    err = fails(train(tmp_path, "--out", str(run), "--resume", str(run), "--steps", "6", "--override"),
                f"Continue that run from its newest step (python -m companion train ... --resume "
                f"{run / 'step-00000004'} --out {run})", capsys)
    assert "trainer.resume(" not in err
    assert main(train(tmp_path, "--out", str(run), "--resume", str(run / "step-00000004"), "--steps", "6",
                      "--override")) == 0
    assert ckpt.resolve(run).name == "step-00000006"


# --- the run lock is the operating system's ------------------------------------------------------------


def test_a_lock_naming_a_live_unrelated_process_is_not_held(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a live process that never took the lock (its PID written there, as a reused PID would be)
        (run / ".run.lock").write_text(json.dumps({"pid": sleeper.pid, "host": os.uname().nodename, "token": "x"}))
        ckpt.save_checkpoint(run, 1, tiny(0))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert ckpt.resolve(run).name == "step-00000001" and not (run / ".run.lock").exists()


def test_a_lock_that_is_a_folder_is_one_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    (run / ".run.lock").mkdir(parents=True)
    with pytest.raises(ValueError, match=rf"run folder {run}: {run / '.run.lock'} is a folder, where the lock file "
                                         "belongs; remove it"):
        ckpt.save_checkpoint(run, 1, tiny(0))
    fails(train(tmp_path, "--out", str(run)), "is a folder, where the lock file belongs", capsys)


def test_a_lock_held_by_a_process_that_was_killed_is_free_at_once(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    code = ("import sys; from companion.training.runlock import run_lock\n"
            f"with run_lock({str(run)!r}):\n    print('held', flush=True); sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()  # SIGKILL: no clean-up runs; the operating system drops its lock
    holder.wait()
    ckpt.save_checkpoint(run, 1, tiny(0))
    assert ckpt.resolve(run).name == "step-00000001"


# --- sizes bounded by what they mean ------------------------------------------------------------------


def test_a_page_larger_than_the_context_is_refused_before_allocation():
    from companion.engine.engine import Engine
    from companion.models import from_preset

    model = from_preset("gpt2-tiny", vocab_size=32, block_size=16).eval()
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"page_size must be at most the model's context \(16 tokens\); got 1000000"):
        Engine(model, page_size=10**6)
    assert time.perf_counter() - start < 5


def test_stop_tokens_are_bounded_by_the_vocabulary():
    from companion.inference.generate import SamplingParams, generate
    from companion.models import from_preset

    start = time.perf_counter()
    with pytest.raises(ValueError, match="stop_tokens must hold at most 2,097,152 ids"):
        SamplingParams(stop_tokens=range(10**9))
    assert time.perf_counter() - start < 5
    model = from_preset("gpt2-tiny", vocab_size=32, block_size=16).eval()
    with pytest.raises(ValueError, match=r"stop_tokens must be ids in \[0, vocab_size=32\); got 40"):
        generate(model, [1, 2], max_new_tokens=2, stop_tokens=(3, 40))


def test_bench_serve_sizes_are_bounded(capsys):
    fails(["bench-serve", "--n-layers", "1000"], "error: --n-layers must be in [1, 48]", capsys)
    fails(["bench-serve", "--page-size", "1000000"], "error: --page-size must be in [1, 512]", capsys)


def test_a_tiny_top_p_keeps_the_most_likely_token():
    from companion.inference.generate import filter_logits

    z = filter_logits(torch.tensor([[0.5, 3.0, -1.0]]), 1.0, None, 1e-300)
    assert torch.isfinite(z).tolist() == [[False, True, False]]


# --- weights checked finite ---------------------------------------------------------------------------


def test_one_nan_in_an_attention_weight_stops_generate(tmp_path, capsys):
    from companion.inference.generate import generate

    model = tiny(0).eval()
    with torch.no_grad():
        next(p for name, p in model.named_parameters() if "attn" in name).view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match=r"the model's weights are not finite \(NaN or \+inf\) in "):
        generate(model, [1, 2, 3], max_new_tokens=2)
    ckpt.save_checkpoint(tmp_path / "run", 1, model)  # a damaged checkpoint (training never writes one)
    with pytest.raises(ValueError, match=r"weight .* holds 1 NaN or infinite value\(s\)"):
        ckpt.load_model(tmp_path / "run")
    fails(["generate", "--checkpoint", str(tmp_path / "run"), "--ids", "1 2"], "NaN or infinite value(s)", capsys)


# --- state, signals, profiles, installation ---------------------------------------------------------


def test_a_state_json_without_the_optimizer_is_one_error(tmp_path, capsys):
    from companion.files import sha256_file

    run = tmp_path / "run"
    assert main(train(tmp_path, "--out", str(run))) == 0
    step = ckpt.resolve(run)
    state = json.loads((step / "state.json").read_text())
    del state["optimizer"]
    (step / "state.json").write_text(json.dumps(state))
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["files"]["state.json"] = sha256_file(step / "state.json")  # edited consistently
    (step / "manifest.json").write_text(json.dumps(manifest))
    fails(train(tmp_path, "--out", str(run), "--resume", str(run), "--steps", "3"),
          "its state.json lacks ['optimizer']", capsys)


def test_sigterm_ends_train_like_ctrl_c(tmp_path):
    run = tmp_path / "run"
    argv = train(tmp_path, "--out", str(run), "--steps", "1000000", "--checkpoint-every", "1")
    proc = subprocess.Popen([sys.executable, "-m", "companion", *argv], stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not (run / "latest").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "train: terminated (SIGTERM) at step " in err
    assert f"resume with python -m companion train ... --resume {run} --out {run}" in err


def test_the_gpu_profile_without_cuda_is_warned(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [a for a in train(tmp_path, "--profile", "gpu", "--steps", "1") if a not in ("--device", "cpu")]
    assert main(argv) == 0
    assert "warning: the gpu profile was asked for but CUDA is absent" in capsys.readouterr().err


def test_train_out_empty_has_one_meaning(tmp_path, capsys):
    fails(train(tmp_path, "--out", ""), "error: --out '' names no folder", capsys)


def test_the_command_line_without_torch_says_how_to_install():
    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'torch': raise ModuleNotFoundError(name=name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from companion.__main__ import main\n"
            "sys.exit(main(['train', '--help']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "error: train needs the package torch" in r.stderr and ".venv/bin/python -m companion" in r.stderr


def test_sample_reads_the_repositorys_reference_decoder(capsys):
    assert main(["sample", "--checkpoint", str(ROOT / "data/reference/ch04-char-gpt"), "--prompt", "ROMEO:",
                 "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    fails(["translate", "--checkpoint", str(ROOT / "data/reference/ch03-translator"), "--prompt", "In"],
          "is a reference model of the book (companion.data.reference's format", capsys)


def test_ctrl_c_during_start_up_is_one_line(monkeypatch, capsys):
    from companion.training import cli

    def interrupted(sub):  # Ctrl-C while the parsers import the model presets
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "add_subcommands", interrupted)
    assert main(["train", "--help"]) == 130
    err = capsys.readouterr().err
    assert err == "train: interrupted\n"


def test_a_full_disk_during_a_course_cut_is_one_line(tmp_path, monkeypatch, capsys):
    import errno

    from companion import course

    def full(staged, out):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "book"))

    monkeypatch.setattr(course, "merge_course", full)
    fails(["course", "--chapters", "1", "--book", str(ROOT), "--out", str(tmp_path / "course")],
          f"--out {tmp_path / 'course'}: the course could not be written: No space left on device", capsys)
