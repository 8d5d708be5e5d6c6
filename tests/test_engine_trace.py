"""The engine's step recorder: same outputs as Engine.generate, and the memory it reports is right."""

import random

import pytest
import torch

from companion.engine import Engine
from companion.engine.trace import block_tables, serve_traced
from companion.inference.generate import SamplingParams
from companion.models import from_preset


def _setup(seed=0, n=6):
    torch.manual_seed(seed)
    model = from_preset("llama-like").eval()
    rng = random.Random(seed)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(3, 20))] for _ in range(n)]
    params = [SamplingParams(max_new_tokens=rng.randint(1, 8)) for _ in range(n)]
    return model, prompts, params, [rng.randint(0, 5) for _ in range(n)]


def test_traced_outputs_equal_generate_and_slots_are_counted_from_the_tables():
    model, prompts, params, arrivals = _setup()
    kw = dict(page_size=4, max_batch_tokens=16, max_seqs=4, prefix_sharing=False)
    plain = Engine(model, **kw).generate(prompts, params, arrivals=arrivals)
    outs, records = serve_traced(Engine(model, **kw), prompts, params, arrivals)
    assert [o.tokens for o in outs] == [o.tokens for o in plain]
    assert len(records) > 1 and records[-1].running == [] and records[-1].held == 0
    assert sorted(i for r in records for i in r.finished) == list(range(len(prompts)))
    for r in records:
        assert 0 <= r.held - r.used <= 3 * len(r.running)  # at most p - 1 unused slots a sequence
        assert r.contiguous == len(r.running) * model.config.max_seq_len


def test_preemptions_in_the_records_match_the_outputs():
    model, prompts, params, arrivals = _setup(1, 8)
    n_pages = max(-(-(len(p) + sp.max_new_tokens) // 3) for p, sp in zip(prompts, params))
    engine = Engine(model, page_size=3, n_pages=n_pages, max_batch_tokens=10, max_seqs=5)
    outs, records = serve_traced(engine, prompts, params, arrivals)
    preempted = [i for r in records for i in r.preempted]
    assert len(preempted) == sum(o.preemptions for o in outs) > 0
    assert all(r.held <= 3 * n_pages for r in records)


def test_block_tables_snapshot_is_a_copy_of_the_running_tables():
    model, prompts, params, _ = _setup(2, 3)
    engine = Engine(model, page_size=4, max_batch_tokens=64)
    for p, sp in zip(prompts, params):
        engine.add_request(p, sp)
    engine.step()
    snap = block_tables(engine)
    assert set(snap) == {s.id for s in engine.scheduler.running}
    for s in engine.scheduler.running:
        table, length = snap[s.id]
        assert table == s.cache.table and table is not s.cache.table and length == s.cache.length
        assert len(table) == -(-length // 4)


def test_contiguous_engines_are_refused():
    model, prompts, params, _ = _setup(3, 2)
    engine = Engine(model, cache="contiguous")
    with pytest.raises(ValueError, match="paged"):
        serve_traced(engine, prompts, params)
    with pytest.raises(ValueError, match="paged"):
        block_tables(engine)
