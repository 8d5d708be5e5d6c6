"""companion.attention_backward: the hand-written attention backward against autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from companion.attention import causal_mask, padding_mask, scaled_dot_product_attention
from companion.attention_backward import attention_backward, cross_entropy_grad, softmax_backward


def _autograd(q, k, v, dout, mask=None, scale=None):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = scaled_dot_product_attention(q, k, v, mask, scale=scale)
    out.backward(dout)
    return q.grad, k.grad, v.grad


def _inputs(gen, batch, T, S, d_k, d_v):
    def r(*shape):
        return torch.randn(*batch, *shape, generator=gen, dtype=torch.float64)
    return r(T, d_k), r(S, d_k), r(S, d_v), r(T, d_v)


@pytest.mark.parametrize("batch, T, S, d_k, d_v", [((), 5, 5, 4, 4), ((2, 3), 6, 9, 8, 5)])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_autograd(batch, T, S, d_k, d_v, masked):
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = _inputs(gen, batch, T, S, d_k, d_v)
    mask = causal_mask(T, S) if masked else None
    ours = attention_backward(q, k, v, dout, mask)
    for name, a, b in zip("qkv", ours, _autograd(q, k, v, dout, mask)):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"d{name}: {m}")


def test_custom_scale_and_broadcast_keys_match_autograd():
    # one set of keys and values shared by 4 heads: the gradient sums over the heads
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 5, 3, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 1, 7, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(2, 4, 5, 3, generator=gen, dtype=torch.float64)
    mask = padding_mask([7, 4])                                 # (2, 1, 1, 7)
    ours = attention_backward(q, k, v, dout, mask, scale=0.3)
    for a, b in zip(ours, _autograd(q, k, v, dout, mask, scale=0.3)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b)


def test_masked_keys_receive_zero_gradient():
    gen = torch.Generator().manual_seed(2)
    q, k, v, dout = _inputs(gen, (), 4, 6, 3, 3)
    mask = padding_mask([4], 6)[0, 0].expand(4, 6)              # keys 4, 5 are padding
    dq, dk, dv = attention_backward(q, k, v, dout, mask)
    assert torch.equal(dk[4:], torch.zeros_like(dk[4:]))
    assert torch.equal(dv[4:], torch.zeros_like(dv[4:]))
    assert dk[:4].abs().min() > 0 and dv[:4].abs().min() > 0


def test_softmax_backward_is_the_jacobian_applied():
    gen = torch.Generator().manual_seed(3)
    s = torch.randn(5, generator=gen, dtype=torch.float64)
    da = torch.randn(5, generator=gen, dtype=torch.float64)
    a = torch.softmax(s, -1)
    jacobian = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s)
    torch.testing.assert_close(jacobian, torch.diag(a) - torch.outer(a, a))
    torch.testing.assert_close(softmax_backward(a, da), jacobian.T @ da)
    with pytest.raises(ValueError, match="a and da must have the same shape"):
        softmax_backward(a, da[:3])


def test_cross_entropy_grad_is_p_minus_y():
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(6, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 10, (6,), generator=gen)
    F.cross_entropy(z, y).backward()
    torch.testing.assert_close(cross_entropy_grad(z.detach(), y), z.grad)
    with pytest.raises(ValueError, match="targets must be class ids in \\[0, 10\\)"):
        cross_entropy_grad(z.detach(), y + 10)


def test_bad_inputs_name_the_argument():
    q = torch.randn(4, 3)
    with pytest.raises(ValueError, match="q and k must share d_k"):
        attention_backward(q, torch.randn(5, 2), torch.randn(5, 3), torch.randn(4, 3))
    with pytest.raises(ValueError, match="dout must have shape"):
        attention_backward(q, torch.randn(5, 3), torch.randn(5, 2), torch.randn(4, 3))
    with pytest.raises(ValueError, match="mask must be boolean"):
        attention_backward(q, q, q, q, torch.zeros(4, 4))
