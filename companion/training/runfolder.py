"""The run folder around the checkpoints: where a run may be written, what it already holds, and how
an old run is kept aside instead of being replaced.

- ``check_run_dir(run_dir)``: fails (ValueError) unless checkpoints can be written there (a folder
  inside a checkpoint's step directory cannot); the trainer calls it before its first step.
- ``check_run(run_dir, model, step)``: fails (ValueError) when the folder holds another run (steps of
  another model config, or newer steps) that a save of ``step`` would take the place of.
- ``keep_aside(run_dir, names)``: moves a run's steps and ``latest`` into ``run_dir/previous-N/``.
- ``step_dirs(run_dir)``: (step, version, path) of every step directory, oldest first.
- ``remember_run(model, step_dir)``: this process now knows ``model`` as the run ``step_dir`` belongs
  to (``load_weights`` and ``Trainer.resume`` call it).

Which model a run folder holds. Two models of the same config are not one run: a save of the second
into the first's folder would replace its step of the same number and let ``keep`` prune the rest.
So every step's manifest.json records the run's id (``"run"``): a fingerprint of the weights of the
run's first save (the first 16 hex digits of their SHA-256, so the same checkpoint saved twice is
still byte for byte the same); in
this process the model saved or loaded carries it (a weak map from model to id, nothing stored on
the model). A save into a folder whose newest step has another run's id is refused (``check_run``)
unless the model was loaded from that run, or its weights are byte for byte the newest step's (the
same model, re-saved). A folder written before ids were recorded has none and is taken as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path

from torch import nn

from companion.models import unwrap
from companion.training.modelspec import config_mismatch as _config_mismatch

__all__ = ["check_run_dir", "check_run", "keep_aside", "step_dirs", "remember_run", "run_of", "run_id",
           "LATEST", "STEP"]

_LATEST = "latest"
_STEP = re.compile(r"step-(\d{8,})(?:\.(\d+))?")  # step-00000200, or step-00000200.3 for a re-save
_DEBRIS = (".step-*.tmp", ".step-*.old", ".latest.*.tmp", ".write-test.*.tmp")


def check_run_dir(run_dir: Path | str) -> Path:
    """Create ``run_dir`` if needed and prove a file can be written in it; ValueError otherwise (a
    path naming a file, a parent that is a file, a read-only or unwritable folder). Returns it."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"out_dir {run_dir} is a file, not a directory: checkpoints need a directory")
    inside = _step_dir_around(run_dir)
    if inside is not None:
        raise ValueError(
            f"out_dir {run_dir} is inside the checkpoint step directory {inside}: a run written there would "
            "add files its manifest.json does not list (both runs would then be refused when loaded) and "
            f"could be deleted with it when {inside.parent} prunes old steps. Choose a folder outside every "
            "step-* directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=run_dir, prefix=".write-test.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"out_dir {run_dir} is not writable: {e.strerror or e}") from None
    return run_dir


def _step_dir_around(path: Path) -> Path | None:
    """The checkpoint step directory that ``path`` is or lies inside, if any: a folder holding a
    manifest.json, or one named ``step-...`` beside a ``latest`` pointer (a run's own step)."""
    for folder in (path.resolve(), *path.resolve().parents):
        if not folder.is_dir():
            continue
        if (folder / "manifest.json").is_file() or (
                _STEP.fullmatch(folder.name) and (folder.parent / _LATEST).is_file()):
            return folder
    return None


def keep_aside(run_dir: Path, names: list[str]) -> Path:
    """Move the entries ``names`` of ``run_dir`` (a run's step directories and ``latest``) into a new
    ``run_dir/previous-N/`` (the first free N), itself a run folder that loads and resumes; returns it.
    ``latest`` moves first, so a crash in between never leaves a pointer to a moved step, and nothing
    is deleted."""
    n = 1
    while (run_dir / f"previous-{n}").exists():
        n += 1
    aside = run_dir / f"previous-{n}"
    tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=".previous.", suffix=".tmp"))
    for name in sorted(names, key=lambda name: name != _LATEST):
        os.replace(run_dir / name, tmp / name)
    os.replace(tmp, aside)
    return aside


_FORCE_HINT = ("save into another folder, or pass force=True to keep the run that is there in a previous-N "
               "folder inside it first")


_RUNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the run id it was saved or loaded as


def run_id(step_dir: Path) -> str | None:
    """The run id a step's manifest.json records (None: none recorded, or unreadable)."""
    try:
        manifest = json.loads((step_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    rid = manifest.get("run") if isinstance(manifest, dict) else None
    return rid if isinstance(rid, str) else None


def remember_run(model: nn.Module, step_dir: Path) -> None:
    """Know ``model`` (in this process) as the run that ``step_dir`` belongs to."""
    rid = run_id(Path(step_dir))
    if rid is not None:
        _RUNS[unwrap(model)] = rid


def _weights_digest(step_dir: Path) -> str | None:
    try:
        return json.loads((step_dir / "manifest.json").read_text())["files"]["model.safetensors"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_of(run_dir: Path, model: nn.Module, weights: Callable[[], bytes] | None = None, step: int | None = None,
           remedy: str = _FORCE_HINT) -> str:
    """The run id a save of ``model`` into ``run_dir`` writes: the folder's own when ``model`` is that
    run (loaded from it, saved there before, or holding the newest step's very weights, which
    ``weights()`` gives as safetensors bytes), else a ValueError naming the other run; a fresh id in a
    folder without one."""
    model = unwrap(model)
    complete = [p for _, _, p in _step_dirs(run_dir) if (p / "manifest.json").is_file()]
    newest = complete[-1] if complete else None
    theirs = run_id(newest) if newest is not None else None
    mine = _RUNS.get(model)
    if theirs is None or mine == theirs:
        rid = mine or theirs or (hashlib.sha256(weights()).hexdigest()[:16] if weights else secrets.token_hex(8))
    elif mine is None and weights is not None and hashlib.sha256(weights()).hexdigest() == _weights_digest(newest):
        rid = theirs  # the same weights: this model is the one that folder holds
    else:
        what = f"step {step}" if step is not None else "this model"
        raise ValueError(
            f"run folder {run_dir} holds {newest.name} of another model (run {theirs}; this model "
            + (f"is run {mine}" if mine else "was not loaded from it and its weights differ")
            + f"): saving {what} there would replace that run's checkpoints or let keep= prune them: {remedy}")
    _RUNS[model] = rid
    return rid


def check_run(run_dir: Path | str, model: nn.Module, step: int, remedy: str = _FORCE_HINT,
              weights: Callable[[], bytes] | None = None) -> str | None:
    """Refuse (ValueError) to add step ``step`` of ``model`` to ``run_dir`` when that would take the
    place of another run's checkpoints: the folder holds steps of another model config (``latest``
    would move to a different model, and ``keep`` would prune the other's steps), or steps newer than
    ``step`` (``latest`` would go back, and ``keep`` would delete the newer ones). Steps of the same
    config up to ``step`` are the same run only when ``model`` is that run (``run_of``: loaded from it,
    saved there, or with the newest step's weights, ``weights()`` as safetensors bytes). ``remedy``
    ends the message: what the caller can do instead. Returns the run id a save writes (None: no folder)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    steps = _step_dirs(run_dir)
    newer = [p.name for s, _, p in steps if s > step]
    if newer:
        raise ValueError(
            f"run folder {run_dir} holds {', '.join(newer)}, newer than step {step}: saving step {step} "
            f"there would move 'latest' back and let keep= delete the newer checkpoints. Continue that run "
            f"from its newest step (python -m companion train ... --resume {run_dir / newer[-1]} --out {run_dir}), "
            f"or {remedy}")
    for _, _, path in reversed(steps):
        config = path / "config.json"
        try:
            saved = json.loads(config.read_text())
            problems = _config_mismatch(saved, model) if isinstance(saved, dict) else ["config.json is not an object"]
        except (OSError, ValueError) as e:
            problems = [f"its config.json is unreadable ({e})"]
        if problems:
            raise ValueError(
                f"run folder {run_dir} holds {path.name} of another model ({'; '.join(problems[:3])}): saving "
                f"this model there would replace that run's checkpoints: {remedy}")
    return run_of(run_dir, model, weights, step, remedy)


def _remove_debris(run_dir: Path) -> None:
    """Temporary directories and files left by a save that was killed."""
    for pattern in _DEBRIS:
        for p in run_dir.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _step_dirs(run_dir: Path) -> list[tuple[int, int, Path]]:
    """(step, version, path) of every visible step directory, oldest first."""
    out = []
    for p in run_dir.iterdir():
        m = _STEP.fullmatch(p.name)
        if m and p.is_dir() and not p.is_symlink():
            out.append((int(m.group(1)), int(m.group(2) or 0), p))
    return sorted(out)


LATEST, STEP, step_dirs = _LATEST, _STEP, _step_dirs
