"""``Engine(compile=True)``: the torch.compile'd decode step against the eager engine (same tokens,
logits within 1e-5, a bounded number of compiled graphs), and its argument checks.

The comparison compiles one small model's decode step (two graphs: batch sizes >= 2, and 1); on two
cores with a cold inductor cache that takes 20-60 s, so it is one test that does everything with one
compilation. It is skipped, with the reason, where torch.compile cannot run (no C++ compiler, an
unsupported Python)."""

import copy
import random

import pytest
import torch

from companion.engine import Engine
from companion.engine.compiled import CompiledDecode, compile_unavailable, compile_unsupported
from companion.inference.batch import StepBuffers
from companion.inference.generate import SamplingParams, packed_forward
from companion.models import from_preset
from companion.inference.paged import PagedKVCache
from tolerances import float32_paths_atol

UNAVAILABLE = compile_unavailable()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(compile="yes"), "compile must be True or False"),
        (dict(compile=True, cache="contiguous"), "compile=True needs cache='paged'"),
        (dict(compile=True, attention_kernel=None), "compile=True"),
        (dict(compile=True, kv_bits=8), "compile=True"),
    ],
)
def test_bad_compile_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Engine(from_preset("llama-like"), **kwargs)


def test_compile_refuses_models_it_cannot_serve():
    assert "MLA" in compile_unsupported(from_preset("deepseek-like"))
    assert "sinks" in compile_unsupported(from_preset("llama-like", sinks=True))
    assert compile_unsupported(from_preset("mistral-like")) is None
    with pytest.raises(ValueError, match="compile=True cannot be used"):
        Engine(from_preset("deepseek-like"), compile=True)


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"torch.compile unavailable: {UNAVAILABLE}")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # from inside torch.compile
def test_compiled_decode_equals_eager(one_thread):
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    rng = random.Random(0)
    model = from_preset("mistral-like", window=6).eval()  # GQA, a sliding window: the mask path too
    prompts = [[rng.randrange(256) for _ in range(rng.randint(1, 12))] for _ in range(7)]
    params = [
        SamplingParams(max_new_tokens=rng.randint(1, 14), temperature=0.0 if i % 2 else 0.8, top_k=40, seed=i) for i in range(7)
    ]
    params[3].stop_tokens = (7, 11)
    arrivals = [0, 0, 1, 2, 2, 5, 9]  # batches of 1..5 decoding sequences, joining and leaving
    graphs_before = counters["stats"]["unique_graphs"]

    outs = {}
    for compile_ in (False, True):
        engine = Engine(model, page_size=4, max_batch_tokens=12, max_seqs=5, compile=compile_)
        outs[compile_] = engine.generate(prompts, params, arrivals=arrivals)
        assert engine.kv.n_free == engine.kv.n_pages  # no leaked page
    for eager, compiled in zip(outs[False], outs[True]):
        assert compiled.tokens == eager.tokens and compiled.finish_reason == eager.finish_reason

    # logits, step by step: two pools of the engine's shape fed the same tokens, one through the eager
    # packed forward, the other through the compiled step
    # (a third pool, "exact", follows the same tokens with a float64 copy of the model, eager)
    model64 = copy.deepcopy(model).double()
    pools = [PagedKVCache(model, engine.kv.n_pages, 4) for _ in range(2)] + [PagedKVCache(model64, engine.kv.n_pages, 4)]
    step = CompiledDecode(model, pools[1])
    buffers = StepBuffers.for_pool(pools[1], 4, 4, model.config.context_length)  # the runner's, as the engine sizes them
    seqs = [[pool.new_sequence() for _ in prompts[:4]] for pool in pools]
    with torch.inference_mode():
        for m, caches in zip((model, model, model64), seqs):  # prefill, eager in all three
            packed_forward(m, caches, prompts[:4])
        tokens = [p[-1] for p in prompts[:4]]
        for n_live in (4, 4, 3, 2, 1, 1):  # shrinking batches, down to one sequence
            ref = packed_forward(model, seqs[0][:n_live], [[t] for t in tokens[:n_live]])
            got = step(buffers.fill(pools[1], seqs[1][:n_live], [1] * n_live, [[t] for t in tokens[:n_live]]))
            exact = packed_forward(model64, seqs[2][:n_live], [[t] for t in tokens[:n_live]])
            # tolerances: compiled and eager are two float32 computations of one step: float32_paths_atol, 4 times
            # the eager step's own float32 error (against the float64 copy) plus 8 ulps
            torch.testing.assert_close(got, ref, atol=float32_paths_atol(ref, exact), rtol=0)
            tokens = [int(t) for t in ref.argmax(-1)]
    assert [c.length for c in seqs[0]] == [c.length for c in seqs[1]]

    # one graph for batch sizes >= 2 and one for B = 1 (torch specialises size 1); none per length
    assert 1 <= counters["stats"]["unique_graphs"] - graphs_before <= 2


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"torch.compile unavailable: {UNAVAILABLE}")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_step_bookkeeping_on_random_traces(seed, one_thread):
    """The compiled step's eager bookkeeping (slots of the new tokens, seats taken, filled from the
    pages and released) on random traces with shared prefixes, copy-on-write, a pool small enough to
    force preemption and sequences joining and leaving: the engine's tokens equal the eager engine's.
    The step function is swapped for the uncompiled ``_decode_step`` (the same code, eager), so
    nothing is compiled here."""
    from companion.engine import compiled

    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = from_preset("mistral-like", window=5).eval()
    prefix = [rng.randrange(256) for _ in range(8)]
    prompts = [(prefix if rng.random() < 0.5 else []) + [rng.randrange(256) for _ in range(rng.randint(1, 9))] for _ in range(10)]
    params = [SamplingParams(max_new_tokens=rng.randint(1, 12), temperature=0.0 if i % 3 else 0.9, top_k=50, seed=i) for i in range(10)]
    arrivals = sorted(rng.randint(0, 8) for _ in prompts)
    n_pages = max(-(-(len(p) + sp.max_new_tokens) // 3) for p, sp in zip(prompts, params)) + 2  # about one request's worth
    outs, checked = {}, [0]
    for compile_ in (False, True):
        engine = Engine(model, page_size=3, n_pages=n_pages, max_batch_tokens=10, max_seqs=5, compile=compile_)
        if compile_:
            step = engine.runner.decode_step

            def counted(*args, **kwargs):
                checked[0] += 1
                return compiled._decode_step(*args, **kwargs)

            step.step = counted  # eager: the bookkeeping is what is tested
        outs[compile_] = engine.generate(prompts, params, arrivals=arrivals)
        assert engine.kv.n_free == engine.kv.n_pages and sum(engine.kv.manager.ref) == 0  # no leaked page
        assert engine.kv.seats.holders == []  # no seat held
    assert [o.tokens for o in outs[True]] == [o.tokens for o in outs[False]]
    assert checked[0] > 5  # decode-only steps ran through the compiled step's bookkeeping
    assert sum(o.preemptions for o in outs[True]) > 0  # the pool really ran out
