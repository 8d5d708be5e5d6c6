"""Every attention backend computes the same function, for MHA, GQA and MQA and every mask kind."""

import pytest
import torch
from tolerances import attention_atol

from companion.attention import padding_mask
from companion.kernels.attend import BACKENDS, attend, build_mask, expand_kv

# The Triton kernel takes CUDA fp16/bf16 tensors with head dim 64 or 128, not these small CPU float
# cases; tests/test_triton_flash.py holds it to the reference on a GPU (and under the interpreter).
_TRITON_SKIP = pytest.mark.skip(reason="backend 'triton' is tested in tests/test_triton_flash.py (CUDA, fp16/bf16, d = 64/128)")
ALL = [pytest.param(b, marks=_TRITON_SKIP) if b == "triton" else b for b in BACKENDS]
CONCRETE = [b for b in ALL if b != "auto"]


def _dense_reference(q, k, v, mask):
    """Independent oracle: loops over heads and rows with the textbook formula in float64."""
    B, h, T, d = q.shape
    g = k.shape[1]
    out = torch.zeros(B, h, T, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for head in range(h):
            kv = head // (h // g)
            for i in range(T):
                s = (k[b, kv].double() @ q[b, head, i].double()) / d**0.5
                allowed = mask[b if mask.shape[0] > 1 else 0, head if mask.shape[1] > 1 else 0, i] if mask is not None else torch.ones_like(s, dtype=torch.bool)
                if not allowed.any():
                    continue
                s = s.masked_fill(~allowed, float("-inf"))
                out[b, head, i] = torch.softmax(s, -1) @ v[b, kv].double()
    return out


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("case", ["none", "causal", "window", "padding", "cached"])
def test_backends_agree_with_oracle(backend, heads, case):
    h, g = heads
    gen = torch.Generator().manual_seed(hash((h, g, case)) % 1000)
    B, T, S, d = 2, 5, 5, 8
    if case == "cached":
        T = 2  # two new rows after a prefix of three
    q = torch.randn(B, h, T, d, generator=gen)
    k = torch.randn(B, g, S, d, generator=gen)
    v = torch.randn(B, g, S, d, generator=gen)
    kwargs = {}
    if case in ("causal", "cached"):
        kwargs["causal"] = True
    if case == "window":
        kwargs.update(causal=True, window=2)
    if case == "padding":
        kwargs.update(causal=True, mask=padding_mask([5, 3], S))
    out = attend(q, k, v, backend=backend, **kwargs)
    mask = build_mask(T, S, **kwargs)
    if mask is not None:
        mask = mask.expand(B, h, T, S) if mask.dim() == 4 else mask.expand(B, h, T, S)
    ref = _dense_reference(q, k, v, mask)
    # float32 against the float64 oracle: one side's rounding (sides=1); an online softmax rescales at most
    # once per key, so rescales=S covers every backend's blocking
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=attention_atol(q, k, v, rescales=S, sides=1))


@pytest.mark.parametrize("backend", CONCRETE)
def test_empty_rows_are_zero_in_every_backend(backend):
    q = torch.randn(1, 2, 3, 4)
    k = torch.randn(1, 2, 3, 4)
    v = torch.randn(1, 2, 3, 4)
    mask = torch.tensor([[True, True, True], [False, False, False], [True, False, True]])
    out = attend(q, k, v, mask=mask, backend=backend)
    assert torch.isfinite(out).all()
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 4))


def test_errors():
    x = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match="backend must be one of"):
        attend(x, x, x, backend="fast")
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        expand_kv(torch.randn(1, 2, 2, 4), 3)
    with pytest.raises(ValueError, match="window requires causal"):
        attend(x, x, x, window=2)
    with pytest.raises(ValueError, match="4-D"):
        attend(x[0], x[0], x[0])
    with pytest.raises(ValueError, match="boolean"):
        attend(x, x, x, mask=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="window requires causal"):
        attend(x, x, x, window=2, backend="tiled")
    with pytest.raises(ValueError, match="boolean"):
        attend(x, x, x, mask=torch.zeros(2, 2), backend="tiled")
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        attend(x, torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4), backend="tiled")
    with pytest.raises(ValueError, match="not supported by backend='tiled'"):
        attend(x, x, x, backend="tiled", sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="CUDA"):
        attend(x, x, x, backend="triton")  # CPU tensors: a clear error, whether or not triton is installed


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan"), True, "0.5"])
def test_every_entry_point_applies_the_one_scale_rule(scale):
    """companion.attention.resolve_scale is the rule; the reference SDPA, the tiled kernel and paged
    attention all answer a bad scale with its error (and a good one with its value)."""
    from companion.attention import resolve_scale, scaled_dot_product_attention
    from companion.kernels.flash import tiled_attention
    from companion.kernels.paged_reference import paged_attention_reference

    x = torch.randn(1, 2, 3, 4)
    pages = torch.randn(2, 2, 2, 4)
    one = torch.tensor([0])
    calls = [
        lambda s: resolve_scale(s, 4),
        lambda s: scaled_dot_product_attention(x, x, x, scale=s),
        lambda s: tiled_attention(x, x, x, scale=s),
        lambda s: paged_attention_reference(x[0, :, :1].transpose(0, 1).contiguous(), pages, pages,
                                            torch.tensor([[0, 1]]), torch.tensor([1]), one, one, scale=s),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="scale must be a positive finite number"):
            call(scale)
    assert resolve_scale(None, 16) == 0.25 and resolve_scale(2, 16) == 2.0 and resolve_scale(None, 0) == 1.0
