"""Paged KV cache: block tables, prefix sharing, copy-on-write, exhaustion, quantised pages."""

import random

import pytest
import torch

from companion.accounting import kv_cache_bytes, mla_cache_bytes
from companion.inference.generate import SamplingParams, packed_forward
from companion.inference.kvquant import bytes_per_group, dequantize, quantize
from companion.models import from_preset
from companion.inference.block_manager import BlockManager, PoolExhausted
from companion.inference.paged import PagedKVCache, kv_token_shapes
from tolerances import float64_twin_atol

# tolerances: logits read through paged caches against the model's forward without a cache are two float32
# computations of one function, within float64_twin_atol: 4 times the forward's own float32 error, measured
# against its float64 twin, plus 8 ulps (tests/tolerances.py, float32_paths_atol)


def _forward(model, tokens):
    """The cache-free logits of one sequence (T, V), and the bound for comparing logits against them."""
    idx = torch.tensor([tokens])
    return model(idx)[0], float64_twin_atol(lambda m, i: m(i)[0], model, idx)


def _prefill_and_decode(model, seq_cache, tokens, split):
    """Feed tokens[:split] in one chunk, then one at a time; logits of every fed position (T, V)."""
    outs = [model(torch.tensor([tokens[seq_cache.length : split]]), cache=seq_cache)[0]]
    for t in range(split, len(tokens)):
        outs.append(model(torch.tensor([tokens[t : t + 1]]), cache=seq_cache)[0])
    return torch.cat(outs)


@pytest.mark.parametrize("name", ["gemma3-like", "deepseek-like", "gpt2-tiny"])
@torch.no_grad()
def test_paged_view_equals_full_forward_and_frees_everything(name):
    torch.manual_seed(0)
    model = from_preset(name).eval()
    kv = PagedKVCache(model, n_pages=8, page_size=3)
    seq = kv.new_sequence()
    tokens = torch.randint(0, 256, (14,)).tolist()  # 14 tokens: 5 pages of 3, last one partial
    logits = _prefill_and_decode(model, seq, tokens, split=5)
    full, atol = _forward(model, tokens)
    torch.testing.assert_close(logits, full, atol=atol, rtol=0)
    assert seq.length == 14 and len(seq.table) == 5 and kv.n_free == 3
    seq.free()
    assert kv.n_free == 8 and seq.table == []


def test_block_manager_allocation_exhaustion_and_refcounts():
    bm = BlockManager(n_pages=4, page_size=2)
    a, b = [], []
    bm.prepare_write(a, 0, 5)  # 3 pages
    assert len(a) == 3 and bm.n_free == 1
    with pytest.raises(PoolExhausted, match="needs 2 free page"):
        bm.prepare_write(b, 0, 4)
    assert b == [] and bm.n_free == 1 and all(bm.ref[p] == 1 for p in a)  # nothing changed
    bm.register(a, [1, 2, 3, 4, 5], n_computed=5)  # two full pages get names
    shared = bm.share_prefix([1, 2, 3, 4, 9])
    assert shared == a[:2] and [bm.ref[p] for p in a] == [2, 2, 1]
    assert bm.share_prefix([7, 2, 3, 4]) == []  # the chain: page 2 matches only after an equal page 1
    bm.free(a)
    assert bm.n_free == 2 and [bm.ref[p] for p in shared] == [1, 1]
    bm.free(list(shared))
    assert bm.n_free == 4
    # freed pages keep their names until handed out again
    revived = bm.share_prefix([1, 2, 3, 4])
    assert revived == shared and bm.n_free == 2
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        BlockManager(4, 0)


@torch.no_grad()
def test_prefix_sharing_equals_unshared_and_copy_on_write():
    torch.manual_seed(1)
    model = from_preset("llama-like").eval()
    kv = PagedKVCache(model, n_pages=12, page_size=4)
    prompt = torch.randint(0, 256, (8,)).tolist()  # exactly two full pages
    a = kv.new_sequence(prompt)
    assert a.length == 0 and a.table == []  # nothing registered yet
    a_logits = model(torch.tensor([prompt]), cache=a)[0]
    a.commit(prompt)
    a_pages = list(a.table)
    snapshot = [t[a_pages].clone() for t in kv.pool.data[0]]
    # B shares A's whole prompt: both pages are mapped, only the last token is recomputed, which
    # writes into a shared page -> copy-on-write of page 2 (page 1 stays shared)
    b = kv.new_sequence(prompt + [5, 6])
    assert b.table == a_pages and b.length == 8
    b2 = kv.new_sequence(prompt)
    assert b2.length == 7  # fully covered prompt: its last token is still computed
    free_before = kv.n_free
    last = model(torch.tensor([prompt[7:]]), cache=b2)[0]
    assert b2.table[0] == a_pages[0] and b2.table[1] != a_pages[1] and kv.n_free == free_before - 1
    torch.testing.assert_close(last, a_logits[7:], atol=_forward(model, prompt)[1], rtol=0)
    for t, snap in zip(kv.pool.data[0], snapshot):
        assert torch.equal(t[a_pages], snap)  # A's pages untouched
    # B continues after the shared prefix; equals an unshared computation of the same tokens
    rest = model(torch.tensor([[5, 6]]), cache=b)[0]
    full, atol = _forward(model, prompt + [5, 6])
    torch.testing.assert_close(rest, full[8:], atol=atol, rtol=0)
    # A keeps decoding correctly after B wrote next to it
    nxt = model(torch.tensor([[42]]), cache=a)[0]
    full, atol = _forward(model, prompt + [42])
    torch.testing.assert_close(nxt, full[8:], atol=atol, rtol=0)
    for s in (a, b, b2):
        s.free()
    assert kv.n_free == kv.n_pages


@torch.no_grad()
def test_packed_paged_batch_with_shared_prefix():
    torch.manual_seed(2)
    model = from_preset("mistral-like", window=5).eval()
    kv = PagedKVCache(model, n_pages=20, page_size=4)
    system = torch.randint(0, 256, (9,)).tolist()
    first = kv.new_sequence(system)
    packed_forward(model, [first], [system])
    first.commit(system)
    users = [system + [1, 2, 3], system + [7], system[:5] + [8, 8]]
    caches = [kv.new_sequence(u) for u in users]
    assert [c.length for c in caches] == [8, 8, 4]
    logits = packed_forward(model, caches, [u[c.length :] for u, c in zip(users, caches)])
    for u, row in zip(users, logits):
        full, atol = _forward(model, u)
        torch.testing.assert_close(row, full[-1], atol=atol, rtol=0)
    for c in [first, *caches]:
        c.free()
    assert kv.n_free == 20


def test_quantisation_roundtrip_and_bounds():
    torch.manual_seed(3)
    x = torch.randn(5, 2, 16)
    for bits, qm in ((8, 127), (4, 7)):
        data, scale = quantize(x, bits)
        assert data.shape == ((5, 2, 16) if bits == 8 else (5, 2, 8)) and scale.shape == (5, 2)
        err = (dequantize(data, scale, bits) - x).abs()
        assert (err <= scale[..., None] / 2 + 1e-6).all()  # rounding error at most s / 2
        torch.testing.assert_close(scale, x.abs().amax(-1) / qm)
    exact = torch.arange(-7, 9, dtype=torch.float32).clamp(max=7).view(1, 16)  # representable values
    data, scale = quantize(exact, 4)
    assert torch.equal(dequantize(data, scale, 4), exact)
    z = torch.zeros(1, 4)
    assert torch.equal(dequantize(*quantize(z, 8), 8), z)
    with pytest.raises(ValueError, match="bits must be one of"):
        quantize(x, 3)


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_quantised_pool_bytes(bits):
    model = from_preset("llama-like")  # GQA: g=2 kv heads of d_h=16, 2 layers
    kv = PagedKVCache(model, n_pages=5, page_size=4, bits=bits)
    c = model.config
    slots, groups = 5 * 4, 5 * 4 * c.n_layers * 2 * c.kv_heads  # x2: K and V
    nbytes = kv.pool.nbytes()
    if bits is None:  # the chapter-10 formula M = 2 L T g d_h b, with T = every slot of the pool
        assert nbytes["data"] == kv_cache_bytes(c.n_layers, c.kv_heads, c.attn_head_dim, tokens=slots, bytes_per_value=4)
        assert nbytes["scales"] == 0
    else:
        assert nbytes["data"] == groups * c.attn_head_dim * bits // 8  # q/8 bytes per element
        assert nbytes["scales"] == groups * 4  # one float32 scale per (token, head)
        assert nbytes["total"] == groups * bytes_per_group(c.attn_head_dim, bits)
    ds = from_preset("deepseek-like").config
    mla_fp = PagedKVCache(from_preset("deepseek-like"), n_pages=2, page_size=2)
    assert mla_fp.pool.nbytes()["data"] == mla_cache_bytes(ds.n_layers, ds.kv_rank, ds.rope_dim, tokens=4, bytes_per_value=4)
    mla = PagedKVCache(from_preset("deepseek-like"), n_pages=2, page_size=2, bits=8)
    assert [[tuple(t.shape) for t in layer] for layer in mla.pool.data][0] == [(2, 2, 32), (2, 2, 8)]
    assert kv_token_shapes(from_preset("deepseek-like"))[0] == [(32,), (8,)]


@torch.no_grad()
def test_quantised_cache_logit_error_is_small_and_ordered():
    torch.manual_seed(4)
    model = from_preset("llama-like").eval()
    tokens = torch.randint(0, 256, (20,)).tolist()
    full = model(torch.tensor([tokens]))[0]
    errs = {}
    for bits in (8, 4):  # teacher-forced on the same tokens: the error comes from the cache alone
        kv = PagedKVCache(model, n_pages=5, page_size=4, bits=bits)
        seq = kv.new_sequence()
        errs[bits] = (_prefill_and_decode(model, seq, tokens, split=6) - full).abs().max().item()
        seq.free()
        assert kv.n_free == 5
    spread = (full.max(-1).values - full.min(-1).values).min().item()
    assert 0 < errs[8] < errs[4] < spread  # int8 perturbs less than int4, neither is zero
    assert errs[8] < 0.05 * spread


def test_bad_pool_arguments():
    model = from_preset("llama-like")
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        PagedKVCache(model, 4, 0)
    with pytest.raises(ValueError, match="n_pages must be >= 1"):
        PagedKVCache(model, 0, 4)
    with pytest.raises(ValueError, match="bits must be None or one of"):
        PagedKVCache(model, 4, 4, bits=2)


@torch.no_grad()
def test_exhaustion_inside_a_forward_changes_nothing():
    torch.manual_seed(5)
    model = from_preset("llama-like").eval()
    kv = PagedKVCache(model, n_pages=4, page_size=2)
    tokens = torch.randint(0, 256, (6,)).tolist()
    a, b = kv.new_sequence(), kv.new_sequence()
    model(torch.tensor([tokens[:5]]), cache=a)  # 3 pages
    snapshot = [t.clone() for layer in kv.pool.data for t in layer]
    with pytest.raises(PoolExhausted, match="needs 2 free page"):
        model(torch.tensor([[1, 2, 3, 4]]), cache=b)  # needs 2 pages, 1 is free
    assert b.length == 0 and b.table == [] and kv.n_free == 1
    assert all(torch.equal(t, s) for t, s in zip((t for layer in kv.pool.data for t in layer), snapshot))
    last = model(torch.tensor([tokens[5:]]), cache=a)[0]  # A carries on, unharmed
    full, atol = _forward(model, tokens)
    torch.testing.assert_close(last, full[5:], atol=atol, rtol=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_commit_fast_path_registers_what_the_full_register_would(seed, monkeypatch):
    """``PagedSequenceCache.commit`` skips the register pass when no page filled up and no page lost
    its name since the sequence's last commit; on random traces with shared prefixes, copy-on-write
    and preemption, running the full chain + register after every commit changes nothing."""
    from companion.engine import Engine
    from companion.inference.generate import SamplingParams
    from companion.inference.paged import PagedSequenceCache

    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = from_preset("llama-like").eval()
    prefix = [rng.randrange(256) for _ in range(9)]
    prompts = [(prefix if rng.random() < 0.6 else []) + [rng.randrange(256) for _ in range(rng.randint(1, 8))] for _ in range(10)]
    params = [SamplingParams(max_new_tokens=rng.randint(1, 10)) for _ in prompts]
    commit, checks = PagedSequenceCache.commit, [0, 0]

    def checked_commit(self, tokens):
        manager = self.owner.manager
        skipped = self.length // self.owner.page_size == len(self._hashes) and manager.unnamed == self._unnamed_seen
        commit(self, tokens)
        named = (dict(manager.hash_of), dict(manager.page_of))
        manager.register(self.table, tokens, self.length, manager.chain(tokens[: self.length]))  # the full pass
        assert (manager.hash_of, manager.page_of) == named
        checks[skipped] += 1

    monkeypatch.setattr(PagedSequenceCache, "commit", checked_commit)
    n_pages = max(-(-(len(p) + sp.max_new_tokens) // 3) for p, sp in zip(prompts, params)) + 3
    engine = Engine(model, page_size=3, n_pages=n_pages, max_batch_tokens=8, max_seqs=4)
    engine.generate(prompts, params, arrivals=sorted(rng.randint(0, 6) for _ in prompts))
    assert checks[0] > 0 and checks[1] > 0  # both the full pass and the skip ran
    assert engine.kv.n_free == engine.kv.n_pages


def test_page_slots_is_the_slot_formula_every_path_uses():
    from companion.inference.batch import PagedBatch
    from companion.kernels.paged_reference import page_slots

    tables = torch.tensor([[5, 0, 3], [2, 7, 1]])
    p = 4
    got = page_slots(tables, p)
    # the definition, one position at a time: position j of sequence b is in page tables[b, j // p], offset j % p
    want = torch.tensor([[int(tables[b, j // p]) * p + j % p for j in range(3 * p)] for b in range(2)])
    assert torch.equal(got, want)
    assert torch.equal(page_slots(tables[1], p), want[1])  # one table: (n,) -> (n * p,)
    with pytest.raises(ValueError, match="page_size must be an int >= 1"):
        page_slots(tables, 0)
    # the packed batch's write and read slots come from it
    torch.manual_seed(6)
    model = from_preset("llama-like").eval()
    kv = PagedKVCache(model, n_pages=10, page_size=3)
    seqs = [kv.new_sequence(), kv.new_sequence()]
    batch = PagedBatch(kv, seqs, [5, 2])
    assert torch.equal(batch.context.slot_mapping, torch.cat([page_slots(torch.tensor(s.table), 3)[:n] for s, n in zip(seqs, [5, 2])]))


def _prefix_run(engine, prompts):
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=4))
    return [o.tokens for o in outs], engine.stats["prefill_tokens_fed"]


@pytest.mark.parametrize("how", ["no_grad", "load_state_dict", "data"])
def test_prefix_pages_are_not_shared_after_the_weights_change(how):
    """Issue 27, item 3: a page computed with the old weights must not be mapped after the weights
    change in place (a merged LoRA update): same tokens, different K/V."""
    from companion.engine import Engine

    torch.manual_seed(0)
    model = from_preset("llama-like", max_seq_len=128).eval()
    prompt = list(range(40))
    engine = Engine(model, page_size=8, n_pages=64, max_seqs=4)
    engine.generate([prompt], SamplingParams(max_new_tokens=4))  # registers the prompt's pages
    fed = engine.stats["prefill_tokens_fed"]
    engine.generate([prompt], SamplingParams(max_new_tokens=4))
    assert engine.stats["prefill_tokens_fed"] - fed < len(prompt)  # shared while the weights are unchanged
    w = model.layers[0].attn.qkv.weight
    delta = 0.5 * torch.randn_like(w)
    if how == "no_grad":
        with torch.no_grad():
            w += delta
    elif how == "load_state_dict":
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["layers.0.attn.qkv.weight"] += delta
        model.load_state_dict(state)
    else:  # through .data: invisible to the version counter, so the engine is told
        w.data += delta
        engine.weights_changed()
    fed = engine.stats["prefill_tokens_fed"]
    got = engine.generate([prompt], SamplingParams(max_new_tokens=4))[0].tokens
    assert engine.stats["prefill_tokens_fed"] - fed == len(prompt)  # every prompt token recomputed
    fresh = Engine(model, page_size=8, n_pages=64, max_seqs=4, prefix_sharing=False)
    assert got == fresh.generate([prompt], SamplingParams(max_new_tokens=4))[0].tokens
