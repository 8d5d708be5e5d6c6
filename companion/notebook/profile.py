"""One switch for every chapter: the run profile.

What this module provides
- ``profile()``: reads the environment variable ``COMPANION_PROFILE`` ("quick" by default, or
  "gpu") and returns a ``Profile`` that names the device, the seed and the size of things.
- ``Profile.pick(quick=..., gpu=...)``: a chapter states both sizes side by side and the profile
  chooses; nothing else in a notebook branches on the profile.
- ``pick_device()``: cuda, then mps, then cpu.
- ``seed_everything(seed)``: Python, NumPy and torch seeds in one call.
- ``Profile.steps(quick=..., gpu=...)``: a training budget in steps (never in seconds).

Threads. The quick profile runs torch on one CPU thread (``$COMPANION_THREADS`` overrides). Two
reasons, both measured (CONTRIBUTING.md): a chapter then degrades gracefully when the machine is
shared (two processes with two threads each on two cores run many times slower than with one), and
the printed numbers do not depend on the machine's core count (a float reduction split over a
different number of threads rounds differently, and training amplifies the last bits).

Dry run. ``COMPANION_PROFILE=gpu COMPANION_DRY_RUN=1`` executes the gpu profile's code paths (bf16
autocast, torch.compile, attention-backend choice, the longer schedule's code) on the CPU with the
quick sizes (or the ``dry=`` size a chapter gives) and at most ``DRY_RUN_STEPS`` steps per training
run, so CI can run every chapter's gpu branch in seconds. Its outputs mean nothing; only errors do.
With ``COMPANION_DEVICE_CHECK=1`` as well, the dry run also finds device-placement defects (a tensor
left on the CPU beside a model on ``P.device``): ``P.device`` is then ``cpu:0``, a device of its own,
and ``companion.notebook.device_check`` fails any operation that would mix devices on a GPU.

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

__all__ = ["Profile", "profile", "pick_device", "seed_everything", "PROFILES", "ENV_VAR", "DRY_RUN_VAR",
           "THREADS_VAR", "DEVICE_CHECK_VAR", "DRY_RUN_STEPS"]

ENV_VAR = "COMPANION_PROFILE"
DRY_RUN_VAR = "COMPANION_DRY_RUN"
THREADS_VAR = "COMPANION_THREADS"
DEVICE_CHECK_VAR = "COMPANION_DEVICE_CHECK"
DRY_RUN_STEPS = 3
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
    dry_run: bool = False

    @property
    def is_gpu(self) -> bool:
        """True in the gpu profile, dry run included: the branches that only the gpu profile takes."""
        return self.name == "gpu"

    def pick(self, quick: T_, gpu: T_, dry: T_ | None = None) -> T_:
        """``quick`` in the quick profile, ``gpu`` in the gpu profile; in a dry run ``dry`` if given,
        else ``quick`` (the gpu code path at the quick size)."""
        if not self.is_gpu:
            return quick
        if self.dry_run:
            return quick if dry is None else dry
        return gpu

    def steps(self, quick: int, gpu: int) -> int:
        """A training budget in optimizer steps: ``pick(quick, gpu)``, at most ``DRY_RUN_STEPS`` in a dry run."""
        for name, value in (("quick", quick), ("gpu", gpu)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int number of steps; got {value!r}")
        return min(quick, DRY_RUN_STEPS) if self.dry_run else self.pick(quick, gpu)

    def seed_everything(self) -> None:
        seed_everything(self.seed)

    def __str__(self) -> str:
        dry = " (dry run)" if self.dry_run else ""
        return f"profile={self.name}{dry} device={self.device.type} seed={self.seed}"


def _flag(var: str) -> bool:
    value = os.environ.get(var, "0").strip().lower()
    if value not in ("0", "1", "", "false", "true"):
        raise ValueError(f"${var} must be 0 or 1; got {value!r}")
    return value in ("1", "true")


def _threads(name: str, dry_run: bool) -> int | None:
    """Threads to set: $COMPANION_THREADS if given, 1 in the quick profile and in a dry run (both run
    in CI beside other work), None (torch's default) in the real gpu profile."""
    raw = os.environ.get(THREADS_VAR, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"${THREADS_VAR} must be a positive integer; got {raw!r}")
        most = 4 * (os.cpu_count() or 1)  # the command line's --threads rule: 100000 threads segfault torch
        if int(raw) > most:
            raise ValueError(f"${THREADS_VAR} must be at most {most} (4 per CPU core of this machine); got {raw}")
        return int(raw)
    return 1 if name == "quick" or dry_run else None


def profile(name: str | None = None, *, seed: int = 0) -> Profile:
    """The active profile: ``name`` if given, else $COMPANION_PROFILE, else "quick".

    Also seeds every generator with ``seed`` and sets torch's CPU threads (one in the quick profile,
    see the module docstring), so a notebook that starts with ``P = companion.profile()`` prints the
    same numbers on every run and every machine.
    """
    name = (name if name is not None else os.environ.get(ENV_VAR, "quick")).strip().lower()
    if name not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES} (from ${ENV_VAR} or the argument); got {name!r}")
    dry_run = _flag(DRY_RUN_VAR)
    if dry_run and name != "gpu":
        raise ValueError(f"${DRY_RUN_VAR}=1 needs ${ENV_VAR}=gpu (it dry-runs the gpu profile); got {name!r}")
    device_check = _flag(DEVICE_CHECK_VAR)
    if device_check and not dry_run:
        raise ValueError(f"${DEVICE_CHECK_VAR}=1 needs ${DRY_RUN_VAR}=1 (it checks the dry run's device placement)")
    threads = _threads(name, dry_run)
    if threads is not None:
        torch.set_num_threads(threads)
    if device_check:
        from companion.notebook import device_check as check

        check.activate()
        device = check.DEVICE
    elif name == "quick" or dry_run:
        device = torch.device("cpu")
    else:
        device = pick_device()
        if device.type != "cuda":
            warnings.warn(
                f"the gpu profile was asked for but CUDA is absent; running its larger settings on {device.type}",
                stacklevel=2,
            )
    prof = Profile(name=name, device=device, seed=seed, dry_run=dry_run)
    prof.seed_everything()
    return prof
