"""The command line's arguments: inputs that would be ignored or crash (a profile variable, thread
counts, empty ids, a course title) are honoured or refused with one line naming the argument."""

from __future__ import annotations

import os

import pytest

from companion.__main__ import main
from companion.training import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_thread")


def fails(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    assert message in err, err
    return err


def train(tmp_path, *extra):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    return ["train", "--preset", "gpt2-tiny", "--data", str(corpus), "--context", "8", "--steps", "1",
            "--batch-size", "2", "--no-progress", "--device", "cpu", "--no-compile", *extra]


def test_companion_profile_gives_trains_default_profile_and_a_bogus_one_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COMPANION_PROFILE", "bogus")
    fails(train(tmp_path), "error: $COMPANION_PROFILE must be quick, cpu or gpu (it gives train's --profile); "
                           "got 'bogus'", capsys)
    monkeypatch.setenv("COMPANION_PROFILE", "gpu")
    assert main(train(tmp_path, "--out", str(tmp_path / "gpu"))) == 0
    assert ckpt.load_state(tmp_path / "gpu")["train_config"]["lr"] == 1e-3  # the gpu profile's (quick: 3e-3)
    assert main(train(tmp_path, "--out", str(tmp_path / "quick"), "--profile", "quick")) == 0  # the option wins
    assert ckpt.load_state(tmp_path / "quick")["train_config"]["lr"] == 3e-3


def test_a_huge_thread_count_is_refused_instead_of_crashing(tmp_path, capsys):
    most = 4 * (os.cpu_count() or 1)
    message = f"error: --threads must be at most {most} (4 per CPU core of this machine); got 100000"
    fails(["bench-serve", "--threads", "100000"], message, capsys)
    fails(train(tmp_path, "--threads", "100000"), message, capsys)


def test_generate_refuses_empty_ids_instead_of_using_the_default_prompt(capsys):
    fails(["generate", "--ids", ""], "error: --ids must hold at least one token id; got none", capsys)


@pytest.mark.parametrize("title", [r"C:\new\folder", "Atención", "注意力"])
def test_a_course_title_is_written_as_given(title):
    import json

    from companion.course import course_config

    text = course_config("title: The book\nauthor: A\n", title, "student")
    assert f"title: {json.dumps(title)}\n" in text and "author: A" in text
