"""The course's output folder (companion.course.folder and the course command): a course record is trusted
only for plain relative paths inside OUT, so a cut never moves or deletes a file outside it; a malformed
record, a file where the course needs a folder, an unwritable folder and a second cut at once are each a
one-line error, not a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from companion import course

RECORD, merge_course = course.RECORD, course.merge_course

ROOT = Path(__file__).resolve().parent.parent


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def staged_cut(tmp_path: Path) -> Path:
    staged = tmp_path / "staged"
    (staged / "book").mkdir(parents=True)
    (staged / "book" / "ch01.ipynb").write_text("{}")
    return staged


@pytest.mark.parametrize("spelling", ["../thesis.txt", "ABSOLUTE", "book/../../thesis.txt", "./../thesis.txt"])
@pytest.mark.parametrize("digest", ["right", "wrong"])
def test_a_record_naming_a_file_outside_out_is_refused_and_the_file_stays(tmp_path, spelling, digest):
    thesis = tmp_path / "thesis.txt"
    thesis.write_text("three years of work")
    out = tmp_path / "out"
    out.mkdir()
    rel = str(thesis) if spelling == "ABSOLUTE" else spelling
    (out / RECORD).write_text(json.dumps({rel: sha(thesis) if digest == "right" else "0" * 64}))
    with pytest.raises(ValueError, match=f"entry {rel!r} of its course record {RECORD} is not a plain relative path"):
        merge_course(staged_cut(tmp_path), out)
    assert thesis.read_text() == "three years of work"
    assert sorted(p.name for p in out.iterdir()) == [RECORD]  # nothing moved in or out


def test_a_record_reaching_out_through_a_link_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.md").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / "book").symlink_to(outside, target_is_directory=True)
    (out / RECORD).write_text(json.dumps({"book/notes.md": sha(outside / "notes.md")}))
    with pytest.raises(ValueError, match="'book/notes.md' of its course record"):
        merge_course(staged_cut(tmp_path), out)
    assert (outside / "notes.md").read_text() == "mine"


@pytest.mark.parametrize("record, rule", [
    ("[1, 2]", "must hold a JSON object"),
    ("{\"book/a.md\": 7}", "must map to a SHA-256 digest"),
    ("{not json", "is unreadable"),
    ("{\"\": \"" + "0" * 64 + "\"}", "is not a plain relative path"),
])
def test_a_malformed_record_is_one_clear_error(tmp_path, record, rule):
    out = tmp_path / "out"
    out.mkdir()
    (out / RECORD).write_text(record)
    with pytest.raises(ValueError, match=rule):
        merge_course(staged_cut(tmp_path), out)


def test_a_plain_record_is_read_and_its_unedited_files_replaced(tmp_path):
    out = tmp_path / "out"
    (out / "book").mkdir(parents=True)
    (out / "book" / "ch02.ipynb").write_text("old chapter")
    (out / RECORD).write_text(json.dumps({"book/ch02.ipynb": sha(out / "book" / "ch02.ipynb")}))
    assert merge_course(staged_cut(tmp_path), out) is None
    assert not (out / "book" / "ch02.ipynb").exists() and (out / "book" / "ch01.ipynb").read_text() == "{}"


def cut(out: Path, *extra: str) -> list[str]:
    return ["--chapters", "1", "--book", str(ROOT), "--out", str(out), *extra]


def test_the_course_command_refuses_the_record_before_any_work(tmp_path, capsys):
    thesis = tmp_path / "thesis.txt"
    thesis.write_text("three years of work")
    out = tmp_path / "out"
    out.mkdir()
    (out / RECORD).write_text(json.dumps({"../thesis.txt": sha(thesis)}))
    with pytest.raises(SystemExit) as exit_info:
        course.main(cut(out, "--force"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert f"entry '../thesis.txt' of its course record {RECORD} is not a plain relative path inside {out}" in err
    assert thesis.read_text() == "three years of work" and sorted(p.name for p in out.iterdir()) == [RECORD]


def test_a_file_where_the_course_needs_a_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "book").write_text("a file, not a folder")
    with pytest.raises(ValueError, match=f"{out / 'book'} is a file where the course needs a folder"):
        merge_course(staged_cut(tmp_path), out)
    assert (out / "book").read_text() == "a file, not a folder"


def test_an_empty_out_is_refused_with_one_meaning(capsys):
    with pytest.raises(SystemExit):
        course.main(["--chapters", "1", "--book", str(ROOT), "--out", ""])
    assert "argument --out: '' names no folder" in capsys.readouterr().err


def test_a_second_cut_into_a_folder_being_cut_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    code = ("import sys; from companion.training.runlock import folder_lock\n"
            f"with folder_lock({str(out)!r}, 'course folder'):\n    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit):
            course.main(cut(out, "--force"))
        err = capsys.readouterr().err
        assert f"course folder {out} is in use: process {proc.pid} on" in err and "Traceback" not in err
    finally:
        proc.stdin.close()
        proc.wait()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_out_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    try:
        with pytest.raises(SystemExit):
            course.main(cut(out, "--force"))
    finally:
        out.chmod(0o755)
    err = capsys.readouterr().err
    assert f"course folder {out} is not writable" in err and "Traceback" not in err
