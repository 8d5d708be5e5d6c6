"""Where a run lives and how it continues: the run-folder rules and ``resume``.

What this module provides
- ``run_in(out_dir) -> list[str]``: the step directories (and ``latest``) of the run a folder holds.
- ``prepare_out_dir(out_dir, resume=None, force=False, delete_old=False) -> str | None``: the rules
  below, checked before any work; returns a line to report (what ``force`` did) or None.
- ``restore(trainer, path, override=False)``: what ``Trainer.resume`` does (weights, optimizer,
  scheduler, RNG and data states, history), after the checks below.
- ``check_tokenizer``, ``changed_hyperparameters``, ``apply_hyperparameters``: its parts.

The run-folder rules (``python -m companion train --out DIR``). A folder holds a run when it has a
``step-*`` directory or a ``latest`` pointer (``companion.training.checkpoint``). A new run, one
that does not continue the run in ``DIR`` (no ``--resume``, or ``--resume`` of a checkpoint outside
``DIR``), would write its checkpoints beside that run's, re-save its step numbers and move
``latest``: it is refused, with the ways out named: ``--resume DIR`` to continue it, another
``--out``, or ``--force``. With ``force`` the old run's files are kept: its step directories and
``latest`` move into ``DIR/previous-N/`` (the first free N, itself a run folder that ``sample
--checkpoint`` and ``--resume`` read); with ``delete_old`` too they are deleted instead. Resuming the
run in ``DIR`` (``--resume DIR``, or its newest step directory) is allowed; resuming an older step
of it is a branch, refused there (it would re-save the newer steps' numbers in their place), and
``DIR/previous-N`` is another run. ``train`` holds ``DIR``'s lock (``companion.training.runlock``)
from this check to its last checkpoint, so two runs started together cannot both pass it.

Resume refuses a checkpoint trained with another tokenizer (compared by content) and, unless
``override=True``, any changed hyper-parameter (``HYPERPARAMETERS``); with ``override=True`` the new
values are applied (learning rate, schedule and its total steps, weight decay, betas) and listed in
``trainer.resume_changes``.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from companion.training import checkpoint as ckpt
from companion.training.config import FIXED, HYPERPARAMETERS, TrainConfig
from companion.training.history import History

__all__ = ["run_in", "prepare_out_dir", "restore", "check_tokenizer", "changed_hyperparameters",
           "apply_hyperparameters", "HYPERPARAMETERS"]

_LATEST = "latest"
STATE_KEYS = ("step", "optimizer", "scheduler", "rng", "data", "history")  # what Trainer.state_dict writes


def run_in(out_dir: str | Path) -> list[str]:
    """The names of the step directories and the ``latest`` pointer ``out_dir`` holds (empty: no run)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    names = [p.name for _, _, p in ckpt._step_dirs(out_dir)]
    if (out_dir / _LATEST).exists():
        names.append(_LATEST)
    return names


def _continues(out_dir: Path, resume: str | Path | None) -> bool:
    """Whether ``resume`` names the run in ``out_dir``: the folder itself, or one of its own step
    directories. A run kept inside it (``out_dir/previous-1``, written by --force) is another run."""
    if resume is None:
        return False
    resume = Path(resume).resolve()
    here = out_dir.resolve()
    return resume == here or (resume.parent == here and ckpt._STEP.fullmatch(resume.name) is not None)


def _newer_than(out_dir: Path, resume: str | Path) -> list[str]:
    """The step directories of ``out_dir`` newer than the step ``resume`` names (none when ``resume``
    is the folder itself, which continues from its ``latest``)."""
    match = ckpt._STEP.fullmatch(Path(resume).resolve().name)
    if Path(resume).resolve() == out_dir.resolve() or match is None:
        return []
    step, version = int(match.group(1)), int(match.group(2) or 0)
    return [p.name for s, v, p in ckpt._step_dirs(out_dir) if (s, v) > (step, version)]


def prepare_out_dir(out_dir: str | Path, resume: str | Path | None = None, force: bool = False,
                    delete_old: bool = False, act: bool = True) -> str | None:
    """Apply the run-folder rules (module docstring) to ``out_dir`` before a run starts.

    Raises ValueError when ``out_dir`` holds a run that this one does not continue and ``force`` is
    False. Resuming one of its step directories that is older than its newest step does not continue
    it either: the resumed run would re-save those steps in place of the newer checkpoints. With
    ``force``, moves that run into ``out_dir/previous-N/`` (or deletes it with ``delete_old``) and
    returns the line saying so; otherwise returns None. ``act=False`` only checks (``train`` checks
    before its work and moves the old run just before its first step)."""
    if delete_old and not force:
        raise ValueError("--delete-old only applies with --force (it deletes the run already in --out)")
    out_dir = Path(out_dir)
    names = run_in(out_dir)
    newer = _newer_than(out_dir, resume) if names and _continues(out_dir, resume) else []
    if not names or (_continues(out_dir, resume) and not newer):
        return None
    steps = [n for n in names if n != _LATEST]
    if not steps:
        held = "a 'latest' pointer"
    else:
        held = f"checkpoint {steps[0]}" if len(steps) == 1 else f"{len(steps)} checkpoints, {steps[0]} to {steps[-1]}"
    if not force:
        if newer:
            how = (f"--resume {resume} is older than that run's newest checkpoint ({newer[-1]}): continuing it "
                   f"there would re-save steps in place of {', '.join(newer)}. Branch from it into another --out, "
                   f"or continue the run from its newest step with --resume {out_dir}")
        elif resume is None:
            how = f"continue it with --resume {out_dir}"
        else:
            how = f"--resume {resume} is another run's checkpoint, not the run in {out_dir}"
        raise ValueError(
            f"--out {out_dir} already holds a run ({held}): a new run there would replace its checkpoints. "
            f"{how[0].upper() + how[1:]}; choose another --out; or pass --force to start a new run there "
            f"(the old run is moved to {out_dir}/previous-N/, or deleted with --force --delete-old)")
    if not act:
        return None
    if delete_old:
        for name in names:
            path = out_dir / name
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        return f"--force --delete-old: deleted the run that was in {out_dir} ({held})"
    aside = ckpt.keep_aside(out_dir, names)
    return (f"--force: the run that was in {out_dir} ({held}) is kept in {aside} "
            f"(sample or resume it from there; delete it when no longer needed)")


def restore(trainer, path: str | Path, override: bool = False):
    """Load weights, optimizer, scheduler, RNG and data states and the history from a checkpoint into
    ``trainer`` (``Trainer.resume``, whose docstring lists what is refused); returns the trainer."""
    state = ckpt.load_state(path)
    if state is None:
        raise ValueError(f"checkpoint {path} holds weights only, no training state to resume from")
    missing = [key for key in STATE_KEYS if key not in state] if isinstance(state, dict) else list(STATE_KEYS)
    if missing:
        raise ValueError(f"checkpoint {path}: its state.json lacks {missing} (it was not written by Trainer, or was "
                         "edited): there is no training state to resume from")
    check_tokenizer(trainer.tokenizer, path)
    changes = changed_hyperparameters(trainer.config, state.get("train_config"))
    fixed = [line for key, line in changes if key in FIXED]
    if fixed:
        raise ValueError(f"checkpoint {path} cannot be resumed with a different optimizer setup ({'; '.join(fixed)}): "
                         "its optimizer state would not fit; start a new run instead")
    if changes and not override:
        raise ValueError(
            f"resuming {path} would change hyper-parameters it was trained with: {'; '.join(line for _, line in changes)}. "
            "Use the checkpoint's values, or pass override=True (train --override) to apply the new ones"
        )
    if state.get("world", 1) != trainer.world:
        raise ValueError(f"checkpoint was written by {state.get('world', 1)} processes; resuming with "
                         f"{trainer.world} would draw different batches (world size must match)")
    saved_parallel = (state.get("train_config") or {}).get("parallel", "ddp")
    if trainer.world > 1 and saved_parallel != trainer.config.parallel:
        raise ValueError(f"checkpoint was written with parallel={saved_parallel!r}; resuming with "
                         f"parallel={trainer.config.parallel!r} cannot read its optimizer state (parallel must match)")
    if trainer._fsdp:  # every process reads the full tensors and keeps its own shards of them
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, set_model_state_dict, set_optimizer_state_dict)

        full = StateDictOptions(full_state_dict=True)
        set_model_state_dict(trainer.model, ckpt.read_weights(trainer.model, path), options=full)
        ckpt.remember_run(trainer.model, ckpt.resolve(path))  # its saves continue that run
        set_optimizer_state_dict(trainer.model, trainer.optimizer, state["optimizer"], options=full)
    else:
        ckpt.load_weights(trainer.model, path)
        try:
            trainer.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, TypeError, IndexError, ValueError, RuntimeError) as e:
            raise ValueError(f"checkpoint {path}: its optimizer state does not fit this run's optimizer "
                             f"({type(e).__name__}: {e}); start a new run") from None
    try:  # a state.json edited into another shape: one error naming the file, not a KeyError deep inside
        trainer.scheduler.load_state_dict(state["scheduler"])
        mine = state["per_rank"][trainer.rank] if "per_rank" in state else {"data": state["data"], "rng": state["rng"]}
        rng = mine["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if trainer.data is not None and mine["data"] is not None:
            trainer.data.load_state_dict(mine["data"])
        trainer.step = int(state["step"])
        trainer.tokens_seen = int(state.get("tokens_seen", 0))
        trainer.history = History.from_dict(state["history"])
    except (KeyError, TypeError, IndexError, AttributeError, RuntimeError) as e:
        raise ValueError(f"checkpoint {path}: its training state (state.json) is malformed ({type(e).__name__}: "
                         f"{e}); resume from another step, or start a new run") from None
    trainer.resume_changes = [line for _, line in changes]
    if changes:
        apply_hyperparameters(trainer)
    return trainer


def check_tokenizer(tokenizer, path) -> None:
    """Refuse a checkpoint whose tokenizer differs from this run's (by content, not size)."""
    step_dir = ckpt.resolve(path)
    file = step_dir / "tokenizer.json"
    saved = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None
    mine = None
    if tokenizer is not None:
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save(Path(tmp) / "tokenizer.json")
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


def changed_hyperparameters(config: TrainConfig, saved: dict | None) -> list[tuple[str, str]]:
    """(field, "field: checkpoint X, now Y") for every hyper-parameter that differs."""
    if not saved:
        return []  # a checkpoint written before configs were recorded
    mine = config.to_dict()
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


def apply_hyperparameters(trainer) -> None:
    """Put this config's lr, schedule (with its total steps), weight decay and betas into the
    optimizer and scheduler just restored from a checkpoint (which carry the old ones)."""
    c, sched = trainer.config, trainer.scheduler
    schedules = [trainer._schedule() for _ in trainer.optimizer.param_groups]
    sched.lr_lambdas = schedules
    sched.base_lrs = [c.lr for _ in trainer.optimizer.param_groups]
    decayed = c.optimizer != "adam"  # "adam" has no decay; the others: [decayed, exempt] (optim.param_groups)
    for i, (group, factor) in enumerate(zip(trainer.optimizer.param_groups, schedules)):
        group["initial_lr"] = c.lr
        group["lr"] = c.lr * factor(sched.last_epoch)  # the lr of the next step under the new schedule
        if "betas" in group:
            group["betas"] = tuple(c.betas)
        if decayed and i == 0:  # the exempt group (norms, biases) stays at 0
            group["weight_decay"] = c.weight_decay
    sched._last_lr = [group["lr"] for group in trainer.optimizer.param_groups]
