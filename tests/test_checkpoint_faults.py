"""Checkpoints under faults: a save killed after every one of its file operations, stable bytes and
modes, and untrusted (tampered) step directories refused with a message naming what is wrong."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

import pytest
import torch

from companion.models import GPT, GPTConfig
from companion.tokenizers import CharTokenizer
from companion.training import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt(seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16))


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def killed_save(run, step, model, state, k) -> bool:
    """Save in a forked child with the fault hook set to k; True when the child was killed."""
    pid = os.fork()
    if pid == 0:  # the child: save, then leave without any cleanup of the parent's test machinery
        code = 1
        try:
            os.environ[ckpt.FAULT_ENV] = str(k)
            ckpt.save_checkpoint(run, step, model, state=state, keep=1)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "the child's save failed without being killed"
    return False


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="needs fork")
@pytest.mark.parametrize("step", [4, 2], ids=["new-step", "re-save-same-step"])
def test_a_save_killed_after_any_file_operation_leaves_a_loadable_checkpoint(tmp_path, step):
    # one model (one run) at two moments: its weights at step 2 (old) and after training on (new)
    model, old, new = tiny_gpt(0), tiny_gpt(0), tiny_gpt(1)
    kills = 0
    for k in range(1, 100):
        run = tmp_path / f"run{k}"
        model.load_state_dict(old.state_dict())
        ckpt.save_checkpoint(run, 2, model, state={"step": 2}, keep=1)
        model.load_state_dict(new.state_dict())
        if not killed_save(run, step, model, {"step": step}, k):
            break
        kills += 1
        loaded = ckpt.load_model(run)  # whatever the moment of death: `latest` names a complete step
        state = ckpt.load_state(run)
        assert (same_weights(loaded, old) and state == {"step": 2}) or (same_weights(loaded, new) and state == {"step": step})
        ckpt.save_checkpoint(run, step, model, state={"step": step}, keep=1)  # the next save cleans up
        assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []
        assert len([p for p in run.iterdir() if p.name.startswith("step-")]) == 1
        assert same_weights(ckpt.load_model(run), new)
    else:
        pytest.fail("the save never completed")
    # mkdir, 4 files + manifest written, the step renamed in, `latest` written and replaced, the
    # superseded step moved aside and deleted: 11 points, each one killed once
    assert kills == 11, kills
    assert same_weights(ckpt.load_model(run), new) and ckpt.load_state(run) == {"step": step}


def test_debris_of_a_killed_save_is_removed_by_the_next_one(tmp_path):
    model = tiny_gpt(0)
    ckpt.save_checkpoint(tmp_path, 1, model)
    (tmp_path / ".step-00000002.x1y2.tmp").mkdir()
    (tmp_path / ".step-00000002.x1y2.tmp" / "config.json").write_text("{}")
    (tmp_path / ".latest.abcd.tmp").write_text("step-00000002\n")
    (tmp_path / ".step-00000001.77.old").mkdir()
    model.load_state_dict(tiny_gpt(1).state_dict())  # the same run, trained on
    ckpt.save_checkpoint(tmp_path, 2, model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000001", "step-00000002"]


def test_identical_checkpoints_are_byte_identical_with_sorted_metadata_and_mode_0644(tmp_path):
    model = tiny_gpt(0)
    tok = CharTokenizer.train("abcdefg")
    state = {"step": 3, "t": torch.arange(4)}
    previous = os.umask(0o077)  # a strict umask must not make the files unreadable to others
    try:
        dirs = [ckpt.save_checkpoint(tmp_path / f"r{i}", 3, model, tokenizer=tok, state=state) for i in range(6)]
    finally:
        os.umask(previous)
    digests = [{p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir()} for d in dirs]
    assert all(d == digests[0] for d in digests)
    for d in dirs:
        assert d.stat().st_mode & 0o777 == 0o755
        assert {p.name: p.stat().st_mode & 0o777 for p in d.iterdir()} == dict.fromkeys(digests[0], 0o644)
        raw = (d / "model.safetensors").read_bytes()
        header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        assert list(header["__metadata__"]) == ["aliases", "format"]
    assert (tmp_path / "r0" / "latest").stat().st_mode & 0o777 == 0o644


# --- untrusted files ---------------------------------------------------------------------------------


def rewrite(step_dir, name, data: bytes) -> None:
    """Replace a file AND its manifest digest: what a deliberate tamperer would do."""
    (step_dir / name).write_bytes(data)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"][name] = hashlib.sha256(data).hexdigest()
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("vocab_size", 10**9, r"field vocab_size = 1000000000 is outside \[0, 2097152\].*FIELD_LIMITS\['vocab_size'\]"),
        ("n_layer", 10**6, r"field n_layer = 1000000 is outside \[0, 1024\]"),
        ("block_size", 10**11, r"field block_size = 100000000000 is outside \[0, 1048576\]"),
        ("n_embd", "abc", "field n_embd must be an integer; got 'abc'"),
        ("n_embd", 1.5, "field n_embd must be an integer; got 1.5"),
    ],
)
def test_tampered_config_sizes_are_refused_before_allocation(tmp_path, field, value, match):
    step_dir = ckpt.save_checkpoint(tmp_path, 1, tiny_gpt(0))
    config = json.loads((step_dir / "config.json").read_text())
    config[field] = value
    rewrite(step_dir, "config.json", json.dumps(config).encode())
    with pytest.raises(ValueError, match=match):
        ckpt.load_model(tmp_path)


def test_element_cap_is_checked_on_the_meta_device_and_can_be_raised(tmp_path, monkeypatch):
    step_dir = ckpt.save_checkpoint(tmp_path, 1, tiny_gpt(0))
    n = sum(p.numel() for p in tiny_gpt(0).parameters()) + sum(b.numel() for b in tiny_gpt(0).buffers())
    with pytest.raises(ValueError, match=f"model of {n:,} elements .* more than the cap of 1,000 "):
        ckpt.load_model(step_dir, max_elements=1000)
    monkeypatch.setenv("COMPANION_MAX_ELEMENTS", "1000")
    with pytest.raises(ValueError, match="more than the cap of 1,000 "):
        ckpt.load_model(step_dir)
    assert ckpt.load_model(step_dir, max_elements=n) is not None  # the explicit cap wins over the variable


def test_manifest_must_list_every_file_and_only_known_names(tmp_path):
    tok = CharTokenizer.train("abcdefg")
    step_dir = ckpt.save_checkpoint(tmp_path, 1, tiny_gpt(0), tokenizer=tok, state={"step": 1})
    manifest = json.loads((step_dir / "manifest.json").read_text())
    for drop, match in [("tokenizer.json", r"holds \['tokenizer.json'\], which manifest.json does not list"),
                        ("state.json", "lists only one of state.json and state.safetensors")]:
        trimmed = {**manifest, "files": {k: v for k, v in manifest["files"].items() if k != drop}}
        (step_dir / "manifest.json").write_text(json.dumps(trimmed))
        with pytest.raises(ValueError, match=match):
            ckpt.load_tokenizer(tmp_path)
    trimmed = {**manifest, "files": {k: v for k, v in manifest["files"].items() if k != "model.safetensors"}}
    (step_dir / "model.safetensors").rename(tmp_path / "aside")
    (step_dir / "manifest.json").write_text(json.dumps(trimmed))
    with pytest.raises(ValueError, match="does not list model.safetensors, which every checkpoint holds"):
        ckpt.load_model(tmp_path)
    (tmp_path / "aside").rename(step_dir / "model.safetensors")
    outside = {**manifest, "files": {**manifest["files"], "../secret": "0" * 64}}
    (step_dir / "manifest.json").write_text(json.dumps(outside))
    with pytest.raises(ValueError, match=r"lists files a checkpoint never holds: \['../secret'\]"):
        ckpt.load_model(tmp_path)
    (step_dir / "manifest.json").write_text(json.dumps(manifest))
    (step_dir / "extra.bin").write_bytes(b"\x00")
    with pytest.raises(ValueError, match=r"holds \['extra.bin'\], which manifest.json does not list"):
        ckpt.load_model(tmp_path)
    (step_dir / "extra.bin").unlink()
    assert ckpt.load_tokenizer(tmp_path).encode("abc") == tok.encode("abc")


def test_latest_may_only_name_a_step_inside_the_run(tmp_path):
    ckpt.save_checkpoint(tmp_path / "other", 1, tiny_gpt(1))
    ckpt.save_checkpoint(tmp_path / "run", 1, tiny_gpt(0))
    run = tmp_path / "run"
    for pointer, match in [
        ("../other/step-00000001", "'latest' must name a step-... directory inside the run directory"),
        (str(tmp_path / "other" / "step-00000001"), "'latest' must name a step-... directory"),
        ("step-00000009", "'latest' names step-00000009, which is not a directory inside the run directory"),
    ]:
        (run / "latest").write_text(pointer + "\n")
        with pytest.raises(ValueError, match=match):
            ckpt.load_model(run)
    (run / "step-00000002").symlink_to(tmp_path / "other" / "step-00000001")
    (run / "latest").write_text("step-00000002\n")
    with pytest.raises(ValueError, match="which is not a directory inside the run directory"):
        ckpt.load_model(run)


def test_state_referencing_a_missing_tensor_is_a_clear_error(tmp_path):
    step_dir = ckpt.save_checkpoint(tmp_path, 1, tiny_gpt(0), state={"step": 1, "t": torch.ones(2)})
    structure = json.loads((step_dir / "state.json").read_text())
    structure["t"]["__tensor__"] = "s.nowhere"
    rewrite(step_dir, "state.json", json.dumps(structure).encode())
    with pytest.raises(ValueError, match=r"state.json is corrupted: the state references tensor 's.nowhere', which"):
        ckpt.load_state(tmp_path)
    structure["t"] = {"__tuple__": 5}
    rewrite(step_dir, "state.json", json.dumps(structure).encode())
    with pytest.raises(ValueError, match="state.json is corrupted: the state has a malformed entry"):
        ckpt.load_state(tmp_path)


def test_one_synced_write_serves_every_crash_safe_file(tmp_path):
    """companion.files.write_synced is the write-chmod-fsync of atomic_write_bytes and of the
    checkpoint's files; atomic_write_bytes's hook runs after the fsync and before the rename, so a
    failure there leaves the old file and no temporary one."""
    from companion.files import atomic_write_bytes, write_synced

    old_umask = os.umask(0o077)
    try:
        write_synced(tmp_path / "a", b"one")
        target = tmp_path / "b"
        atomic_write_bytes(target, b"old")
        seen = []

        def hook():
            seen.append(sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".b.")))
            raise OSError("disk gone")

        with pytest.raises(OSError, match="disk gone"):
            atomic_write_bytes(target, b"new", before_replace=hook)
    finally:
        os.umask(old_umask)
    assert (tmp_path / "a").read_bytes() == b"one" and (tmp_path / "a").stat().st_mode & 0o777 == 0o644
    assert len(seen[0]) == 1 and target.read_bytes() == b"old" and target.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
