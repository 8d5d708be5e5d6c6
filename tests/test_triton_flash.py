"""companion.kernels.triton_flash: argument checks everywhere, the kernels under Triton's CPU interpreter where
triton is installed, and on a GPU where CUDA is available (skipped with a visible reason elsewhere).

The oracle is companion.kernels.flash.tiled_attention in float32 on the same (rounded) half-precision
inputs, itself held to the dense reference by tests/test_flash.py, plus the dense reference
through companion.kernels.attend.attend for the backend check.
"""

import importlib.util
import json
import textwrap

import pytest
import torch
from python_snippet import missing_triton_message, run_snippet

from companion.kernels import triton_flash
from companion.kernels.attend import attend
from companion.kernels.flash import tiled_attention

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(
    not (HAS_CUDA and HAS_TRITON),
    reason="needs a CUDA GPU and triton (pip install 'companion[triton]'); "
    + ("no CUDA device here" if not HAS_CUDA else "triton is not installed"),
)


# ---------------------------------------------------------------- everywhere: checks and messages


@pytest.mark.skipif(triton_flash.INTERPRET, reason="TRITON_INTERPRET=1 lets CPU tensors through by design")
def test_cpu_tensors_get_a_clear_error():
    x = torch.randn(1, 2, 16, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="needs CUDA tensors; q is on cpu.*backend='tiled'"):
        triton_flash.triton_attention(x, x, x)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        attend(x, x, x, backend="triton")


def test_argument_checks():
    h = torch.randn(1, 2, 16, 64, dtype=torch.float16)
    cases = [
        ((h.float(), h.float(), h.float()), {}, "float16 or bfloat16"),
        ((h, h, h.bfloat16()), {}, "share a dtype"),
        ((h[..., :48], h[..., :48], h[..., :48]), {}, "head dim must be one of"),
        ((h[0], h[0], h[0]), {}, "4-D"),
        ((torch.randn(1, 3, 16, 64, dtype=torch.float16), h, h), {}, "multiple of the key/value heads"),
        ((h, h[:, :, :8], h), {}, "same heads and rows"),
        ((h, h[:, :, :8], h[:, :, :8]), {"causal": True}, "S >= T"),
        ((h, h, h), {"window": 4}, "window requires causal"),
        ((h, h, h), {"causal": True, "window": 0}, "window must be an int >= 1"),
        ((h, h, h), {"scale": 0.0}, "scale must be a positive"),
        ((h, h, h), {"causal": "yes"}, "causal must be a bool"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            triton_flash.flash_forward(*args, **kwargs)


def test_package_imports_and_explains_without_triton():
    """With triton hidden, the package and this module still import, and asking for the kernel says what to install."""
    message = missing_triton_message("triton_flash", "x = torch.randn(1, 1, 16, 16, dtype=torch.float16); m.flash_forward(x, x, x)")
    assert "pip install 'companion[triton]'" in message


# ---------------------------------------------------------------- CPU: the kernels under the interpreter

_INTERPRETED = textwrap.dedent(
    """
    import json, torch
    from companion.kernels.triton_flash import flash_forward, flash_backward, triton_attention, INTERPRET
    from companion.kernels.flash import tiled_attention
    assert INTERPRET
    gen = torch.Generator().manual_seed(0)
    results = []
    # (causal, window, T, S, h, g, d): square and cached (T < S), MHA / GQA / MQA, T not a multiple of 16
    for causal, window, T, S, h, g, d in [
        (False, None, 40, 40, 2, 1, 64),
        (True, None, 40, 40, 2, 2, 64),
        (True, None, 31, 48, 4, 2, 32),  # offset S - T = 17: the last key block starts right at a row
        (True, 7, 37, 50, 2, 1, 16),
        (True, 2, 40, 40, 2, 1, 16),  # window 2 puts the block-skipping bounds exactly on a 16-row edge
    ]:
        q = torch.randn(1, h, T, d, generator=gen).half()
        k = torch.randn(1, g, S, d, generator=gen).half()
        v = torch.randn(1, g, S, d, generator=gen).half()
        do = torch.randn(1, h, T, d, generator=gen).half()
        leaves = [x.float().requires_grad_() for x in (q, k, v)]
        ref_o, ref_lse = tiled_attention(*leaves, causal=causal, window=window, block_q=8, block_k=8)
        ref_grads = torch.autograd.grad((ref_o * do.float()).sum(), leaves)
        o, lse = flash_forward(q, k, v, causal=causal, window=window)
        grads = flash_backward(q, k, v, o, lse, do, causal=causal, window=window)
        # and through autograd, as attend(backend="triton") uses it
        tl_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        auto = torch.autograd.grad((triton_attention(*tl_leaves, causal=causal, window=window).float() * do.float()).sum(), tl_leaves)
        err = lambda a, b: (a.float() - b.float()).abs().max().item()
        results.append({
            "case": [causal, window, T, S, h, g, d],
            "o": err(o, ref_o), "lse": err(lse, ref_lse),
            "dq": err(grads[0], ref_grads[0]), "dk": err(grads[1], ref_grads[1]), "dv": err(grads[2], ref_grads[2]),
            "autograd": max(err(a, b) for a, b in zip(auto, grads)),
        })
    print("RESULTS" + json.dumps(results))
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install 'companion[triton]'); the interpreted kernel test needs it")
@pytest.mark.skipif(HAS_CUDA, reason="a GPU is present: the kernels are tested compiled, in the gpu tests below")
def test_kernels_under_the_interpreter_match_tiled_attention():
    """fp16 only: Triton 3.9's interpreter computes tl.dot on bfloat16 inputs wrongly (it multiplies the
    raw bits), so bf16 is checked on GPUs only. Runs in a subprocess because TRITON_INTERPRET must be set
    before the kernels are defined."""
    res = run_snippet(_INTERPRETED, interpret=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads(res.stdout.split("RESULTS", 1)[1])
    assert len(results) == 5
    for r in results:
        # fp16 inputs, fp32 accumulation; the remaining error is P and dS rounded to fp16 before the
        # second matmul and the fp16 outputs (about 1e-3 relative), on values of size ~1.
        assert r["o"] < 5e-3 and r["lse"] < 1e-4, r
        assert max(r["dq"], r["dk"], r["dv"]) < 1e-2, r
        assert r["autograd"] == 0.0, r


# ---------------------------------------------------------------- GPU: the compiled kernels


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 4, 300, 300), (1, 8, 2, 129, 517)])
def test_gpu_matches_tiled_reference(dtype, d, causal, shape):
    B, h, g, T, S = shape  # the second shape: GQA, T < S (cached prefix), neither a multiple of a block
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, h, T, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(B, g, S, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(B, g, S, d, device="cuda", generator=gen).to(dtype)
    do = torch.randn(B, h, T, d, device="cuda", generator=gen).to(dtype)
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    ref_o, ref_lse = tiled_attention(*leaves, causal=causal, block_q=128, block_k=128)
    ref_grads = torch.autograd.grad((ref_o * do.float()).sum(), leaves)
    tri = [x.clone().requires_grad_() for x in (q, k, v)]
    out = triton_flash.triton_attention(*tri, causal=causal)
    grads = torch.autograd.grad((out.float() * do.float()).sum(), tri)
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(out.float(), ref_o, rtol=tol, atol=tol)
    _, lse = triton_flash.flash_forward(q, k, v, causal=causal)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-4, atol=1e-4)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a.float(), b, rtol=5 * tol, atol=5 * tol, msg=lambda m: f"d{name}: {m}")


@pytest.mark.gpu
@needs_gpu
def test_gpu_backend_agrees_with_reference():
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(2, 4, 64, 64, device="cuda", generator=gen, dtype=torch.float16)
    k = torch.randn(2, 2, 96, 64, device="cuda", generator=gen, dtype=torch.float16)
    v = torch.randn(2, 2, 96, 64, device="cuda", generator=gen, dtype=torch.float16)
    for kwargs in ({}, {"causal": True}, {"causal": True, "window": 17}):
        ours = attend(q, k, v, backend="triton", **kwargs)
        ref = attend(q.float(), k.float(), v.float(), backend="reference", **kwargs)
        torch.testing.assert_close(ours.float(), ref, rtol=4e-3, atol=4e-3)
