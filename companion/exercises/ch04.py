"""Checkers for chapter 4's exercises (GPT: the prefix becomes the condition).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch04.shift``: ``fn(tokens (B, T)) -> (inputs (B, T - 1), targets (B, T - 1))``: position t of the
  inputs reads tokens 0..t and is graded on token t + 1.
- ``ch04.bits_per_char``: ``fn(logits (N, V), targets (N,), n_chars) -> float``: the summed negative
  log-likelihood of the N targets, in bits, divided by the n_chars characters those tokens spell.
- ``ch04.top_p_filter``: ``fn(logits (..., V), p) -> (..., V)``: the logits of the nucleus (the smallest
  set of most likely tokens whose probability reaches p) unchanged, every other logit -inf.
- ``ch04.answer_loss``: ``fn(logits (B, T, V), tokens (B, T), prompt_lengths (B,), lengths (B,)) -> ()``:
  the mean next-token cross-entropy over the answer tokens only; logits[:, t] predicts tokens[:, t + 1],
  and a target counts when prompt_lengths[b] <= t + 1 < lengths[b].

Each checker draws fresh inputs from the generator it is given, runs the learner's function and an
independent reference (``torch.nn.functional``, ``companion.inference.generate.filter_logits``,
``companion.training.losses``) and, on a mismatch, names the case and the typical mistake it matches.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.exercises import ExerciseFailed, call, compare, diagnose, register
from companion.inference.generate import filter_logits
from companion.training.losses import cross_entropy, prompt_mask


# --- ch04.shift --------------------------------------------------------------------------------


@register("ch04.shift")
def check_shift(fn, gen, report) -> None:
    for case, shape in [("one row of 6 tokens", (1, 6)), ("a batch (3, 10)", (3, 10)),
                        ("the shortest useful rows, (4, 2)", (4, 2))]:
        tokens = torch.randint(0, 50, shape, generator=gen)
        got = call(case, fn, tokens.clone())
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise ExerciseFailed(f"{case}: expected a pair (inputs, targets), got {type(got).__name__}")
        inputs, targets = got
        compare(case + ", inputs", inputs, tokens[:, :-1], atol=0, rtol=0)
        diagnose(case + ", targets", targets, tokens[:, 1:], {
            "the inputs: the targets must be the inputs moved one position left": tokens[:, :-1],
        }, atol=0, rtol=0)
        report.cases.append(case)


# --- ch04.bits_per_char ------------------------------------------------------------------------


@register("ch04.bits_per_char")
def check_bits_per_char(fn, gen, report) -> None:
    cases = [("8 character tokens (n_chars = N)", 8, 30, 8),
             ("20 BPE tokens spelling 57 characters", 20, 500, 57),
             ("100 tokens spelling 330 characters, sharp logits", 100, 200, 330)]
    for case, n, vocab, n_chars in cases:
        scale = 4.0 if "sharp" in case else 1.0
        logits = scale * torch.randn(n, vocab, generator=gen, dtype=torch.float64)
        targets = torch.randint(0, vocab, (n,), generator=gen)
        total = F.cross_entropy(logits, targets, reduction="sum").item()
        expected = total / (n_chars * math.log(2))
        got = call(case, fn, logits.clone(), targets.clone(), n_chars)
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, numbers.Real):
            raise ExerciseFailed(f"{case}: expected a number, got {type(got).__name__}")
        if not math.isclose(got, expected, rel_tol=1e-6):
            hints = {
                "bits per token (divided by N, not by n_chars)": total / (n * math.log(2)),
                "nats per character (not divided by ln 2)": total / n_chars,
                "nats per token": total / n,
            }
            hint = next((h for h, v in hints.items() if math.isclose(got, v, rel_tol=1e-6)), None)
            more = f" -- your result equals {hint}" if hint else ""
            raise ExerciseFailed(f"{case}: expected {expected:.6f} bits/char, got {got:.6f}{more}")
        report.cases.append(case)


# --- ch04.top_p_filter -------------------------------------------------------------------------


@register("ch04.top_p_filter")
def check_top_p_filter(fn, gen, report) -> None:
    cases = [("logits (10,), p = 0.9", (10,), 0.9, 1.0),
             ("logits (4, 50), p = 0.5", (4, 50), 0.5, 2.0),
             ("a peaked row (3, 20) whose top token alone exceeds p = 0.3", (3, 20), 0.3, 6.0),
             ("p = 1 keeps everything, (2, 7)", (2, 7), 1.0, 1.0)]
    for case, shape, p, scale in cases:
        logits = scale * torch.randn(*shape, generator=gen)
        expected = filter_logits(logits, 1.0, None, p)
        got = call(case, fn, logits.clone(), p)
        probs = torch.softmax(logits, -1)
        sorted_p, order = probs.sort(-1, descending=True)
        strict = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, sorted_p.cumsum(-1) > p)
        unsorted = probs.cumsum(-1) - probs >= p
        diagnose(case, got, expected, {
            "the logits unfiltered: every token outside the nucleus must become -inf": logits,
            "dropping the token that crosses p (keep only while the cumulative sum <= p): the nucleus "
            "must reach p, and is never empty": logits.masked_fill(strict, float("-inf")),
            "a cumulative sum in vocabulary order: sort the probabilities first": logits.masked_fill(
                unsorted, float("-inf")),
        })
        report.cases.append(case)


# --- ch04.answer_loss --------------------------------------------------------------------------


@register("ch04.answer_loss")
def check_answer_loss(fn, gen, report) -> None:
    cases = [("one row: prompt 3, length 7, T = 7", [3], [7], 7),
             ("three rows with padding, T = 9", [2, 4, 1], [9, 6, 5], 9),
             ("a row whose answer is one token", [5, 2], [6, 8], 8)]
    for case, prompts, lengths, T in cases:
        B, V = len(prompts), 13
        logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64)
        tokens = torch.randint(0, V, (B, T), generator=gen)
        answer = prompt_mask(prompts, lengths, T)          # True on answer tokens
        expected = cross_entropy(logits[:, :-1], tokens[:, 1:], loss_mask=answer[:, 1:])
        got = call(case, fn, logits.clone(), tokens.clone(), torch.tensor(prompts), torch.tensor(lengths))
        real = prompt_mask([0] * B, lengths, T)
        diagnose(case, got, expected, {
            "the loss over every real token, prompt included": cross_entropy(
                logits[:, :-1], tokens[:, 1:], loss_mask=real[:, 1:]),
            "a mask not shifted with the targets (logits[:, t] predicts token t + 1)": cross_entropy(
                logits[:, :-1], tokens[:, 1:], loss_mask=answer[:, :-1]),
        }, atol=1e-9, rtol=1e-9)
        report.cases.append(case)
