"""The ``sample`` and ``translate`` commands of ``python -m companion`` (their options are registered by
``companion.training.cli.add_subcommands``), and the sliding-window sampler they and ``generate`` use.

- ``cmd_sample(args)``: ``sample`` (continue a prompt, streamed) and ``translate`` (beam search).
- ``sample_lm(model, ids, max_new_tokens, temperature, top_k, seed) -> list[int]``: sampling with
  ``generate``'s filters, sliding the context window past the model's context.
- ``slide(model, ids, n, params, generator)``: the sliding window, one token at a time.
- ``crop_prompt(prompt, context)``: the prompt's last ``context`` tokens, with a note when cropped.
- ``load_for_sampling(path, device)``: a checkpoint of ``train --out``, or a decoder-only reference model
  of ``data/reference/`` (``companion.data.reference``).
- ``CONTEXT_RULE``: the sentence the commands' help uses to say all this.
"""

from __future__ import annotations

import math
import sys

MAX_ALPHA = 10.0  # ((5 + length) / 6) ** alpha overflows a float past this for the longest translations

__all__ = ["cmd_sample", "sample_lm", "slide", "crop_prompt", "load_for_sampling", "CONTEXT_RULE"]

CONTEXT_RULE = ("A prompt longer than the model's context is cropped to its last context-length tokens (a note on "
                "stderr says so); generation then goes on past the context by sliding the window (each new token "
                "sees the last context-length tokens) until --max-new-tokens tokens or a stop token. Any other "
                "early stop is reported on stderr.")



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


def load_for_sampling(path, device="cpu"):
    """(model in eval mode, tokenizer or None) from a checkpoint written by ``train --out`` or from one of
    the book's decoder-only reference models under ``data/reference/`` (``companion.data.reference``'s
    format: config.json, float16 model.safetensors, tokenizer.json, info.json and SHA256SUMS.json,
    verified against the digests committed with that module)."""
    from pathlib import Path

    from companion.training.checkpoint import load_model, load_tokenizer

    folder = Path(path)
    if (folder / "SHA256SUMS.json").is_file() and (folder / "info.json").is_file() and \
            not (folder / "manifest.json").exists():
        from companion.data.reference import DIGESTS, load_gpt_reference

        if folder.name in DIGESTS and (folder / "tokenizer.json").is_file():
            ref = load_gpt_reference(folder.name, root=folder.parent)
            return ref.model.to(device).eval(), ref.tok
        raise ValueError(
            f"--checkpoint {path} is a reference model of the book (companion.data.reference's format: separate "
            "source and target tokenizers, float16 weights, digests committed with that module), not a checkpoint "
            f"of train --out: load it in Python with companion.data.reference.load_reference({folder.name!r})")
    return load_model(path, device=device), load_tokenizer(path)


def cmd_sample(args) -> int:
    """``sample`` (continue a prompt, streamed) and ``translate`` (an encoder-decoder checkpoint)."""
    from companion.training.checkpoint import model_kind
    from companion.training.trainer import check_device

    translating = args.command == "translate"
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0; got {args.max_new_tokens}")
    if args.beam_size is not None and args.beam_size < 1:
        raise ValueError(f"--beam-size must be >= 1; got {args.beam_size}")
    if not translating and not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be >= 0 and finite; got {args.temperature}")
    if args.alpha is not None and not (math.isfinite(args.alpha) and 0 <= args.alpha <= MAX_ALPHA):
        raise ValueError(f"--alpha must be in [0, {MAX_ALPHA:g}] (the length-penalty exponent; 0: none; a larger one "
                         f"overflows the beam's scores); got {args.alpha}")
    model, tokenizer = load_for_sampling(args.checkpoint, check_device(args.device or "cpu"))
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
        if args.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1 to translate (the translation's tokens, its end token "
                             f"included); got {args.max_new_tokens}")
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
