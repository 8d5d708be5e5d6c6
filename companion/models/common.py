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

Preset names are unique across families (registering a clashing name is an error), which is what lets
one function dispatch on the name alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from torch import nn

__all__ = ["init_normal", "Family", "FAMILIES", "register_family", "preset_family", "preset_config", "from_preset"]


def init_normal(m: nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialisation, used by every decoder in the book: N(0, 0.02) weights, zero biases."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, mean=0.0, std=std)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)


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
