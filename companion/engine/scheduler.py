"""Continuous-batching scheduler: decide, every step, which sequences run and with how many tokens.

Policy (one step, at most ``max_batch_tokens`` tokens and ``max_seqs`` running sequences):
1. running sequences, oldest first: one token each when decoding, a chunk of the rest of the
   prompt when still prefilling (chunked prefill: long prompts do not stall everyone's decode);
   if the pool lacks a page, preempt the YOUNGEST running sequence (least work lost) and retry;
2. waiting sequences, first come first served: admitted while token budget, seats and pages last.
   With a paged cache a new sequence first maps any registered prefix pages (prefix sharing).

Pages are reserved here, so the runner's forward can never run out of them.
"""

from __future__ import annotations

from collections import deque

from companion.inference.paged import PagedKVCache
from companion.engine.sequence import Sequence, Status

__all__ = ["Scheduler"]


class Scheduler:
    def __init__(self, model, kv: PagedKVCache | None, max_batch_tokens: int, max_seqs: int):
        self.model, self.kv = model, kv
        self.max_batch_tokens, self.max_seqs = max_batch_tokens, max_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: oldest first

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _new_cache(self, seq: Sequence):
        if self.kv is None:
            return self.model.new_cache()
        return self.kv.new_sequence(seq.tokens)  # shares any registered leading pages

    def _fits(self, seq: Sequence, n: int) -> bool:
        return self.kv is None or seq.cache.pages_needed(n) <= self.kv.n_free

    def preempt(self, seq: Sequence) -> None:
        """Drop seq's cache and put it first in line; it is recomputed from its tokens on readmission."""
        self.running.remove(seq)
        self.release(seq)
        seq.status, seq.preemptions = Status.WAITING, seq.preemptions + 1
        self.waiting.appendleft(seq)

    def release(self, seq: Sequence) -> None:
        if self.kv is not None and seq.cache is not None:
            seq.cache.free()
        seq.cache = None

    def schedule(self) -> list[tuple[Sequence, int]]:
        budget, batch = self.max_batch_tokens, []
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget == 0:
                continue
            n = min(seq.pending, budget)
            while not self._fits(seq, n):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            if self.kv is not None:
                seq.cache.reserve(n)
            batch.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            seq = self.waiting[0]
            seq.cache = self._new_cache(seq)
            n = min(seq.pending, budget)
            if not self._fits(seq, n):
                self.release(seq)  # gives back any shared prefix pages it had mapped
                break
            if self.kv is not None:
                seq.cache.reserve(n)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.append((seq, n))
            budget -= n
        return batch

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.release(seq)
        seq.status = Status.FINISHED
