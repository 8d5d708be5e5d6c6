"""One switch for every chapter: the run profile.

What this module provides
- ``profile()``: reads the environment variable ``COMPANION_PROFILE`` ("quick" by default, or
  "gpu") and returns a ``Profile`` that names the device, the seed and the size of things.
- ``Profile.pick(quick=..., gpu=...)``: a chapter states both sizes side by side and the profile
  chooses; nothing else in a notebook branches on the profile.
- ``pick_device()``: cuda, then mps, then cpu.
- ``seed_everything(seed)``: Python, NumPy and torch seeds in one call.

The "quick" profile is what CI runs and what the committed notebook outputs come from: it uses
the CPU even when a GPU exists, so its numbers are the same on every machine. The "gpu" profile
uses the best available device and the bigger settings; asking for it without CUDA still works
(on mps or cpu) but warns, because it will be slow.
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

__all__ = ["Profile", "profile", "pick_device", "seed_everything", "PROFILES", "ENV_VAR"]

ENV_VAR = "COMPANION_PROFILE"
PROFILES = ("quick", "gpu")
T_ = TypeVar("T_")


def pick_device() -> torch.device:
    """The fastest device present: cuda, then Apple's mps, then cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (all devices)."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int; got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class Profile:
    """The run settings a chapter reads. Build it with ``profile()``."""

    name: str
    device: torch.device
    seed: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"

    def pick(self, quick: T_, gpu: T_) -> T_:
        """Return ``quick`` in the quick profile and ``gpu`` in the gpu profile."""
        return gpu if self.is_gpu else quick

    def seed_everything(self) -> None:
        seed_everything(self.seed)

    def __str__(self) -> str:
        return f"profile={self.name} device={self.device.type} seed={self.seed}"


def profile(name: str | None = None, *, seed: int = 0) -> Profile:
    """The active profile: ``name`` if given, else $COMPANION_PROFILE, else "quick".

    Also seeds every generator with ``seed`` and keeps torch to deterministic CPU threads, so a
    notebook that starts with ``P = companion.profile()`` prints the same numbers on every run.
    """
    name = (name if name is not None else os.environ.get(ENV_VAR, "quick")).strip().lower()
    if name not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES} (from ${ENV_VAR} or the argument); got {name!r}")
    if name == "quick":
        device = torch.device("cpu")
    else:
        device = pick_device()
        if device.type != "cuda":
            warnings.warn(
                f"the gpu profile was asked for but CUDA is absent; running its larger settings on {device.type}",
                stacklevel=2,
            )
    prof = Profile(name=name, device=device, seed=seed)
    prof.seed_everything()
    return prof
