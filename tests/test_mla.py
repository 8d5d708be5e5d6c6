"""MultiHeadLatentAttention's pieces (chapter 8): absorbed queries, expanded keys and values, the cache
width, against per-head loops written out here."""

import pytest
import torch

from companion.accounting import mla_cache_bytes
from companion.cache import ContiguousLayerCache
from companion.mla import MultiHeadLatentAttention


def _layer(seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(kv_rank=12, head_dim=8, rope_dim=4, v_head_dim=6)
    args.update(kw)
    return MultiHeadLatentAttention(32, 4, **args).double()


def test_absorbed_query_scores_equal_expanded_content_scores():
    m = _layer()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    pos = torch.arange(7)
    q_c, _ = m.queries(x, pos)
    c, _ = m.latents(x, pos)
    q_lat = m.absorb_query(q_c)
    assert q_lat.shape == (2, 4, 7, 12)
    for r in range(4):  # head r's content key is c U_K^r, rows r*d_h .. (r+1)*d_h of k_up
        u_k = m.k_up.weight[r * 8 : (r + 1) * 8].T  # (d_c, d_h)
        expanded = q_c[:, r] @ (c @ u_k).transpose(1, 2)
        torch.testing.assert_close(q_lat[:, r] @ c.transpose(1, 2), expanded)


def test_expand_rebuilds_per_head_keys_and_values():
    m = _layer(1)
    c, k_r = torch.randn(2, 5, 12, dtype=torch.float64), torch.randn(2, 5, 4, dtype=torch.float64)
    k, v = m.expand(c, k_r)
    assert k.shape == (2, 4, 5, 8 + 4) and v.shape == (2, 4, 5, 6)
    for r in range(4):
        torch.testing.assert_close(k[:, r, :, :8], c @ m.k_up.weight[r * 8 : (r + 1) * 8].T)
        torch.testing.assert_close(k[:, r, :, 8:], k_r)  # one RoPE key shared by every head
        torch.testing.assert_close(v[:, r], c @ m.v_up.weight[r * 6 : (r + 1) * 6].T)


def test_factored_value_sum_equals_expanded_value_sum():
    m = _layer(2)
    c = torch.randn(1, 6, 12, dtype=torch.float64)
    a = torch.randn(1, 4, 3, 6, dtype=torch.float64).softmax(-1)  # weights (B, h, T, S)
    _, v = m.expand(c, torch.zeros(1, 6, 4, dtype=torch.float64))
    for r in range(4):
        u_v = m.v_up.weight[r * 6 : (r + 1) * 6].T
        torch.testing.assert_close((a[:, r] @ c) @ u_v, a[:, r] @ v[:, r])


def test_cache_holds_cache_width_numbers_per_token():
    m = _layer(3).float()
    x = torch.randn(3, 9, 32)
    cache = ContiguousLayerCache()
    m(x, cache=cache)
    assert m.cache_width == 12 + 4
    assert cache.nbytes() == mla_cache_bytes(1, 12, 4, tokens=9, batch=3, bytes_per_value=4)


@pytest.mark.parametrize("absorbed", [False, True])
def test_output_depends_on_relative_positions_only(absorbed):
    """Content scores carry no position and RoPE scores only j - i: shifting every position by the
    same offset leaves the output unchanged."""
    m = _layer(4, absorbed=absorbed)
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    torch.testing.assert_close(m(x, positions=torch.arange(6) + 37), m(x))


def test_piece_validation():
    m = _layer()
    with pytest.raises(ValueError, match="q_c must have shape"):
        m.absorb_query(torch.randn(1, 3, 5, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="c must have shape"):
        m.expand(torch.randn(1, 5, 11), torch.randn(1, 5, 4))
    with pytest.raises(ValueError, match="k_r must have shape"):
        m.expand(torch.randn(1, 5, 12), torch.randn(1, 4, 4))
