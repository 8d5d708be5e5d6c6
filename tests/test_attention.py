"""companion.attention against torch's fused implementation and against hand-worked numbers."""

import math

import pytest
import torch
import torch.nn.functional as F
from tolerances import attention_atol

from companion.attention import (
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
    stable_softmax,
    to_additive_mask,
)


def _random_qkv(gen, lead, T, S, dk, dv, dtype=torch.float64):
    q = torch.randn(*lead, T, dk, generator=gen, dtype=dtype)
    k = torch.randn(*lead, S, dk, generator=gen, dtype=dtype)
    v = torch.randn(*lead, S, dv, generator=gen, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("seed", range(6))
def test_matches_torch_sdpa_on_random_shapes(seed):
    gen = torch.Generator().manual_seed(seed)
    lead = tuple(int(x) for x in torch.randint(1, 4, (int(torch.randint(0, 3, (1,), generator=gen)),), generator=gen))
    T, S, dk, dv = (int(x) for x in torch.randint(1, 9, (4,), generator=gen))
    q, k, v = _random_qkv(gen, lead, T, S, dk, dv)
    ours = scaled_dot_product_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(ours, ref, rtol=0, atol=attention_atol(q, k, v, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["causal", "window", "random", "padding"])
@pytest.mark.parametrize("additive", [False, True])
def test_masks_match_torch_sdpa(kind, additive):
    gen = torch.Generator().manual_seed(7)
    B, h, T, d = 2, 3, 6, 5
    q, k, v = _random_qkv(gen, (B, h), T, T, d, d)
    if kind == "causal":
        mask = causal_mask(T)
    elif kind == "window":
        mask = sliding_window_mask(T, window=3)
    elif kind == "padding":
        mask = padding_mask([6, 4], T)
    else:
        mask = torch.rand(B, h, T, T, generator=gen) < 0.7
        mask[..., 0] = True  # some torch kernels return NaN for empty rows; keep every row non-empty here
    m = to_additive_mask(mask, torch.float64) if additive else mask
    ours = scaled_dot_product_attention(q, k, v, m)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, rtol=0, atol=attention_atol(q, k, v, dtype=torch.float64))


def test_causal_flag_equivalence_and_custom_scale():
    gen = torch.Generator().manual_seed(3)
    q, k, v = _random_qkv(gen, (2,), 5, 5, 4, 3)
    ours = scaled_dot_product_attention(q, k, v, causal_mask(5), scale=0.3)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(ours, ref)


def test_worked_example_from_chapter_one():
    # scores (0, log 2, 0) give weights (1/4, 1/2, 1/4); values give output (1, 1).
    q = torch.tensor([[1.0]], dtype=torch.float64)
    k = torch.tensor([[0.0], [math.log(2)], [0.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]], dtype=torch.float64)
    out, w = scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
    torch.testing.assert_close(w, torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    out, w = scaled_dot_product_attention(q, k, v, torch.tensor([[True, True, False]]), scale=1.0, return_weights=True)
    torch.testing.assert_close(w, torch.tensor([[1 / 3, 2 / 3, 0.0]], dtype=torch.float64))


def test_fully_masked_row_gives_zeros_not_nan():
    gen = torch.Generator().manual_seed(0)
    q, k, v = _random_qkv(gen, (1,), 3, 4, 2, 2, dtype=torch.float32)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, 1], torch.zeros(2))
    assert torch.equal(w[0, 1], torch.zeros(4))
    torch.testing.assert_close(w[0, [0, 2]].sum(-1), torch.ones(2))
    # gradients through the empty row are finite too
    q.requires_grad_(True)
    scaled_dot_product_attention(q, k, v, mask).sum().backward()
    assert torch.isfinite(q.grad).all()


def test_stable_softmax_survives_huge_scores():
    s = torch.tensor([1000.0, 1000.0 + math.log(3), -1000.0])
    p = stable_softmax(s)
    torch.testing.assert_close(p, torch.tensor([0.25, 0.75, 0.0]))
    assert torch.isnan(torch.exp(s) / torch.exp(s).sum()).any()  # the naive formula overflows


def test_mask_builders():
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # two new rows at positions 3 and 4 of a five-token sequence see the whole prefix
    assert causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert sliding_window_mask(4, 2).tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [False, True, True, False],
        [False, False, True, True],
    ]
    pm = padding_mask([2, 3], 4)
    assert pm.shape == (2, 1, 1, 4)
    assert pm[:, 0, 0].tolist() == [[True, True, False, False], [True, True, True, False]]
    assert sliding_window_mask(5, 5).equal(causal_mask(5))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: scaled_dot_product_attention(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3)), "d_k"),
        (lambda: scaled_dot_product_attention(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(5, 3)), "rows S"),
        (lambda: scaled_dot_product_attention(torch.zeros(3), torch.zeros(4, 3), torch.zeros(4, 3)), r"\(\.\.\., T, d\)"),
        (lambda: scaled_dot_product_attention(torch.zeros(2, 2, 3), torch.zeros(3, 2, 3), torch.zeros(3, 2, 3)), "broadcast"),
        (lambda: scaled_dot_product_attention(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(4, 3), torch.ones(3, 4, dtype=torch.bool)), "mask"),
        (lambda: scaled_dot_product_attention(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(4, 3), torch.ones(2, 4, dtype=torch.long)), "dtype"),
        (lambda: scaled_dot_product_attention(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(4, 3), scale=-1.0), "scale"),
        (lambda: causal_mask(4, 2), "T <= S"),
        (lambda: sliding_window_mask(4, 0), "window"),
        (lambda: padding_mask([2, 5], 4), "S=4"),
        (lambda: to_additive_mask(torch.zeros(2, 2)), "boolean"),
    ],
)
def test_bad_input_raises_value_error_naming_the_rule(call, match):
    with pytest.raises(ValueError, match=match):
        call()
