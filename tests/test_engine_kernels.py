"""The engine's attention paths against each other: the per-sequence gather (decode fast path and
padded prefill groups, ``attention_kernel="gather"``), the packed block-mask layout (None), the
PyTorch paged-attention reference, flex_attention over the pool with a block mask ("flex"; on a CPU
its unfused form, and its mask_mod as plain tensors), and the Triton kernel under TRITON_INTERPRET=1."""

import copy
import importlib.util
import json
import random
import textwrap

import pytest
import torch
from python_snippet import run_snippet

from companion.engine import Engine
from companion.inference.generate import SamplingParams, generate, packed_forward
from companion.models import from_preset
from companion.inference.paged import PagedKVCache
from companion.kernels.paged_flex import flex_block_mask, flex_logical_pages, paged_flex_mask_mod
from companion.inference.batch import PagedBatch
from tolerances import float32_paths_atol

# tolerances: the kernels are float32 computations of one function; each step's logits are compared with the
# packed layout's (None) within float32_paths_atol: 4 times that layout's own float32 error, measured against
# a float64 copy of the model fed the same trace through a pool of its own ("exact"), plus 8 ulps

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_FLEX = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
FLEX = ("flex",) if HAS_FLEX else ()


@torch.no_grad()
@pytest.mark.parametrize(
    "name, overrides, bits",
    [("llama-like", {}, None), ("mistral-like", dict(window=5), None), ("gemma3-like", {}, None), ("llama-like", {}, 8)],
)
def test_gather_path_equals_packed_path_on_random_traces(name, overrides, bits):
    """Two pools fed the same random trace (prefill chunks, decode rows, pure decode steps, shared
    prefixes, sequences retiring and arriving): every step's logits agree, kernel "gather" against
    the packed layout (None), and with float pages also against "reference" and "flex" (whose block
    mask must map shared and private pages back to each sequence's positions)."""
    torch.manual_seed(0)
    rng = random.Random(len(name) + (bits or 0))
    model = from_preset(name, **overrides).eval()
    # flex on llama and mistral only (global and windowed layers): its unfused CPU form is slow
    kernels = ("gather", None) + (("reference",) + (FLEX if name != "gemma3-like" else ()) if bits is None else ())
    pools = {k: PagedKVCache(model, n_pages=64, page_size=3, bits=bits, attention_kernel=k) for k in kernels}
    model64 = copy.deepcopy(model).double()
    pools["exact"] = PagedKVCache(model64, n_pages=64, page_size=3, bits=bits, attention_kernel=None)
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
        exact = packed_forward(model64, [s["caches"]["exact"] for s in live], chunks)
        atol = float32_paths_atol(logits[None], exact)
        for k in kernels:
            torch.testing.assert_close(logits[k], logits[None], atol=atol, rtol=0, msg=lambda m: f"{k}: {m}")
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


@pytest.mark.parametrize("kernel", ["gather", None, "reference", *FLEX])
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
    with pytest.raises(ValueError, match="attention_kernel='flex' reads float pages"):
        PagedKVCache(model, 4, 4, bits=4, attention_kernel="flex")


@pytest.mark.skipif(not HAS_FLEX, reason="this torch has no torch.nn.attention.flex_attention")
def test_flex_block_mask_has_create_block_masks_layout():
    from torch.nn.attention.flex_attention import create_block_mask

    tables = [[5, 9, 2], [5, 9, 30], [0]]
    q_seq, q_pos = torch.tensor([0, 1, 1, 2]), torch.tensor([7, 6, 8, 0])
    mask_mod = paged_flex_mask_mod(q_seq, q_pos, flex_logical_pages(tables, 70), 3, window=5)
    ours = flex_block_mask(mask_mod, 4, 210, "cpu", block=16)
    theirs = create_block_mask(mask_mod, None, None, 4, 210, device="cpu", BLOCK_SIZE=16)
    assert torch.equal(ours.to_dense(), theirs.to_dense())


@pytest.mark.parametrize("window", [None, 4])
def test_flex_mask_mod_as_plain_tensors_equals_the_gathered_mask(window):
    """``paged_flex_mask_mod`` evaluated on broadcast index tensors (no flex_attention involved, so
    this runs on any torch) gives, for every query row, exactly the pool slots the reference path
    reads: slot table[j // p] * p + j % p for each position j <= the row's position (and within the
    window); with shared and private pages in a scrambled pool."""
    p, n_pages = 3, 20
    rng = random.Random(0)
    free = list(range(n_pages))
    rng.shuffle(free)
    shared = [free.pop(), free.pop()]  # two full pages both sequences start with (prefix sharing)
    tables = [shared + [free.pop()], shared + [free.pop(), free.pop()], [free.pop()]]
    lens = [8, 11, 2]
    q_seq = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    q_pos = torch.tensor([6, 7, 8, 9, 10, 0, 1])
    mask_mod = paged_flex_mask_mod(q_seq, q_pos, flex_logical_pages(tables, n_pages), p, window)
    dense = mask_mod(None, None, torch.arange(len(q_seq))[:, None], torch.arange(n_pages * p)[None, :])  # (N, S)
    expected = torch.zeros_like(dense)
    for n, (b, t) in enumerate(zip(q_seq.tolist(), q_pos.tolist())):
        assert t < lens[b]
        for j in range(t + 1):
            if window is None or t - j < window:
                expected[n, tables[b][j // p] * p + j % p] = True
    assert torch.equal(dense, expected)


def test_views_that_cannot_attend_say_so():
    """The protocol: a contiguous view returns None (the layer reads update()'s rows itself); a paged
    batch with attention_kernel=None does too, and stores nothing."""
    model = from_preset("llama-like")
    q, k = torch.randn(1, 4, 2, 16), torch.randn(1, 2, 2, 16)
    assert model.new_cache().layer(0).attend(q, k, k, torch.arange(2)) is None
    kv = PagedKVCache(model, 4, 4, attention_kernel=None)
    seq = kv.new_sequence()
    batch = PagedBatch(kv, [seq], [2])
    assert batch.layer(0).attend(q, k, k, torch.arange(2)) is None and batch.layers_done == 0
    kv_gather = PagedKVCache(model, 4, 4)
    view = PagedBatch(kv_gather, [kv_gather.new_sequence()], [2]).layer(0)
    assert view.attend(q, k, k, torch.arange(2), backend="reference") is None  # a backend the kernel does not provide


_ENGINE_TRITON = textwrap.dedent(
    """
    import json, torch
    from companion.engine import Engine
    from companion.inference.generate import SamplingParams
    from companion.models import from_preset
    import companion.kernels.triton_paged as triton_paged
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


@torch.no_grad()
@pytest.mark.parametrize("bits", [None, 8])
def test_seats_hold_the_pages_rows(bits):
    """The "gather" kernel reads seats (``SeatBuffers``), written with the pages. A sequence whose
    pages were written by another path (its own single-sequence view) takes a seat on its first
    packed step and fills it from its pages; seats out of order (one freed, a later sequence in the
    last seat's holder moving into it) are attended in place; every step's logits equal the packed block-mask path
    (None); after each step every seat row below a sequence's length equals its pages' row as a read
    gives it back (dequantised); freeing a sequence gives its seat back."""
    torch.manual_seed(3)
    model = from_preset("llama-like").eval()
    pools = {k: PagedKVCache(model, n_pages=40, page_size=3, bits=bits, attention_kernel=k) for k in ("gather", None)}
    model64 = copy.deepcopy(model).double()
    pools["exact"] = PagedKVCache(model64, n_pages=40, page_size=3, bits=bits, attention_kernel=None)
    models = {"gather": model, None: model, "exact": model64}
    prompts = [[5, 6, 7, 8, 9], [1, 2], [3, 3, 3, 3], [9, 8, 7]]
    seqs = {k: [pool.new_sequence() for _ in prompts[:3]] for k, pool in pools.items()}
    for k in pools:  # sequence 0 through its own view (pages only), the others packed
        models[k](torch.tensor([prompts[0]]), cache=seqs[k][0])
        packed_forward(models[k], seqs[k][1:], prompts[1:3])
    assert seqs["gather"][0].seat is None and seqs["gather"][1].seat is not None
    tokens = [[4], [4], [4]]
    for step in range(6):
        if step == 2:  # free the middle sequence; a new one takes its seat
            for k, pool in pools.items():
                seqs[k][1].free()
                seqs[k][1] = pool.new_sequence()
            assert seqs["gather"][1].seat is None
            tokens[1] = prompts[3]
        logits = {k: packed_forward(models[k], seqs[k], tokens) for k in pools}
        atol = float32_paths_atol(logits[None], logits["exact"])
        torch.testing.assert_close(logits["gather"], logits[None], atol=atol, rtol=0)
        tokens = [[int(t)] for t in logits["gather"].argmax(-1)]
        pool, seats = pools["gather"].pool, pools["gather"].seats
        for seq in seqs["gather"]:
            slots = torch.tensor([seq.table[j // 3] * 3 + j % 3 for j in range(seq.length)])
            for layer in range(len(seats.k)):
                for i, buffer in enumerate((seats.k[layer], seats.v[layer])):
                    assert torch.equal(buffer[seq.seat, : seq.length], pool.read_slots(layer, i, slots, seats.dtype))
    assert [s.seat for s in seqs["gather"]] == [0, 2, 1]  # batch order is not seat order: read in place
    assert pools["gather"].seats.holders == [seqs["gather"][0], seqs["gather"][2], seqs["gather"][1]]
    for seq in seqs["gather"]:
        seq.free()
    assert pools["gather"].seats.holders == []
