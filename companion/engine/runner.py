"""Model runner: one packed forward over the scheduled chunks, then one sampled token for every
sequence whose chunk reached the end of its known tokens.

The forward is ``companion.inference.batch.packed_forward`` (the sequences' new tokens in one row,
their pages and seats packed into a ``PagedBatch``, the model run with it as its cache), or, for a
step in which every sequence feeds one token and ``compile=True``, the compiled decode step
(``companion.engine.compiled``), which runs the same read."""

from __future__ import annotations

import torch

from companion.inference.batch import packed_forward
from companion.inference.generate import sample_rows
from companion.engine.sequence import Sequence

__all__ = ["Runner"]


class Runner:
    """``decode_step``: optional ``companion.engine.compiled.CompiledDecode``, run for the steps in
    which every sequence feeds exactly one token (the others go through the eager packed forward)."""

    def __init__(self, model, decode_step=None):
        self.model, self.decode_step = model, decode_step

    @torch.inference_mode()  # no autograd bookkeeping at all (a little cheaper than no_grad per op)
    def run(self, batch: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """Feed tokens[computed : computed + n] of every (seq, n); return (seq, new token) pairs."""
        if self.decode_step is not None and all(n == 1 for _, n in batch):
            logits = self.decode_step([seq.cache for seq, _ in batch], [seq.tokens[seq.computed] for seq, _ in batch])
        else:
            chunks = [seq.tokens[seq.computed : seq.computed + n] for seq, n in batch]
            logits = packed_forward(self.model, [seq.cache for seq, _ in batch], chunks)  # (B, V)
        # a sequence that fed everything it had: its last row's logits predict its next token
        ready = [row for row, (seq, _) in enumerate(batch) if seq.pending == 0]
        if not ready:
            return []
        if len(ready) != len(batch):
            logits = logits[torch.tensor(ready, dtype=torch.long, device=logits.device)]
        seqs = [batch[row][0] for row in ready]
        tokens = sample_rows(logits, [seq.params for seq in seqs], [seq.generator for seq in seqs])
        return list(zip(seqs, tokens))
