"""One request inside the engine: its tokens, where it is in its life, its cache and its timings.

Life: WAITING -> RUNNING -> FINISHED (reason "stop", "length", "context", or "error" when its step
raised), with RUNNING -> WAITING on preemption (the cache is dropped and
the tokens so far, prompt + generated, are recomputed on readmission). Invariant while RUNNING:
the cache holds the state of ``tokens[:cache.length]``; ``pending = len(tokens) - cache.length >= 1``
tokens still have to be fed; when a step feeds the last of them, its logits give the next token.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from companion.inference.generate import SamplingParams

__all__ = ["Status", "Sequence"]


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    id: int
    prompt: list[int]
    params: SamplingParams
    arrival: float  # perf_counter() when the request was added
    output: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    cache: object | None = None  # PagedSequenceCache or ModelCache while RUNNING
    generator: torch.Generator | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str = ""
    preemptions: int = 0
    error: str | None = None  # why the request failed (finish_reason "error")
    tokens: list[int] = field(init=False)  # prompt + output, kept in step by ``append``

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt) + list(self.output)

    def append(self, token: int) -> None:
        """A generated token (one list append: the engine calls this for every sequence every step)."""
        self.output.append(token)
        self.tokens.append(token)

    @property
    def computed(self) -> int:
        return 0 if self.cache is None else self.cache.length

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.computed
