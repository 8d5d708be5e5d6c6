"""Model runner: one packed forward over the scheduled chunks, then one sampled token for every
sequence whose chunk reached the end of its known tokens."""

from __future__ import annotations

import torch

from ..generate import packed_forward, sample
from .sequence import Sequence

__all__ = ["Runner"]


class Runner:
    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def run(self, batch: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """Feed tokens[computed : computed + n] of every (seq, n); return (seq, new token) pairs."""
        chunks = [seq.tokens[seq.computed : seq.computed + n] for seq, n in batch]
        logits = packed_forward(self.model, [seq.cache for seq, _ in batch], chunks)  # (B, V)
        out = []
        for row, (seq, _) in enumerate(batch):
            if seq.pending == 0:  # fed everything it had: its last row's logits predict the next token
                out.append((seq, sample(logits[row], seq.params, seq.generator)))
        return out
