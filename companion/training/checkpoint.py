"""Checkpoints without pickle: safetensors weights, JSON config, training state, SHA-256 manifest.

What this module provides
- ``MODEL_KINDS``: ``"decoder"``, ``"gpt"``, ``"seq2seq"`` -> (model class, config class).
- ``model_kind(model) -> str`` and ``config_dict(model) -> dict``: ``{"model": kind, **config fields}``,
  the ``config.json`` layout (the one ``python -m companion generate --checkpoint`` reads too).
- ``save_checkpoint(run_dir, step, model, tokenizer=None, state=None, keep=2) -> Path``: writes
  ``run_dir/step-00000200/`` and points ``run_dir/latest`` at it.
- ``resolve(path) -> Path``: a run directory (follows ``latest``) or one step directory.
- ``load_model(path, device="cpu") -> nn.Module``: a model rebuilt from ``config.json`` with its weights.
- ``load_weights(model, path)``: weights into an existing model; a model of another config raises a
  ValueError naming every mismatched field.
- ``load_state(path) -> dict | None`` and ``load_tokenizer(path)``: the training state and tokenizer.
- ``encode_state(obj) -> (json_obj, tensors)`` / ``decode_state(json_obj, tensors)``: nested Python
  objects (optimizer and scheduler state dicts, RNG states) split into JSON plus a flat tensor dict.

A step directory holds
- ``config.json``: the model kind and every config field;
- ``model.safetensors``: the weights; a tensor shared by two names (tied embeddings) is stored once
  and the alias recorded in the file's metadata;
- ``tokenizer.json`` (optional): the tokenizer's own ``save`` format;
- ``state.json`` + ``state.safetensors`` (optional): optimizer, scheduler, RNG and data states, the
  step, the metrics history (``companion.training.trainer``);
- ``manifest.json``, written last: the SHA-256 of every other file. Loading checks it first, so a
  flipped byte anywhere gives "checkpoint file ... is corrupted" instead of silently wrong weights.

Atomicity: the step directory is written under a temporary name and renamed into place, and
``latest`` is replaced with ``os.replace``; a crash at any moment leaves the previous checkpoint and
the ``latest`` pointer to it untouched. Nothing here ever unpickles: weights and tensors come from
safetensors, everything else from JSON.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from companion.files import atomic_write_bytes, sha256_file
from companion.models import unwrap

__all__ = [
    "MODEL_KINDS", "model_kind", "config_dict", "build_model", "save_checkpoint", "resolve", "load_model",
    "load_weights", "load_state", "load_tokenizer", "encode_state", "decode_state", "atomic_write_bytes",
    "FORMAT",
]

FORMAT = "companion-checkpoint/1"
_LATEST = "latest"


def _kinds() -> dict[str, tuple[type, type]]:
    from companion.models import GPT, Decoder, DecoderConfig, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer

    return {"decoder": (Decoder, DecoderConfig), "gpt": (GPT, GPTConfig), "seq2seq": (Seq2SeqTransformer, Seq2SeqConfig)}


MODEL_KINDS = ("decoder", "gpt", "seq2seq")


def model_kind(model: nn.Module) -> str:
    """``"decoder"``, ``"gpt"`` or ``"seq2seq"`` for the book's three model classes."""
    model = unwrap(model)
    for kind, (cls, _) in _kinds().items():
        if type(model) is cls:
            return kind
    raise ValueError(f"model must be a Decoder, GPT or Seq2SeqTransformer to be checkpointed; got {type(model).__name__}")


def config_dict(model: nn.Module) -> dict:
    """``{"model": kind, **asdict(model.config)}``: the contents of config.json."""
    kind = model_kind(model)
    return {"model": kind, **asdict(unwrap(model).config)}


def build_model(config: dict) -> nn.Module:
    """A freshly initialised model from a config.json dict."""
    config = dict(config)
    kind = config.pop("model", None)
    kinds = _kinds()
    if kind not in kinds:
        raise ValueError(f"config 'model' must be one of {list(kinds)}; got {kind!r}")
    cls, config_cls = kinds[kind]
    known = {f.name for f in fields(config_cls)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"config.json has fields that {config_cls.__name__} does not know: {unknown}")
    return cls(config_cls(**config))


# --- file helpers ----------------------------------------------------------------------------------


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


# --- state encoding (JSON + tensors, no pickle) ----------------------------------------------------


def encode_state(obj) -> tuple[object, dict[str, Tensor]]:
    """Split a nested object into a JSON-able structure and a flat {name: tensor} dict.

    Tensors become ``{"__tensor__": name}``; tuples ``{"__tuple__": [...]}``; dicts with non-string keys
    ``{"__items__": [[key, value], ...]}``; NumPy arrays ``{"__ndarray__": [...], "dtype": ...}``;
    bytes ``{"__bytes__": base64}``. Anything else that JSON cannot hold raises ValueError.
    """
    tensors: dict[str, Tensor] = {}

    def enc(x, path: str):
        if isinstance(x, Tensor):
            tensors[path] = x.detach().to("cpu").contiguous().clone()
            return {"__tensor__": path}
        if isinstance(x, np.ndarray):
            return {"__ndarray__": x.tolist(), "dtype": str(x.dtype)}
        if isinstance(x, (bytes, bytearray)):
            return {"__bytes__": base64.b64encode(bytes(x)).decode()}
        if isinstance(x, dict):
            if all(isinstance(k, str) for k in x):
                return {k: enc(v, f"{path}.{k}") for k, v in x.items()}
            return {"__items__": [[k, enc(v, f"{path}.{k}")] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v, f"{path}.{i}") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [enc(v, f"{path}.{i}") for i, v in enumerate(x)]
        if isinstance(x, (np.integer, np.floating, np.bool_)):
            return x.item()
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise ValueError(f"state at {path!r} has type {type(x).__name__}, which a checkpoint cannot store without pickle")

    return enc(obj, "s"), tensors


def decode_state(obj, tensors: dict[str, Tensor]):
    """Inverse of ``encode_state``."""

    def dec(x):
        if isinstance(x, list):
            return [dec(v) for v in x]
        if isinstance(x, dict):
            if "__tensor__" in x:
                return tensors[x["__tensor__"]]
            if "__tuple__" in x:
                return tuple(dec(v) for v in x["__tuple__"])
            if "__items__" in x:
                return {k: dec(v) for k, v in x["__items__"]}
            if "__ndarray__" in x:
                return np.asarray(x["__ndarray__"], dtype=x["dtype"])
            if "__bytes__" in x:
                return base64.b64decode(x["__bytes__"])
            return {k: dec(v) for k, v in x.items()}
        return x

    return dec(obj)


# --- saving ----------------------------------------------------------------------------------------


def _weights(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """State dict with shared tensors stored once: (tensors, {alias: stored name})."""
    tensors, aliases, seen = {}, {}, {}
    for name, value in unwrap(model).state_dict().items():
        key = (value.data_ptr(), value.dtype, tuple(value.shape), value.stride()) if value.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        tensors[name] = value.detach().to("cpu").contiguous()
    return tensors, aliases


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


def save_checkpoint(
    run_dir: Path | str, step: int, model: nn.Module, tokenizer=None, state: dict | None = None, keep: int | None = 2
) -> Path:
    """Write ``run_dir/step-<step>/`` atomically, point ``run_dir/latest`` at it, keep the newest ``keep``.

    Args:
        state: optional training state (see ``encode_state`` for what it may contain).
        keep: number of step directories to keep (None: all). The one just written is always kept.
    Returns the step directory.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0; got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None; got {keep}")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / _step_name(step)
    tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        (tmp / "config.json").write_text(json.dumps(config_dict(model), indent=1, sort_keys=True) + "\n")
        tensors, aliases = _weights(model)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": FORMAT, "aliases": json.dumps(aliases)})
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
        if state is not None:
            structure, state_tensors = encode_state(state)
            save_file(state_tensors, str(tmp / "state.safetensors"), metadata={"format": FORMAT})
            (tmp / "state.json").write_text(json.dumps(structure) + "\n")
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        manifest = {"format": FORMAT, "step": step, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        for p in tmp.iterdir():
            with open(p, "rb") as handle:
                os.fsync(handle.fileno())
        os.chmod(tmp, 0o755)
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same step: move the old one aside first (rename is atomic)
            trash = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{final.name}.", suffix=".old"))
            os.replace(final, trash / final.name)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_bytes(run_dir / _LATEST, (final.name + "\n").encode())
    if keep is not None:
        steps = sorted(p for p in run_dir.glob("step-*") if p.is_dir() and p != final)
        for old in steps[: max(0, len(steps) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    return final


# --- loading ---------------------------------------------------------------------------------------


def resolve(path: Path | str) -> Path:
    """The step directory that ``path`` names: itself if it has a manifest, else the one ``path/latest`` names."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint must be a directory (a run directory or a step-... directory); {path} is not one")
    if (path / "manifest.json").is_file():
        return path
    pointer = path / _LATEST
    if pointer.is_file():
        target = path / pointer.read_text().strip()
        if not (target / "manifest.json").is_file():
            raise ValueError(f"checkpoint {path}: 'latest' names {target.name}, which has no manifest.json")
        return target
    raise ValueError(f"checkpoint {path} has neither manifest.json nor a 'latest' pointer: not a companion checkpoint")


def _verified(path: Path | str) -> Path:
    step_dir = resolve(path)
    try:
        manifest = json.loads((step_dir / "manifest.json").read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"checkpoint file {step_dir / 'manifest.json'} is corrupted (unreadable JSON: {e})") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"checkpoint {step_dir} has format {manifest.get('format')!r}; this library reads {FORMAT!r}")
    for name, digest in files.items():
        file = step_dir / name
        if not file.is_file():
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


def _config_mismatch(saved: dict, model: nn.Module) -> list[str]:
    current = config_dict(model)
    problems = []
    if saved.get("model") != current["model"]:
        return [f"model: checkpoint has {saved.get('model')!r}, the model is {current['model']!r}"]
    for key in sorted(set(saved) | set(current)):
        if key in ("model", "name", "backend", "dropout"):  # names, kernels and dropout do not change the weights' meaning
            continue
        if saved.get(key) != current.get(key):
            problems.append(f"{key}: checkpoint has {saved.get(key)!r}, the model has {current.get(key)!r}")
    return problems


def load_weights(model: nn.Module, path: Path | str) -> nn.Module:
    """Load a checkpoint's weights into ``model`` (in place, on the model's device); returns the model.

    Raises ValueError when the checkpoint is corrupted or was written for a different config; the
    message names each mismatched config field.
    """
    step_dir = _verified(path)
    saved = _read_json(step_dir / "config.json")
    problems = _config_mismatch(saved, model)
    if problems:
        raise ValueError(f"checkpoint {step_dir} does not fit this model; mismatched config: " + "; ".join(problems))
    tensors, metadata = _read_tensors(step_dir / "model.safetensors")
    for alias, stored in json.loads(metadata.get("aliases", "{}")).items():
        tensors[alias] = tensors[stored]
    target = unwrap(model)
    try:
        target.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise ValueError(f"checkpoint {step_dir}: weights do not fit the model: {e}") from None
    return model


def load_model(path: Path | str, device: torch.device | str = "cpu") -> nn.Module:
    """Rebuild the model a checkpoint describes and load its weights (eval mode, on ``device``)."""
    step_dir = _verified(path)
    model = build_model(_read_json(step_dir / "config.json"))
    load_weights(model, step_dir)
    return model.to(device).eval()


def load_state(path: Path | str) -> dict | None:
    """The training state saved with the checkpoint (None if it has none)."""
    step_dir = _verified(path)
    if not (step_dir / "state.json").is_file():
        return None
    tensors, _ = _read_tensors(step_dir / "state.safetensors")
    return decode_state(_read_json(step_dir / "state.json"), tensors)


def load_tokenizer(path: Path | str):
    """The tokenizer saved with the checkpoint (None if it has none), by the ``kind`` in its JSON."""
    from companion.tokenizers import ByteBPE, CharTokenizer, FastByteBPE

    step_dir = _verified(path)
    file = step_dir / "tokenizer.json"
    if not file.is_file():
        return None
    kind = _read_json(file).get("kind")
    for cls in (CharTokenizer, ByteBPE, FastByteBPE):
        if cls.kind == kind:
            return cls.load(file)
    raise ValueError(f"checkpoint file {file}: unknown tokenizer kind {kind!r}")
