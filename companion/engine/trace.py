"""A step-by-step record of an ``Engine`` serving a request trace (chapter 12's plots and diagram).

``Engine.generate`` serves a whole trace and returns only the outputs; the chapter also wants to see
what happened in between: how much KV memory the block tables held against how much the tokens
filled, which requests ran, which were preempted. ``serve_traced`` runs the same loop as
``Engine.generate`` (request i is added before step ``arrivals[i]``) and takes a ``StepRecord``
after every step; ``block_tables`` is a snapshot of the running sequences' tables for drawing.

Memory is counted in token slots, per layer and per cached tensor (multiply by the bytes of one
token's K and V in all layers to get bytes):
    held = p * (pages referenced by some sequence)    (a shared page is counted once)
    used = sum over running sequences of the tokens their cache stores
    contiguous = (running sequences) * context        (what max-length preallocation reserves)
and ``held - used < p * running`` whenever nothing is shared: at most p - 1 unused slots a sequence.

What this module provides
- ``StepRecord``: one step's running ids, slots held / used / contiguous, preempted and finished ids.
- ``serve_traced(engine, prompts, params, arrivals) -> (outputs, records)``.
- ``block_tables(engine) -> {request id: (block table, length)}`` of the running sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence as Seq

from companion.engine.engine import Engine, RequestOutput
from companion.engine.sequence import Status
from companion.inference.generate import SamplingParams

__all__ = ["StepRecord", "serve_traced", "block_tables"]


@dataclass
class StepRecord:
    step: int
    running: list[int]  # request ids running after the step
    held: int  # token slots of the pages referenced (each page once)
    used: int  # tokens stored by the running sequences' caches
    contiguous: int  # running * context: slots a max-length preallocation would reserve
    preempted: list[int] = field(default_factory=list)  # ids preempted during this step
    finished: list[int] = field(default_factory=list)  # ids that finished during this step


def block_tables(engine: Engine) -> dict[int, tuple[list[int], int]]:
    """{request id: (a copy of its block table, tokens stored)} for every running sequence."""
    if engine.kv is None:
        raise ValueError("block_tables needs an engine with cache='paged'; this one is contiguous")
    return {s.id: (list(s.cache.table), s.cache.length) for s in engine.scheduler.running}


def serve_traced(
    engine: Engine, prompts: Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams],
    arrivals: Seq[int] | None = None,
) -> tuple[list[RequestOutput], list[StepRecord]]:
    """Serve ``prompts`` like ``Engine.generate`` and record every step (see the module docstring)."""
    if engine.kv is None:
        raise ValueError("serve_traced needs an engine with cache='paged'; this one is contiguous")
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    arrivals = [0] * len(prompts) if arrivals is None else list(arrivals)
    if len(params) != len(prompts) or len(arrivals) != len(prompts):
        raise ValueError(f"params and arrivals need one entry per prompt ({len(prompts)}); "
                         f"got {len(params)} and {len(arrivals)}")
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    ids: dict[int, int] = {}
    records: list[StepRecord] = []
    step, k, p = 0, 0, engine.page_size
    while k < len(order) or engine.scheduler.has_work():
        while k < len(order) and arrivals[order[k]] <= step:
            ids[order[k]] = engine.add_request(prompts[order[k]], params[order[k]])
            k += 1
        before = {s.id: (s.preemptions, s.status) for s in engine.sequences}
        engine.step()
        running = [s for s in engine.scheduler.running]
        pages = {page for s in running for page in s.cache.table}
        records.append(StepRecord(
            step, [s.id for s in running], p * len(pages), sum(s.cache.length for s in running),
            len(running) * engine.context,
            [s.id for s in engine.sequences if s.id in before and s.preemptions > before[s.id][0]],
            [s.id for s in engine.sequences
             if s.status is Status.FINISHED and before.get(s.id, (0, None))[1] is not Status.FINISHED],
        ))
        step += 1
    return [engine.output(ids[i]) for i in range(len(prompts))], records
