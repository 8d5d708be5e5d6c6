"""Batches for the two kinds of training in the book: language modelling and sequence pairs.

What this module provides
- ``lm_batch(data, batch_size, context, generator)``: B random windows of a token stream, x (B, T)
  and the targets y (B, T) = x shifted left by one (y[b, t] = data[start_b + t + 1]).
- ``lm_eval_batches(data, batch_size, context)``: every non-overlapping window once, in order, for a
  deterministic validation loss.
- ``PairBatch`` and ``pair_batches(pairs, batch_size, ...)``: padded, length-bucketed (source, target)
  batches with the decoder input (BOS + target), the labels (target + EOS, padding = ``ignore_index``)
  and the masks of ``companion.attention``: ``src_mask`` (B, 1, 1, S) and ``tgt_mask`` (B, 1, T, T),
  boolean, True = may read.

Length bucketing: the pairs are shuffled (seeded), cut into pools of ``pool_batches * batch_size``
pairs, each pool is sorted by length and cut into batches, and the batches are shuffled again. Pairs
of similar length share a batch, so little compute is spent on padding, while the order of batches
stays random from epoch to epoch (``epoch`` enters the seed).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from companion.attention import causal_mask, padding_mask

__all__ = ["lm_batch", "lm_eval_batches", "PairBatch", "collate_pairs", "pair_batches", "IGNORE_INDEX"]

# The target id that counts for nothing (padding, prompts): PyTorch's default ignore_index.
IGNORE_INDEX = -100



def _check_lm(data: Tensor, batch_size: int, context: int) -> None:
    if not isinstance(data, Tensor) or data.dim() != 1:
        raise ValueError(f"data must be a 1-D tensor of token ids (N,); got {type(data).__name__} "
                         f"{tuple(getattr(data, 'shape', ()))}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    if context < 1:
        raise ValueError(f"context must be >= 1; got {context}")
    if data.numel() < context + 1:
        raise ValueError(f"context must be <= len(data) - 1 = {data.numel() - 1} (a window needs context + 1 "
                         f"tokens for its shifted targets); got context={context}")


def lm_batch(
    data: Tensor, batch_size: int, context: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Random windows of ``data`` (N,): x (B, T) = data[s : s+T], y (B, T) = data[s+1 : s+T+1].

    Start offsets s are uniform over the N - T valid positions, drawn with ``generator`` (so a seeded
    generator makes the batch sequence reproducible, and its state can be checkpointed).
    """
    _check_lm(data, batch_size, context)
    starts = torch.randint(0, data.numel() - context, (batch_size,), generator=generator)
    offsets = torch.arange(context + 1)
    windows = data[starts.unsqueeze(1) + offsets]  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]


def lm_eval_batches(data: Tensor, batch_size: int, context: int) -> Iterator[tuple[Tensor, Tensor]]:
    """Every non-overlapping window of ``data`` once, in order, as (x, y) batches of at most ``batch_size``."""
    _check_lm(data, batch_size, context)
    n_windows = (data.numel() - 1) // context
    starts = torch.arange(n_windows) * context
    offsets = torch.arange(context + 1)
    for first in range(0, n_windows, batch_size):
        windows = data[starts[first : first + batch_size].unsqueeze(1) + offsets]
        yield windows[:, :-1], windows[:, 1:]


@dataclass
class PairBatch:
    """One padded batch of sequence pairs (B pairs, source length S, target length T).

    src (B, S), src_lengths (B,), src_mask (B, 1, 1, S): the encoder input and its key padding mask.
    tgt_in (B, T) = BOS + target, padded; labels (B, T) = target + EOS, padding set to ``IGNORE_INDEX``;
    tgt_lengths (B,) = target length + 1; tgt_mask (B, 1, T, T) = causal & key padding.
    """

    src: Tensor
    src_lengths: Tensor
    src_mask: Tensor
    tgt_in: Tensor
    labels: Tensor
    tgt_lengths: Tensor
    tgt_mask: Tensor

    def to(self, device: torch.device | str) -> PairBatch:
        """The same batch with every tensor on ``device``."""
        return PairBatch(**{name: value.to(device) for name, value in vars(self).items()})

    @property
    def n_target_tokens(self) -> int:
        """Number of label positions that count in the loss."""
        return int((self.labels != IGNORE_INDEX).sum())


def _pad(sequences: list[list[int]], pad_id: int) -> Tensor:
    width = max(len(s) for s in sequences)
    out = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def collate_pairs(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, bos_id: int, eos_id: int) -> PairBatch:
    """Pad one list of (source ids, target ids) pairs into a ``PairBatch``."""
    src = [list(s) for s, _ in pairs]
    tgt_in = [[bos_id, *t] for _, t in pairs]
    labels = [[*t, eos_id] for _, t in pairs]
    src_lengths = torch.tensor([len(s) for s in src])
    tgt_lengths = torch.tensor([len(t) for t in tgt_in])
    src_t, tgt_t = _pad(src, pad_id), _pad(tgt_in, pad_id)
    labels_t = _pad(labels, IGNORE_INDEX)
    S, T = src_t.shape[1], tgt_t.shape[1]
    tgt_mask = causal_mask(T)[None, None] & padding_mask(tgt_lengths, T)
    return PairBatch(src_t, src_lengths, padding_mask(src_lengths, S), tgt_t, labels_t, tgt_lengths, tgt_mask)


def pair_batches(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    batch_size: int,
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    pool_batches: int = 50,
    drop_last: bool = False,
) -> list[PairBatch]:
    """Length-bucketed, padded batches of (source ids, target ids) pairs (see the module docstring).

    With ``shuffle=False`` the pairs are simply sorted by length (source, then target) and cut in order.
    Every pair appears in exactly one batch unless ``drop_last`` drops a final short one.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    if pool_batches < 1:
        raise ValueError(f"pool_batches must be >= 1; got {pool_batches}")
    if len(pairs) == 0:
        raise ValueError("pairs must not be empty")
    for i, (s, t) in enumerate(pairs):
        if len(s) == 0:
            raise ValueError(f"every source must have at least one token; pairs[{i}] has an empty source")
    rng = random.Random(f"{seed}:{epoch}")
    order = list(range(len(pairs)))

    def length(i: int) -> tuple[int, int]:
        return len(pairs[i][0]), len(pairs[i][1])

    if shuffle:
        rng.shuffle(order)
        pool = pool_batches * batch_size
        order = [i for start in range(0, len(order), pool) for i in sorted(order[start : start + pool], key=length)]
    else:
        order.sort(key=length)
    chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    if drop_last and len(chunks[-1]) < batch_size:
        chunks.pop()
    if shuffle:
        rng.shuffle(chunks)
    return [collate_pairs([pairs[i] for i in chunk], pad_id, bos_id, eos_id) for chunk in chunks]
