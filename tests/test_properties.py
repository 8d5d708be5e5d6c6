"""Property-based tests (hypothesis) of attention masks, the attention layer and residual blocks.

Each property is checked on a bounded number of generated shapes and options (derandomised, so a run
is reproducible); the whole file takes a few seconds on a CPU.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import float64_twin_atol

from companion.kernels.attend import build_mask
from companion.blocks import Block
from companion.feedforward import SwiGLU
from companion.mha import AttentionVariant, MultiHeadAttention, position_mask
from companion.models import Decoder, DecoderConfig
from companion.positions import RotaryEmbedding

FAST = settings(max_examples=25, deadline=None, derandomize=True, database=None)
windows = st.one_of(st.none(), st.integers(1, 6))


@st.composite
def head_layouts(draw):
    """(h, g, d_h) with g dividing h."""
    h = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    g = draw(st.sampled_from([d for d in range(1, h + 1) if h % d == 0]))
    return h, g, draw(st.sampled_from([2, 4, 8]))


def _call(m, x):
    return m(x)


# tolerances: where two float32 computations of one function are compared (a GQA layer and its MHA copy,
# cached chunks and one pass, a prefix and the whole), float64_twin_atol bounds them: 4 times one side's own
# float32 error, measured against its float64 twin, plus 8 ulps (tests/tolerances.py, float32_paths_atol)


def _attention(h, g, dh, *, window=None, keep=0, backend="reference", seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(h * dh, h, g, dh, rope=RotaryEmbedding(dh), backend=backend, variant=AttentionVariant(window=window, keep=keep)).eval()


# ------------------------------------------------------------------------------------------- masks


@FAST
@given(
    start=st.integers(0, 10), T=st.integers(1, 8), window=windows, keep=st.integers(0, 3), causal=st.booleans(),
)
def test_position_mask_is_the_elementwise_rule(start, T, window, keep, causal):
    """position_mask == the rule written per (query, key) pair with plain integers."""
    q = torch.arange(start, start + T)
    k = torch.arange(0, start + T)
    got = position_mask(q, k, causal=causal, window=window, keep=keep)
    assert got.shape == (T, start + T) and got.dtype == torch.bool
    for i, pi in enumerate(q.tolist()):
        for j, pj in enumerate(k.tolist()):
            ok = (pj <= pi) if causal else True
            if window is not None:
                ok = ok and (pi - pj < window or pj < keep)
            assert bool(got[i, j]) == ok


@FAST
@given(start=st.integers(0, 10), T=st.integers(1, 8), window=windows)
def test_positional_and_index_masks_agree_for_contiguous_keys(start, T, window):
    """The cache-aware mask from absolute positions equals the (T, S) mask with queries at S - T + i."""
    S = start + T
    from_positions = position_mask(torch.arange(start, S), torch.arange(S), window=window)
    assert torch.equal(from_positions, build_mask(T, S, causal=True, window=window))
    if window is not None:  # every query reads exactly min(w, p + 1) keys, itself included
        counts = from_positions.sum(-1)
        assert torch.equal(counts, torch.clamp(torch.arange(start, S) + 1, max=window))


# ------------------------------------------------------------------------------------------- attention


@FAST
@given(layout=head_layouts(), B=st.integers(1, 2), T=st.integers(1, 9), window=windows, backend=st.sampled_from(["reference", "sdpa"]))
def test_gqa_equals_mha_with_repeated_kv_weights(layout, B, T, window, backend):
    """Query head i reads kv head i // (h / g): the same layer with its k/v weights repeated per group
    and g = h computes the same function; the output keeps the input's shape."""
    h, g, dh = layout
    gqa = _attention(h, g, dh, window=window, backend=backend)
    mha = _attention(h, h, dh, window=window, backend=backend)
    with torch.no_grad():
        q, k, v = gqa.qkv.weight.split([h * dh, g * dh, g * dh])
        rep = lambda w: w.view(g, dh, -1).repeat_interleave(h // g, dim=0).reshape(h * dh, -1)  # noqa: E731
        mha.qkv.weight.copy_(torch.cat((q, rep(k), rep(v))))
        mha.out.weight.copy_(gqa.out.weight)
    x = torch.randn(B, T, h * dh)
    out = gqa(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, mha(x), atol=float64_twin_atol(_call, gqa, x), rtol=0)


@FAST
@given(layout=head_layouts(), T=st.integers(2, 10), window=windows, keep=st.integers(0, 2), data=st.data())
def test_each_row_depends_exactly_on_the_rows_its_mask_allows(layout, T, window, keep, data):
    """Perturb the input at one position k: row i changes iff the mask lets query i read key k."""
    h, g, dh = layout
    keep = keep if window is not None else 0
    attn = _attention(h, g, dh, window=window, keep=keep, seed=1)
    k = data.draw(st.integers(0, T - 1), label="perturbed row")
    x = torch.randn(1, T, h * dh, dtype=torch.float64)
    y = x.clone()
    y[0, k] += torch.randn(h * dh, dtype=torch.float64)
    attn = attn.double()
    with torch.no_grad():
        changed = (attn(x) - attn(y)).abs().amax(-1)[0] > 1e-9
    allowed = position_mask(torch.arange(T), torch.arange(T), window=window, keep=keep)[:, k]
    assert torch.equal(changed, allowed)


@FAST
@given(layout=head_layouts(), T=st.integers(2, 8), data=st.data())
def test_padding_mask_hides_padded_keys(layout, T, data):
    """Changing a padded token's input changes no other row's output."""
    h, g, dh = layout
    attn = _attention(h, g, dh, seed=2)
    pad = torch.tensor(data.draw(st.lists(st.booleans(), min_size=T, max_size=T), label="padded"))
    pad[0] = False  # keep one readable key for every query
    keys = ~pad
    x = torch.randn(1, T, h * dh)
    y = x.clone()
    y[0, pad] = torch.randn(int(pad.sum()), h * dh)
    with torch.no_grad():
        a, b = attn(x, mask=keys[None, None, None, :]), attn(y, mask=keys[None, None, None, :])
    # exact: a kept row reads a padded key only through a score of -inf, so through a weight exp(-inf) = 0
    # and terms 0 * v = 0; its other sums see the same values in the same order, so it is bit-identical
    assert torch.equal(a[0, keys], b[0, keys])


@FAST
@given(layout=head_layouts(), T=st.integers(2, 12), window=windows, keep=st.integers(0, 2), data=st.data())
def test_cached_chunks_equal_one_pass(layout, T, window, keep, data):
    """Feeding the sequence in random chunks through a (windowed, bounded) cache == one full pass."""
    from companion.cache import ContiguousLayerCache

    h, g, dh = layout
    keep = keep if window is not None else 0
    attn = _attention(h, g, dh, window=window, keep=keep, backend="sdpa", seed=3)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, T - 1), max_size=3), label="cuts")))
    x = torch.randn(2, T, h * dh)
    cache = ContiguousLayerCache(window, keep)
    with torch.no_grad():
        full = attn(x)
        parts = [attn(x[:, a:b], cache=cache) for a, b in zip([0, *cuts], [*cuts, T])]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=float64_twin_atol(_call, attn, x), rtol=0)
    if window is not None:
        assert cache.stored <= window - 1 + keep


# ------------------------------------------------------------------------------------------- blocks


@FAST
@given(
    d=st.sampled_from([8, 16]), T=st.integers(1, 6), norm=st.sampled_from(["layer", "rms"]),
    placement=st.sampled_from(["pre", "post"]),
)
def test_block_wiring_matches_its_equation(d, T, norm, placement):
    """pre: x + f(N(x)) then + FFN(N'(.)); post: N(x + f(x)) then N'(. + FFN(.)), using the block's own parts."""
    torch.manual_seed(4)
    block = Block(d, MultiHeadAttention(d, 2, rope=RotaryEmbedding(d // 2)), SwiGLU(d, 24), norm=norm, placement=placement).eval()
    with torch.no_grad():
        for p in block.parameters():  # norms away from the identity, so a swapped norm shows
            p.add_(torch.randn_like(p) * 0.1)
        x = torch.randn(2, T, d)
        if placement == "pre":
            hdn = x + block.attn(block.attn_norm(x))
            want = hdn + block.ffn(block.ffn_norm(hdn))
        else:
            hdn = block.attn_norm(x + block.attn(x))
            want = block.ffn_norm(hdn + block.ffn(hdn))
        got = block(x)
    assert got.shape == x.shape
    # exact: the block's forward and the equation call the same modules on the same tensors in the same order
    assert torch.equal(got, want)


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(
    layout=head_layouts(), n_layers=st.integers(1, 2), window=windows, global_every=st.one_of(st.none(), st.integers(1, 3)),
    ffn=st.sampled_from(["swiglu", "gelu"]), position=st.sampled_from(["rope", "alibi", "learned", "none"]),
    T=st.integers(2, 10), data=st.data(),
)
def test_decoder_shapes_and_causal_prefix_on_random_configs(layout, n_layers, window, global_every, ffn, position, T, data):
    """Any valid config: logits (B, T, V), and logits at t < T' unchanged by appending tokens."""
    h, g, dh = layout
    config = DecoderConfig(
        vocab_size=50, d_model=h * dh, n_layers=n_layers, n_heads=h, n_kv_heads=g, max_seq_len=16, window=window,
        global_every=global_every, ffn=ffn, position=position, d_ff=32,
    )
    torch.manual_seed(5)
    model = Decoder(config).eval()
    idx = torch.randint(0, 50, (2, T))
    t = data.draw(st.integers(1, T), label="prefix")
    with torch.no_grad():
        logits = model(idx)
        assert logits.shape == (2, T, 50)
        torch.testing.assert_close(model(idx[:, :t]), logits[:, :t], atol=float64_twin_atol(_call, model, idx), rtol=0)

