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
import math
import os
import sys
from dataclasses import fields
from pathlib import Path

__all__ = ["add_subcommands", "DATASETS", "PROFILES", "build_run", "sample_lm", "slide", "crop_prompt", "cmd_train",
           "cmd_sample", "HelpFormatter", "COMMANDS", "CONTEXT_RULE", "check_threads"]

# torch is imported inside the functions that need it: `python -m companion --help` imports none of it.
COMMANDS = {  # the one-line help of each command, shown by `python -m companion --help`
    "train": "train a model of the book on a corpus, with checkpoints",
    "sample": "continue a prompt with a trained (decoder) checkpoint, streaming the text",
    "translate": "translate a sentence with a trained encoder-decoder (seq2seq) checkpoint",
}
CONTEXT_RULE = ("A prompt longer than the model's context is cropped to its last context-length tokens (a note on "
                "stderr says so); generation then goes on past the context by sliding the window (each new token "
                "sees the last context-length tokens) until --max-new-tokens tokens or a stop token. Any other "
                "early stop is reported on stderr.")


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


def rough_weight_bytes(config) -> int:
    """float32 bytes of a config's weights, from its sizes alone (12 d^2 per block, the embeddings):
    for a model too large even to describe on the meta device."""
    d = getattr(config, "d_model", None) or getattr(config, "n_embd", 0)
    layers = (getattr(config, "n_layers", None) or getattr(config, "n_layer", None)
              or getattr(config, "n_encoder_layers", 0) + getattr(config, "n_decoder_layers", 0))
    vocab = getattr(config, "vocab_size", None) or getattr(config, "src_vocab_size", 0) + getattr(config, "tgt_vocab_size", 0)
    return 4 * (12 * int(layers) * int(d) ** 2 + int(vocab) * int(d))


def check_threads(threads: int) -> int:
    """``--threads``: at least 1 and at most 4 per CPU core; torch crashes (a segfault) when asked for
    100,000 threads, and more threads than cores only slow a run down."""
    most = 4 * (os.cpu_count() or 1)
    if threads < 1:
        raise ValueError(f"--threads must be >= 1; got {threads}")
    if threads > most:
        raise ValueError(f"--threads must be at most {most} (4 per CPU core of this machine); got {threads}")
    return threads


def _overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set takes FIELD=VALUE; got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _check_overrides(overrides: dict, config_cls: type) -> None:
    """Each --set names a field of ``config_cls`` and gives a value of the field's type (the field
    annotations, e.g. "int | None"): --set d_model=abc is a one-line error, not a traceback later."""
    known = {f.name: str(f.type) for f in fields(config_cls)}
    takes = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "None": lambda v: v is None,
    }
    for key, value in overrides.items():
        if key not in known:
            raise ValueError(f"--set {key}=...: {config_cls.__name__} has no field {key!r} (fields: {', '.join(known)})")
        kinds = [t.strip() for t in known[key].split("|")]
        if all(k in takes for k in kinds) and not any(takes[k](value) for k in kinds):
            raise ValueError(f"--set {key}={json.dumps(value)}: {key} takes {known[key]}; got {value!r}")


def _read_corpus(path: Path) -> str:
    """A .txt corpus as text; a binary or non-UTF-8 file is a ValueError naming it."""
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise ValueError(f"--data {path}: the file is binary (it contains NUL bytes), not UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--data {path} is not UTF-8 text: byte {e.start} (0x{raw[e.start]:02x}) cannot be decoded; "
                         "convert it first (e.g. iconv -t UTF-8)") from None


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
    except KeyboardInterrupt:  # Ctrl-C: no traceback; say where the run stands and how to go on
        if trainer.rank == 0:
            print(_interrupted(args, trainer.step), file=sys.stderr)
        return 130
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


def _interrupted(args, step: int) -> str:
    """The line train prints on Ctrl-C: the step reached and the checkpoint to resume from."""
    head = f"train: interrupted at step {step}"
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


def sample_lm(model, ids: list[int], max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
              seed: int = 0) -> list[int]:
    """Append ``max_new_tokens`` sampled ids to ``ids`` (temperature 0: argmax), cropping to the model's context.

    Each token is drawn by ``companion.inference.generate.sample`` (the same temperature and top-k
    filters as ``generate``) from the logits of the last ``context_length`` tokens: unlike ``generate``,
    this keeps going past the context by sliding the window, so it recomputes the window every step.
    Settings are checked by ``SamplingParams`` (ValueError naming the field)."""
    from companion.inference.generate import SamplingParams

    if not ids:
        raise ValueError("the prompt must contain at least one token")
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed)
    return list(ids) + list(slide(model, ids, params.max_new_tokens, params, params.generator()))


def slide(model, ids: list[int], n: int, params, generator=None):
    """Yield up to ``n`` new token ids after ``ids``, each drawn by ``generate.sample`` from the logits of
    the last ``context_length`` tokens (the window slides past the context; no cache, so every step
    recomputes the window). Stops early only after one of ``params.stop_tokens``."""
    import torch

    from companion.inference.generate import context_length, sample

    context = context_length(model)
    device = next(model.parameters()).device
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([out[-context:]], device=device))[0, -1].float().cpu()  # (V,)
            token = sample(logits, params, generator)
            out.append(token)
            yield token
            if token in params.stop_tokens:
                return


def crop_prompt(prompt: list[int], context: int) -> list[int]:
    """The last ``context`` tokens of ``prompt``, with a note on stderr when that drops some (``CONTEXT_RULE``)."""
    if len(prompt) > context:
        print(f"note: the prompt has {len(prompt)} tokens, more than the model's context of {context}; "
              f"the model sees only its last {context} tokens", file=sys.stderr)
    return prompt[-context:]


def cmd_sample(args) -> int:
    """``sample`` (continue a prompt, streamed) and ``translate`` (an encoder-decoder checkpoint)."""
    from companion.training.checkpoint import load_model, load_tokenizer, model_kind
    from companion.training.trainer import check_device

    translating = args.command == "translate"
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0; got {args.max_new_tokens}")
    if args.beam_size is not None and args.beam_size < 1:
        raise ValueError(f"--beam-size must be >= 1; got {args.beam_size}")
    if not translating and not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be >= 0 and finite; got {args.temperature}")
    if args.alpha is not None and not (math.isfinite(args.alpha) and args.alpha >= 0):
        raise ValueError(f"--alpha must be >= 0 and finite (the length-penalty exponent; 0: none); got {args.alpha}")
    model = load_model(args.checkpoint, device=check_device(args.device or "cpu"))
    tokenizer = load_tokenizer(args.checkpoint)
    seq2seq = model_kind(model) == "seq2seq"
    if translating and not seq2seq:
        raise ValueError(f"translate needs an encoder-decoder (seq2seq) checkpoint; {args.checkpoint} holds a "
                         f"decoder-only model, which continues text: python -m companion sample --checkpoint "
                         f"{args.checkpoint} --prompt TEXT")
    if not seq2seq:
        given = [f"--{name.replace('_', '-')}" for name in ("beam_size", "alpha") if getattr(args, name) is not None]
        if given:  # a decoder samples: a beam setting would be ignored
            raise ValueError(f"{' and '.join(given)} apply to encoder-decoder checkpoints (translate); "
                             f"{args.checkpoint} holds a decoder-only model, which samples (see --temperature, "
                             "--top-k): drop " + " and ".join(given))
    if tokenizer is not None:
        prompt = tokenizer.encode(args.prompt)
    else:
        try:
            prompt = [int(t) for t in args.prompt.split()]
        except ValueError:
            raise ValueError("this checkpoint has no tokenizer (synthetic data): --prompt must be space-separated token ids") from None
    if seq2seq:
        if not translating:
            print(f"note: {args.checkpoint} is an encoder-decoder checkpoint: sample translates the prompt, as "
                  "python -m companion translate does (the command's own name)", file=sys.stderr)
        out = _translate(model, tokenizer, prompt, args)
        sys.stdout.write(out + "\n")
        return 0
    if not prompt:
        raise ValueError("--prompt must hold at least one token; got an empty prompt")
    crop_prompt(prompt, model.config.context_length)  # the note; slide's window does the cropping
    # Streamed: the prompt, then each token as it is drawn (a long sample shows text from the first token)
    show = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else (lambda ids: " ".join(map(str, ids)))
    sep = "" if tokenizer is not None else " "
    sys.stdout.write(show(prompt))
    sys.stdout.flush()
    from companion.inference.generate import SamplingParams

    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            seed=args.seed)
    for tok in slide(model, prompt, params.max_new_tokens, params, params.generator()):
        sys.stdout.write(sep + show([tok]))
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _translate(model, tokenizer, prompt: list[int], args) -> str:
    """The translation ``translate`` prints: greedy (--beam-size 1) or beam search, the best hypothesis
    that is not empty (a wide beam keeps the end token as a first token, whose empty hypothesis can
    score best under the length penalty; a note says when that happened)."""
    import torch

    from companion.inference.translate import beam_search_one, greedy_decode

    beam_size = 4 if args.beam_size is None else args.beam_size
    alpha = 0.6 if args.alpha is None else args.alpha
    specials = tokenizer.special_tokens if tokenizer is not None else {"<bos>": 1, "<eos>": 2}
    if len(prompt) > model.config.max_len:
        print(f"note: the prompt has {len(prompt)} tokens, more than the model's max_len of {model.config.max_len}; "
              f"only its first {model.config.max_len} are translated", file=sys.stderr)
    src = torch.tensor([prompt[: model.config.max_len]], device=next(model.parameters()).device)
    max_len = min(model.config.max_len, args.max_new_tokens)
    if beam_size == 1:
        hyp = greedy_decode(model, src, specials["<bos>"], specials["<eos>"], max_len)[0]
    else:
        hyps = beam_search_one(model, src, specials["<bos>"], specials["<eos>"], beam_size, alpha, max_len)
        hyp = next((h for h in hyps if h.tokens), hyps[0])
        if not hyps[0].tokens and hyp.tokens:
            print(f"note: the best-scoring hypothesis of --beam-size {beam_size} is empty (the end token first); "
                  "the best non-empty one is printed", file=sys.stderr)
        elif not hyp.tokens:
            print(f"note: every hypothesis of --beam-size {beam_size} is empty (the model puts the end token "
                  "first): the translation is empty", file=sys.stderr)
    out = tokenizer.decode(hyp.tokens) if tokenizer is not None else " ".join(map(str, hyp.tokens))
    if len(hyp.tokens) >= max_len < args.max_new_tokens:
        print(f"note: the translation stopped at {len(hyp.tokens)} tokens without an end token: that is the "
              f"model's max_len ({model.config.max_len}), fewer than --max-new-tokens {args.max_new_tokens}",
              file=sys.stderr)
    return out


def add_subcommands(sub) -> None:
    """Register ``train`` and ``sample`` on an ``argparse`` subparsers object."""
    t = sub.add_parser(
        "train", help=COMMANDS["train"],
        description="Train a model on a corpus. Defaults come from --profile; every option below overrides them. "
                    "Under torchrun the same command trains with DDP (or FSDP2 with --parallel fsdp).",
        formatter_class=HelpFormatter,
    )
    t.add_argument("--preset", required=True, help=f"model preset: one of {', '.join(_presets())} (base and "
                   "tiny, the library's names of the seq2seq ones, are accepted with a note)")
    t.add_argument("--data", required=True, help=f"corpus: one of {', '.join(DATASETS)}, or a path to a UTF-8 .txt file "
                   "(character-level; the last 10%% is the validation split)")
    t.add_argument("--profile", default=None, choices=("quick", "cpu", "gpu"),
                   help="settings for a short CPU run (quick, alias cpu) or a long run on one CUDA GPU (gpu); "
                        "default: $COMPANION_PROFILE, else quick")
    t.add_argument("--out", default=None, help="run directory for checkpoints (step-*/ and a 'latest' pointer); none if "
                   "omitted. A folder that holds another run is refused (continue it with --resume, or see --force)")
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
