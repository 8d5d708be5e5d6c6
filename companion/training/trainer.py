"""One training loop for every model in the book: decoder LMs, GPT and the 2017 encoder-decoder.

What this module provides
- ``TrainConfig``: the budget (``steps``, optional ``max_seconds`` wall-clock guard), optimizer and
  schedule, gradient accumulation and clipping, evaluation and checkpoint cadence, precision, compile.
- It reads any data source with the batch/step protocol below (``companion.data.loaders``: ``LMData``,
  ``SequenceData``, ``PairData``) and any loss function ``loss_fn(model, batch) -> (summed loss (),
  counted tokens ())`` (``companion.training.losses``: ``lm_loss``, ``seq2seq_loss``, ``default_loss``).
- ``Trainer(model, data, config, loss_fn=None, tokenizer=None)``: ``fit()``, ``train_step()``,
  ``forward_backward(batches)``, ``evaluate()``, ``save_checkpoint()``, ``resume(path)``.
- ``History``: the metrics of a run (one dict per logged step); ``history.plot()`` draws the curves.
- Throughput: tokens/s, and model FLOPs utilisation (MFU) on CUDA from
  ``companion.accounting.training_flops_per_token`` and ``companion.accounting.peak_flops``.
- Several processes: ``setup_distributed()`` (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; gloo on CPU,
  nccl on GPU), then ``TrainConfig.parallel``: ``"ddp"`` (every process holds the whole model and
  optimizer, gradients are averaged) or ``"fsdp"`` (torch's FSDP2, ``fully_shard``: every process holds
  1/world of each parameter, gradient and optimizer state; see "FSDP" below).
- ``check_device(name) -> torch.device``: a device name that exists here, or a one-line ValueError.
- ``NonFiniteLoss``: raised by ``fit`` when the loss (or a weight about to be saved) is NaN or inf.
- ``HYPERPARAMETERS``: the ``TrainConfig`` fields a resume compares with the checkpoint's.

Failure behaviour. Checks come before work: ``fit`` proves ``out_dir`` writable before the first
step, and the device is checked when the Trainer is built. A loss that becomes NaN or inf stops the
run with ``NonFiniteLoss`` naming the step (checked at every log step, every evaluation and before
every checkpoint, so no device sync is added per step); no checkpoint of diverged weights is ever
written, so the last good one stays ``latest``. ``resume`` refuses a checkpoint trained with another
tokenizer (compared by content) and, unless ``override=True``, any changed hyper-parameter; with
``override=True`` the new values are applied (learning rate, schedule and its total steps, weight
decay, betas) and listed in ``trainer.resume_changes``.

The batch/step protocol. A data source has ``next_batch()`` (one micro-batch for training),
``eval_batches(max_batches)`` (a deterministic validation pass, possibly empty), ``shard(rank, world)``
(each DDP process draws different batches) and ``state_dict()`` / ``load_state_dict()`` (so a resumed
run draws the batches the uninterrupted run would have drawn). A loss function returns the *sum* of the
per-token losses and the number of tokens that count; one optimizer step divides the summed loss of all
``grad_accum`` micro-batches on all processes by their total token count, so accumulation and DDP give
exactly the gradient of one big batch even when the batches hold different numbers of real tokens
(padded pairs). Any object with this shape works, and so does any ``loss_fn`` with this signature.

FSDP. With ``parallel="fsdp"`` under torchrun, each item of the model's ``nn.ModuleList``s (its
transformer blocks) is sharded with ``torch.distributed.fsdp.fully_shard``, then the model itself (the
embeddings, final norm and output layer), so a block's full weights exist only while that block runs.
The gradient it computes is the same as DDP's (FSDP2 averages the reduce-scattered gradients over the
processes, as DDP averages its all-reduced ones), so the loss scaling above holds unchanged. Checkpoints
hold full weights, gathered to process 0 (``torch.distributed.checkpoint.state_dict`` with
``full_state_dict=True, cpu_offload=True``): the same files a single process writes, which load into a
single process with ``companion.training.checkpoint.load_model``. The optimizer state is saved in that
API's form too (keyed by parameter name); resuming it needs the same world size and ``parallel``.
Evaluation runs every validation batch on every process (a sharded forward is a collective, so all
processes must run the same number of them). With one process ``parallel`` changes nothing.

Precision: ``"auto"`` is bf16 autocast on CUDA and float32 on the CPU (``"bf16"`` forces autocast on the
CPU too). On CUDA the models' ``backend="auto"`` attention already calls torch's SDPA kernels; the
trainer also allows TF32 matmuls. ``compile=True`` wraps the model in ``torch.compile``.
Progress: a ``tqdm.auto`` bar with loss, tokens/s and learning rate; off when ``progress=False``, when
``$COMPANION_PROGRESS=0``, or under pytest (which covers nbval runs of the notebooks), and on every DDP
rank but 0.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from companion.accounting import peak_flops, training_flops_per_token
from companion.data.batching import IGNORE_INDEX, PairBatch
from companion.models import unwrap
from companion.training import checkpoint as ckpt
from companion.training.losses import default_loss
from companion.training.optim import ConstantWithWarmup, Noam, WarmupCosine, build_optimizer, clip_grad_norm, param_groups

__all__ = [
    "TrainConfig", "Trainer", "History", "setup_distributed", "check_device", "NonFiniteLoss",
    "SCHEDULES", "OPTIMIZERS", "PRECISIONS", "PARALLEL", "HYPERPARAMETERS", "transformer_blocks",
]

SCHEDULES = ("constant", "cosine", "noam")
OPTIMIZERS = ("adamw", "adam", "adam_l2", "torch_adamw")
PRECISIONS = ("auto", "fp32", "bf16")
PARALLEL = ("ddp", "fsdp")  # how several torchrun processes share a run (one process: no wrapping at all)

# --- configuration ---------------------------------------------------------------------------------


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
    precision: str = "auto"  # auto | fp32 | bf16
    compile: bool = False
    parallel: str = "ddp"  # ddp | fsdp: how several torchrun processes share the work (module docstring)
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
        need(0 <= self.lr_floor <= 1, f"lr_floor must be in [0, 1]; got {self.lr_floor}")
        need(self.grad_clip is None or (real(self.grad_clip) and self.grad_clip > 0),
             f"grad_clip must be > 0 and finite, or None; got {self.grad_clip}")
        need(real(self.label_smoothing) and 0 <= self.label_smoothing < 1, f"label_smoothing must be in [0, 1); got {self.label_smoothing}")
        need(self.eval_batches is None or self.eval_batches >= 1, f"eval_batches must be >= 1 or None; got {self.eval_batches}")
        need(self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}; got {self.precision!r}")
        need(self.parallel in PARALLEL, f"parallel must be one of {PARALLEL}; got {self.parallel!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def _to(batch, device: torch.device):
    if isinstance(batch, PairBatch):
        return batch.to(device)
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(b, device) for b in batch)
    return batch


def batch_tokens(batch) -> tuple[int, int]:
    """(tokens read, positions predicted) of one batch, from shapes only (no device sync):
    LM: (B T, B T); PairBatch: (B S + B T, B T)."""
    if isinstance(batch, PairBatch):
        return batch.src.numel() + batch.tgt_in.numel(), batch.tgt_in.numel()
    return batch[0].numel(), batch[0].numel()


def _context(batch) -> int:
    return batch.tgt_in.shape[1] if isinstance(batch, PairBatch) else batch[0].shape[1]


# --- metrics history -------------------------------------------------------------------------------


@dataclass
class History:
    """The metrics of a run: ``records`` is a list of dicts, one per logged step (and per evaluation).

    Keys: ``step``, ``loss`` (training, mean per token over the step), ``lr``, ``tokens_per_s``,
    ``mfu`` (CUDA only), ``elapsed_s``; evaluation records have ``val_loss``. ``stop_reason`` is
    ``"steps"`` or ``"max_seconds"`` after ``fit``.
    """

    records: list[dict] = field(default_factory=list)
    stop_reason: str | None = None

    def log(self, **values) -> None:
        self.records.append(values)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of every record that has ``key``."""
        rows = [r for r in self.records if r.get(key) is not None]
        return [r["step"] for r in rows], [r[key] for r in rows]

    def last(self, key: str):
        """The most recent value of ``key`` (None if never logged)."""
        values = self.series(key)[1]
        return values[-1] if values else None

    def plot(self, ax=None, title: str | None = None):
        """Training loss (line) and validation loss (dots) against the step; returns the matplotlib Axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots()
        steps, loss = self.series("loss")
        if steps:
            ax.plot(steps, loss, label="train", lw=1.2)
        steps, val = self.series("val_loss")
        if steps:
            ax.plot(steps, val, "o-", label="validation", ms=4)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats / token)")
        ax.legend()
        if title:
            ax.set_title(title)
        return ax

    def to_dict(self) -> dict:
        return {"records": self.records, "stop_reason": self.stop_reason}

    @classmethod
    def from_dict(cls, data: dict) -> History:
        return cls(records=[dict(r) for r in data["records"]], stop_reason=data.get("stop_reason"))

    def __repr__(self) -> str:
        return (f"History({len(self.records)} records, last loss={self.last('loss')}, "
                f"last val_loss={self.last('val_loss')}, stop_reason={self.stop_reason})")


# --- distributed -----------------------------------------------------------------------------------


def setup_distributed() -> tuple[int, int, int]:
    """(rank, world_size, local_rank). Joins the process group torchrun describes (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR/PORT) if it is not joined yet: nccl when CUDA is present, else gloo.
    Without torchrun and without an initialised group: (0, 1, 0)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size(), local_rank


def check_device(name: str | torch.device) -> torch.device:
    """``torch.device(name)`` when that device exists here; otherwise a one-line ValueError (an
    unknown name, CUDA or MPS asked for where it is absent, a CUDA index beyond the devices present)."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps; got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(name)!r} asked for, but CUDA is not available here (torch.cuda.is_available() "
                             "is False); use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(name)!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) are present")
    elif device.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"device {str(name)!r} asked for, but MPS is not available here; use cpu")
    elif device.type != "cpu":
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps; got {str(name)!r}")
    return device


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The items of every ``nn.ModuleList`` in ``model`` that hold parameters, outermost lists first and
    without looking inside an item: the transformer blocks of the book's models (GPT's and Decoder's
    layers, the encoder's and decoder's layers of the 2017 model), which FSDP shards one by one."""
    out: list[nn.Module] = []

    def walk(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, nn.ModuleList):
                out.extend(item for item in child if next(item.parameters(), None) is not None)
            else:
                walk(child)

    walk(model)
    return out


def _shard(model: nn.Module, device: torch.device, world: int) -> None:
    """FSDP2: ``fully_shard`` each transformer block, then the root (in place: the parameters become
    DTensors holding 1/world of each tensor on this process)."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # pragma: no cover - torch < 2.6 or built without distributed
        raise ValueError(f"parallel='fsdp' needs torch.distributed.fsdp.fully_shard (FSDP2, torch >= 2.6); torch "
                         f"{torch.__version__} lacks it: use parallel='ddp'") from None
    mesh = init_device_mesh(device.type, (world,))
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _full_options():
    """Gather full tensors, on the CPU, to process 0 only (the others receive empty dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


class NonFiniteLoss(FloatingPointError):
    """The training loss, or a weight about to be checkpointed, is NaN or infinite."""


# Resume compares these TrainConfig fields with the checkpoint's (steps only under the cosine
# schedule, whose total it is). The rest (budget, cadences, device, progress, out_dir) may change
# freely; seed may too, because a resume restores the RNG and data states, which supersede it.
HYPERPARAMETERS = ("lr", "optimizer", "weight_decay", "betas", "decay_embeddings", "schedule", "warmup", "lr_floor",
                   "grad_clip", "label_smoothing", "grad_accum", "steps")
_FIXED = ("optimizer", "decay_embeddings")  # they shape the optimizer state itself: never overridable


def _progress_default() -> bool:
    if os.environ.get("COMPANION_PROGRESS", "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return "PYTEST_CURRENT_TEST" not in os.environ


# --- the trainer -----------------------------------------------------------------------------------


class Trainer:
    """Train ``model`` on ``data`` as ``config`` says (see the module docstring for the protocol).

    Args:
        model: a Decoder, GPT, Seq2SeqTransformer, or any module ``loss_fn`` knows how to call.
        data: a data source (``LMData``, ``SequenceData``, ``PairData`` or the same protocol); may be
            None for ``forward_backward`` on explicit batches.
        loss_fn: ``loss_fn(model, batch) -> (summed loss, counted tokens)``; default ``default_loss``
            with ``config.label_smoothing``.
        tokenizer: saved into checkpoints (anything with ``save(path)`` and a ``kind``).
    """

    def __init__(self, model: nn.Module, data=None, config: TrainConfig | None = None, *,
                 loss_fn: Callable | None = None, tokenizer=None):
        self.config = config = config if config is not None else TrainConfig()
        config.validate()
        self.rank, self.world, local_rank = setup_distributed()
        if config.device is not None:
            self.device = check_device(config.device)
        elif torch.cuda.is_available():
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device("cpu")
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.autocast_dtype = (
            torch.bfloat16 if config.precision == "bf16" or (config.precision == "auto" and self.device.type == "cuda") else None
        )
        self.model = model.to(self.device)
        self.data = data
        if data is not None:
            data.shard(self.rank, self.world)
        if loss_fn is None:
            smoothing = config.label_smoothing
            loss_fn = lambda m, b: default_loss(m, b, smoothing)  # noqa: E731
        self.loss_fn = loss_fn
        self.tokenizer = tokenizer
        self._fsdp = self.world > 1 and config.parallel == "fsdp"
        if self._fsdp:
            _shard(self.model, self.device, self.world)  # before the optimizer: it must hold the sharded parameters
        self.optimizer = self._build_optimizer()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._schedule())
        self.step = 0
        self.history = History()
        self.tokens_seen = 0
        self._train_model: nn.Module = self.model
        self._ddp = None
        if self.world > 1 and not self._fsdp:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self._train_model = self._ddp = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if config.compile:
            self._train_model = torch.compile(self._train_model)
        self._flops_per_token: dict[int, int | None] = {}
        self._last_context: int | None = None  # the sequence length of the last step's batches (for MFU)
        self._peak = peak_flops(self.device)
        self.resume_changes: list[str] = []  # hyper-parameters a resume with override=True replaced
        self._unchecked: list[tuple[int, Tensor]] = []  # (step, mean loss) not yet checked for NaN/inf

    # set-up ----------------------------------------------------------------------------------------
    def _build_optimizer(self) -> torch.optim.Optimizer:
        c = self.config
        if c.optimizer == "torch_adamw":
            groups = param_groups(self.model, c.weight_decay, decay_embeddings=c.decay_embeddings)
            fused = self.device.type == "cuda"
            return torch.optim.AdamW(groups, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, fused=fused)
        return build_optimizer(self.model, c.optimizer, lr=c.lr, weight_decay=c.weight_decay, betas=c.betas,
                               decay_embeddings=c.decay_embeddings)

    def _schedule(self) -> Callable[[int], float]:
        c = self.config
        if c.schedule == "cosine":
            return WarmupCosine(c.warmup, c.steps, c.lr_floor)
        if c.schedule == "noam":
            return Noam(unwrap(self.model).config.d_model, c.warmup)
        return ConstantWithWarmup(c.warmup)

    def _autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    # one step --------------------------------------------------------------------------------------
    def forward_backward(self, batches: Sequence) -> tuple[Tensor, Tensor]:
        """Accumulate the gradient of the mean loss over every counted token of ``batches`` (all processes).

        Leaves the gradients in ``.grad`` (set, not added: they are zeroed first). Returns the local
        (summed loss, token count), detached. Under DDP the token count is all-reduced first and each
        process scales its summed loss by world / total, so DDP's gradient averaging yields exactly the
        gradient of the whole global batch's mean loss.
        """
        if len(batches) == 0:
            raise ValueError("batches must hold at least one micro-batch")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        batches = [_to(b, self.device) for b in batches]
        counts = []
        losses = []
        # The counts are needed before the first backward (they normalise it); they come from the batch
        # labels, so compute them up front without a forward pass.
        for b in batches:
            labels = b.labels if isinstance(b, PairBatch) else b[1]
            counts.append((labels != IGNORE_INDEX).sum())
        total = torch.stack(counts).sum().to(torch.float32)
        if self.world > 1:
            import torch.distributed as dist

            total = total.clone()
            dist.all_reduce(total)
        scale = self.world / total.clamp(min=1)
        for i, b in enumerate(batches):
            sync = i == len(batches) - 1
            context = self._ddp.no_sync() if (self._ddp is not None and not sync) else contextlib.nullcontext()
            if self._fsdp:  # reduce-scatter once, after the last micro-batch (FSDP2's no_sync)
                self.model.set_requires_gradient_sync(sync)
            with context:
                with self._autocast():
                    loss_sum, _ = self.loss_fn(self._train_model, b)
                (loss_sum * scale).backward()
            losses.append(loss_sum.detach())
        return torch.stack(losses).sum(), torch.stack(counts).sum()

    def train_step(self) -> float:
        """One optimizer step on ``grad_accum`` micro-batches from ``data``; returns its mean loss per token."""
        return self._loss_value(*self._step())

    def _loss_value(self, loss_sum: Tensor, count: Tensor) -> float:
        both = torch.stack([loss_sum.float(), count.float()])
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(both)
        return float(both[0] / both[1].clamp(min=1))

    def _step(self) -> tuple[Tensor, Tensor]:
        """One optimizer step; returns the local (summed loss, count) as tensors (no device sync)."""
        if self.data is None:
            raise ValueError("data must be given to the Trainer to take training steps")
        batches = [self.data.next_batch() for _ in range(self.config.grad_accum)]
        self._last_context = _context(batches[0])
        self._last_tokens = sum(batch_tokens(b)[0] for b in batches) * self.world
        loss_sum, count = self.forward_backward(batches)
        if self.config.grad_clip is not None:
            clip_grad_norm([p for p in self.model.parameters() if p.grad is not None], self.config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        update_bias = getattr(unwrap(self.model), "update_expert_bias", None)
        if callable(update_bias):
            update_bias()
        self.step += 1
        self.tokens_seen += self._last_tokens
        return loss_sum, count

    @torch.no_grad()
    def evaluate(self, max_batches: int | None = None) -> float | None:
        """Mean validation loss per counted token (None when the data has no validation part)."""
        if self.data is None:
            raise ValueError("data must be given to the Trainer to evaluate")
        max_batches = self.config.eval_batches if max_batches is None else max_batches
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        split = self.world > 1 and not self._fsdp  # FSDP: every process runs every batch (forwards are collectives)
        for i, batch in enumerate(self.data.eval_batches(max_batches)):
            if split and i % self.world != self.rank:
                continue
            with self._autocast():
                loss_sum, count = self.loss_fn(self.model, _to(batch, self.device))
            total += torch.stack([loss_sum.double(), count.double()])
        if self._fsdp:  # without a backward the root keeps its gathered weights; drop them (back to shards)
            self.model.reshard()
        if split:
            import torch.distributed as dist

            dist.all_reduce(total)
        self.model.train()
        if total[1] == 0:
            return None
        return float(total[0] / total[1])

    # the loop --------------------------------------------------------------------------------------
    def fit(self, steps: int | None = None) -> History:
        """Train until ``steps`` (default ``config.steps``) optimizer steps in all, or ``max_seconds`` pass.

        Logs every ``log_every`` steps, evaluates every ``eval_every`` steps and at the end, checkpoints
        every ``checkpoint_every`` steps and at the end when ``out_dir`` is set. Returns the history.
        """
        c = self.config
        target = c.steps if steps is None else steps
        if target < self.step:
            raise ValueError(f"steps must be >= the steps already taken ({self.step}); got {target}")
        if c.out_dir and self.rank == 0:
            ckpt.check_run_dir(c.out_dir)  # a file or an unwritable folder fails now, not after the last step
        show = (c.progress if c.progress is not None else _progress_default()) and self.rank == 0
        from tqdm.auto import tqdm

        bar = tqdm(total=target, initial=self.step, disable=not show, desc="train", dynamic_ncols=True)
        start = window_start = time.perf_counter()
        window_tokens = 0
        self.history.stop_reason = "steps"
        try:
            while self.step < target:
                log = (self.step + 1) % c.log_every == 0 or self.step + 1 == target
                lr = self.lr
                loss_sum, count = self._step()
                self._unchecked.append((self.step, loss_sum.detach().float() / count.clamp(min=1)))
                window_tokens += self._last_tokens
                bar.update(1)
                out_of_time = c.max_seconds is not None and time.perf_counter() - start >= c.max_seconds
                if log or out_of_time:
                    self._check_finite()
                    loss = self._loss_value(loss_sum, count)
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    now = time.perf_counter()
                    rate = window_tokens / max(now - window_start, 1e-9)
                    record = {"step": self.step, "loss": loss, "lr": lr, "tokens_per_s": rate,
                              "elapsed_s": now - start, "tokens": self.tokens_seen}
                    mfu = self._mfu(rate)
                    if mfu is not None:
                        record["mfu"] = mfu
                    self.history.log(**record)
                    bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{rate:,.0f}", lr=f"{lr:.2e}",
                                    **({"mfu": f"{mfu:.1%}"} if mfu is not None else {}))
                    window_start, window_tokens = time.perf_counter(), 0
                done = self.step >= target or out_of_time
                if c.eval_every and self.step % c.eval_every == 0 and not done:
                    self._log_eval()
                if c.checkpoint_every and c.out_dir and self.step % c.checkpoint_every == 0 and not done:
                    self.save_checkpoint()
                if out_of_time:
                    self.history.stop_reason = "max_seconds"
                    break
        finally:
            bar.close()
        self._check_finite()
        self._log_eval()
        if c.out_dir:
            self.save_checkpoint()
        return self.history

    def _check_finite(self) -> None:
        """Raise NonFiniteLoss if any step since the last check had a NaN or infinite loss (one
        device sync for all of them)."""
        if not self._unchecked:
            return
        steps, losses = zip(*self._unchecked)
        self._unchecked.clear()
        values = torch.stack(losses)
        finite = torch.isfinite(values)
        if self.world > 1:
            import torch.distributed as dist

            flag = finite.all().to(torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if bool(flag):
                return
        elif bool(finite.all()):
            return
        if bool(finite.all()):  # another process diverged
            raise NonFiniteLoss(f"training stopped: the loss became non-finite on another process by step {steps[-1]}")
        bad = int((~finite).nonzero()[0, 0])
        raise NonFiniteLoss(
            f"training stopped: the loss became {float(values[bad])} at step {steps[bad]} (diverged: try a lower "
            f"lr than {self.config.lr}, warmup or grad_clip); no checkpoint of the diverged weights was written"
            + self._kept()
        )

    def _kept(self) -> str:
        """Where the last good checkpoint is, for the NonFiniteLoss message."""
        out_dir = self.config.out_dir
        if not out_dir:
            return ""
        try:
            return f"; the last good checkpoint, {ckpt.resolve(out_dir)}, is kept"
        except ValueError:
            return f"; {out_dir} holds no checkpoint yet"

    def _log_eval(self) -> None:
        self._check_finite()
        val = self.evaluate()
        if val is not None:
            if not math.isfinite(val):
                raise NonFiniteLoss(f"training stopped: the validation loss became {val} at step {self.step}; "
                                    "no checkpoint of these weights was written" + self._kept())
            self.history.log(step=self.step, val_loss=val)

    def _mfu(self, tokens_per_s: float) -> float | None:
        if self._peak is None:
            return None
        context = self._last_context
        if context not in self._flops_per_token:
            self._flops_per_token[context] = training_flops_per_token(self.model, context)
        flops = self._flops_per_token[context]
        return None if flops is None else flops * tokens_per_s / (self._peak * self.world)

    # checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything but the weights that an exact resume needs (this process's view). Under FSDP the
        optimizer state is gathered in full to process 0 (a collective: every process must call this)."""
        rng = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(legacy=False),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "optimizer": self._optimizer_state(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng,
            "data": self.data.state_dict() if self.data is not None else None,
            "history": self.history.to_dict(),
            "train_config": self.config.to_dict(),
            "world": self.world,
        }

    def _optimizer_state(self) -> dict:
        if not self._fsdp:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer, options=_full_options())

    def _weights_finite(self) -> bool:
        """Every weight finite, on every process (under FSDP each checks its own shards)."""
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.model.parameters()]
        ok = all(bool(torch.isfinite(p).all()) for p in local)
        if self._fsdp:
            import torch.distributed as dist

            flag = torch.tensor(int(ok), dtype=torch.int32, device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            ok = bool(flag)
        return ok

    def save_checkpoint(self, out_dir: str | Path | None = None) -> Path | None:
        """Write a checkpoint of the current step under ``out_dir`` (default ``config.out_dir``).

        Under DDP and FSDP every process contributes its data and RNG state; process 0 writes (under
        FSDP the full weights and optimizer state are gathered to it first). Returns the step directory
        (None on other processes).
        """
        out_dir = out_dir if out_dir is not None else self.config.out_dir
        if out_dir is None:
            raise ValueError("out_dir must be given (or set in TrainConfig) to save a checkpoint")
        self._check_finite()
        if not self._weights_finite():
            raise NonFiniteLoss(f"training stopped: the weights hold NaN or inf at step {self.step}; "
                                "no checkpoint of them was written" + self._kept())
        state = self.state_dict()
        weights = None
        if self._fsdp:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            weights = get_model_state_dict(self.model, options=_full_options())  # full tensors on process 0
        if self.world > 1:
            import torch.distributed as dist

            per_rank = [None] * self.world
            dist.all_gather_object(per_rank, {"data": state["data"], "rng": state["rng"]})
            state["per_rank"] = per_rank
        path = None
        if self.rank == 0:
            path = ckpt.save_checkpoint(out_dir, self.step, self.model, tokenizer=self.tokenizer, state=state,
                                        keep=self.config.keep_checkpoints, weights=weights)
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
        return path

    def resume(self, path: str | Path, override: bool = False) -> Trainer:
        """Load weights, optimizer, scheduler, RNG and data states and the history from a checkpoint.

        ``path`` is a run directory (its ``latest`` step) or a step directory. Refused with ValueError:
        a checkpoint of a different model config (naming the fields), a corrupted file (naming it), a
        checkpoint trained with another tokenizer (compared by content: the same vocabulary size is
        not enough), and one whose ``HYPERPARAMETERS`` differ from this config's unless ``override``
        is True; then the new values are applied and described in ``self.resume_changes``.
        """
        state = ckpt.load_state(path)
        if state is None:
            raise ValueError(f"checkpoint {path} holds weights only, no training state to resume from")
        self._check_tokenizer(path)
        changes = self._changed_hyperparameters(state.get("train_config"))
        fixed = [line for key, line in changes if key in _FIXED]
        if fixed:
            raise ValueError(f"checkpoint {path} cannot be resumed with a different optimizer setup ({'; '.join(fixed)}): "
                             "its optimizer state would not fit; start a new run instead")
        if changes and not override:
            raise ValueError(
                f"resuming {path} would change hyper-parameters it was trained with: {'; '.join(line for _, line in changes)}. "
                "Use the checkpoint's values, or pass override=True (train --override) to apply the new ones"
            )
        if state.get("world", 1) != self.world:
            raise ValueError(f"checkpoint was written by {state.get('world', 1)} processes; resuming with "
                             f"{self.world} would draw different batches (world size must match)")
        saved_parallel = (state.get("train_config") or {}).get("parallel", "ddp")
        if self.world > 1 and saved_parallel != self.config.parallel:
            raise ValueError(f"checkpoint was written with parallel={saved_parallel!r}; resuming with "
                             f"parallel={self.config.parallel!r} cannot read its optimizer state (parallel must match)")
        if self._fsdp:  # every process reads the full tensors and keeps its own shards of them
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions, set_model_state_dict, set_optimizer_state_dict)

            full = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.model, ckpt.read_weights(self.model, path), options=full)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=full)
        else:
            ckpt.load_weights(self.model, path)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        mine = state["per_rank"][self.rank] if "per_rank" in state else {"data": state["data"], "rng": state["rng"]}
        rng = mine["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if self.data is not None and mine["data"] is not None:
            self.data.load_state_dict(mine["data"])
        self.step = int(state["step"])
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.history = History.from_dict(state["history"])
        self.resume_changes = [line for _, line in changes]
        if changes:
            self._apply_hyperparameters()
        return self

    def _check_tokenizer(self, path) -> None:
        """Refuse a checkpoint whose tokenizer differs from this run's (by content, not size)."""
        step_dir = ckpt.resolve(path)
        file = step_dir / "tokenizer.json"
        saved = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None
        mine = None
        if self.tokenizer is not None:
            with tempfile.TemporaryDirectory() as tmp:
                self.tokenizer.save(Path(tmp) / "tokenizer.json")
                mine = json.loads((Path(tmp) / "tokenizer.json").read_text(encoding="utf-8"))
        if saved == mine:
            return
        if saved is None or mine is None:
            has, lacks = ("the checkpoint", "this run") if saved is not None else ("this run", "the checkpoint")
            raise ValueError(f"checkpoint {path}: {has} has a tokenizer and {lacks} has none; resume needs the same tokenizer")
        what = [k for k in sorted(set(saved) | set(mine)) if saved.get(k) != mine.get(k)]
        raise ValueError(
            f"checkpoint {path} was trained with a different tokenizer (tokenizer.json differs in {what}): its token "
            "ids would mean other text. Resume on the corpus (and tokenizer) it was trained with"
        )

    def _changed_hyperparameters(self, saved: dict | None) -> list[tuple[str, str]]:
        """(field, "field: checkpoint X, now Y") for every hyper-parameter that differs."""
        if not saved:
            return []  # a checkpoint written before configs were recorded
        mine = self.config.to_dict()
        out = []
        for key in HYPERPARAMETERS:
            if key == "steps" and not (mine["schedule"] == saved.get("schedule") == "cosine"):
                continue  # the step budget only shapes the cosine schedule
            old, new = saved.get(key), mine[key]
            if isinstance(old, (list, tuple)):
                old, new = list(old), list(new)
            if old != new:
                label = "steps (the cosine schedule's total)" if key == "steps" else key
                out.append((key, f"{label}: checkpoint {old!r}, now {new!r}"))
        return out

    def _apply_hyperparameters(self) -> None:
        """Put this config's lr, schedule (with its total steps), weight decay and betas into the
        optimizer and scheduler just restored from a checkpoint (which carry the old ones)."""
        c, sched = self.config, self.scheduler
        schedules = [self._schedule() for _ in self.optimizer.param_groups]
        sched.lr_lambdas = schedules
        sched.base_lrs = [c.lr for _ in self.optimizer.param_groups]
        decayed = c.optimizer != "adam"  # "adam" has no decay; the others: [decayed, exempt] (optim.param_groups)
        for i, (group, factor) in enumerate(zip(self.optimizer.param_groups, schedules)):
            group["initial_lr"] = c.lr
            group["lr"] = c.lr * factor(sched.last_epoch)  # the lr of the next step under the new schedule
            if "betas" in group:
                group["betas"] = tuple(c.betas)
            if decayed and i == 0:  # the exempt group (norms, biases) stays at 0
                group["weight_decay"] = c.weight_decay
        sched._last_lr = [group["lr"] for group in self.optimizer.param_groups]
