"""Training data sources: the batch/step protocol the trainer reads (chapters 3, 4, 6).

A data source has ``next_batch()`` (one micro-batch for training), ``eval_batches(max_batches)`` (a
deterministic validation pass, possibly empty), ``shard(rank, world)`` (each data-parallel process draws
different batches) and ``state_dict()`` / ``load_state_dict()`` (so a resumed run draws the batches the
uninterrupted run would have drawn).

What this module provides
- ``LMData``: random windows of a token stream (x (B, T), y (B, T)).
- ``SequenceData``: padded decoder-only sequences with loss masks (e.g. ``synthetic.to_lm``).
- ``PairData``: length-bucketed ``PairBatch`` epochs for ``Seq2SeqTransformer``.
- ``seeded_generator(seed, rank)``: the torch generator each source draws from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from companion.data.batching import IGNORE_INDEX, PairBatch, lm_batch, lm_eval_batches, pair_batches

__all__ = ["LMData", "SequenceData", "PairData", "seeded_generator"]


def seeded_generator(seed: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + rank)


class LMData:
    """Language-model batches (x (B, T), y (B, T)) from token streams (``companion.data.batching``).

    Args:
        train: (N,) token ids; validation: (M,) token ids or None.
        batch_size: B windows per micro-batch; context: T tokens per window.
    Training windows are random (a seeded generator whose state is checkpointed); validation takes
    every non-overlapping window in order.
    """

    def __init__(self, train: Tensor, validation: Tensor | None, batch_size: int, context: int, seed: int = 0):
        train = torch.as_tensor(train, dtype=torch.long)
        if train.dim() != 1:
            raise ValueError(f"train must be a 1-D tensor of token ids (N,); got shape {tuple(train.shape)}")
        if train.numel() == 0:
            raise ValueError("train must be a non-empty 1-D tensor of token ids; got 0 tokens: the corpus is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if context < 1:
            raise ValueError(f"context must be >= 1; got {context}")
        if context > train.numel() - 1:
            raise ValueError(f"context must be <= len(train) - 1 = {train.numel() - 1} (a window needs context + 1 tokens); got {context}")
        if validation is not None:
            validation = torch.as_tensor(validation, dtype=torch.long)
            if validation.numel() < context + 1:
                raise ValueError(f"context must be <= len(validation) - 1 = {validation.numel() - 1}; got {context} "
                                 "(pass validation=None to train without evaluation)")
        self.train, self.validation, self.batch_size, self.context, self.seed = train, validation, batch_size, context, seed
        self.rank, self.world = 0, 1
        self.generator = seeded_generator(seed, 0)

    def shard(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.generator = seeded_generator(self.seed, rank)

    def next_batch(self) -> tuple[Tensor, Tensor]:
        return lm_batch(self.train, self.batch_size, self.context, self.generator)

    def eval_batches(self, max_batches: int | None = None) -> Iterator[tuple[Tensor, Tensor]]:
        if self.validation is None:
            return iter(())
        batches = lm_eval_batches(self.validation, self.batch_size, self.context)
        return (b for i, b in enumerate(batches) if max_batches is None or i < max_batches)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


class SequenceData:
    """Decoder-only batches from whole sequences with loss masks (e.g. ``companion.data.synthetic.to_lm``).

    Each micro-batch draws ``batch_size`` sequences at random, right-pads them with ``pad_id`` and
    shifts them (``companion.training.losses.lm_shift``): x (B, L-1), y (B, L-1) with y = IGNORE_INDEX wherever the
    next token is padding or its mask is False (the prompt). Validation is every sequence once, in order.
    """

    def __init__(self, sequences: Sequence[Sequence[int]], masks: Sequence[Sequence[bool]] | None, batch_size: int,
                 validation: tuple[Sequence[Sequence[int]], Sequence[Sequence[bool]] | None] | None = None,
                 pad_id: int = 0, seed: int = 0):
        if len(sequences) == 0:
            raise ValueError("sequences must not be empty (the corpus is empty)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        self._check(sequences, masks, "sequences")
        if validation is not None:
            self._check(validation[0], validation[1], "validation")
        self.sequences, self.masks, self.batch_size, self.pad_id, self.seed = sequences, masks, batch_size, pad_id, seed
        self.validation = validation
        self.rank, self.world = 0, 1
        self.generator = seeded_generator(seed, 0)

    @staticmethod
    def _check(sequences, masks, name: str) -> None:
        if any(len(s) < 2 for s in sequences):
            raise ValueError(f"every sequence in {name} needs >= 2 tokens (an input and a target)")
        if masks is not None and [len(m) for m in masks] != [len(s) for s in sequences]:
            raise ValueError(f"masks of {name} must match their sequences in number and length")

    def _collate(self, idx: Sequence[int], sequences, masks) -> tuple[Tensor, Tensor]:
        width = max(len(sequences[i]) for i in idx)
        tokens = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
        counted = torch.zeros((len(idx), width), dtype=torch.bool)
        for row, i in enumerate(idx):
            n = len(sequences[i])
            tokens[row, :n] = torch.tensor(list(sequences[i]), dtype=torch.long)
            counted[row, :n] = torch.tensor(list(masks[i]), dtype=torch.bool) if masks is not None else True
        x, y = tokens[:, :-1], tokens[:, 1:].clone()
        y[~counted[:, 1:]] = IGNORE_INDEX
        return x, y

    def shard(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.generator = seeded_generator(self.seed, rank)

    def next_batch(self) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, len(self.sequences), (self.batch_size,), generator=self.generator).tolist()
        return self._collate(idx, self.sequences, self.masks)

    def eval_batches(self, max_batches: int | None = None) -> Iterator[tuple[Tensor, Tensor]]:
        if self.validation is None:
            return
        seqs, masks = self.validation
        for k, start in enumerate(range(0, len(seqs), self.batch_size)):
            if max_batches is not None and k >= max_batches:
                return
            yield self._collate(range(start, min(start + self.batch_size, len(seqs))), seqs, masks)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


class PairData:
    """Sequence-pair batches (``PairBatch``) for ``Seq2SeqTransformer``, epoch after epoch.

    Each epoch is ``pair_batches(train, batch_size, ..., seed, epoch)`` (length-bucketed, shuffled);
    under DDP process r takes batches r, r + world, ... (the epoch is cut to a multiple of world).
    The state is (epoch, index), so resuming continues mid-epoch with the same batches.
    """

    def __init__(self, train: Sequence[tuple[Sequence[int], Sequence[int]]],
                 validation: Sequence[tuple[Sequence[int], Sequence[int]]] | None, batch_size: int,
                 *, pad_id: int, bos_id: int, eos_id: int, seed: int = 0):
        if len(train) == 0:
            raise ValueError("train must contain at least one pair (the corpus is empty)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        self.train, self.validation, self.batch_size = train, validation, batch_size
        self.ids = dict(pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
        self.seed, self.rank, self.world = seed, 0, 1
        self.epoch, self.index = 0, 0
        self._batches: list[PairBatch] | None = None
        self._validation_batches: list[PairBatch] | None = None

    def shard(self, rank: int, world: int) -> None:
        self.rank, self.world, self._batches = rank, world, None

    def _epoch_batches(self) -> list[PairBatch]:
        if self._batches is None:
            batches = pair_batches(self.train, self.batch_size, seed=self.seed, epoch=self.epoch, **self.ids)
            usable = len(batches) - len(batches) % self.world
            if usable == 0:
                raise ValueError(f"train has {len(batches)} batch(es) per epoch, fewer than the {self.world} processes")
            self._batches = batches[self.rank:usable:self.world]
        return self._batches

    def next_batch(self) -> PairBatch:
        if self.index >= len(self._epoch_batches()):
            self.epoch, self.index, self._batches = self.epoch + 1, 0, None
        batch = self._epoch_batches()[self.index]
        self.index += 1
        return batch

    def eval_batches(self, max_batches: int | None = None) -> Iterator[PairBatch]:
        if not self.validation:
            return iter(())
        if self._validation_batches is None:
            self._validation_batches = pair_batches(self.validation, self.batch_size, shuffle=False, **self.ids)
        return iter(self._validation_batches[:max_batches])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index, self._batches = int(state["epoch"]), int(state["index"]), None
