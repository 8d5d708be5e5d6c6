"""The engine's attention paths against each other: the per-sequence gather (decode fast path and
padded prefill groups, ``attention_kernel="gather"``), the packed block-mask layout (None), the
PyTorch paged-attention reference, and the Triton kernel under TRITON_INTERPRET=1."""

import importlib.util
import json
import random
import textwrap

import pytest
import torch
from python_snippet import run_snippet

from companion.engine import Engine
from companion.generate import SamplingParams, generate, packed_forward
from companion.models import from_preset
from companion.paged import PagedKVCache

HAS_TRITON = importlib.util.find_spec("triton") is not None


@torch.no_grad()
@pytest.mark.parametrize(
    "name, overrides, bits",
    [("llama-like", {}, None), ("mistral-like", dict(window=5), None), ("gemma3-like", {}, None), ("llama-like", {}, 8)],
)
def test_gather_path_equals_packed_path_on_random_traces(name, overrides, bits):
    """Two pools fed the same random trace (prefill chunks, decode rows, pure decode steps, shared
    prefixes, sequences retiring and arriving): every step's logits agree, kernel "gather" against
    the packed layout (None), and with float pages also against "reference"."""
    torch.manual_seed(0)
    rng = random.Random(len(name) + (bits or 0))
    model = from_preset(name, **overrides).eval()
    kernels = ("gather", None) + (("reference",) if bits is None else ())
    pools = {k: PagedKVCache(model, n_pages=64, page_size=3, bits=bits, attention_kernel=k) for k in kernels}
    system = [rng.randrange(256) for _ in range(7)]
    live: list[dict] = []  # per sequence: its tokens, and its cache in each pool
    steps_by_kind = {"decode only": 0, "mixed": 0}
    for step in range(30):
        if len(live) < 5 and rng.random() < 0.4:  # a new request, half of them sharing a prefix
            toks = (system if rng.random() < 0.5 else []) + [rng.randrange(256) for _ in range(rng.randint(1, 9))]
            caches = {k: pool.new_sequence(toks) for k, pool in pools.items()}
            live.append({"tokens": toks, "caches": caches})
        if not live:
            continue
        chunks = []
        for s in live:
            done = next(iter(s["caches"].values())).length
            pending = s["tokens"][done:]
            chunks.append(pending[: rng.randint(1, 4)] if len(pending) > 1 else pending)
        steps_by_kind["decode only" if all(len(c) == 1 for c in chunks) else "mixed"] += 1
        logits = {k: packed_forward(model, [s["caches"][k] for s in live], chunks) for k in kernels}
        for k in kernels[1:]:
            torch.testing.assert_close(logits["gather"], logits[k], atol=1e-5, rtol=1e-5)
        for s, chunk, row in zip(live, chunks, logits["gather"]):
            if next(iter(s["caches"].values())).length == len(s["tokens"]):  # fed everything: extend greedily
                s["tokens"].append(int(row.argmax()))
            for c in s["caches"].values():
                c.commit(s["tokens"])
        for s in [s for s in live if len(s["tokens"]) > 20 or rng.random() < 0.05]:  # retire some
            for c in s["caches"].values():
                c.free()
            live.remove(s)
    for s in live:
        for c in s["caches"].values():
            c.free()
    assert all(pool.n_free == pool.n_pages for pool in pools.values())
    assert steps_by_kind["decode only"] > 3 and steps_by_kind["mixed"] > 3, steps_by_kind


@pytest.mark.parametrize("kernel", ["gather", None, "reference"])
def test_engine_kernels_equal_running_each_request_alone(kernel):
    torch.manual_seed(1)
    model = from_preset("mistral-like", window=6).eval()
    rng = random.Random(1)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(1, 12))] for _ in range(7)]
    params = [SamplingParams(max_new_tokens=rng.randint(1, 8), temperature=0.0 if i % 2 else 0.8, seed=i) for i in range(7)]
    engine = Engine(model, page_size=4, max_batch_tokens=12, max_seqs=4, attention_kernel=kernel)
    outs = engine.generate(prompts, params, arrivals=[0, 0, 1, 2, 2, 5, 6])
    for p, sp, out in zip(prompts, params, outs):
        assert out.tokens == generate(model, p, sp, cache="none").tokens[0]
    assert engine.kv.n_free == engine.kv.n_pages


def test_bad_attention_kernel():
    model = from_preset("llama-like")
    with pytest.raises(ValueError, match="attention_kernel must be None or one of"):
        Engine(model, attention_kernel="flash")
    with pytest.raises(ValueError, match="attention_kernel='triton' reads float pages"):
        Engine(model, kv_bits=8, attention_kernel="triton")
    with pytest.raises(ValueError, match="attention_kernel must be None or one of"):
        PagedKVCache(model, 4, 4, attention_kernel="sdpa")


def test_views_that_cannot_attend_say_so():
    """The protocol: a contiguous view returns None (the layer reads update()'s rows itself); a paged
    batch with attention_kernel=None does too, and stores nothing."""
    model = from_preset("llama-like")
    q, k = torch.randn(1, 4, 2, 16), torch.randn(1, 2, 2, 16)
    assert model.new_cache().layer(0).attend(q, k, k, torch.arange(2)) is None
    kv = PagedKVCache(model, 4, 4, attention_kernel=None)
    seq = kv.new_sequence()
    batch = kv.pack([seq], [2])
    assert batch.layer(0).attend(q, k, k, torch.arange(2)) is None and batch.layers_done == 0
    kv_gather = PagedKVCache(model, 4, 4)
    view = kv_gather.pack([kv_gather.new_sequence()], [2]).layer(0)
    assert view.attend(q, k, k, torch.arange(2), backend="reference") is None  # a backend the kernel does not provide


_ENGINE_TRITON = textwrap.dedent(
    """
    import json, torch
    from companion.engine import Engine
    from companion.generate import SamplingParams
    from companion.models import from_preset
    import companion.triton_paged as triton_paged
    assert triton_paged.INTERPRET
    calls, real = [0], triton_paged.paged_attention

    def counted(*args, **kwargs):  # the engine must really run the kernel
        calls[0] += 1
        return real(*args, **kwargs)

    triton_paged.paged_attention = counted
    torch.manual_seed(0)
    model = from_preset("mistral-like", d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, window=4).eval()
    prompts = [[1, 2, 3, 4, 5], [9], [7, 7, 7]]
    params = [SamplingParams(max_new_tokens=3), SamplingParams(max_new_tokens=2), SamplingParams(max_new_tokens=3)]
    outs = {}
    for kernel in ("triton", "reference", "gather"):
        engine = Engine(model, page_size=2, max_batch_tokens=16, attention_kernel=kernel)
        outs[kernel] = [o.tokens for o in engine.generate(prompts, params, arrivals=[0, 1, 1])]
        assert engine.kv.n_free == engine.kv.n_pages
    outs["kernel_calls"] = calls[0]
    print("RESULTS" + json.dumps(outs))
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install 'companion[triton]'); the interpreted kernel test needs it")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the kernel is tested compiled in tests/test_triton_paged.py")
def test_engine_with_the_triton_kernel_under_the_interpreter():
    """The whole engine with attention_kernel="triton" (prefill and decode rows, a sliding window,
    GQA) gives the same tokens as the reference and gather paths. A subprocess: TRITON_INTERPRET
    must be set before the kernel is defined."""
    res = run_snippet(_ENGINE_TRITON, interpret=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    outs = json.loads(res.stdout.split("RESULTS", 1)[1])
    assert outs["triton"] == outs["reference"] == outs["gather"]
    assert [len(t) for t in outs["triton"]] == [3, 2, 3]
    assert outs["kernel_calls"] >= 2 * 3  # 2 layers, at least 3 steps
