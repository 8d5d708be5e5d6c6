"""Synthetic sequence tasks: small problems a tiny Transformer must solve exactly (smoke tests, exercises).

What this module provides
- ``SPECIALS``: the reserved ids shared by every task: PAD = 0, BOS = 1, EOS = 2, SEP = 3; ordinary
  symbols are 4 .. vocab_size - 1.
- ``TASKS``: ``copy`` (y = x), ``reverse`` (y = x read backwards) and ``sort`` (y = sorted x).
- ``make_pairs(task, n, vocab_size, min_len, max_len, seed) -> list[(x, y)]``: random instances as
  id lists, ready for ``companion.data.batching.pair_batches`` (encoder-decoder models).
- ``to_lm(pairs) -> (sequences, loss_masks)``: the decoder-only form ``x SEP y EOS`` with a loss mask
  that is False on the prompt ``x SEP`` and True on ``y EOS`` (what an SFT loss trains on; see
  ``companion.training.losses.cross_entropy``).

Why these three: copying needs only attention to a fixed offset, reversing needs position arithmetic,
and sorting needs content-based attention (find the next-smallest symbol), so they probe different
abilities of a model at the cost of a few hundred training steps on a CPU.
"""

from __future__ import annotations

import random

__all__ = ["PAD", "BOS", "EOS", "SEP", "SPECIALS", "TASKS", "make_pairs", "to_lm"]

PAD, BOS, EOS, SEP = 0, 1, 2, 3
SPECIALS = {"<pad>": PAD, "<bos>": BOS, "<eos>": EOS, "<sep>": SEP}

TASKS = {
    "copy": lambda x: list(x),
    "reverse": lambda x: list(reversed(x)),
    "sort": lambda x: sorted(x),
}


def make_pairs(
    task: str, n: int, vocab_size: int = 16, min_len: int = 1, max_len: int = 8, seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """``n`` random (x, y) instances of ``task``: x has a uniform length in [min_len, max_len] and
    symbols uniform in [len(SPECIALS), vocab_size)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}; got {task!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    if vocab_size <= len(SPECIALS):
        raise ValueError(f"vocab_size must be > {len(SPECIALS)} (ids 0..{len(SPECIALS) - 1} are special); got {vocab_size}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"min_len and max_len must satisfy 1 <= min_len <= max_len; got {min_len}, {max_len}")
    rng = random.Random(seed)
    rule = TASKS[task]
    pairs = []
    for _ in range(n):
        x = [rng.randrange(len(SPECIALS), vocab_size) for _ in range(rng.randint(min_len, max_len))]
        pairs.append((x, rule(x)))
    return pairs


def to_lm(pairs: list[tuple[list[int], list[int]]]) -> tuple[list[list[int]], list[list[bool]]]:
    """Decoder-only sequences ``x SEP y EOS`` and their loss masks (False on ``x SEP``, True on ``y EOS``).

    The mask is aligned with the sequence; for next-token training shift both by one, as
    ``companion.training.losses`` documents: position t predicts token t + 1, counted when mask[t + 1] is True.
    """
    if not pairs:
        raise ValueError("pairs must not be empty")
    sequences, masks = [], []
    for x, y in pairs:
        sequences.append([*x, SEP, *y, EOS])
        masks.append([False] * (len(x) + 1) + [True] * (len(y) + 1))
    return sequences, masks
