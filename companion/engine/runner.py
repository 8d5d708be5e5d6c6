"""Model runner: build the step's context once, run one packed forward over the scheduled chunks,
then sample one token for every sequence whose chunk reached the end of its known tokens.

The step's metadata (token ids, positions, slot mapping, block tables, context lengths, seats) is a
``companion.inference.batch.StepContext``, filled here into ``StepBuffers`` allocated once, when the
engine is built, for the largest batch (``max_batch_tokens`` rows, ``max_seqs`` sequences): every step
writes the same tensors. The model then runs over the packed (1, N) row with the context's
``PagedBatch`` as its cache, and every attention path reads the context (``companion.inference.batch``
has the read). A decode step with ``compile=True`` runs the same context through the compiled step
(``companion.engine.compiled``). Without a page pool (``cache="contiguous"``) the step is
``packed_forward`` over the sequences' own caches.
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion.inference.batch import PagedBatch, StepBuffers, StepContext
from companion.inference.generate import context_length, packed_forward, sample_rows
from companion.inference.paged import PagedKVCache
from companion.engine.sequence import Sequence

__all__ = ["Runner"]


class Runner:
    """``kv``: the engine's page pool (None: contiguous caches); ``max_tokens``, ``max_seqs``: the
    largest step, which sizes the step buffers. ``decode_step``: optional
    ``companion.engine.compiled.CompiledDecode``, run for the steps in which every sequence feeds
    exactly one token (the others go through the eager packed forward)."""

    paged_batch = PagedBatch  # the cache the forward reads the step through (benchmarks/serving.py swaps in its baseline)

    def __init__(self, model, kv: PagedKVCache | None = None, max_tokens: int = 1, max_seqs: int = 1, decode_step=None):
        self.model, self.kv, self.decode_step = model, kv, decode_step
        self.buffers = None if kv is None else StepBuffers.for_pool(kv, max_tokens, max_seqs, context_length(model))
        self.context: StepContext | None = None  # the last step's

    def prepare(self, batch: list[tuple[Sequence, int]]) -> StepContext:
        """The step's context: pages and seats reserved, metadata written into the step buffers."""
        chunks = [seq.tokens[seq.computed : seq.computed + n] for seq, n in batch]
        self.context = self.buffers.fill(self.kv, [seq.cache for seq, _ in batch], [n for _, n in batch], chunks)
        return self.context

    def forward(self, context: StepContext) -> Tensor:
        """Logits (B, V) of each sequence's last fed row."""
        if self.decode_step is not None and context.decoding:
            return self.decode_step(context)
        cache = self.paged_batch(self.kv, context)  # the step's view of the pages: what each layer reads K/V from
        return context.last_rows(self.model(context.input_ids[None], cache=cache, positions=context.positions)[0])

    @torch.inference_mode()  # no autograd bookkeeping at all (a little cheaper than no_grad per op)
    def run(self, batch: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """Feed tokens[computed : computed + n] of every (seq, n); return (seq, new token) pairs."""
        if self.kv is None:
            chunks = [seq.tokens[seq.computed : seq.computed + n] for seq, n in batch]
            logits = packed_forward(self.model, [seq.cache for seq, _ in batch], chunks)  # (B, V)
        else:
            logits = self.forward(self.prepare(batch))
        # a sequence that fed everything it had: its last row's logits predict its next token
        ready = [row for row, (seq, _) in enumerate(batch) if seq.pending == 0]
        if not ready:
            return []
        if len(ready) != len(batch):
            logits = logits[torch.tensor(ready, dtype=torch.long, device=logits.device)]
        seqs = [batch[row][0] for row in ready]
        tokens = sample_rows(logits, [seq.params for seq in seqs], [seq.generator for seq in seqs])
        return list(zip(seqs, tokens))
