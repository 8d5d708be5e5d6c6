"""Checkpoints without pickle: safetensors weights, JSON config, training state, SHA-256 manifest.

The module is the file format; its parts live beside it, and every name below is importable from here
too: ``companion.training.modelspec`` (what config.json says, the size caps), ``.statecodec`` (the
training state as JSON plus tensors) and ``.runfolder`` (the run folder: where a run may be written,
what it holds, keeping an old run aside).

What this module provides
- ``model_kind(model) -> str``: ``"decoder"``, ``"gpt"`` or ``"seq2seq"``, the model's family in
  ``companion.models.common.FAMILIES`` (the registry that also maps a kind back to its classes).
- ``config_dict(model) -> dict``: ``{"model": kind, **config fields}``, the ``config.json`` layout
  (the one ``python -m companion generate --checkpoint`` reads too).
- ``build_model(config, max_elements=None)``: a model from a config.json dict, sizes bounded first.
- ``save_checkpoint(run_dir, step, model, tokenizer=None, state=None, keep=2, force=False) -> Path``:
  writes ``run_dir/step-00000200/`` and points ``run_dir/latest`` at it (``check_run``'s rule first).
- ``CheckpointNotWritten``: what ``save_checkpoint`` raises when the disk fails it (full, a quota):
  an OSError whose message says that nothing partial was left and which step ``latest`` names.
- ``check_run_dir(run_dir)``: fails (ValueError) unless checkpoints can be written there (a folder
  inside a checkpoint's step directory cannot); the trainer calls it before its first step.
- ``check_run(run_dir, model, step)``: fails (ValueError) when the folder holds another run (steps of
  another model config, or newer steps) that a save of ``step`` would take the place of.
- ``keep_aside(run_dir, names)``: moves a run's steps and ``latest`` into ``run_dir/previous-N/``.
- ``resolve(path) -> Path``: a run directory (follows ``latest``) or one step directory.
- ``load_model(path, device="cpu", max_elements=None) -> nn.Module``: a model rebuilt from
  ``config.json`` with its weights.
- ``read_weights(model, path) -> dict``: the checkpoint's full state dict, checked against ``model``'s
  config (the trainer hands it to FSDP, which keeps each process's shards).
- ``load_weights(model, path)``: weights into an existing model; a model of another config raises a
  ValueError naming every mismatched field.
- ``load_state(path) -> dict | None`` and ``load_tokenizer(path)``: the training state and tokenizer.
- ``encode_state(obj) -> (json_obj, tensors)`` / ``decode_state(json_obj, tensors)``: nested Python
  objects (optimizer and scheduler state dicts, RNG states) split into JSON plus a flat tensor dict.
- ``FIELD_LIMITS`` and ``MAX_ELEMENTS``: the bounds a config.json must respect before anything is
  allocated (see "Untrusted files" below).

A step directory holds
- ``config.json``: the model kind and every config field;
- ``model.safetensors``: the weights; a tensor shared by two names (tied embeddings) is stored once
  and the alias recorded in the file's metadata;
- ``tokenizer.json`` (optional): the tokenizer's own ``save`` format;
- ``state.json`` + ``state.safetensors`` (optional): optimizer, scheduler, RNG and data states, the
  step, the metrics history (``companion.training.trainer``);
- ``manifest.json``, written last: the SHA-256 of every other file. Loading checks it first, so a
  flipped byte anywhere gives "checkpoint file ... is corrupted" instead of silently wrong weights.
Every file is mode 0644, and the same checkpoint saved twice gives byte-identical files (the
safetensors header's metadata is written in sorted key order).

Crash safety: write new, flip ``latest``, then delete old. A save writes the new step directory
under a hidden temporary name (``.step-....tmp``), fsyncs it and renames it to a name that does not
exist yet (``step-00000200``; re-saving a step that already exists writes ``step-00000200.1``, then
``.2``, ...); only then is ``latest`` replaced (``os.replace`` of a fsynced ``.latest.*.tmp``), and
only after that are superseded directories renamed aside (``.step-....old``) and deleted. A kill at
any moment therefore leaves ``latest`` naming a complete, verified step. Debris of an earlier crash
(``.step-*.tmp``, ``.step-*.old``, ``.latest.*.tmp``) is removed at the start of the next save.
``COMPANION_CHECKPOINT_FAULT=k`` kills the process (SIGKILL) right after the k-th file operation of
a save: the fault-injection hook the tests use to kill a save at every point.

Untrusted files. Nothing here ever unpickles: weights and tensors come from safetensors, everything
else from JSON. ``latest`` may only name a ``step-...`` directory inside the run directory. The
manifest may only list the five files above, must list every file the step directory holds (an
unlisted file is refused, not read unverified) and must list config.json and model.safetensors.
Before a model is built, its config.json is bounded (``companion.training.modelspec``: every size
field within ``FIELD_LIMITS``, the element count within ``MAX_ELEMENTS``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn

from companion.files import atomic_write_bytes, sha256_file, write_synced
from companion.models import unwrap
from companion.training.modelspec import (  # noqa: F401  (re-exported: the checkpoint's public names)
    FIELD_LIMITS, MAX_ELEMENTS, build_model, config_dict, model_kind)
from companion.training.modelspec import config_mismatch as _config_mismatch
from companion.training.runfolder import (  # noqa: F401  (re-exported)
    _DEBRIS, _LATEST, _STEP, _remove_debris, _step_dirs, check_run, check_run_dir, keep_aside, remember_run)
from companion.training.statecodec import decode_state, encode_state  # noqa: F401  (re-exported)

__all__ = [
    "model_kind", "config_dict", "build_model", "save_checkpoint", "check_run_dir", "check_run", "keep_aside", "resolve",
    "load_model", "load_weights", "read_weights", "load_state", "load_tokenizer", "encode_state", "decode_state",
    "atomic_write_bytes", "FORMAT", "FIELD_LIMITS", "MAX_ELEMENTS", "FAULT_ENV", "CheckpointNotWritten",
]

FORMAT = "companion-checkpoint/1"
FAULT_ENV = "COMPANION_CHECKPOINT_FAULT"
# the files a step directory may hold; the loader reads nothing else
_FILES = ("config.json", "model.safetensors", "tokenizer.json", "state.json", "state.safetensors")


# --- file helpers ----------------------------------------------------------------------------------

_ops = 0  # file operations of the current save, for the fault-injection hook


def _done(what: str) -> None:
    """Called after every file operation of a save. With ``$COMPANION_CHECKPOINT_FAULT=k`` the k-th
    call kills the process on the spot (SIGKILL: no cleanup, no ``finally``), as a power cut would."""
    global _ops
    _ops += 1
    spec = os.environ.get(FAULT_ENV, "").strip()
    if spec and int(spec) == _ops:
        if hasattr(signal, "SIGKILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(137)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    """A new file, mode 0644 whatever the umask, fsynced."""
    write_synced(path, data)
    _done(f"write {path.name}")


def _safetensors(tensors: dict[str, Tensor], metadata: dict[str, str]) -> bytes:
    """safetensors bytes whose header lists the metadata in sorted key order. The library keeps the
    metadata in a hash map, so its order (and the file's bytes) would change from run to run; the
    header is re-serialised here with the same length (compact JSON, space padding), so the offsets
    of the data that follows stay valid."""
    raw = safetensors_bytes(tensors, metadata=metadata)
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | header
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:  # cannot happen (same content, compact form); keep the library's bytes if it does
        return raw
    return raw[:8] + text + b" " * (n - len(text)) + raw[8 + n :]


class CheckpointNotWritten(OSError):
    """A save failed on the disk (full, a quota, an I/O error): nothing of the new step was left
    behind and ``latest`` still names the previous one. ``errno`` is the failure's."""


def _not_written(run_dir: Path, step: int, error: OSError) -> CheckpointNotWritten:
    pointer = run_dir / _LATEST
    previous = pointer.read_text(errors="replace").strip() if pointer.is_file() else None
    kept = f"'latest' still names {previous}" if previous else "the run has no earlier checkpoint"
    failure = CheckpointNotWritten(
        f"checkpoint of step {step} not written to {run_dir}: {error.strerror or error} (nothing of it was left "
        f"behind; {kept}). Free some space, then continue with --resume {run_dir}")
    failure.errno = error.errno
    return failure



# --- saving ----------------------------------------------------------------------------------------


def _weights(model: nn.Module, weights: dict[str, Tensor] | None = None) -> tuple[dict[str, Tensor], dict[str, str]]:
    """State dict (``weights``, default the model's own) with shared tensors stored once:
    (tensors, {alias: stored name}). Sharing is found by storage and by parameter identity in the model
    (a full state dict gathered from FSDP shards may hold two copies of a tied weight)."""
    model = unwrap(model)
    first_name: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first_name.setdefault(id(param), name)
    tied = {name: first_name[id(param)] for name, param in model.named_parameters(remove_duplicate=False)}
    tensors, aliases, seen = {}, {}, {}
    for name, value in (model.state_dict() if weights is None else weights).items():
        key = (value.data_ptr(), value.dtype, tuple(value.shape), value.stride()) if value.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if tied.get(name, name) != name and tied[name] in tensors:
            aliases[name] = tied[name]
            continue
        if key is not None:
            seen[key] = name
        tensors[name] = value.detach().to("cpu").contiguous()
    return tensors, aliases


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


def save_checkpoint(
    run_dir: Path | str, step: int, model: nn.Module, tokenizer=None, state: dict | None = None, keep: int | None = 2,
    weights: dict[str, Tensor] | None = None, force: bool = False,
) -> Path:
    """Write ``run_dir/step-<step>/`` crash-safely, point ``run_dir/latest`` at it, keep the newest ``keep``.

    Order (see the module docstring): remove debris of earlier crashes; write every file into a
    hidden temporary directory and fsync it; rename it to a fresh name; replace ``latest``; only then
    move superseded directories aside and delete them. The whole save holds the run folder's lock
    (``companion.training.runlock``): a folder another process is writing is refused.

    The run-folder rule (as ``train --out``): a folder holding checkpoints of another model config, or
    steps newer than ``step``, is refused with a ValueError (``check_run``), because this save would
    take their place. ``force=True`` first moves that run into ``run_dir/previous-N/``, deleting nothing.

    Args:
        state: optional training state (see ``encode_state`` for what it may contain).
        keep: number of step directories to keep (None: all). The one just written is always kept;
            an older copy of the same step is always deleted.
        weights: the full state dict to write instead of ``model.state_dict()`` (the trainer passes
            the weights it gathered from FSDP shards; ``model`` still gives the config).
    Returns the step directory.
    """
    from companion.training.runlock import run_lock

    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0; got {step!r}")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep must be an int >= 1 or None; got {keep!r}")
    run_dir = check_run_dir(run_dir)
    # every file's bytes before touching the disk (an encoding error leaves nothing behind)
    files = {"config.json": (json.dumps(config_dict(model), indent=1, sort_keys=True) + "\n").encode()}
    tensors, aliases = _weights(model, weights)
    files["model.safetensors"] = _safetensors(tensors, {"format": FORMAT, "aliases": json.dumps(aliases, sort_keys=True)})
    del tensors
    with run_lock(run_dir):
        try:
            rid = check_run(run_dir, model, step, weights=lambda: files["model.safetensors"])
        except ValueError:
            if not force:
                raise
            names = [p.name for _, _, p in _step_dirs(run_dir)] + ([_LATEST] if (run_dir / _LATEST).exists() else [])
            keep_aside(run_dir, names)
            rid = check_run(run_dir, model, step, weights=lambda: files["model.safetensors"])
        return _save(run_dir, step, files, rid, tokenizer, state, keep)


def _save(run_dir: Path, step: int, files: dict[str, bytes], rid: str, tokenizer, state: dict | None,
          keep: int | None) -> Path:
    """``save_checkpoint`` once its arguments, the folder and the lock are settled (``files``: the
    config and weights as bytes; ``rid``: the run id the manifest records)."""
    global _ops
    _ops = 0
    _remove_debris(run_dir)
    if state is not None:
        structure, state_tensors = encode_state(state)
        files["state.safetensors"] = _safetensors(state_tensors, {"format": FORMAT})
        files["state.json"] = (json.dumps(structure) + "\n").encode()
    base = _step_name(step)
    final, version = run_dir / base, 0
    while final.exists() or final.is_symlink():  # re-saving a step: a new name, never a swap in place
        version += 1
        final = run_dir / f"{base}.{version}"

    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{base}.", suffix=".tmp"))
        _done("mkdir")
        for name, data in files.items():
            _write_file(tmp / name, data)
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
            _write_file(tmp / "tokenizer.json", (tmp / "tokenizer.json").read_bytes())  # 0644 and fsynced
        digests = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        manifest = {"format": FORMAT, "step": step, "files": digests, "run": rid}
        _write_file(tmp / "manifest.json", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        os.chmod(tmp, 0o755)
        _fsync_dir(tmp)
        os.replace(tmp, final)  # a fresh name: nothing is replaced, nothing lies half-swapped
        _fsync_dir(run_dir)
        _done("rename step")
    except BaseException as error:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError):
            raise _not_written(run_dir, step, error) from error
        raise
    # flip `latest` (temporary file, fsync, os.replace): before this, `latest` names the old step
    try:
        atomic_write_bytes(run_dir / _LATEST, (final.name + "\n").encode(), before_replace=lambda: _done("write latest"))
    except OSError as error:  # the new step is complete but not `latest`: take it back too
        shutil.rmtree(final, ignore_errors=True)
        raise _not_written(run_dir, step, error) from error
    _fsync_dir(run_dir)
    _done("replace latest")
    # then delete what the new step supersedes: older copies of this step, and the steps beyond `keep`
    others = [(s, v, p) for s, v, p in _step_dirs(run_dir) if p != final]
    stale = [p for s, _, p in others if s == step]
    rest = [p for s, _, p in others if s != step]
    if keep is not None:
        stale += rest[: max(0, len(rest) - (keep - 1))]
    for old in stale:
        aside = run_dir / f".{old.name}.{os.getpid()}.old"
        os.replace(old, aside)  # atomic: no half-deleted directory is ever visible as a step
        _done(f"move aside {old.name}")
        shutil.rmtree(aside, ignore_errors=True)
        _done(f"delete {old.name}")
    return final


# --- loading ---------------------------------------------------------------------------------------


def resolve(path: Path | str) -> Path:
    """The step directory that ``path`` names: itself if it has a manifest, else the one ``path/latest``
    names (a ``step-...`` directory inside ``path``, nothing else), else, when a save was killed before
    its first ``latest`` was written, the newest step directory with a manifest."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint must be a directory (a run directory or a step-... directory); {path} is not one")
    if (path / "manifest.json").is_file():
        return path
    pointer = path / _LATEST
    if pointer.is_file():
        name = pointer.read_text(errors="replace").strip()
        if not _STEP.fullmatch(name):
            raise ValueError(f"checkpoint {path}: 'latest' must name a step-... directory inside the run directory; got {name[:80]!r}")
        target = path / name
        if target.is_symlink() or not target.is_dir() or target.resolve().parent != path.resolve():
            raise ValueError(f"checkpoint {path}: 'latest' names {name}, which is not a directory inside the run directory")
        if not (target / "manifest.json").is_file():
            raise ValueError(f"checkpoint {path}: 'latest' names {target.name}, which has no manifest.json")
        return target
    complete = [p for _, _, p in _step_dirs(path) if (p / "manifest.json").is_file()]
    if complete:
        return complete[-1]
    raise ValueError(f"checkpoint {path} has neither manifest.json nor a 'latest' pointer: not a companion checkpoint")


def _verified(path: Path | str) -> Path:
    """The step directory, after checking that its manifest lists exactly the files it holds (known
    names only, config.json and model.safetensors among them) and that every digest matches."""
    step_dir = resolve(path)
    manifest_file = step_dir / "manifest.json"
    try:
        manifest = json.loads(manifest_file.read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or not all(isinstance(d, str) for d in files.values()):
            raise TypeError("'files' must map names to digests")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"checkpoint file {manifest_file} is corrupted (unreadable JSON: {e})") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"checkpoint {step_dir} has format {manifest.get('format')!r}; this library reads {FORMAT!r}")
    strange = sorted(name for name in files if name not in _FILES)
    if strange:
        raise ValueError(f"checkpoint file {manifest_file} lists files a checkpoint never holds: {strange} (allowed: {list(_FILES)})")
    for name in ("config.json", "model.safetensors"):
        if name not in files:
            raise ValueError(f"checkpoint file {manifest_file} does not list {name}, which every checkpoint holds")
    if ("state.json" in files) != ("state.safetensors" in files):
        raise ValueError(f"checkpoint file {manifest_file} lists only one of state.json and state.safetensors")
    unlisted = sorted(p.name for p in step_dir.iterdir() if p.name != "manifest.json" and p.name not in files)
    if unlisted:
        raise ValueError(
            f"checkpoint {step_dir} holds {unlisted}, which manifest.json does not list: an unverified file is not read"
        )
    for name, digest in files.items():
        file = step_dir / name
        if not file.is_file() or file.is_symlink():
            raise ValueError(f"checkpoint file {file} is missing (listed in manifest.json)")
        if sha256_file(file) != digest:
            raise ValueError(f"checkpoint file {file} is corrupted: its SHA-256 differs from the one in manifest.json")
    return step_dir


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except ValueError as e:
        raise ValueError(f"checkpoint file {file} is corrupted (unreadable JSON: {e})") from None


def _read_tensors(file: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    try:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as handle:
            metadata = handle.metadata() or {}
        return load_file(str(file)), metadata
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"checkpoint file {file} is corrupted (not a readable safetensors file: {e})") from None



def read_weights(model: nn.Module, path: Path | str) -> dict[str, Tensor]:
    """A checkpoint's full state dict (on the CPU, tied names restored), after checking that it was
    written for ``model``'s config (ValueError naming each mismatched field, or the corrupted file)."""
    return _read_weights(model, _verified(path))


def _read_weights(model: nn.Module, step_dir: Path) -> dict[str, Tensor]:
    saved = _read_json(step_dir / "config.json")
    if not isinstance(saved, dict):
        raise ValueError(f"checkpoint file {step_dir / 'config.json'} is corrupted (not a JSON object)")
    problems = _config_mismatch(saved, model)
    if problems:
        raise ValueError(f"checkpoint {step_dir} does not fit this model; mismatched config: " + "; ".join(problems))
    file = step_dir / "model.safetensors"
    tensors, metadata = _read_tensors(file)
    try:
        aliases = json.loads(metadata.get("aliases", "{}"))
        for alias, stored in aliases.items():
            tensors[alias] = tensors[stored]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"checkpoint file {file} is corrupted (bad 'aliases' metadata: {e!r})") from None
    for name, tensor in tensors.items():  # training never saves such weights; a model built on them prints noise
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"checkpoint file {file}: weight {name} holds {bad} NaN or infinite value(s) of "
                             f"{tensor.numel()} (a damaged checkpoint: training never saves non-finite weights); "
                             "load another step")
    return tensors


def load_weights(model: nn.Module, path: Path | str) -> nn.Module:
    """Load a checkpoint's weights into ``model`` (in place, on the model's device); returns the model.

    Raises ValueError when the checkpoint is corrupted or was written for a different config; the
    message names each mismatched config field.
    """
    step_dir = _verified(path)
    tensors = _read_weights(model, step_dir)
    target = unwrap(model)
    try:
        target.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise ValueError(f"checkpoint {step_dir}: weights do not fit the model: {e}") from None
    remember_run(target, step_dir)  # saving it back into that run continues the run
    return model


def load_model(path: Path | str, device: torch.device | str = "cpu", max_elements: int | None = None) -> nn.Module:
    """Rebuild the model a checkpoint describes and load its weights (eval mode, on ``device``).
    ``max_elements``: the size cap of ``build_model``."""
    step_dir = _verified(path)
    model = build_model(_read_json(step_dir / "config.json"), max_elements=max_elements)
    load_weights(model, step_dir)
    return model.to(device).eval()


def load_state(path: Path | str) -> dict | None:
    """The training state saved with the checkpoint (None if it has none)."""
    step_dir = _verified(path)
    if not (step_dir / "state.json").is_file():
        return None
    tensors, _ = _read_tensors(step_dir / "state.safetensors")
    try:
        return decode_state(_read_json(step_dir / "state.json"), tensors)
    except ValueError as e:
        raise ValueError(f"checkpoint file {step_dir / 'state.json'} is corrupted: {e}") from None


def load_tokenizer(path: Path | str):
    """The tokenizer saved with the checkpoint (None if it has none), by the ``kind`` in its JSON."""
    from companion.tokenizers import tokenizer_from_json  # every tokenizer class registers its kind there

    step_dir = _verified(path)
    file = step_dir / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        return tokenizer_from_json(file)
    except ValueError as error:
        raise ValueError(f"checkpoint file {file}: {error}") from None
