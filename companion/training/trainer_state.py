"""The Trainer's checkpoints: what an exact resume needs besides the weights (``state_dict``), writing
a checkpoint (``save_checkpoint``: full weights gathered to process 0 under FSDP, nothing written when
a weight is NaN or inf) and ``resume`` (``companion.training.resume.restore``). ``Trainer`` inherits
them from ``TrainerCheckpoints``; the loop itself is ``companion.training.trainer``."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from companion.training import checkpoint as ckpt
from companion.training.distributed import full_options as _full_options
from companion.training.resume import restore

__all__ = ["TrainerCheckpoints", "NonFiniteLoss"]


class NonFiniteLoss(FloatingPointError):
    """The training loss, or a weight about to be checkpointed, is NaN or infinite."""


class TrainerCheckpoints:
    """The checkpoint half of ``companion.training.trainer.Trainer`` (it reads the Trainer's model,
    optimizer, scheduler, data, history, config, rank and world)."""

    def _kept(self) -> str:
        """Where the last good checkpoint is, for the NonFiniteLoss message."""
        out_dir = self.config.out_dir
        if not out_dir:
            return ""
        try:
            return f"; the last good checkpoint, {ckpt.resolve(out_dir)}, is kept"
        except ValueError:
            return f"; {out_dir} holds no checkpoint yet"


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

    def resume(self, path: str | Path, override: bool = False) -> TrainerCheckpoints:
        """Load weights, optimizer, scheduler, RNG and data states and the history from a checkpoint.

        ``path`` is a run directory (its ``latest`` step) or a step directory. Refused with ValueError:
        a checkpoint of a different model config (naming the fields), a corrupted file (naming it), a
        checkpoint trained with another tokenizer (compared by content: the same vocabulary size is
        not enough), and one whose ``HYPERPARAMETERS`` differ from this config's unless ``override``
        is True; then the new values are applied and described in ``self.resume_changes``
        (``companion.training.resume.restore``).
        """
        return restore(self, path, override)
