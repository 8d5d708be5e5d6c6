"""An audit of every numeric argument: each command-line sub-command and each public constructor, given
the boundary values of each of its numeric arguments (0, negative, huge, NaN, the wrong type), either
refuses it with one clear error naming the argument (the command line: exit 2, one ``error:`` line, no
traceback; a constructor: a ValueError naming it) or finishes a bounded run within ``LIMIT_S``.
A new option or field joins the tables below; a value that hangs, crashes or raises anything else
fails here, naming the command, the argument and the value."""

from __future__ import annotations

import contextlib
import io
import math
import signal
from pathlib import Path

import pytest

from companion.__main__ import main

pytestmark = pytest.mark.usefixtures("one_thread")

LIMIT_S = 20  # a bounded run of the tiny settings below ends well within this on a busy 2-core machine
BOUNDARIES = {"zero": "0", "negative": "-1", "huge": "1000000000000", "nan": "nan", "wrong type": "abc"}
PY_BOUNDARIES = {"zero": 0, "negative": -1, "huge": 10**12, "nan": math.nan, "wrong type": "abc"}


class Hung(BaseException):
    """Raised by the alarm: the call did not end within LIMIT_S."""


@contextlib.contextmanager
def time_limit(what: str):
    def alarm(signum, frame):
        raise Hung(f"{what} did not end within {LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus) -> Path:
    out = tmp_path_factory.mktemp("audit") / "run"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(train_argv(corpus) + ["--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def seq2seq_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("audit") / "seq2seq"
    argv = ["train", "--preset", "seq2seq-tiny", "--data", "copy", "--steps", "1", "--batch-size", "2", "--no-progress",
            "--device", "cpu", "--no-compile", "--eval-every", "0", "--threads", "1", "--out", str(out)]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    return out


def train_argv(corpus: Path) -> list[str]:
    return ["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8", "--steps", "1",
            "--batch-size", "2", "--no-progress", "--device", "cpu", "--no-compile", "--max-seconds", "5",
            "--eval-every", "1", "--threads", "1"]


# command -> (its base arguments, with the fixtures' paths filled in; its numeric options)
CLI = {
    "generate": (lambda c, r, s: ["generate", "--preset", "gpt2-tiny", "--prompt", "ab", "--max-new-tokens", "2"],
                 ["--max-new-tokens", "--temperature", "--top-k", "--top-p", "--stop", "--seed", "--page-size",
                  "--kv-bits"]),
    "bench-serve": (lambda c, r, s: ["bench-serve", "--requests", "2", "--new-tokens", "2", "--n-layers", "1"],
                    ["--d-model", "--n-layers", "--requests", "--new-tokens", "--page-size", "--threads"]),
    "train": (lambda c, r, s: train_argv(c),
              ["--steps", "--max-seconds", "--batch-size", "--context", "--grad-accum", "--lr", "--weight-decay",
               "--warmup", "--grad-clip", "--label-smoothing", "--eval-every", "--log-every", "--checkpoint-every",
               "--seed", "--max-words", "--threads", "--set n_layer", "--set n_embd", "--set dropout"]),
    "sample": (lambda c, r, s: ["sample", "--checkpoint", str(r), "--prompt", "the", "--max-new-tokens", "2"],
               ["--max-new-tokens", "--temperature", "--top-k", "--seed", "--beam-size", "--alpha"]),
    "translate": (lambda c, r, s: ["translate", "--checkpoint", str(s), "--prompt", "1 2 3",
                                "--max-new-tokens", "2"], ["--max-new-tokens", "--beam-size", "--alpha"]),
    "course": (lambda c, r, s: ["course", "--out", str(r.parent / "course")], ["--chapters"]),
}
CLI_CASES = [(command, option, name) for command, (_, options) in CLI.items() for option in options
             for name in BOUNDARIES]


@pytest.mark.parametrize("command, option, value", CLI_CASES, ids=[f"{c} {o} {v}" for c, o, v in CLI_CASES])
def test_each_numeric_option_is_refused_in_one_line_or_bounded(command, option, value, corpus, run, seq2seq_run,
                                                               tmp_path):
    base, _ = CLI[command]
    argv = base(corpus, run, seq2seq_run)
    if option.startswith("--set "):
        argv += ["--set", f"{option.split()[1]}={BOUNDARIES[value]}"]
    else:
        argv += [option, BOUNDARIES[value]]
    if command == "train" and option == "--checkpoint-every":
        argv += ["--out", str(tmp_path / "out")]
    out, err = io.StringIO(), io.StringIO()
    with time_limit(" ".join(argv)), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    text = err.getvalue()
    assert "Traceback" not in text, text
    # 0: a bounded run; 2: a refused argument; 1: a run that stopped with one error line (a diverged loss)
    assert code in (0, 1, 2), f"{' '.join(argv)}: exit {code}\n{text}"
    assert code != 1 or text.count("error:") == 1, text
    if code == 2:
        line = [line for line in text.splitlines() if "error:" in line][-1]
        named = option.split()[-1].lstrip("-")
        names = {named, named.replace("-", "_"), "argument", "--set", "chapters", "field", "device"}
        assert any(n in line for n in names), f"{' '.join(argv)}: the error does not name {option}: {line}"


def tiny_model():
    from companion.models import from_preset

    return from_preset("gpt2-tiny", vocab_size=32, block_size=16).eval()


def constructors():
    """(name, callable taking one keyword, its numeric keywords): the public constructors with numbers."""
    from companion.engine.engine import Engine
    from companion.inference.generate import SamplingParams
    from companion.training.trainer import TrainConfig

    model = tiny_model()
    return [
        ("SamplingParams", SamplingParams, ["max_new_tokens", "temperature", "top_k", "top_p", "seed"]),
        ("Engine", lambda **kw: Engine(model, **kw), ["max_batch_tokens", "page_size", "n_pages", "max_seqs"]),
        ("TrainConfig", lambda **kw: TrainConfig(**kw).validate(),
         ["steps", "max_seconds", "grad_accum", "lr", "weight_decay", "warmup", "grad_clip", "label_smoothing",
          "eval_every", "eval_batches", "log_every", "checkpoint_every", "keep_checkpoints", "lr_floor"]),
    ]


CONSTRUCTOR_CASES = [(name, field, value) for name, _, fields in constructors() for field in fields
                     for value in PY_BOUNDARIES]


@pytest.mark.parametrize("name, field, value", CONSTRUCTOR_CASES,
                         ids=[f"{n}({f}={v})" for n, f, v in CONSTRUCTOR_CASES])
def test_each_numeric_constructor_argument_is_refused_naming_it_or_bounded(name, field, value):
    build = next(make for n, make, _ in constructors() if n == name)
    with time_limit(f"{name}({field}={PY_BOUNDARIES[value]!r})"):
        try:
            build(**{field: PY_BOUNDARIES[value]})
        except ValueError as e:
            assert field in str(e), f"{name}({field}={PY_BOUNDARIES[value]!r}): the error does not name {field}: {e}"


def test_the_audit_covers_every_numeric_option_of_every_command():
    """A new numeric option must join CLI: every int and float option of every sub-command's parser."""
    import argparse

    from companion.__main__ import build_parser

    for command in ("generate", "bench-serve", "train", "sample", "translate"):
        parser = build_parser([command])
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        numeric = {a.option_strings[0] for a in sub._actions if a.type in (int, float) and a.option_strings}
        missing = numeric - set(CLI[command][1])
        assert not missing, f"{command}: numeric options missing from the audit: {sorted(missing)}"
