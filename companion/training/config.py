"""``TrainConfig``: everything about a training run that is not the model or the data.

What this module provides
- ``TrainConfig`` (validated at construction: a bad field is a ValueError naming it).
- ``SCHEDULES``, ``OPTIMIZERS``, ``PRECISIONS``, ``PARALLEL``: the values its fields accept.
- ``HYPERPARAMETERS``: the fields a resume compares with the checkpoint's; ``FIXED``: those of them
  that shape the optimizer state itself, never overridable (``companion.training.resume``).
- ``progress_default()``: whether a progress bar is shown when ``TrainConfig.progress`` is None.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

from companion.precision import DTYPES
from companion.precision import PRECISIONS as PRECISION_CHOICES

__all__ = ["TrainConfig", "SCHEDULES", "OPTIMIZERS", "PRECISIONS", "PARALLEL", "HYPERPARAMETERS", "FIXED",
           "progress_default"]

SCHEDULES = ("constant", "cosine", "noam")
OPTIMIZERS = ("adamw", "adam", "adam_l2", "torch_adamw")
PRECISIONS = PRECISION_CHOICES  # companion.precision: "auto" follows the GPU's compute capability
REDUCE_PRECISIONS = tuple(DTYPES)  # the dtypes FSDP may reduce gradients in
PARALLEL = ("ddp", "fsdp")  # how several torchrun processes share a run (one process: no wrapping at all)


@dataclass
class TrainConfig:
    """Everything about a run that is not the model or the data (defaults: a short CPU run)."""

    steps: int = 200  # optimizer steps: the budget
    max_seconds: float | None = None  # wall-clock guard: stop after the step that crosses it
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 3e-4
    optimizer: str = "adamw"  # companion.training.optim: adamw | adam | adam_l2; or torch_adamw (torch's fused kernel)
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    decay_embeddings: bool = True
    schedule: str = "cosine"  # constant | cosine (to lr_floor x lr at `steps`) | noam (lr is a multiplier)
    warmup: int = 0
    lr_floor: float = 0.1
    grad_clip: float | None = 1.0
    label_smoothing: float = 0.0
    eval_every: int = 0  # 0: evaluate only at the end
    eval_batches: int | None = 20  # cap on validation batches per evaluation (None: all)
    log_every: int = 10
    checkpoint_every: int = 0  # 0: only at the end (when out_dir is set)
    keep_checkpoints: int = 2
    out_dir: str | None = None
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (companion.precision)
    compile: bool = False
    parallel: str = "ddp"  # ddp | fsdp: how several torchrun processes share the work (module docstring)
    fsdp_reduce_dtype: str = "fp32"  # fsdp with precision bf16/fp16: the dtype gradients are reduced in
    device: str | None = None  # None: cuda (this process's LOCAL_RANK) if available, else cpu
    seed: int = 0
    progress: bool | None = None  # None: on, except under pytest / $COMPANION_PROGRESS=0

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        self.validate()

    def validate(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        for name in ("steps", "grad_accum", "log_every", "keep_checkpoints"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, f"{name} must be an int >= 1; got {getattr(self, name)!r}")
        for name in ("eval_every", "checkpoint_every", "warmup", "seed"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 0, f"{name} must be an int >= 0; got {getattr(self, name)!r}")
        def real(x) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

        need(self.max_seconds is None or (isinstance(self.max_seconds, (int, float)) and self.max_seconds > 0),
             f"max_seconds must be > 0 or None; got {self.max_seconds}")
        need(real(self.lr) and self.lr > 0, f"lr must be > 0 and finite; got {self.lr}")
        need(real(self.weight_decay) and self.weight_decay >= 0, f"weight_decay must be >= 0 and finite; got {self.weight_decay}")
        need(len(self.betas) == 2 and all(real(b) and 0 <= b < 1 for b in self.betas),
             f"betas must be two numbers in [0, 1); got {self.betas}")
        need(self.optimizer in OPTIMIZERS, f"optimizer must be one of {OPTIMIZERS}; got {self.optimizer!r}")
        need(self.schedule in SCHEDULES, f"schedule must be one of {SCHEDULES}; got {self.schedule!r}")
        need(self.schedule != "noam" or self.warmup >= 1, "warmup must be >= 1 with schedule='noam'")
        need(self.schedule != "cosine" or self.warmup < self.steps, f"warmup must be < steps={self.steps} with schedule='cosine'; got {self.warmup}")
        need(real(self.lr_floor) and 0 <= self.lr_floor <= 1, f"lr_floor must be in [0, 1]; got {self.lr_floor!r}")
        need(self.grad_accum <= MAX_GRAD_ACCUM, f"grad_accum must be at most {MAX_GRAD_ACCUM} (micro-batches per step: more "
             f"is beyond any run of the book, and one step would not end for hours); got {self.grad_accum}")
        need(self.grad_clip is None or (real(self.grad_clip) and self.grad_clip > 0),
             f"grad_clip must be > 0 and finite, or None; got {self.grad_clip}")
        need(real(self.label_smoothing) and 0 <= self.label_smoothing < 1, f"label_smoothing must be in [0, 1); got {self.label_smoothing}")
        need(self.eval_batches is None or (isinstance(self.eval_batches, int) and not isinstance(self.eval_batches, bool)
                                           and self.eval_batches >= 1),
             f"eval_batches must be an int >= 1 or None; got {self.eval_batches!r}")
        need(self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}; got {self.precision!r}")
        need(self.parallel in PARALLEL, f"parallel must be one of {PARALLEL}; got {self.parallel!r}")
        need(self.fsdp_reduce_dtype in REDUCE_PRECISIONS,
             f"fsdp_reduce_dtype must be one of {REDUCE_PRECISIONS}; got {self.fsdp_reduce_dtype!r}")

    def to_dict(self) -> dict:
        return asdict(self)


MAX_GRAD_ACCUM = 4096  # micro-batches per optimizer step (TrainConfig.grad_accum's cap)


# Resume compares these TrainConfig fields with the checkpoint's (steps only under the cosine
# schedule, whose total it is). The rest (budget, cadences, device, progress, out_dir) may change
# freely; seed may too, because a resume restores the RNG and data states, which supersede it.
HYPERPARAMETERS = ("lr", "optimizer", "weight_decay", "betas", "decay_embeddings", "schedule", "warmup", "lr_floor",
                   "grad_clip", "label_smoothing", "grad_accum", "steps")
FIXED = ("optimizer", "decay_embeddings")  # they shape the optimizer state itself: never overridable


def progress_default() -> bool:
    """On, except with ``$COMPANION_PROGRESS=0`` (or false/no/off) and under pytest."""
    if os.environ.get("COMPANION_PROGRESS", "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return "PYTEST_CURRENT_TEST" not in os.environ
