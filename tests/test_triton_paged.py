"""Paged attention: the PyTorch reference (gather through the block table, then attention) against
what the model computes, the argument rules, the Triton kernel under Triton's CPU interpreter where
triton is installed, and compiled on a GPU where CUDA is available (skipped with a visible reason
elsewhere).

The reference itself is held to independent oracles here: dense attention over K/V read back with
``PagePool.read`` (a different gather), and the attention output the model computes in its own forward
over a packed paged batch. The kernel is then held to the reference.
"""

import importlib.util
import json
import math
import textwrap

import pytest
import torch
from python_snippet import missing_triton_message, run_snippet
from tolerances import attention_atol

import companion.mha
from companion.kernels import triton_paged
from companion.inference.generate import packed_forward
from companion.models import from_preset
from companion.inference.paged import PagedKVCache
from companion.kernels.paged_reference import paged_attention_reference
from companion.inference.batch import PagedBatch

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(
    not (HAS_CUDA and HAS_TRITON),
    reason="needs a CUDA GPU and triton (pip install 'companion[triton]'); "
    + ("no CUDA device here" if not HAS_CUDA else "triton is not installed"),
)


def _random_paged(lens, new, p, h, g, d, dtype=torch.float32, seed=0, device="cpu", spare=3):
    """Random pages in a shuffled pool, block tables for sequences of lengths ``lens`` whose last
    ``new[b]`` positions are query rows. Returns the argument tuple of paged attention."""
    gen = torch.Generator().manual_seed(seed)
    n_pages = sum(-(-L // p) for L in lens) + spare
    kp = torch.randn(n_pages, p, g, d, generator=gen).to(dtype)
    vp = torch.randn(n_pages, p, g, d, generator=gen).to(dtype)
    perm = torch.randperm(n_pages, generator=gen).tolist()  # pages of a sequence are scattered, out of order
    width = max(-(-L // p) for L in lens)
    tables, used = [], 0
    for L in lens:
        m = -(-L // p)
        tables.append(perm[used : used + m] + [perm[-1]] * (width - m))  # padding points at a foreign page
        used += m
    q_seq = torch.cat([torch.full((n,), b) for b, n in enumerate(new)])
    q_pos = torch.cat([torch.arange(L - n, L) for L, n in zip(lens, new)])
    q = torch.randn(len(q_seq), h, d, generator=gen).to(dtype)
    args = (q, kp, vp, torch.tensor(tables), torch.tensor(lens), q_seq, q_pos)
    return tuple(a.to(device) for a in args)


def _dense_oracle(q, kp, vp, tables, lens, q_seq, q_pos, window=None):
    """Per query row: keys read back one by one through the table, softmax with explicit loops over keys."""
    p, g = kp.shape[1], kp.shape[2]
    N, h, d = q.shape
    out = torch.zeros(N, h, d, dtype=torch.float64)
    for n in range(N):
        b, t = int(q_seq[n]), int(q_pos[n])
        js = [j for j in range(int(lens[b])) if j <= t and (window is None or t - j < window)]
        K = torch.stack([kp[int(tables[b, j // p]), j % p] for j in js]).double()  # (S, g, d)
        V = torch.stack([vp[int(tables[b, j // p]), j % p] for j in js]).double()
        for i in range(h):
            w = torch.softmax(K[:, i // (h // g)] @ q[n, i].double() / math.sqrt(d), 0)
            out[n, i] = w @ V[:, i // (h // g)]
    return out


# ---------------------------------------------------------------- everywhere: the reference and checks


@pytest.mark.parametrize("window", [None, 4])
def test_reference_matches_a_dense_oracle(window):
    # three sequences, page size 3 dividing none of the lengths, GQA 6/2, decode and prefill rows
    args = _random_paged([7, 1, 11], [1, 1, 5], p=3, h=6, g=2, d=8)
    ref = paged_attention_reference(*args, window=window)
    q, kp, vp = args[:3]  # float32 against the float64 oracle (sides=1); S <= every slot of the pool
    atol = attention_atol(q, kp.reshape(-1, kp.shape[-1]), vp.reshape(-1, vp.shape[-1]), sides=1)
    torch.testing.assert_close(ref.double(), _dense_oracle(*args, window=window), atol=atol, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("name", ["llama-like", "mistral-like"])
def test_paged_batch_attend_equals_what_the_model_computes(name, monkeypatch):
    """Capture the attention output of every layer in a packed paged forward (shared prefix, one
    prefill chunk, decode rows) and recompute it with PagedBatch.attend from the pages alone.
    attention_kernel=None: the layers attend over the packed rows themselves (update + block mask),
    an implementation independent of the kernels checked here. (The "gather" kernel reads seats,
    which only a pool built with it keeps: tests/test_engine_kernels.py compares its logits.)"""
    torch.manual_seed(0)
    model = from_preset(name, window=5).eval() if name == "mistral-like" else from_preset(name).eval()
    kv = PagedKVCache(model, n_pages=24, page_size=4, attention_kernel=None)
    system = torch.randint(0, 256, (9,)).tolist()
    first = kv.new_sequence(system)
    packed_forward(model, [first], [system])
    first.commit(system)
    users = [system + [1, 2, 3], system[:5] + [8, 8, 8, 8, 8, 8]]
    caches = [first, *(kv.new_sequence(u) for u in users)]
    chunks = [[42], *(u[c.length :] for u, c in zip(users, caches[1:]))]  # decode row, 4 new rows, 6 new rows
    captured = []
    real_attend = companion.mha.attend

    def spy(q, k, v, **kwargs):
        out = real_attend(q, k, v, **kwargs)
        captured.append((q, k, v, out))
        return out

    monkeypatch.setattr(companion.mha, "attend", spy)
    batch = PagedBatch(kv, caches, [len(c) for c in chunks])
    positions = torch.cat([torch.arange(c.length, c.length + len(ch)) for c, ch in zip(caches, chunks)])
    model(torch.tensor([[t for ch in chunks for t in ch]]), cache=batch, positions=positions)
    assert len(captured) == model.config.n_layers and batch.context.positions.tolist() == positions.tolist()
    window = getattr(model.config, "window", None)
    for layer, (q, k, v, out) in enumerate(captured):
        ours = batch.paged_attention(layer, q[0].transpose(0, 1), window=window, kernel="reference")  # (N, h, d)
        # two float32 attentions over the same rows: tolerances.attention_atol, any blocking (rescales=S)
        atol = attention_atol(q, k, v, rescales=k.shape[-2])
        torch.testing.assert_close(ours, out[0].transpose(0, 1), atol=atol, rtol=0)
    with pytest.raises(ValueError, match="kernel='gather' reads the seats"):  # a pool without seats
        batch.paged_attention(0, q[0].transpose(0, 1), kernel="gather")
    for c in caches:
        c.free()
    assert kv.n_free == kv.n_pages


def test_argument_checks():
    q, kp, vp, tables, lens, q_seq, q_pos = _random_paged([5, 9], [1, 2], p=4, h=4, g=2, d=8)
    cases = [
        ((q[0], kp, vp, tables, lens, q_seq, q_pos), {}, "q must be a 3-D tensor"),
        ((q.int(), kp, vp, tables, lens, q_seq, q_pos), {}, "q must be float16, bfloat16 or float32"),
        ((q, kp.half(), vp, tables, lens, q_seq, q_pos), {}, "k_pages must have q's dtype"),
        ((q, kp, vp[:, :2], tables, lens, q_seq, q_pos), {}, "same shape"),
        ((q, kp[0], vp, tables, lens, q_seq, q_pos), {}, "k_pages must be a 4-D tensor"),
        ((q[:, :3], kp, vp, tables, lens, q_seq, q_pos), {}, "positive multiple of the key/value heads"),
        ((q[..., :4], kp, vp, tables, lens, q_seq, q_pos), {}, "share the head dim"),
        ((q, kp, vp, tables.float(), lens, q_seq, q_pos), {}, "block_tables must be a 2-D integer"),
        ((q, kp, vp, tables, lens[:1], q_seq, q_pos), {}, "seq_lens must be a 1-D integer tensor of length 2"),
        ((q, kp, vp, tables, lens, q_seq[:1], q_pos), {}, "q_seq must be a 1-D integer tensor of length 3"),
        ((q, kp, vp, tables, lens + 4, q_seq, q_pos), {}, "seq_lens must be in"),
        ((q, kp, vp, tables + 100, lens, q_seq, q_pos), {}, "block_tables entries in use must be page ids"),
        ((q, kp, vp, tables, lens, q_seq + 1, q_pos), {}, "q_seq must index the B=2"),
        ((q, kp, vp, tables, lens, q_seq, q_pos + 1), {}, "q_pos must satisfy"),
        ((q, kp, vp, tables, lens, q_seq, q_pos), {"window": 0}, "window must be None or an int >= 1"),
        ((q, kp, vp, tables, lens, q_seq, q_pos), {"scale": -1.0}, "scale must be a positive"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            paged_attention_reference(*args, **kwargs)
    model = from_preset("llama-like")
    kv = PagedKVCache(model, n_pages=4, page_size=4)
    seq = kv.new_sequence()
    batch = PagedBatch(kv, [seq], [2])
    with pytest.raises(ValueError, match="kernel must be one of"):
        batch.paged_attention(0, torch.zeros(2, 4, 16), kernel="flash")
    with pytest.raises(ValueError, match="layer must be in"):
        batch.paged_attention(7, torch.zeros(2, 4, 16))
    quant = PagedKVCache(model, n_pages=4, page_size=4, bits=8)
    with pytest.raises(ValueError, match="bits=8"):
        PagedBatch(quant, [quant.new_sequence()], [2]).paged_attention(0, torch.zeros(2, 4, 16))
    mla = PagedKVCache(from_preset("deepseek-like"), n_pages=4, page_size=4)
    with pytest.raises(ValueError, match="MLA latent"):
        PagedBatch(mla, [mla.new_sequence()], [2]).paged_attention(0, torch.zeros(2, 4, 16))


@pytest.mark.skipif(triton_paged.INTERPRET, reason="TRITON_INTERPRET=1 lets CPU tensors through by design")
def test_cpu_tensors_get_a_clear_error():
    args = _random_paged([5], [1], p=4, h=2, g=2, d=16)
    with pytest.raises(ValueError, match="needs CUDA tensors; q is on cpu.*kernel='reference'"):
        triton_paged.paged_attention(*args)
    kv = PagedKVCache(from_preset("llama-like"), n_pages=4, page_size=4)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        PagedBatch(kv, [kv.new_sequence()], [1]).paged_attention(0, torch.zeros(1, 4, 16), kernel="triton")


def test_package_imports_and_explains_without_triton():
    message = missing_triton_message("triton_paged", "m.paged_attention(torch.zeros(1, 1, 16), *[None] * 6)")
    assert "pip install 'companion[triton]'" in message


# ---------------------------------------------------------------- CPU: the kernel under the interpreter

_INTERPRETED = textwrap.dedent(
    """
    import json, sys, torch
    sys.path.insert(0, "tests")
    from test_triton_paged import _random_paged
    from companion.kernels.triton_paged import paged_attention, INTERPRET
    from companion.inference.paged import PagedKVCache
    from companion.kernels.paged_reference import paged_attention_reference
    from companion.inference.generate import packed_forward
    from companion.inference.batch import PagedBatch
    from companion.models import from_preset
    assert INTERPRET
    results = []
    # (lens, new rows per sequence, p, h, g, d, dtype, window): several sequences of different
    # lengths, p dividing none of them, decode (1 row) and prefill (> 1 row) sequences in one batch,
    # lengths past one 16-key block, MHA / GQA / MQA, a head dim that is not a power of two
    for lens, new, p, h, g, d, dtype, window in [
        ([5, 17, 40], [1, 1, 1], 3, 4, 2, 16, "float32", None),
        ([5, 17, 40], [5, 1, 9], 3, 4, 4, 16, "float32", None),
        ([23, 2, 9], [23, 1, 4], 5, 8, 1, 24, "float32", 6),
        ([33, 12], [1, 12], 4, 4, 2, 32, "float16", None),
        ([19, 7], [3, 7], 16, 2, 2, 16, "float16", None),
    ]:
        dt = getattr(torch, dtype)
        args = _random_paged(lens, new, p, h, g, d, dtype=dt, seed=len(results))
        ref = paged_attention_reference(*(a.float() if a.is_floating_point() else a for a in args), window=window)
        out = paged_attention(*args, window=window)
        assert out.dtype == dt and out.shape == ref.shape
        results.append({"case": [lens, new, p, h, g, d, dtype, window], "err": (out.float() - ref).abs().max().item()})
    # through the paged cache of a model: PagedBatch.paged_attention(kernel="triton") == kernel="reference"
    torch.manual_seed(0)
    model = from_preset("llama-like").eval()
    kv = PagedKVCache(model, n_pages=16, page_size=3)
    seqs = [kv.new_sequence() for _ in range(3)]
    prompts = [torch.randint(0, 256, (n,)).tolist() for n in (7, 2, 10)]
    with torch.no_grad():
        packed_forward(model, seqs, prompts)
        batch = PagedBatch(kv, seqs, [1, 1, 1])
        for layer in range(kv.n_layers):
            batch.layer(layer).update(batch.context.positions, *(torch.randn(1, 2, 3, 16) for _ in range(2)))
        q = torch.randn(3, 4, 16)
        errs = [(batch.paged_attention(l, q, kernel="triton") - batch.paged_attention(l, q)).abs().max().item() for l in range(kv.n_layers)]
    results.append({"case": "PagedBatch.attend", "err": max(errs)})
    print("RESULTS" + json.dumps(results))
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install 'companion[triton]'); the interpreted kernel test needs it")
@pytest.mark.skipif(HAS_CUDA, reason="a GPU is present: the kernel is tested compiled, in the gpu tests below")
def test_kernel_under_the_interpreter_matches_the_reference():
    """float32 and float16: Triton 3.9's interpreter computes tl.dot on bfloat16 inputs wrongly, so bf16
    is checked on GPUs only. A subprocess, because TRITON_INTERPRET must be set before the kernel is defined."""
    res = run_snippet(_INTERPRETED, interpret=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads(res.stdout.split("RESULTS", 1)[1])
    assert len(results) == 6
    for r in results:
        # float32: summation order only. float16: P rounded to fp16 before the second matmul and the
        # fp16 output (about 1e-3 relative on values of size ~1).
        tol = 2e-3 if "float16" in r["case"] else 1e-5
        assert r["err"] < tol, r


# ---------------------------------------------------------------- GPU: the compiled kernel


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(4, 4, 128, 16), (8, 2, 64, 1), (32, 8, 128, 7)])  # (h, g, d, page size)
@pytest.mark.parametrize("window", [None, 100])
def test_gpu_matches_the_reference(dtype, shape, window):
    h, g, d, p = shape
    lens, new = [1, 300, 77, 1031], [1, 1, 40, 3]  # decode and prefill rows; lengths past several key blocks
    args = _random_paged(lens, new, p, h, g, d, dtype=dtype, device="cuda")
    ref = paged_attention_reference(*(a.float() if a.is_floating_point() else a for a in args), window=window)
    out = triton_paged.paged_attention(*args, window=window)
    tol = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)


@pytest.mark.gpu
@needs_gpu
@torch.no_grad()
def test_gpu_paged_batch_attend():
    torch.manual_seed(0)
    model = from_preset("llama-like").cuda().eval()
    kv = PagedKVCache(model, n_pages=32, page_size=4, device="cuda")
    seqs = [kv.new_sequence() for _ in range(3)]
    packed_forward(model, seqs, [torch.randint(0, 256, (n,)).tolist() for n in (9, 1, 30)])
    batch = PagedBatch(kv, seqs, [1, 1, 1])
    for layer in range(kv.n_layers):
        batch.layer(layer).update(batch.context.positions.cuda(), *(torch.randn(1, 2, 3, 16, device="cuda") for _ in range(2)))
    q = torch.randn(3, 4, 16, device="cuda")
    for layer in range(kv.n_layers):
        # two float32 attentions (the Triton kernel's dots are IEEE float32): tolerances.attention_atol over every
        # slot of the pool (S <= all of them; one rescale per key at most)
        k, v = (t.reshape(-1, q.shape[-1]).float() for t in kv.pool.data[layer])
        atol = attention_atol(q, k, v, rescales=k.shape[-2])
        torch.testing.assert_close(batch.paged_attention(layer, q, kernel="triton"), batch.paged_attention(layer, q), atol=atol, rtol=0)
