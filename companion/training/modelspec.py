"""What a checkpoint's config.json says about its model, and the bounds it must respect.

- ``model_kind(model) -> str``: ``"decoder"``, ``"gpt"`` or ``"seq2seq"``, the model's family in
  ``companion.models.common.FAMILIES`` (the registry that also maps a kind back to its classes).
- ``config_dict(model) -> dict``: ``{"model": kind, **config fields}``, the ``config.json`` layout.
- ``build_model(config, max_elements=None)``: a model from a config.json dict, sizes bounded first.
- ``config_mismatch(saved, model)``: the fields of a saved config that differ from ``model``'s.
- ``check_sizes(config, source)``: every size field within ``FIELD_LIMITS`` (``train --set`` obeys it too).

Untrusted files. Before a model is built, every size field of config.json is checked against
``FIELD_LIMITS`` (e.g. vocab_size <= 2,097,152, n_layers <= 1024, max_seq_len <= 1,048,576) and the
model's element count (parameters + buffers, counted on the meta device, so nothing is allocated)
against ``MAX_ELEMENTS`` (2^31, about 8 GiB of float32). Both are caps, not facts: raise a field's
limit by editing ``FIELD_LIMITS`` and the element cap with ``max_elements=`` or
``$COMPANION_MAX_ELEMENTS``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, fields

import torch
from torch import nn

from companion.models import unwrap

__all__ = ["model_kind", "config_dict", "build_model", "config_mismatch", "check_sizes", "FIELD_LIMITS", "MAX_ELEMENTS"]


# Caps on config.json sizes, checked before anything is built. Generous for the book's models (the
# largest preset is far below every one); raise an entry to load a bigger model.
_WIDTH, _DEPTH, _LENGTH, _VOCAB = 1 << 16, 1024, 1 << 20, 1 << 21
FIELD_LIMITS: dict[str, int] = {
    **dict.fromkeys(("vocab_size", "src_vocab_size", "tgt_vocab_size", "pad_id"), _VOCAB),
    **dict.fromkeys(("d_model", "n_embd", "d_ff", "moe_d_ff", "head_dim", "kv_rank", "q_rank", "mla_head_dim",
                     "rope_dim", "v_head_dim"), _WIDTH),
    **dict.fromkeys(("n_layers", "n_layer", "n_encoder_layers", "n_decoder_layers", "n_heads", "n_head",
                     "n_kv_heads", "n_experts", "n_shared_experts", "top_k", "first_dense_layers", "global_every"), _DEPTH),
    **dict.fromkeys(("max_seq_len", "block_size", "max_len", "rope_original_max_len", "window", "keep"), _LENGTH),
}
MAX_ELEMENTS = 1 << 31  # parameters + buffers of a loaded model (override: max_elements= or $COMPANION_MAX_ELEMENTS)


def _families() -> dict:
    """family name -> ``companion.models.common.Family`` (model and config classes), from the registry
    each model module fills at import (importing ``companion.models`` imports all three)."""
    import companion.models  # noqa: F401  (registers the families)
    from companion.models.common import FAMILIES

    return FAMILIES


def _plain_type(model: nn.Module) -> type:
    """The model's own class; FSDP2's ``fully_shard`` swaps a module's class for a subclass
    ``FSDP<Name>(FSDPModule, Name)``, which is still the same model."""
    cls = type(model)
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch built without distributed
        return cls
    if issubclass(cls, FSDPModule):
        cls = next(base for base in cls.__bases__ if not issubclass(base, FSDPModule))
    return cls


def model_kind(model: nn.Module) -> str:
    """``"decoder"``, ``"gpt"`` or ``"seq2seq"`` for the book's three model classes."""
    cls = _plain_type(unwrap(model))
    for kind, family in _families().items():
        if cls is family.model:
            return kind
    raise ValueError(f"model must be a Decoder, GPT or Seq2SeqTransformer to be checkpointed; got {type(model).__name__}")


def config_dict(model: nn.Module) -> dict:
    """``{"model": kind, **asdict(model.config)}``: the contents of config.json."""
    kind = model_kind(model)
    return {"model": kind, **asdict(unwrap(model).config)}


def check_sizes(config: dict, source: str = "config.json") -> None:
    """Every size field an int (or None) within ``FIELD_LIMITS``: a tampered config.json is refused
    before any model is built, with the field and its limit named."""
    for key, value in config.items():
        if key not in FIELD_LIMITS or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{source} field {key} must be an integer; got {value!r}")
        limit = FIELD_LIMITS[key]
        if not 0 <= value <= limit:
            raise ValueError(
                f"{source} field {key} = {value} is outside [0, {limit}] (the cap "
                f"companion.training.checkpoint.FIELD_LIMITS[{key!r}]; raise it to load a bigger model)"
            )


def _max_elements(max_elements: int | None) -> int:
    if max_elements is not None:
        return max_elements
    env = os.environ.get("COMPANION_MAX_ELEMENTS", "").strip()
    if not env:
        return MAX_ELEMENTS
    try:
        return int(float(env))
    except ValueError:
        raise ValueError(f"$COMPANION_MAX_ELEMENTS must be a number of elements; got {env!r}") from None


def build_model(config: dict, max_elements: int | None = None) -> nn.Module:
    """A freshly initialised model from a config.json dict.

    The config is bounded first (``FIELD_LIMITS``), then the model is built on the meta device to
    count its elements without allocating them; more than ``max_elements`` (default ``MAX_ELEMENTS``,
    or ``$COMPANION_MAX_ELEMENTS``) raises ValueError before the real model is allocated."""
    if not isinstance(config, dict):
        raise ValueError(f"config.json must hold a JSON object; got {type(config).__name__}")
    config = dict(config)
    kind = config.pop("model", None)
    families = _families()
    if kind not in families:
        raise ValueError(f"config 'model' must be one of {list(families)}; got {kind!r}")
    cls, config_cls = families[kind].model, families[kind].config
    known = {f.name for f in fields(config_cls)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"config.json has fields that {config_cls.__name__} does not know: {unknown}")
    check_sizes(config)
    cap = _max_elements(max_elements)
    try:
        model_config = config_cls(**config)
        with torch.device("meta"):
            shape_only = cls(model_config)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"config.json does not describe a valid {config_cls.__name__}: {e}") from None
    n = sum(t.numel() for t in shape_only.parameters()) + sum(t.numel() for t in shape_only.buffers())
    del shape_only
    if n > cap:
        raise ValueError(
            f"config.json describes a model of {n:,} elements (parameters + buffers), more than the cap of {cap:,} "
            "(companion.training.checkpoint.MAX_ELEMENTS; raise it with max_elements= or $COMPANION_MAX_ELEMENTS)"
        )
    return cls(model_config)


def config_mismatch(saved: dict, model: nn.Module) -> list[str]:
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
