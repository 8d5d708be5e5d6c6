"""What the book's three model families share: their initialisation and one way to build any preset.

What this module provides
- ``init_normal``: GPT-2's initialisation, N(0, 0.02) weights and zero biases (GPT and Decoder).
- ``from_preset(name, **overrides)``: the model a preset name stands for, any config field
  overridden: a ``Decoder`` ("llama-like", ..., see ``companion.models.decoder.PRESETS``), a ``GPT``
  ("gpt1", "gpt2", "gpt2-tiny") or a ``Seq2SeqTransformer`` ("base", "tiny").
- ``preset_config(name, **overrides)``: the config alone, not built.
- ``preset_family(name)``: "decoder", "gpt" or "seq2seq".
- ``FAMILIES``: family -> ``Family(presets, config, model)``; ``register_family`` fills it (each model
  module registers its own family, so this module imports none of them).
- ``check_inputs``: the value rules of every model's forward (token ids below the vocabulary size,
  positions inside the context), without a device sync on a GPU.

Preset names are unique across families (registering a clashing name is an error), which is what lets
one function dispatch on the name alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from companion.positions import compiling, value_range

__all__ = ["init_normal", "check_inputs", "Family", "FAMILIES", "register_family", "preset_family", "preset_config",
           "from_preset"]


def init_normal(m: nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialisation, used by every decoder in the book: N(0, 0.02) weights, zero biases."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, mean=0.0, std=std)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)


def check_inputs(idx: Tensor, positions: Tensor | None, start: int, vocab_size: int, context: int,
                 context_name: str, ids_name: str = "token ids", vocab_name: str = "vocab_size") -> None:
    """A forward's value rules: token ids ``idx`` (B, T) in [0, vocab_size), positions in [0, context).

    ``positions`` None stands for the forward's own ``start + arange(T)``, whose range is known on the
    host without reading a tensor. Values in CPU memory are read there (free), and a broken rule is a
    ValueError naming the argument and the rule. Values on a GPU are not read: that would stall the
    device on every call (a decode step, every step); the rule is asserted on the device instead
    (``torch._assert_async``, no sync: a broken rule fails the next synchronising call, with the same
    message). Nothing is checked on the meta device or while torch.compile traces (the caller of a
    compiled step checks its inputs). ``ids_name`` and ``vocab_name`` name the argument and its limit
    in the messages (an encoder-decoder model has two vocabularies)."""
    if compiling() or not idx.numel():
        return
    T = idx.shape[1]
    ids_rule = f"{ids_name} must be in [0, {vocab_name}={vocab_size})"
    context_rule = f"sequence longer than the configured context: positions must be < {context_name}={context}"
    if idx.device.type == "cpu":
        lo, hi = value_range(idx)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{ids_rule}; got range [{lo}, {hi}]")
    elif idx.device.type != "meta":
        torch._assert_async(((idx >= 0) & (idx < vocab_size)).all(), ids_rule)
    if positions is None:
        p_lo, p_hi = start, start + T - 1
    elif positions.device.type == "cpu":
        p_lo, p_hi = value_range(positions)
    else:
        if positions.device.type != "meta":
            torch._assert_async(((positions >= 0) & (positions < context)).all(),
                                f"positions must be >= 0, and {context_rule}")
        return
    if p_lo < 0:
        raise ValueError(f"positions must be >= 0; got {p_lo}")
    if p_hi >= context:
        raise ValueError(f"sequence longer than the configured context: position {p_hi} >= {context_name}={context}")


@dataclass(frozen=True)
class Family:
    """A model family: its presets (name -> config fields), its config dataclass and its model class."""

    presets: dict[str, dict]
    config: type
    model: type


FAMILIES: dict[str, Family] = {}


def register_family(family: str, presets: dict[str, dict], config: type, model: type) -> None:
    """Make ``presets`` buildable by ``from_preset``; their names must not clash with another family's."""
    for other, known in FAMILIES.items():
        clash = sorted(set(presets) & set(known.presets)) if other != family else []
        if clash:
            raise ValueError(f"preset names must be unique across families; {clash} are taken by {other!r}")
    FAMILIES[family] = Family(presets, config, model)


def _all_names() -> list[str]:
    return [name for fam in FAMILIES.values() for name in fam.presets]


def preset_family(name: str) -> str:
    """The family ("decoder", "gpt", "seq2seq") whose presets include ``name``."""
    for family, fam in FAMILIES.items():
        if name in fam.presets:
            return family
    raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(_all_names())}")


def preset_config(name: str, **overrides):
    """The config of preset ``name`` with ``overrides`` applied (each must be a field of that config)."""
    fam = FAMILIES[preset_family(name)]
    unknown = set(overrides) - {f.name for f in fields(fam.config)}
    if unknown:
        raise ValueError(f"unknown {fam.config.__name__} field(s) {sorted(unknown)}")
    return fam.config(**{**fam.presets[name], "name": name, **overrides})


def from_preset(name: str, **overrides) -> nn.Module:
    """Build the model of preset ``name`` (any family), with any config field overridden."""
    return FAMILIES[preset_family(name)].model(preset_config(name, **overrides))


def from_family_preset(family: str, name: str, **overrides) -> nn.Module:
    """``from_preset`` restricted to one family (for the family-named helpers the chapters import)."""
    if name not in FAMILIES[family].presets:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(FAMILIES[family].presets)}")
    return from_preset(name, **overrides)
