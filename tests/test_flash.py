"""companion.kernels.flash: the online-softmax algebra, tiled attention and its recomputing backward.

The oracle throughout is the dense path: ``companion.attention.scaled_dot_product_attention`` on
explicitly expanded K/V heads with an explicitly built (T, S) mask, plus torch.softmax /
torch.logsumexp on the full score matrix, and autograd through that dense path for gradients.
"""

import math

import pytest
import torch
from tolerances import U, attention_atol, float32_paths_atol, logsumexp_atol, reduction_atol

from companion.attention import causal_mask, padding_mask, scaled_dot_product_attention, sliding_window_mask
from companion.kernels.flash import (
    SoftmaxState,
    block_state,
    empty_state,
    finalize,
    key_block_range,
    logsumexp,
    merge,
    tiled_attention,
)

MASK_KINDS = ["none", "causal", "window", "padding", "random", "additive", "cached", "cached_window"]


# ---------------------------------------------------------------- helpers (the independent oracle)


def _problem(seed, kind, heads=(4, 2), dtype=torch.float64, lead=(2,), T=None, S=None, d=None, dv=None):
    """Random q, k, v and the arguments describing one mask kind, plus the dense (T, S) mask for the oracle."""
    gen = torch.Generator().manual_seed(seed)
    h, g = heads
    T = T or int(torch.randint(1, 12, (1,), generator=gen))
    if kind.startswith("cached"):
        S = S or T + int(torch.randint(1, 8, (1,), generator=gen))  # T new rows after a prefix
    else:
        S = S or (T if kind in ("causal", "window", "padding") else int(torch.randint(1, 12, (1,), generator=gen)))
    d = d or int(torch.randint(1, 9, (1,), generator=gen))
    dv = dv or int(torch.randint(1, 9, (1,), generator=gen))
    q = torch.randn(*lead, h, T, d, generator=gen, dtype=dtype)
    k = torch.randn(*lead, g, S, d, generator=gen, dtype=dtype)
    v = torch.randn(*lead, g, S, dv, generator=gen, dtype=dtype)
    kwargs, dense = {}, None
    if kind in ("causal", "cached"):
        kwargs["causal"] = True
        dense = causal_mask(T, S)
    elif kind in ("window", "cached_window"):
        w = int(torch.randint(1, 4, (1,), generator=gen))
        kwargs.update(causal=True, window=w)
        dense = sliding_window_mask(T, w, S)
    elif kind == "padding":
        lengths = torch.randint(0, S + 1, lead, generator=gen)  # length 0: every row fully masked
        kwargs.update(causal=True, mask=padding_mask(lengths, S))
        dense = causal_mask(T, S) & padding_mask(lengths, S)
    elif kind == "random":
        m = torch.rand(*lead, h, T, S, generator=gen) < 0.6
        kwargs["mask"] = m
        dense = m
    elif kind == "additive":
        add = torch.randn(*lead, 1, T, S, generator=gen, dtype=dtype)
        add = add.masked_fill(torch.rand(T, S, generator=gen) < 0.3, float("-inf"))
        kwargs["mask"] = add
        dense = add
    return q, k, v, kwargs, dense


def _bias(kwargs) -> float:
    """The largest finite entry of an additive (float) mask, 0 for a boolean mask or none."""
    m = kwargs.get("mask")
    if m is None or m.dtype == torch.bool:
        return 0.0
    finite = m[torch.isfinite(m)]
    return finite.abs().max().item() if finite.numel() else 0.0


def _dense(q, k, v, dense_mask, scale=None):
    """Dense attention and logsumexp on expanded heads, computed from the full (T, S) scores."""
    r = q.shape[-3] // k.shape[-3]
    k_full, v_full = k.repeat_interleave(r, dim=-3), v.repeat_interleave(r, dim=-3)
    out = scaled_dot_product_attention(q, k_full, v_full, dense_mask, scale=scale)
    s = (q @ k_full.transpose(-2, -1)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if dense_mask is not None:
        s = s.masked_fill(~dense_mask, float("-inf")) if dense_mask.dtype == torch.bool else s + dense_mask
    return out, torch.logsumexp(s, dim=-1)


# ---------------------------------------------------------------- 1. the online-softmax algebra


def test_block_state_then_finalize_is_softmax_times_v():
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64) * 4
    v = torch.randn(3, 7, 2, generator=gen, dtype=torch.float64)
    st = block_state(s, v)
    torch.testing.assert_close(st.m, s.amax(-1))
    torch.testing.assert_close(finalize(st), torch.softmax(s, -1) @ v)
    torch.testing.assert_close(logsumexp(st), torch.logsumexp(s, -1))


@pytest.mark.parametrize("seed", range(4))
def test_merging_any_partition_equals_the_whole(seed):
    gen = torch.Generator().manual_seed(seed)
    S = 13
    s = torch.randn(4, S, generator=gen, dtype=torch.float64) * 5
    s = s.masked_fill(torch.rand(4, S, generator=gen) < 0.3, float("-inf"))
    v = torch.randn(S, 3, generator=gen, dtype=torch.float64)
    cuts = sorted(torch.randperm(S - 1, generator=gen)[:3].add(1).tolist())
    pieces = list(zip([0, *cuts], [*cuts, S]))
    states = [block_state(s[:, a:b], v[a:b]) for a, b in pieces]
    whole = block_state(s, v)
    # left to right, as the forward loop does ...
    acc = empty_state((4,), 3, dtype=torch.float64)
    for st in states:
        acc = merge(acc, st)
    # ... and in a shuffled order: merge is commutative and associative (up to rounding)
    acc2 = empty_state((4,), 3, dtype=torch.float64)
    for i in torch.randperm(len(states), generator=gen).tolist():
        acc2 = merge(states[i], acc2)
    for a in (acc, acc2):
        torch.testing.assert_close(a.m, whole.m)
        torch.testing.assert_close(a.l, whole.l)
        torch.testing.assert_close(a.u, whole.u)
    torch.testing.assert_close(finalize(acc), torch.softmax(s, -1).nan_to_num(0.0) @ v)


def test_empty_and_fully_masked_blocks_give_no_nan():
    v = torch.randn(4, 2, dtype=torch.float64)
    masked = block_state(torch.full((3, 4), float("-inf"), dtype=torch.float64), v)
    assert torch.equal(masked.m, torch.full((3,), float("-inf"), dtype=torch.float64))
    assert torch.equal(masked.l, torch.zeros(3, dtype=torch.float64))
    assert torch.equal(masked.u, torch.zeros(3, 2, dtype=torch.float64))
    no_keys = block_state(torch.zeros(3, 0, dtype=torch.float64), torch.zeros(0, 2, dtype=torch.float64))
    assert torch.isneginf(no_keys.m).all() and (no_keys.l == 0).all()
    both = merge(masked, no_keys)
    assert not any(torch.isnan(x).any() for x in both)
    assert torch.equal(finalize(both), torch.zeros(3, 2, dtype=torch.float64))
    assert torch.isneginf(logsumexp(both)).all()
    # an empty side passes the other through unchanged, in either order
    real = block_state(torch.randn(3, 4, dtype=torch.float64), v)
    for merged in (merge(masked, real), merge(real, masked)):
        for x, y in zip(merged, real):
            assert torch.equal(x, y)


def test_state_does_not_overflow_on_huge_scores():
    s = torch.tensor([[1000.0, 999.0, -1000.0]])
    v = torch.tensor([[1.0], [2.0], [3.0]])
    a, b = block_state(s[:, :1], v[:1]), block_state(s[:, 1:], v[1:])
    out = finalize(merge(a, b))
    expected = (1 * 1 + 2 * math.exp(-1)) / (1 + math.exp(-1))
    assert torch.isfinite(out).all()
    assert abs(out.item() - expected) < 1e-5


def test_state_api_errors():
    with pytest.raises(ValueError, match="must equal v's rows"):
        block_state(torch.zeros(2, 3), torch.zeros(4, 1))
    with pytest.raises(ValueError, match=r"\+inf"):
        block_state(torch.tensor([[float("inf")]]), torch.zeros(1, 1))
    with pytest.raises(ValueError, match="a must be a SoftmaxState"):
        merge((torch.zeros(1), torch.zeros(1), torch.zeros(1, 1)), empty_state((1,), 1))
    with pytest.raises(ValueError, match="state must have m and l"):
        finalize(SoftmaxState(torch.zeros(2), torch.zeros(3), torch.zeros(2, 1)))
    with pytest.raises(ValueError, match="non-negative"):
        empty_state((-1,), 2)


# ---------------------------------------------------------------- 2. which key blocks are read


@pytest.mark.parametrize("seed", range(20))
def test_key_block_range_is_exactly_the_blocks_with_an_allowed_pair(seed):
    gen = torch.Generator().manual_seed(seed)
    T = int(torch.randint(1, 20, (1,), generator=gen))
    S = T + int(torch.randint(0, 10, (1,), generator=gen))
    bq, bk = (int(x) for x in torch.randint(1, 7, (2,), generator=gen))
    window = None if seed % 2 else int(torch.randint(1, 6, (1,), generator=gen))
    allowed = causal_mask(T, S) if window is None else sliding_window_mask(T, window, S)
    for qs in range(0, T, bq):
        qe = min(T, qs + bq)
        needed = {kb for kb in range(-(-S // bk)) if allowed[qs:qe, kb * bk : (kb + 1) * bk].any()}
        assert set(key_block_range(qs, qe, T, S, bk, causal=True, window=window)) == needed
    assert list(key_block_range(0, T, T, S, bk, causal=False, window=None)) == list(range(-(-S // bk)))


# ---------------------------------------------------------------- 3. the tiled forward is exact


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (3, 1)])
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_tiled_forward_matches_dense(kind, heads, dtype):
    for seed in range(3):
        q, k, v, kwargs, dense = _problem(seed + 10 * MASK_KINDS.index(kind), kind, heads, dtype)
        gen = torch.Generator().manual_seed(seed)
        bq, bk = (int(x) for x in torch.randint(1, 6, (2,), generator=gen))  # rarely divide T or S
        out, lse = tiled_attention(q, k, v, block_q=bq, block_k=bk, **kwargs)
        ref_out, ref_lse = _dense(q, k, v, dense)
        assert out.dtype == dtype and out.shape == ref_out.shape and lse.shape == ref_lse.shape
        # two computations in dtype: one online softmax over ceil(S / bk) key blocks, one dense
        bound = dict(rescales=-(-k.shape[-2] // bk), bias=_bias(kwargs), dtype=dtype)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=attention_atol(q, k, v, **bound))
        torch.testing.assert_close(lse, ref_lse, rtol=0, atol=logsumexp_atol(q, k, **bound))


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    q, k, v = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    out, lse = tiled_attention(q, k, v, mask=mask, block_q=3, block_k=2)
    assert torch.equal(out[..., 2, :], torch.zeros(1, 2, 3))
    assert torch.isneginf(lse[..., 2]).all() and torch.isfinite(lse[..., [0, 1, 3]]).all()


def test_no_leading_dims_custom_scale_and_large_blocks():
    q, k, v = torch.randn(2, 7, 5, dtype=torch.float64), torch.randn(1, 9, 5, dtype=torch.float64), torch.randn(1, 9, 4, dtype=torch.float64)
    out, lse = tiled_attention(q, k, v, causal=True, block_q=100, block_k=100, scale=0.3)
    ref, ref_lse = _dense(q, k, v, causal_mask(7, 9), scale=0.3)
    # two float64 computations; one key block of 9, but rescales=S bounds any blocking
    bound = dict(scale=0.3, rescales=9, dtype=torch.float64)
    torch.testing.assert_close(out, ref, rtol=0, atol=attention_atol(q, k, v, **bound))
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=logsumexp_atol(q, k, **bound))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_float32(dtype):
    q, k, v, kwargs, dense = _problem(3, "causal", (2, 1), torch.float32, T=20, d=16, dv=16)
    out, lse = tiled_attention(q.to(dtype), k.to(dtype), v.to(dtype), block_q=8, block_k=8, **kwargs)
    ref, ref_lse = _dense(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), dense)
    assert out.dtype == dtype and lse.dtype == torch.float32
    # the only rounding beyond float32 is the final cast of O to the half type: |o| <= max|v|, one
    # rounding of it in dtype, on top of two float32 attentions of the same half-rounded inputs
    hq, hk, hv = (x.to(dtype).float() for x in (q, k, v))
    tol = U[dtype] * hv.abs().max().item() + attention_atol(hq, hk, hv, rescales=hk.shape[-2])
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=tol)
    # lse stays float32 on both sides, from the same half-rounded inputs: two float32 logsumexps
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=logsumexp_atol(hq, hk, rescales=hk.shape[-2]))


# ---------------------------------------------------------------- 4. the recomputing backward


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_gradients_match_autograd_through_dense(kind, dtype):
    for seed, heads in enumerate([(2, 2), (4, 2), (3, 1)]):
        q, k, v, kwargs, dense = _problem(100 + seed + 10 * MASK_KINDS.index(kind), kind, heads, dtype)
        gen = torch.Generator().manual_seed(seed)
        bq, bk = (int(x) for x in torch.randint(1, 6, (2,), generator=gen))
        d_out = torch.randn(*q.shape[:-1], v.shape[-1], generator=gen, dtype=dtype)
        d_lse = torch.randn(q.shape[:-1], generator=gen, dtype=dtype)

        def loss(out, lse):
            # the lse term checks its gradient too; -inf entries (empty rows) carry none
            return (out * d_out).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * d_lse).sum()

        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        grads = torch.autograd.grad(loss(*tiled_attention(*leaves, block_q=bq, block_k=bk, **kwargs)), leaves)
        ref_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        ref_grads = torch.autograd.grad(loss(*_dense(*ref_leaves, dense)), ref_leaves)
        atols = _gradient_atols(q, k, v, kwargs, bq, bk, d_out, d_lse, dtype)
        for name, g, r, atol in zip("qkv", grads, ref_grads, atols):
            assert g.shape == r.shape, name
            torch.testing.assert_close(g, r, rtol=0, atol=atol, msg=lambda m: f"d{name}: {m}")


def _gradient_atols(q, k, v, kwargs, bq, bk, d_out, d_lse, dtype):
    """The allowed difference of each gradient, tiled against dense autograd, from the arithmetic: the
    tiled backward run in float32 and in float64 on the same float32-rounded inputs measures float32's
    error, and tolerances.float32_paths_atol bounds two float32 computations by it. In float64 the same
    algorithm's rounding errors are, to first order, u64 / u32 = 2^-29 times as large."""
    def grads(dt):
        leaves = [x.to(torch.float32).to(dt).requires_grad_() for x in (q, k, v)]
        cast = {n: (m.to(dt) if n == "mask" and m.is_floating_point() else m) for n, m in kwargs.items()}
        out, lse = tiled_attention(*leaves, block_q=bq, block_k=bk, **cast)
        loss = (out * d_out.to(dt)).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * d_lse.to(dt)).sum()
        return torch.autograd.grad(loss, leaves)

    atols = [float32_paths_atol(g32, g64) for g32, g64 in zip(grads(torch.float32), grads(torch.float64))]
    return atols if dtype == torch.float32 else [a * U[torch.float64] / U[torch.float32] for a in atols]


def test_gradcheck_small():
    q, k, v, kwargs, _ = _problem(5, "cached_window", (2, 1), torch.float64, T=4, d=3, dv=2)
    inputs = [x.requires_grad_() for x in (q, k, v)]
    # float64 central differences with step eps = 1e-6 are off by eps^2 |f'''| / 6 ~ 1e-12 (truncation) plus
    # u |f| / eps ~ 1e-10 (rounding, u = 2^-53): the 1e-6 below is a bound of both with 4 orders to spare
    assert torch.autograd.gradcheck(
        lambda a, b, c: tiled_attention(a, b, c, block_q=3, block_k=2, **kwargs), inputs, eps=1e-6, atol=1e-6  # float64 bound, derived above
    )


def test_backward_saves_no_T_by_S_tensor():
    """Every tensor saved for the backward is recorded; none may be (T, S)-sized.

    The same probe on the dense path does find a (T, S) tensor, which shows the probe can fail.
    """
    B, h, g, T, S, d = 1, 4, 2, 48, 80, 8
    q = torch.randn(B, h, T, d, requires_grad=True)
    k = torch.randn(B, g, S, d, requires_grad=True)
    v = torch.randn(B, g, S, d, requires_grad=True)

    def saved_shapes(fn):
        shapes = []

        def pack(t):
            shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return shapes

    def is_score_sized(shape):
        return len(shape) >= 2 and shape[-2:] in ((T, S), (S, T))

    tiled = saved_shapes(lambda: tiled_attention(q, k, v, causal=True, block_q=16, block_k=16))
    assert sorted(tiled) == sorted([(B, h, T, d), (B, g, S, d), (B, g, S, d), (B, h, T, d), (B, h, T)])
    assert not any(is_score_sized(s) for s in tiled)
    dense = saved_shapes(lambda: _dense(q, k, v, causal_mask(T, S)))
    assert any(is_score_sized(s) for s in dense)


def test_backward_node_saves_only_tensors():
    """Tools that walk ``grad_fn.saved_tensors`` (memory profilers, checkpointing) need tensors only:
    no mask saves five tensors, not five and a None; a mask is saved as the sixth."""
    q, k, v = (torch.randn(1, 2, 6, 4, requires_grad=True) for _ in range(3))
    out, _ = tiled_attention(q, k, v, causal=True, block_q=4, block_k=4)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 5 and all(isinstance(t, torch.Tensor) for t in saved)
    mask = torch.rand(6, 6) > 0.3
    out, _ = tiled_attention(q, k, v, mask=mask, block_q=4, block_k=4)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 6 and all(isinstance(t, torch.Tensor) for t in saved)
    assert torch.equal(saved[-1], mask)
    out.sum().backward()  # the backward still finds the mask it needs
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_only_q_needs_grad():
    q, k, v, kwargs, dense = _problem(7, "causal", (2, 2), torch.float64, T=6)
    qq = q.clone().requires_grad_()
    (g,) = torch.autograd.grad(tiled_attention(qq, k, v, block_q=4, block_k=4, **kwargs)[0].sum(), [qq])
    qr = q.clone().requires_grad_()
    (r,) = torch.autograd.grad(_dense(qr, k, v, dense)[0].sum(), [qr])
    # two float64 backwards: scores, lse, dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D), dQ = scale dS K, six
    # reductions of length <= S + d + dv + 5 (exp's ulps) whose terms are bounded by M = scale S max|k| 2 dv max|v|
    # (|dO| = 1; |dP| and |D| are at most dv max|v|; sum_j P_ij = 1 but M takes S to bound the terms of dQ too)
    S, d, dv = k.shape[-2], k.shape[-1], v.shape[-1]
    M = d ** -0.5 * S * k.abs().max().item() * 2 * dv * v.abs().max().item()
    torch.testing.assert_close(g, r, rtol=0, atol=reduction_atol(S + d + dv + 5, M, chain=6, dtype=torch.float64))


# ---------------------------------------------------------------- 5. argument checks


def test_tiled_attention_errors():
    x = torch.randn(1, 2, 4, 3)
    with pytest.raises(ValueError, match="at least 3 dims"):
        tiled_attention(x[0, 0], x[0, 0], x[0, 0])
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        tiled_attention(torch.randn(1, 3, 4, 3), x, x)
    with pytest.raises(ValueError, match="share the key width"):
        tiled_attention(x, torch.randn(1, 2, 4, 5), x)
    with pytest.raises(ValueError, match="same number of rows"):
        tiled_attention(x, x, torch.randn(1, 2, 5, 3))
    with pytest.raises(ValueError, match="share a dtype"):
        tiled_attention(x, x, x.double())
    with pytest.raises(ValueError, match="window requires causal"):
        tiled_attention(x, x, x, window=2)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        tiled_attention(x, x, x, causal=True, window=0)
    with pytest.raises(ValueError, match="S >= T"):
        tiled_attention(x, x[:, :, :2], x[:, :, :2], causal=True)
    with pytest.raises(ValueError, match="block_q must be an int >= 1"):
        tiled_attention(x, x, x, block_q=0)
    with pytest.raises(ValueError, match="block_k must be an int >= 1"):
        tiled_attention(x, x, x, block_k=2.5)
    with pytest.raises(ValueError, match="scale must be a positive"):
        tiled_attention(x, x, x, scale=-1.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        tiled_attention(x, x, x, mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool .* or floating"):
        tiled_attention(x, x, x, mask=torch.ones(4, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="causal must be a bool"):
        tiled_attention(x, x, x, causal=1)
    with pytest.raises(ValueError, match="leading"):
        tiled_attention(x, torch.randn(2, 2, 4, 3), torch.randn(2, 2, 4, 3))


# ---------------------------------------------------------------- traffic model and tensor byte count


def test_dense_traffic_counts_four_passes_over_the_score_matrix_plus_the_operands():
    from companion.kernels.flash import dense_traffic_bytes

    T, S, d, h, b = 96, 80, 16, 3, 2
    by_hand = h * b * (T * d + S * d + T * S + 2 * T * S + T * S + S * d + T * d)
    assert dense_traffic_bytes(T, S, d, h, b) == by_hand
    # the seeds' example: one 4096 x 4096 bf16 score matrix for 32 heads is 4096^2 * 32 * 2 bytes
    assert dense_traffic_bytes(4096, 4096, 128, 32, 2) > 4 * 4096**2 * 32 * 2


def test_tiled_traffic_reads_kv_once_per_query_block_or_once_when_cached():
    from companion.kernels.flash import tiled_traffic_bytes

    T, S, d, h, b, bq = 100, 100, 8, 2, 2, 32  # 4 query blocks, the last one partial
    assert tiled_traffic_bytes(T, S, d, h, b, bq) == h * (b * (2 * T * d + 4 * 2 * S * d) + 4 * T)
    assert tiled_traffic_bytes(T, S, d, h, b, bq, kv_cached=True) == h * (b * (2 * T * d + 2 * S * d) + 4 * T)
    for bad in ({"block_q": 0}, {"T": 1.5}, {"heads": True}):
        args = {"T": T, "S": S, "d": d, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            tiled_traffic_bytes(**args)
    with pytest.raises(ValueError, match="kv_cached"):
        tiled_traffic_bytes(T, S, d, kv_cached=1)


def test_tensor_bytes_counts_new_storage_ignores_views_and_frees():
    from companion.kernels.flash import TensorBytes

    x = torch.zeros(1000)  # made outside: never counted
    with TensorBytes() as meter:
        view = x[:10]  # a view of an outside tensor: no new memory
        assert meter.now == 0
        a = torch.ones(250) * 2  # ones (1000 B) then the product (1000 B)
        assert meter.now == 1000 and meter.peak == 2000  # the ones() temporary is gone
        b = a.view(25, 10).t()  # views of a: still 1000 B
        assert meter.now == 1000
        del a
        assert meter.now == 1000  # b still holds the storage
        del b
        assert meter.now == 0 and meter.peak == 2000
    del view


def test_tensor_bytes_peak_of_dense_attention_holds_the_score_matrix_and_tiled_does_not():
    from companion.kernels.flash import TensorBytes

    T, d = 256, 16
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, T, d, generator=gen) for _ in range(3))
    with TensorBytes() as dense:
        scaled_dot_product_attention(q, k, v)
    with TensorBytes() as tiled:
        tiled_attention(q, k, v, block_q=32, block_k=32)
    assert dense.peak >= 2 * T * T * 4  # at least the scores and the probabilities at once
    assert tiled.peak < T * T * 4 / 4  # less than a quarter of one T x T float32 matrix
