"""One training loop for every model in the book: decoder LMs, GPT and the 2017 encoder-decoder.

The module is the loop; its parts live beside it, and every name below is importable from here too:
``companion.training.trainer_state`` (the Trainer's checkpoints: ``state_dict``, ``save_checkpoint``,
``resume``), ``companion.training.config`` (``TrainConfig`` and the values it accepts), ``.history``
(``History``), ``.distributed`` (process groups, devices, FSDP sharding) and ``.resume`` (the
run-folder rules of ``train --out`` and ``Trainer.resume``).

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

Precision (``companion.precision``): ``"auto"`` is bf16 autocast on a GPU of compute capability 8.0+,
fp16 autocast with a gradient scaler on 7.x (a T4, a V100: the scaler multiplies the loss before backward,
unscales before clipping, and skips a step whose gradients overflowed), float32 on older GPUs and the CPU
(``"bf16"`` forces autocast on the CPU too; a request the device cannot honour is a ValueError). Under
``parallel="fsdp"`` a 16-bit precision is FSDP2's mixed-precision policy instead of autocast: float32
shards, 16-bit all-gathers and compute, gradients reduced in ``fsdp_reduce_dtype`` (float32 by default). On CUDA the models' ``backend="auto"`` attention already calls torch's SDPA kernels; the
trainer also allows TF32 matmuls. ``compile=True`` wraps the model in ``torch.compile``.
Progress: a ``tqdm.auto`` bar with loss, tokens/s and learning rate; off when ``progress=False``, when
``$COMPANION_PROGRESS=0``, or under pytest (which covers nbval runs of the notebooks), and on every DDP
rank but 0.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from companion.accounting import peak_flops, training_flops_per_token
from companion.data.batching import IGNORE_INDEX, PairBatch
from companion.models import unwrap
from companion.training import checkpoint as ckpt
from companion.training.config import (  # noqa: F401  (re-exported: the public names of this module)
    HYPERPARAMETERS, OPTIMIZERS, PARALLEL, PRECISIONS, SCHEDULES, TrainConfig)
from companion.training.config import progress_default as _progress_default
from companion.training.distributed import check_device, setup_distributed, transformer_blocks
from companion.training.distributed import shard as _shard
from companion.training.history import History
from companion.training.losses import default_loss
from companion.precision import DTYPES, choose_precision, cuda_capability, tf32_matmuls
from companion.training.optim import ConstantWithWarmup, Noam, WarmupCosine, build_optimizer, clip_grad_norm, param_groups
from companion.training.runlock import run_lock
from companion.training.trainer_state import NonFiniteLoss, TrainerCheckpoints

__all__ = [
    "TrainConfig", "Trainer", "History", "setup_distributed", "check_device", "NonFiniteLoss",
    "SCHEDULES", "OPTIMIZERS", "PRECISIONS", "PARALLEL", "HYPERPARAMETERS", "transformer_blocks",
]


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


# --- the trainer -----------------------------------------------------------------------------------


class Trainer(TrainerCheckpoints):
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
        self._tf32 = self.device.type == "cuda"  # inside the Trainer's own steps only (tf32_matmuls)
        # bf16 on compute capability 8.0+, fp16 with a gradient scaler on 7.x (a T4), else fp32
        self.precision = choose_precision(self.device.type, cuda_capability(self.device), config.precision)
        self.autocast_dtype = self.precision.autocast_dtype
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision.needs_scaler else None
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
        if self._fsdp:  # before the optimizer: it must hold the sharded parameters
            # a 16-bit precision becomes FSDP's mixed-precision policy (16-bit all-gathers and compute,
            # float32 shards and reductions) instead of autocast
            _shard(self.model, self.device, self.world, compute_dtype=self.autocast_dtype,
                   reduce_dtype=DTYPES[config.fsdp_reduce_dtype])
            self.autocast_dtype = None
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
            with context, tf32_matmuls(self._tf32):
                with self._autocast():
                    loss_sum, _ = self.loss_fn(self._train_model, b)
                loss = loss_sum * scale
                (loss if self.scaler is None else self.scaler.scale(loss)).backward()
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
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        if self.config.grad_clip is not None:
            clip_grad_norm([p for p in self.model.parameters() if p.grad is not None], self.config.grad_clip)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)  # skipped when a gradient overflowed fp16
            self.scaler.update()
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
            with self._autocast(), tf32_matmuls(self._tf32):
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
        lock = contextlib.nullcontext()
        if c.out_dir and self.rank == 0:
            ckpt.check_run_dir(c.out_dir)  # a file or an unwritable folder fails now, not after the last step
            # held for the whole fit: another process writing the same folder is refused, not pruned
            lock = run_lock(c.out_dir)
        with lock:
            if c.out_dir and self.rank == 0:  # another run's checkpoints there: refused before any work
                ckpt.check_run(c.out_dir, self.model, self.step, remedy=(
                    f"resume that run (Trainer.resume of it; on the command line --resume {c.out_dir}) or choose "
                    "another out_dir"))
            return self._fit(target)

    def _fit(self, target: int) -> History:
        """``fit`` once the output folder is checked and locked."""
        c = self.config
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

