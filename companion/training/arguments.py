"""Checks of the ``train`` command's arguments, each a ValueError naming the argument and its rule:
``check_threads`` (--threads), ``parse_overrides`` and ``check_overrides`` (--set: a known field, a value of
its type, a size within the caps a loaded checkpoint obeys), ``read_corpus`` (--data FILE.txt) and
``rough_weight_bytes`` (the memory of a model too large to describe)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import fields
from pathlib import Path

__all__ = ["check_threads", "parse_overrides", "check_overrides", "read_corpus", "rough_weight_bytes"]


def rough_weight_bytes(config) -> int:
    """float32 bytes of a config's weights, from its sizes alone (12 d^2 per block, the embeddings):
    for a model too large even to describe on the meta device."""
    d = getattr(config, "d_model", None) or getattr(config, "n_embd", 0)
    layers = (getattr(config, "n_layers", None) or getattr(config, "n_layer", None)
              or getattr(config, "n_encoder_layers", 0) + getattr(config, "n_decoder_layers", 0))
    vocab = getattr(config, "vocab_size", None) or getattr(config, "src_vocab_size", 0) + getattr(config, "tgt_vocab_size", 0)
    return 4 * (12 * int(layers) * int(d) ** 2 + int(vocab) * int(d))


def check_threads(threads: int) -> int:
    """``--threads``: at least 1 and at most 4 per CPU core; torch crashes (a segfault) when asked for
    100,000 threads, and more threads than cores only slow a run down."""
    most = 4 * (os.cpu_count() or 1)
    if threads < 1:
        raise ValueError(f"--threads must be >= 1; got {threads}")
    if threads > most:
        raise ValueError(f"--threads must be at most {most} (4 per CPU core of this machine); got {threads}")
    return threads


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set takes FIELD=VALUE; got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def check_overrides(overrides: dict, config_cls: type) -> None:
    """Each --set names a field of ``config_cls`` and gives a value of the field's type (the field
    annotations, e.g. "int | None"): --set d_model=abc is a one-line error, not a traceback later."""
    known = {f.name: str(f.type) for f in fields(config_cls)}
    takes = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "None": lambda v: v is None,
    }
    for key, value in overrides.items():
        if key not in known:
            raise ValueError(f"--set {key}=...: {config_cls.__name__} has no field {key!r} (fields: {', '.join(known)})")
        kinds = [t.strip() for t in known[key].split("|")]
        if all(k in takes for k in kinds) and not any(takes[k](value) for k in kinds):
            raise ValueError(f"--set {key}={json.dumps(value)}: {key} takes {known[key]}; got {value!r}")
    from companion.training.modelspec import check_sizes

    check_sizes(overrides, source="--set")  # the caps a loaded config.json obeys: 10**5 layers never finish


def read_corpus(path: Path) -> str:
    """A .txt corpus as text; a binary or non-UTF-8 file is a ValueError naming it."""
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise ValueError(f"--data {path}: the file is binary (it contains NUL bytes), not UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--data {path} is not UTF-8 text: byte {e.start} (0x{raw[e.start]:02x}) cannot be decoded; "
                         "convert it first (e.g. iconv -t UTF-8)") from None
