"""The command line: ``python -m companion <command>``.

Commands
- ``generate``: sample from a model, streaming tokens as they come.
    python -m companion generate --preset llama-like --prompt "Once upon" --max-new-tokens 20 --cache paged
  ``--checkpoint DIR`` loads a ``companion.training.checkpoint`` directory (config.json, model.safetensors and
  the tokenizer saved with it); without it the preset's random weights are used and text prompts are
  encoded as UTF-8 bytes (ids 0..255, the toy models' vocabulary). ``--ids`` takes token ids.
- ``bench-serve``: engine (continuous batching) versus one-request-at-a-time throughput.
- ``train`` / ``sample`` / ``translate``: train a model on a corpus with checkpoints; continue a prompt with
  a decoder checkpoint (streamed), or translate with an encoder-decoder one (``companion.training.cli``;
  ``python -m companion train --help``).
Output piped into a program that stops reading (``| head``) ends the command quietly; Ctrl-C ends it with
one line (train: the step reached and how to resume), exit status 130; SIGTERM the same way, exit 143.
- ``course``: cut a course from the book's chapters (``companion.course``; ``python -m companion course --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from companion.training.cli import COMMANDS, CONTEXT_RULE, SEQ2SEQ_PREFIX, HelpFormatter, Terminated, check_threads

# the packages the commands import (pyproject.toml): one missing is a line saying how to install them
DEPENDENCIES = ("torch", "numpy", "safetensors", "tqdm", "matplotlib")
DEFAULT_PRESET, DEFAULT_PROMPT = "llama-like", "Hello"  # generate's, when neither --checkpoint nor --ids is given

# torch and the models are imported inside the commands: `python -m companion --help` loads none of them.


def _load_model(args):
    """(model, tokenizer or None): from a checkpoint (``companion.training.checkpoint``) or a preset's random weights."""
    import torch

    from companion.models import SEQ2SEQ_PRESETS, from_preset

    if args.checkpoint:
        from companion.training.cli_sample import load_for_sampling

        if args.preset is not None:  # the checkpoint's config.json gives the model: a preset would be ignored
            raise ValueError(f"--preset {args.preset} and --checkpoint {args.checkpoint}: pass one of them (the "
                             "checkpoint's config.json gives its model; --preset builds random weights)")
        return load_for_sampling(args.checkpoint)  # a reference model of data/reference/ too
    args.preset = args.preset or DEFAULT_PRESET
    name = args.preset[len(SEQ2SEQ_PREFIX):] if args.preset.startswith(SEQ2SEQ_PREFIX) else args.preset
    if name in SEQ2SEQ_PRESETS:  # refused before its weights are built
        raise ValueError(f"--preset {args.preset} is an encoder-decoder (translation) preset; generate continues a "
                         "prompt with a decoder-only model (a decoder preset such as llama-like, or gpt2-tiny). To "
                         f"translate: python -m companion train --preset {SEQ2SEQ_PREFIX}{name} --data bible-en-fr "
                         "--out RUN_DIR, then python -m companion translate --checkpoint RUN_DIR --prompt TEXT")
    torch.manual_seed(args.seed if args.seed is not None else 0)
    return from_preset(args.preset).eval(), None  # any family: the name says which


def cmd_generate(args) -> int:
    import torch

    from companion.inference.generate import SamplingParams, check_decoder, context_length, generate
    from companion.training.cli import crop_prompt, slide

    if args.kv_bits is not None and args.cache != "paged":
        raise ValueError(f"--kv-bits quantises the pages of --cache paged; got --cache {args.cache}")
    model, tokenizer = _load_model(args)
    check_decoder(model, f"generate --checkpoint {args.checkpoint}" if args.checkpoint else "generate")
    if args.ids is not None and args.prompt is not None:  # one would be ignored
        raise ValueError("--prompt and --ids: pass one of them (--prompt is text, --ids token ids)")
    if args.prompt is None:
        args.prompt = DEFAULT_PROMPT
    if args.ids is not None:  # --ids '' is an empty prompt, refused below, not the default --prompt
        try:
            prompt = [int(t) for t in args.ids.split()]
        except ValueError:
            raise ValueError(f"--ids must be token ids separated by spaces; got {args.ids!r}") from None
        if not prompt:
            raise ValueError("--ids must hold at least one token id; got none")
    elif tokenizer is not None:
        prompt = tokenizer.encode(args.prompt)
    else:
        prompt = list(args.prompt.encode("utf-8"))
    if not prompt:
        raise ValueError("--prompt must hold at least one token; got an empty prompt")
    generator = None if args.seed is None else torch.Generator().manual_seed(args.seed)  # shared with the sliding part
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        stop_tokens=tuple(args.stop), seed=generator,
    )
    as_bytes = tokenizer is None and model.config.vocab_size == 256 and not args.ids
    if not args.checkpoint:
        print(f"note: {args.preset} has random weights (no --checkpoint), so the output is noise; "
              + ("bytes outside printable ASCII are shown as \\xNN" if as_bytes else "token ids are shown"),
              file=sys.stderr)

    def show(tok: int) -> str:
        if tokenizer is not None and not args.ids:
            return tokenizer.decode([tok])
        return printable_byte(tok) if as_bytes else f"{tok} "

    tty = sys.stdout.isatty()
    if not args.ids:  # the prompt, echoed; in a terminal the generated text that follows is bold
        if as_bytes:
            sys.stdout.write("".join(map(printable_byte, prompt)))
        else:
            sys.stdout.write(tokenizer.decode(prompt) if tokenizer is not None else args.prompt)
    if tty:
        sys.stdout.write("\033[1m")
    cropped = crop_prompt(prompt, context_length(model))
    new: list[int] = []
    try:
        for step in generate(model, [cropped], params, cache=args.cache, page_size=args.page_size,
                             kv_bits=args.kv_bits, stream_tokens=True):
            for _, tok in step:
                new.append(tok)
                sys.stdout.write(show(tok))
                sys.stdout.flush()
        stopped = bool(new) and new[-1] in params.stop_tokens
        if len(new) < params.max_new_tokens and not stopped:  # the context is full: slide the window on
            for tok in slide(model, cropped + new, params.max_new_tokens - len(new), params, generator):
                new.append(tok)
                sys.stdout.write(show(tok))
                sys.stdout.flush()
    finally:
        if tty:
            sys.stdout.write("\033[0m")
    sys.stdout.write("\n")
    sys.stdout.flush()
    if new and new[-1] in params.stop_tokens:
        why = f"stop token {new[-1]}"
    elif len(new) >= params.max_new_tokens:
        why = f"--max-new-tokens {params.max_new_tokens}"
    else:
        why = f"stopped early, before --max-new-tokens {params.max_new_tokens}"
    echoed = "the prompt is not echoed (--ids)" if args.ids else "the prompt is echoed first"
    print(f"generate: {len(new)} tokens generated after the {len(prompt)}-token prompt ({why}); {echoed}",
          file=sys.stderr)
    return 0


def printable_byte(b: int) -> str:
    """One byte for a terminal: printable ASCII and newlines as they are, anything else as ``\\xNN``
    (random weights produce control bytes that would otherwise move the cursor or ring the bell)."""
    return chr(b) if 32 <= b < 127 or b == 10 else f"\\x{b:02x}"


BENCH_CONTEXT = 512  # bench-serve's model context (its prompts are 16 to 64 tokens)
BENCH_PROMPTS = (16, 64)
# What each of bench-serve's sizes can mean: a benchmark of the book's models that ends in minutes on a
# CPU (--n-layers 1000 ran 580 s without a word). The widest and deepest are GPT-2 XL's 48 layers and
# 1600 wide; the rest follow from the context.
BENCH_LIMITS = {"d_model": 1600, "n_layers": 48, "requests": 256, "new_tokens": BENCH_CONTEXT, "page_size": BENCH_CONTEXT}
BENCH_WHY = {"d_model": "GPT-2 XL's width is the widest it serves", "n_layers": "GPT-2 XL's 48 layers are the deepest",
             "requests": "enough to fill the batch many times over", "new_tokens": "the model's context",
             "page_size": "a page holds at most the model's context"}


def bench_model_sizes(preset: str, d_model: int, n_layers: int, context: int) -> dict:
    """bench-serve's --d-model / --n-layers and its context in the field names of ``preset``'s family
    (a GPT calls them n_embd, n_layer and block_size; a Decoder d_model, n_layers and max_seq_len)."""
    from companion.models import GPT_PRESETS, PRESETS, SEQ2SEQ_PRESETS

    if preset in GPT_PRESETS:
        return {"n_embd": d_model, "n_layer": n_layers, "block_size": context}
    if preset in PRESETS:
        return {"d_model": d_model, "n_layers": n_layers, "max_seq_len": context}
    name = preset[len(SEQ2SEQ_PREFIX):] if preset.startswith(SEQ2SEQ_PREFIX) else preset
    if name in SEQ2SEQ_PRESETS:
        raise ValueError(f"--preset {preset} is an encoder-decoder (translation) preset; bench-serve serves "
                         "decoder-only models (llama-like, ..., gpt2-tiny)")
    raise ValueError(f"--preset must be one of {[*PRESETS, *GPT_PRESETS]}; got {preset!r}")


def serve_memory(model, n_requests: int, context: int) -> int:
    """Rough bytes bench-serve needs (float32): the weights, and the engine's page pool, which holds
    ``context`` tokens of keys and values per request and layer (at most d_model wide each)."""
    from companion.training.memory import _shape

    layers, d, _, _ = _shape(model)
    weights = 4 * sum(p.numel() for p in model.parameters())
    return weights + 4 * 2 * layers * d * n_requests * context


def cmd_bench_serve(args) -> int:
    import torch

    from companion.engine.bench import serve_benchmark
    from companion.models import from_preset
    from companion.training.memory import available_bytes, human

    torch.set_num_threads(check_threads(args.threads))
    if args.d_model is None:  # 128, or 16 per head where the preset's head count does not divide 128 (gpt2: 192)
        from companion.models import preset_config

        name = args.preset[len(SEQ2SEQ_PREFIX):] if args.preset.startswith(SEQ2SEQ_PREFIX) else args.preset
        try:
            config = preset_config(name)
        except ValueError:
            config = None  # an unknown preset: refused by bench_model_sizes below
        heads = getattr(config, "n_head", None) or getattr(config, "n_heads", None) or 1
        args.d_model = 128 if 128 % heads == 0 else 16 * heads
    for name in ("d_model", "n_layers", "requests", "new_tokens", "page_size"):
        value, most = getattr(args, name), BENCH_LIMITS[name]
        if not 1 <= value <= most:
            raise ValueError(f"--{name.replace('_', '-')} must be in [1, {most}] ({BENCH_WHY[name]}); got {value}")
    sizes = bench_model_sizes(args.preset, args.d_model, args.n_layers, BENCH_CONTEXT)
    try:
        with torch.device("meta"):  # shapes only: the memory estimate comes before any allocation
            shape = from_preset(args.preset, **sizes)
    except RuntimeError as e:  # "Storage size calculation overflowed": too large to describe at all
        raise ValueError(f"--d-model {args.d_model} --n-layers {args.n_layers}: the model is too large to build "
                         f"({e}); lower --d-model or --n-layers") from None
    except ValueError as e:  # e.g. a width its heads do not divide
        raise ValueError(f"--preset {args.preset} --d-model {args.d_model} --n-layers {args.n_layers}: {e}") from None
    need, available = serve_memory(shape, args.requests, BENCH_CONTEXT), available_bytes("cpu")
    del shape
    if available is not None and need > available:
        raise ValueError(f"--d-model {args.d_model} --n-layers {args.n_layers} --requests {args.requests}: serving "
                         f"needs about {human(need)} of memory (float32 weights and the engine's KV pages, "
                         f"{BENCH_CONTEXT} tokens per request), more than the {human(available)} available here; "
                         "lower --d-model, --n-layers or --requests")
    lo, hi = BENCH_PROMPTS
    if hi + args.new_tokens > BENCH_CONTEXT:
        print(f"note: the model's context is {BENCH_CONTEXT} tokens and the prompts have {lo} to {hi}: a request "
              f"stops at the context before its --new-tokens {args.new_tokens} (generated_tokens counts the tokens "
              "generated, stopped_at_context the requests cut short)", file=sys.stderr)
    torch.manual_seed(0)
    model = from_preset(args.preset, **sizes).eval()
    r = serve_benchmark(model, n_requests=args.requests, new_tokens=args.new_tokens, page_size=args.page_size,
                        prompt_range=BENCH_PROMPTS)
    print(json.dumps(r, indent=2))
    return 0


EXAMPLES = """\
examples:
  python -m companion generate --prompt "Once upon" --max-new-tokens 20
      sample from the llama-like preset (random weights: the output is noise)
  python -m companion generate --checkpoint RUN_DIR --prompt "ROMEO:"
      sample from a checkpoint written by `train --out RUN_DIR`, with its tokenizer
  python -m companion bench-serve --requests 16 --new-tokens 32
      continuous batching versus one request at a time, as JSON
  python -m companion train --help
      train a model on a corpus, with checkpoints (then: sample, or translate for seq2seq-* presets)
  python -m companion course --chapters 1-3 --student --out course/
      a student edition of chapters 1 to 3 (solutions replaced by stubs), as its own site

Each command has its own --help.
"""


class _HelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows an option's default once (``companion.training.cli.HelpFormatter``), and keeps the examples'
    line breaks."""


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The command line's parser; train, sample and translate get their full options only when ``argv``
    names one of them (building them imports the model presets)."""
    parser = argparse.ArgumentParser(
        prog="python -m companion", formatter_class=_HelpFormatter, epilog=EXAMPLES,
        description="The companion library's command line: generate text, benchmark serving, train and sample.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="generate tokens from a model", formatter_class=_HelpFormatter,
                       description="Sample from a model, streaming tokens as they come. Without --checkpoint the "
                                   "preset has random weights, so the output is noise; text prompts are then "
                                   "encoded as UTF-8 bytes (ids 0..255, the toy models' vocabulary). The prompt is "
                                   "echoed, then the generated text follows (bold in a terminal; with --ids only the "
                                   "generated ids are printed), and a line on stderr counts the tokens generated and "
                                   "says why they stopped. " + CONTEXT_RULE + " Decoder-only models: an "
                                   "encoder-decoder (seq2seq) checkpoint translates with 'sample'.")
    g.add_argument("--preset", default=None, help=f"decoder preset (default {DEFAULT_PRESET}; mistral-like, ..., "
                   "gpt2-tiny) with random weights; not the encoder-decoder presets seq2seq-base and seq2seq-tiny, "
                   "nor with --checkpoint")
    g.add_argument("--checkpoint", default=None, help="a companion.training.checkpoint run or step directory")
    g.add_argument("--prompt", default=None, help=f"text prompt (default {DEFAULT_PROMPT!r}; UTF-8 bytes as token "
                   "ids without a checkpoint)")
    g.add_argument("--ids", default=None, help="prompt as space-separated token ids instead of --prompt's text")
    g.add_argument("--max-new-tokens", type=int, default=32, help="how many tokens to generate (fewer only after a "
                   "--stop token), past the model's context by a sliding window")
    g.add_argument("--temperature", type=float, default=0.0, help="softmax temperature; 0 is greedy decoding")
    g.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens (None: all)")
    g.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling: the smallest set of tokens with this total probability")
    g.add_argument("--stop", type=int, nargs="*", default=[], help="stop token ids")
    g.add_argument("--seed", type=int, default=None, help="random seed for the weights and the sampling")
    g.add_argument("--cache", default="contiguous", choices=("none", "contiguous", "paged"),
                   help="KV cache: none (recompute), one contiguous buffer, or fixed-size pages")
    g.add_argument("--page-size", type=int, default=16, help="tokens per page of --cache paged")
    g.add_argument("--kv-bits", type=int, default=None, choices=(8, 4),
                   help="quantise the pages of --cache paged to 8 or 4 bits (None: full precision)")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench-serve", help="engine throughput versus sequential generation",
                       formatter_class=_HelpFormatter,
                       description="Serve the same requests with the engine (continuous batching) and one at a "
                                   "time, and print both throughputs as JSON. Timings depend on the machine and "
                                   "its load; compare the two numbers of one run, not numbers across runs.")
    b.add_argument("--preset", default="llama-like", help="decoder preset to build (random weights)")
    b.add_argument("--d-model", type=int, default=None, help="model width (default 128, or 16 per head when the "
                   "preset's head count does not divide 128: gpt2 192)")
    b.add_argument("--n-layers", type=int, default=4, help="number of decoder blocks")
    b.add_argument("--requests", type=int, default=16, help="number of requests served")
    b.add_argument("--new-tokens", type=int, default=32, help="tokens generated per request")
    b.add_argument("--page-size", type=int, default=16, help="tokens per KV-cache page")
    b.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads; one thread keeps the two numbers comparable on a busy machine "
                        "(CONTRIBUTING.md, 'Threads and determinism')")
    b.set_defaults(func=cmd_bench_serve)

    if argv[:1] in (["train"], ["sample"], ["translate"]):
        from companion.training.cli import add_subcommands

        add_subcommands(sub)  # train, sample, translate, with every option
    else:  # listed by --help; their options (which name the model presets) are built only when asked for
        for name, text in COMMANDS.items():
            sub.add_parser(name, help=text)

    sub.add_parser("course", help="cut a course: student/instructor editions, its own site, slides",
                   add_help=False)  # parsed by companion.course, whose --help explains every option
    return parser


def _main(argv: list[str]) -> int:
    parser = build_parser(argv)
    if argv[:1] == ["course"]:
        from companion.course import main as course_main

        return course_main(argv[1:])
    args = parser.parse_args(argv)
    from companion.data.sources import CorpusNotInstalled

    try:
        return args.func(args)
    except (ValueError, CorpusNotInstalled) as e:
        parser.exit(2, f"error: {e}\n")
    except BrokenPipeError:  # stdout closed by the reader (| head -c 50): stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would fail on the closed pipe again
        return 128 + 13  # what a shell reports for a program ended by SIGPIPE


def main(argv: list[str] | None = None) -> int:
    """The command line (``_main``), with the ways out that hold from the first line on: Ctrl-C or
    SIGTERM at any moment (start-up, imports and corpus loading included) end it with one line, exit
    130 or 143; a missing dependency (torch in a Python without the package's environment) is one
    line saying how to install it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else "companion"
    previous = _on_sigterm()
    try:
        return _main(argv)
    except KeyboardInterrupt as stop:  # outside train's own handling: one line, no traceback
        terminated = isinstance(stop, Terminated)
        print(f"{command}: {'terminated (SIGTERM)' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in DEPENDENCIES:
            raise
        print(f"error: {command} needs the package {e.name}, which this Python ({sys.executable}) does not have: "
              "install the companion package (make install, or pip install -e .) and run the virtual "
              "environment's python (.venv/bin/python -m companion ...)", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _on_sigterm():
    """Make SIGTERM raise ``Terminated`` (a KeyboardInterrupt) in the main thread, so that ``kill PID`` ends
    a command as Ctrl-C does (train says which checkpoint to resume from); returns the handler it replaced
    (None where it cannot be installed: another thread, no SIGTERM)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return None

    def terminate(signum, frame):
        raise Terminated()

    return signal.signal(signal.SIGTERM, terminate)


if __name__ == "__main__":
    sys.exit(main())
