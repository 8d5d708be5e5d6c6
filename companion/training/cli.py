"""The ``train``, ``sample`` and ``translate`` commands of ``python -m companion`` (registered by
``companion.__main__``).

What this module provides
- ``add_subcommands(subparsers)``: adds ``train``, ``sample`` and ``translate`` to an argparse subparser set.
- ``DATASETS``: the names ``--data`` accepts (or a path to a UTF-8 ``.txt`` file).
- ``PROFILES``: the defaults of ``--profile quick`` (CPU, minutes) and ``--profile gpu``.
- ``build_run(args) -> (model, data, tokenizer, TrainConfig)``: what ``train`` runs, for notebooks too.
- ``sample_lm(model, ids, max_new_tokens, temperature, top_k, seed) -> list[int]``: sampling with
  ``generate``'s filters, sliding the context window past the model's context.

    python -m companion train --preset gpt2-tiny --data shakespeare --profile quick --out runs/shakespeare
    python -m companion sample --checkpoint runs/shakespeare --prompt "ROMEO:"
    python -m companion train --preset seq2seq-tiny --data bible-en-fr --out runs/fr
    python -m companion translate --checkpoint runs/fr --prompt "In the beginning"
    torchrun --nproc_per_node 2 -m companion train ...      # DDP: gloo on CPU, nccl on GPUs
    torchrun --nproc_per_node 2 -m companion train --parallel fsdp ...   # FSDP2: sharded weights
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from companion.training.arguments import check_overrides as _check_overrides
from companion.training.arguments import check_threads, rough_weight_bytes  # noqa: F401  (re-exported)
from companion.training.arguments import parse_overrides as _overrides
from companion.training.arguments import read_corpus as _read_corpus
from companion.training.cli_sample import (  # noqa: F401  (re-exported: this module's public names)
    CONTEXT_RULE, cmd_sample, crop_prompt, sample_lm, slide)

__all__ = ["add_subcommands", "DATASETS", "PROFILES", "build_run", "sample_lm", "slide", "crop_prompt", "cmd_train",
           "cmd_sample", "HelpFormatter", "Terminated", "COMMANDS", "CONTEXT_RULE", "check_threads"]

# torch is imported inside the functions that need it: `python -m companion --help` imports none of it.
COMMANDS = {  # the one-line help of each command, shown by `python -m companion --help`
    "train": "train a model of the book on a corpus, with checkpoints",
    "sample": "continue a prompt with a trained (decoder) checkpoint, streaming the text",
    "translate": "translate a sentence with a trained encoder-decoder (seq2seq) checkpoint",
}
class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default once: appended as "(default: X)" only when the help text does not
    already say it (a "default" or "profile:" in it) and there is a value to show (not None, False
    or an empty list)."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        said = "default" in text or "profile:" in text
        nothing = action.default is None or action.default is False or action.default == [] or \
            action.default == argparse.SUPPRESS
        if said or nothing:
            return text
        return super()._get_help_string(action)

SYNTHETIC = ("copy", "reverse", "sort")
BIBLE = ("bible-en-fr", "bible-en-es", "bible-en-de")
DATASETS = ("shakespeare", *SYNTHETIC, *BIBLE)
SEQ2SEQ_PREFIX = "seq2seq-"

PROFILES: dict[str, dict] = {
    # quick: what a laptop CPU finishes in a few minutes; the step budget rules, the clock is a guard.
    "quick": dict(device="cpu", steps=300, batch_size=32, context=64, lr=3e-3, eval_every=100, max_seconds=600.0,
                  compile=False, max_words=12),
    # gpu: one CUDA device (bf16 autocast, SDPA, torch.compile).
    "gpu": dict(device=None, steps=5000, batch_size=64, context=256, lr=1e-3, eval_every=500, max_seconds=3600.0,
                compile=True, max_words=48),
}


def _presets() -> list[str]:
    from companion.models import GPT_PRESETS, PRESETS, SEQ2SEQ_PRESETS

    return [*PRESETS, *GPT_PRESETS, *(SEQ2SEQ_PREFIX + p for p in SEQ2SEQ_PRESETS)]


def preset_name(preset: str) -> str:
    """The command line's one name for a preset: the encoder-decoder presets are seq2seq-base and
    seq2seq-tiny (companion.models calls them base and tiny); the old names are accepted with a note."""
    from companion.models import SEQ2SEQ_PRESETS

    if preset in SEQ2SEQ_PRESETS:
        print(f"note: --preset {preset} is called {SEQ2SEQ_PREFIX}{preset} on the command line; using "
              f"{SEQ2SEQ_PREFIX}{preset}", file=sys.stderr)
        return SEQ2SEQ_PREFIX + preset
    return preset


def _text_data(args, text_train: str, text_val: str, context: int):
    import torch

    from companion.tokenizers import CharTokenizer
    from companion.data.loaders import LMData

    if not text_train:
        raise ValueError("the corpus is empty: --data gave no training text")
    tokenizer = CharTokenizer.train([text_train, text_val])
    train = torch.tensor(tokenizer.encode(text_train))
    val = torch.tensor(tokenizer.encode(text_val)) if len(text_val) > context + 1 else None
    return LMData(train, val, args.batch_size, context, seed=args.seed), tokenizer


def build_run(args):
    """(model, data source, tokenizer or None, TrainConfig) from parsed ``train`` arguments."""
    import torch

    from companion.data import load, make_pairs, split_text, to_lm
    from companion.data.synthetic import BOS, EOS, PAD
    from companion.models import GPT_PRESETS, PRESETS, SEQ2SEQ_PRESETS, from_preset
    from companion.data.loaders import PairData, SequenceData
    from companion.training.trainer import TrainConfig

    if args.threads is not None:
        torch.set_num_threads(check_threads(args.threads))
    if args.profile is None:  # --profile, else $COMPANION_PROFILE (the notebooks' switch), else quick
        # the variable's name, not an import of companion.notebook.profile: that layer sits above this one
        ENV_VAR = "COMPANION_PROFILE"
        args.profile = os.environ.get(ENV_VAR, "quick").strip().lower() or "quick"
        if args.profile not in ("quick", "cpu", "gpu"):
            raise ValueError(f"${ENV_VAR} must be quick, cpu or gpu (it gives train's --profile); got {args.profile!r}")
    profile = PROFILES["quick" if args.profile in ("quick", "cpu") else "gpu"]
    if args.profile == "gpu" and args.device is None and not torch.cuda.is_available():  # as the notebooks warn
        print("warning: the gpu profile was asked for but CUDA is absent; running its larger settings (5,000 "
              "steps, torch.compile) on the CPU will be slow: --profile quick suits this machine", file=sys.stderr)
    for key, value in profile.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1; got {args.batch_size}")
    if args.context < 1:
        raise ValueError(f"--context must be >= 1; got {args.context}")
    args.preset = preset_name(args.preset)
    if args.seed is None:  # --seed's default (cmd_train gives a resumed run its own seed first)
        args.seed = 0
    if args.preset not in _presets():
        raise ValueError(f"--preset must be one of {_presets()}; got {args.preset!r}")
    seq2seq = args.preset.startswith(SEQ2SEQ_PREFIX)
    overrides = _overrides(args.set)
    torch.manual_seed(args.seed)

    data_path = Path(args.data)
    tokenizer = None
    if args.data == "shakespeare" or (args.data not in DATASETS and data_path.suffix == ".txt"):
        if seq2seq:
            raise ValueError(f"--data {args.data} is a text corpus for decoder models; --preset {args.preset} is an encoder-decoder "
                             f"(use one of {list(BIBLE)} or {list(SYNTHETIC)})")
        if args.data == "shakespeare":
            ds = load("shakespeare")
            text_train, text_val = split_text(ds["train"]), split_text(ds["validation"])
        else:
            if not data_path.is_file():
                raise ValueError(f"--data {args.data}: no such file")
            text = _read_corpus(data_path)
            cut = int(len(text) * 0.9)
            text_train, text_val = text[:cut], text[cut:]
        data, tokenizer = _text_data(args, text_train, text_val, args.context)
        vocab, length = tokenizer.vocab_size, args.context
    elif args.data in SYNTHETIC:
        vocab = 16
        pairs = make_pairs(args.data, 4000, vocab_size=vocab, min_len=1, max_len=8, seed=args.seed)
        val_pairs = make_pairs(args.data, 200, vocab_size=vocab, min_len=1, max_len=8, seed=args.seed + 1)
        if seq2seq:
            data = PairData(pairs, val_pairs, args.batch_size, pad_id=PAD, bos_id=BOS, eos_id=EOS, seed=args.seed)
        else:
            seqs, masks = to_lm(pairs)
            data = SequenceData(seqs, masks, args.batch_size, validation=to_lm(val_pairs), pad_id=PAD, seed=args.seed)
        length = 2 * 8 + 2
    elif args.data in BIBLE:
        if not seq2seq:
            raise ValueError(f"--data {args.data} is a sentence-pair corpus: --preset must be one of "
                             f"{[SEQ2SEQ_PREFIX + p for p in SEQ2SEQ_PRESETS]}")
        from companion.tokenizers import CharTokenizer

        lang = args.data.split("-")[-1]
        ds = load(args.data, max_words=args.max_words)
        rows = {split: [(r["en"], r[lang]) for r in ds[split]["translation"]] for split in ds}
        tokenizer = CharTokenizer.train([s for src, tgt in rows["train"] + rows.get("validation", []) for s in (src, tgt)],
                                        special_tokens=["<pad>", "<bos>", "<eos>"])
        ids = tokenizer.special_tokens
        encode = lambda part: [(tokenizer.encode(s), tokenizer.encode(t)) for s, t in part]  # noqa: E731
        pairs, val_pairs = encode(rows["train"]), encode(rows.get("validation", []))
        data = PairData(pairs, val_pairs or None, args.batch_size, pad_id=ids["<pad>"], bos_id=ids["<bos>"],
                        eos_id=ids["<eos>"], seed=args.seed)
        vocab = tokenizer.vocab_size
        length = max(max(len(s), len(t) + 1) for s, t in pairs + val_pairs)
    else:
        raise ValueError(f"--data must be one of {list(DATASETS)} or a path to a .txt file; got {args.data!r}")

    from companion.models import DecoderConfig, GPTConfig, Seq2SeqConfig

    _check_overrides(overrides, Seq2SeqConfig if seq2seq else GPTConfig if args.preset in GPT_PRESETS else DecoderConfig)
    try:
        if seq2seq:
            name = args.preset[len(SEQ2SEQ_PREFIX):]
            max_len = max(length, SEQ2SEQ_PRESETS[name].get("max_len", 512))
            sizes = {"src_vocab_size": vocab, "tgt_vocab_size": vocab, "max_len": max_len, "pad_id": 0}
        elif args.preset in GPT_PRESETS:
            name, sizes = args.preset, {"vocab_size": vocab, "block_size": length}
        else:
            name = args.preset
            sizes = {"vocab_size": vocab, "max_seq_len": max(length, PRESETS[name].get("max_seq_len", 256))}
        with torch.device("meta"):  # shapes only: the memory estimate comes before any allocation
            shape = from_preset(name, **{**sizes, **overrides})  # each family names its own length field
    except (TypeError, ZeroDivisionError) as e:
        settings = " ".join(f"--set {item}" for item in args.set) or "the preset"
        raise ValueError(f"the model cannot be built from {settings}: {e}") from None
    except RuntimeError as e:  # "Storage size calculation overflowed": a weight too large to describe at all
        from companion.models import preset_config
        from companion.training.memory import human

        settings = " ".join(f"--set {item}" for item in args.set) or f"--preset {args.preset}"
        need = rough_weight_bytes(preset_config(name, **{**sizes, **overrides}))
        raise ValueError(f"{settings}: the model's weights alone need about {human(need)} of memory (float32), "
                         f"more than any machine has (torch: {e}); --set a smaller model") from None
    if not args.no_memory_check:
        from companion.training import memory

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        note = memory.check(shape, args.batch_size, length, device)
        if note:
            print(note, file=sys.stderr)
    del shape
    model = from_preset(name, **{**sizes, **overrides})
    config = TrainConfig(
        steps=args.steps, max_seconds=args.max_seconds or None, grad_accum=args.grad_accum, lr=args.lr,
        optimizer=args.optimizer, weight_decay=args.weight_decay, schedule=args.schedule, warmup=args.warmup,
        grad_clip=args.grad_clip or None, label_smoothing=args.label_smoothing, eval_every=args.eval_every,
        log_every=args.log_every, checkpoint_every=args.checkpoint_every, out_dir=args.out, precision=args.precision,
        compile=args.compile, parallel=args.parallel, device=args.device, seed=args.seed, progress=False if args.no_progress else None,
    )
    return model, data, tokenizer, config


def cmd_train(args) -> int:
    import contextlib
    import os

    from companion.training.checkpoint import check_run_dir
    from companion.training.runlock import run_lock

    if args.delete_old and not args.force:
        raise ValueError("--delete-old only applies with --force (it deletes the run already in --out)")
    if args.out is not None and not args.out.strip():
        raise ValueError("--out '' names no folder: omit --out to train without checkpoints, or name a folder "
                         "(--out . for the current one)")
    if not args.out:
        return _train(args)
    check_run_dir(args.out)  # before the corpus is read and the model built
    # The folder's lock is held from the run-folder check to the last checkpoint: a second run started
    # at the same time is refused instead of passing the check too and pruning this run's steps.
    # Under torchrun process 0 alone writes checkpoints, and it alone holds the lock.
    first = int(os.environ.get("RANK", "0")) == 0
    with run_lock(args.out) if first else contextlib.nullcontext():
        return _train(args)


def _train(args) -> int:
    from companion.training.checkpoint import CheckpointNotWritten
    from companion.training.resume import prepare_out_dir
    from companion.training.trainer import NonFiniteLoss, Trainer, check_device

    if args.out:
        prepare_out_dir(args.out, resume=args.resume, force=args.force, delete_old=args.delete_old, act=False)
    if args.device is not None:
        check_device(args.device)
    if args.override and not args.resume:
        raise ValueError("--override only applies with --resume")
    if args.resume:  # a resumed run keeps the seed it was started with (its weights, batch order, synthetic data)
        saved = _saved_seed(args.resume)
        if saved is not None and args.seed is not None and args.seed != saved:
            raise ValueError(f"--seed {args.seed}: the run in {args.resume} was started with --seed {saved}, which "
                             "a resumed run keeps (its batch order and data come from it); drop --seed")
        if saved is not None:
            args.seed = saved
    model, data, tokenizer, config = build_run(args)
    trainer = Trainer(model, data, config, tokenizer=tokenizer)
    if args.resume:
        trainer.resume(args.resume, override=args.override)
        for change in trainer.resume_changes:
            if trainer.rank == 0:
                print(f"resume: --override applies {change}", file=sys.stderr)
    if args.out:  # every check has passed: only now is an old run (with --force) moved aside
        moved = None
        if trainer.rank == 0:
            moved = prepare_out_dir(args.out, resume=args.resume, force=args.force, delete_old=args.delete_old)
        if trainer.world > 1:
            import torch.distributed as dist

            dist.barrier()  # the other processes wait until the old run is out of the way
        if moved:
            print(f"train: {moved}", file=sys.stderr)
    try:
        history = trainer.fit()
    except (NonFiniteLoss, CheckpointNotWritten) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: no traceback; where the run stands, how to go on
        terminated = isinstance(stop, Terminated)
        if trainer.rank == 0:
            print(_interrupted(args, trainer.step, "terminated (SIGTERM)" if terminated else "interrupted"),
                  file=sys.stderr)
        return 143 if terminated else 130
    if trainer.rank == 0:
        summary = {
            "steps": trainer.step, "stop_reason": history.stop_reason, "loss": history.last("loss"),
            "val_loss": history.last("val_loss"), "tokens_per_s": history.last("tokens_per_s"),
            "mfu": history.last("mfu"), "checkpoint": str(Path(config.out_dir).resolve()) if config.out_dir else None,
        }
        # The human-readable lines first (stderr), then the JSON a script can parse (stdout).
        val = summary["val_loss"]
        print(f"trained {trainer.step} steps ({history.stop_reason}); last training loss {summary['loss']:.4f}"
              + (f", validation loss {val:.4f}" if val is not None else ", no validation run (see --eval-every)"),
              file=sys.stderr)
        if summary["checkpoint"]:
            verb = "translate" if args.preset.startswith(SEQ2SEQ_PREFIX) else "sample"
            print(f"checkpoints in {summary['checkpoint']} ({verb} with: python -m companion {verb} "
                  f"--checkpoint {summary['checkpoint']} --prompt ...)", file=sys.stderr)
        else:
            print("no checkpoint written (pass --out DIR to keep the model)", file=sys.stderr)
        print(json.dumps(summary, indent=1))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # joined by the Trainer under torchrun
        dist.destroy_process_group()
    return 0


def _saved_seed(resume) -> int | None:
    """The --seed the run in ``resume`` was started with (None when it cannot be read: restore reports why)."""
    from companion.training.checkpoint import load_state

    try:
        state = load_state(resume) or {}
    except (ValueError, OSError):
        return None
    seed = (state.get("train_config") or {}).get("seed")
    return seed if isinstance(seed, int) else None


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill PID``, a job scheduler's stop), raised where Ctrl-C would be so that both end a
    command the same way (``companion.__main__`` installs the handler)."""


def _interrupted(args, step: int, how: str = "interrupted") -> str:
    """The line train prints on Ctrl-C or SIGTERM: the step reached and the checkpoint to resume from."""
    head = f"train: {how} at step {step}"
    if not args.out:
        return head + "; nothing was saved (no --out)"
    from companion.training.checkpoint import resolve

    try:
        last = resolve(args.out)
    except (ValueError, OSError):
        return (head + f"; no checkpoint was written to {args.out} yet (--checkpoint-every N writes one every N "
                "steps); start again to train")
    return (head + f"; the last checkpoint is {last.name} in {args.out}: resume with python -m companion train "
            f"... --resume {args.out} --out {args.out} (the same options)")


TRAIN_EXAMPLES = """\
examples (run with the virtual environment's python, .venv/bin/python, after make install):
  .venv/bin/python -m companion train --preset gpt2-tiny --data shakespeare --out runs/shakespeare
      300 steps of a character-level GPT (about 2 minutes on a laptop CPU), checkpoints in runs/shakespeare
  .venv/bin/python -m companion sample --checkpoint runs/shakespeare --prompt "ROMEO:"
      continue a prompt with the model just trained
  .venv/bin/python -m companion train --preset gpt2-tiny --data shakespeare --out runs/shakespeare \\
      --resume runs/shakespeare --steps 600
      continue that run to step 600 (a run folder holds one run; --force keeps an old one aside)
  .venv/bin/python -m companion train --preset seq2seq-tiny --data bible-en-fr --out runs/fr
      an encoder-decoder translator (about 4 minutes); then: translate --checkpoint runs/fr --prompt "In the beginning"
Without --out nothing is saved; --out '' is refused (it names no folder).
"""


class _ExamplesHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows an option's default once (``HelpFormatter``) and keeps the examples' line breaks."""


def add_subcommands(sub) -> None:
    """Register ``train`` and ``sample`` on an ``argparse`` subparsers object."""
    t = sub.add_parser(
        "train", help=COMMANDS["train"],
        description="Train a model on a corpus. Defaults come from --profile; every option below overrides them. "
                    "Under torchrun the same command trains with DDP (or FSDP2 with --parallel fsdp).",
        formatter_class=_ExamplesHelpFormatter, epilog=TRAIN_EXAMPLES,
    )
    t.add_argument("--preset", required=True, help=f"model preset: one of {', '.join(_presets())} (base and "
                   "tiny, the library's names of the seq2seq ones, are accepted with a note)")
    t.add_argument("--data", required=True, help=f"corpus: one of {', '.join(DATASETS)}, or a path to a UTF-8 .txt file "
                   "(character-level; the last 10%% is the validation split)")
    t.add_argument("--profile", default=None, choices=("quick", "cpu", "gpu"),
                   help="settings for a short CPU run (quick, alias cpu) or a long run on one CUDA GPU (gpu); "
                        "default: $COMPANION_PROFILE, else quick")
    t.add_argument("--out", default=None, help="run directory for checkpoints (step-*/ and a 'latest' pointer); none if "
                   "omitted ('' is refused: it names no folder). A folder that holds another run is refused (continue it with --resume, or see --force)")
    t.add_argument("--force", action="store_true", help="start a new run in an --out folder that holds another run; "
                   "the old run's files are kept, moved into OUT/previous-N/ (see --delete-old)")
    t.add_argument("--delete-old", action="store_true", help="with --force: delete the run already in --out instead of "
                   "keeping it in OUT/previous-N/")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps (the budget; profile: quick 300, gpu 5000)")
    t.add_argument("--max-seconds", type=float, default=None, help="wall-clock guard: stop after the step that crosses it (0: none)")
    t.add_argument("--batch-size", type=int, default=None, help="sequences per micro-batch per process")
    t.add_argument("--context", type=int, default=None, help="tokens per training window (text corpora)")
    t.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    t.add_argument("--lr", type=float, default=None, help="peak learning rate")
    t.add_argument("--optimizer", default="adamw", choices=("adamw", "adam", "adam_l2", "torch_adamw"),
                   help="companion.training.optim's AdamW / Adam / Adam+L2, or torch's (fused on CUDA) AdamW")
    t.add_argument("--weight-decay", type=float, default=0.1, help="decoupled weight decay (norms and biases exempt)")
    t.add_argument("--schedule", default="cosine", choices=("cosine", "constant", "noam"), help="learning-rate schedule")
    t.add_argument("--warmup", type=int, default=0, help="linear warmup steps")
    t.add_argument("--grad-clip", type=float, default=1.0, help="clip the global gradient norm to this (0: no clipping)")
    t.add_argument("--label-smoothing", type=float, default=0.0, help="label smoothing epsilon (0.1 in the 2017 paper)")
    t.add_argument("--eval-every", type=int, default=None, help="evaluate on the validation split every N steps (and at the end)")
    t.add_argument("--log-every", type=int, default=10, help="record loss, tokens/s and lr every N steps")
    t.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (0: only at the end)")
    t.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"), help="auto: bf16 autocast on CUDA, fp32 on CPU")
    t.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="wrap the model in torch.compile (profile: gpu on)")
    t.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (profile: quick cpu, gpu the best present)")
    t.add_argument("--parallel", default="ddp", choices=("ddp", "fsdp"),
                   help="under torchrun: ddp (each process holds the whole model) or fsdp (FSDP2: each holds a shard of "
                        "every weight, gradient and optimizer state); one process: ignored")
    t.add_argument("--seed", type=int, default=None, help="seed of the initial weights and of the batch order "
                   "(default 0; with --resume, the resumed run's own seed)")
    t.add_argument("--max-words", type=int, default=None, help="Bible corpora: longest verse kept, in words (quick 12, gpu 48)")
    t.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a model config field, e.g. --set n_layers=4 --set d_model=128 (repeatable; JSON values)")
    t.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice; 1 is "
                   "often fastest for small models on a shared machine)")
    t.add_argument("--resume", default=None, help="checkpoint (run or step directory) to continue from, exactly; refused "
                   "if it was trained with another tokenizer or other hyper-parameters (lr, schedule, steps under cosine, ...)")
    t.add_argument("--override", action="store_true", help="with --resume: apply the changed hyper-parameters (lr, "
                   "schedule and its total steps, weight decay, betas) instead of refusing them; each is reported")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--no-memory-check", action="store_true", help="skip the estimate of the memory the run needs "
                   "(weights, gradients, optimizer state, activations, attention scores), which refuses a run that "
                   "cannot fit before anything is allocated")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser(
        "sample", help=COMMANDS["sample"],
        description="Load a checkpoint written by 'train' (weights, config and tokenizer) and continue a prompt. "
                    "The text printed is the prompt followed by its continuation, each token as it is drawn. "
                    "An encoder-decoder checkpoint is translated instead, as 'translate' does. " + CONTEXT_RULE,
        formatter_class=HelpFormatter,
    )
    s.add_argument("--checkpoint", required=True, help="run directory (its 'latest' step) or a step-* directory")
    s.add_argument("--prompt", required=True, help="text to continue or translate (token ids separated by spaces when the checkpoint has no tokenizer)")
    s.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate, past the model's context by a "
                   "sliding window (translation: the longest output, at most the model's max_len)")
    s.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 takes the argmax")
    s.add_argument("--top-k", type=int, default=None, help="sample among the k most probable tokens only")
    s.add_argument("--beam-size", type=int, default=None, help="encoder-decoder only (refused for a decoder): "
                   "beam width (default 4; 1: greedy)")
    s.add_argument("--alpha", type=float, default=None, help="encoder-decoder only (refused for a decoder): "
                   "length-penalty exponent (default 0.6)")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampler")
    s.add_argument("--device", default="cpu", help="device to run on: cpu, cuda, cuda:N or mps")
    s.set_defaults(func=cmd_sample)

    tr = sub.add_parser(
        "translate", help=COMMANDS["translate"],
        description="Load an encoder-decoder checkpoint written by 'train --preset seq2seq-...' (for example on "
                    "--data bible-en-fr) and print the translation of --prompt: beam search (--beam-size 1: "
                    "greedy), the best non-empty hypothesis. A decoder-only checkpoint continues text with "
                    "'sample' instead.",
        formatter_class=HelpFormatter,
    )
    tr.add_argument("--checkpoint", required=True, help="run directory (its 'latest' step) or a step-* directory")
    tr.add_argument("--prompt", required=True, help="sentence to translate (token ids separated by spaces when the "
                    "checkpoint has no tokenizer)")
    tr.add_argument("--max-new-tokens", type=int, default=200, help="the longest translation, in tokens (at most the "
                    "model's max_len)")
    tr.add_argument("--beam-size", type=int, default=None, help="beam width (default 4; 1: greedy)")
    tr.add_argument("--alpha", type=float, default=None, help="length-penalty exponent (default 0.6; 0: none)")
    tr.add_argument("--device", default="cpu", help="device to run on: cpu, cuda, cuda:N or mps")
    tr.set_defaults(func=cmd_sample, temperature=0.0, top_k=None, seed=0)
