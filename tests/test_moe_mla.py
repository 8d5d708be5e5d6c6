"""Mixture of experts against a dense formulation; MLA absorbed == expanded == cached."""

import pytest
import torch

from companion.cache import ContiguousLayerCache
from companion.mla import MultiHeadLatentAttention
from companion.moe import MoE
from tolerances import float64_twin_atol

# tolerances: a layer against its dense or written-out formulation (or one path of it against another) are
# two float32 computations of one function, within float64_twin_atol of each other: 4 times the layer's own
# float32 error, measured against its float64 twin, plus 8 ulps (tests/tolerances.py, float32_paths_atol)


def _call(m, x):
    return m(x)


def _dense_moe(moe: MoE, x):
    """Every expert on every token, weighted by the renormalised top-k gates (0 elsewhere)."""
    logits = x @ moe.router.weight.T
    scores = logits.softmax(-1) if moe.router_kind == "softmax" else torch.sigmoid(logits)
    sel = scores + moe.balance_bias if moe.bias_balancing else scores
    ids = sel.topk(moe.top_k, -1).indices
    w = torch.zeros_like(scores).scatter(-1, ids, scores.gather(-1, ids))
    w = w / w.sum(-1, keepdim=True)
    y = sum(w[:, e : e + 1] * expert(x) for e, expert in enumerate(moe.experts))
    return y + sum(s(x) for s in moe.shared) if len(moe.shared) else y


@pytest.mark.parametrize("router,shared,balancing", [("softmax", 0, False), ("sigmoid", 1, True)])
def test_moe_matches_dense_formulation(router, shared, balancing):
    torch.manual_seed(0)
    moe = MoE(16, 24, n_experts=6, top_k=2, n_shared=shared, router=router, bias_balancing=balancing)
    if balancing:
        moe.balance_bias.copy_(torch.randn(6) * 0.1)
    x = torch.randn(40, 16)
    torch.testing.assert_close(moe(x), _dense_moe(moe, x), atol=float64_twin_atol(_call, moe, x), rtol=0)
    assert moe.last_load.sum().item() == 40 * 2


def test_moe_aux_loss_and_load_report():
    torch.manual_seed(1)
    moe = MoE(8, 16, n_experts=4, top_k=1, aux_loss_coef=1.0, bias_update_rate=1.0)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0  # positive inputs -> expert 0 wins for every token
    x = torch.rand(20, 8) + 0.1
    moe(x)
    assert moe.last_load.tolist() == [20.0, 0.0, 0.0, 0.0]
    # f = (1, 0, 0, 0), so L = alpha * N * P_0 with P_0 the mean softmax probability of expert 0
    p0 = (torch.exp(x.sum(-1)) / (torch.exp(x.sum(-1)) + 3)).mean()
    assert moe.aux_loss.item() == pytest.approx(4 * p0.item(), rel=1e-5)
    # uniform routing gives the minimum, alpha
    with torch.no_grad():
        moe.router.weight.zero_()
    moe(x)
    assert moe.aux_loss.item() == pytest.approx(1.0, rel=1e-5)
    # bias balancing pushes an overloaded expert down and the idle ones up
    with torch.no_grad():
        moe.router.weight[0] = 1.0
    moe.bias_balancing = True
    moe(x)
    moe.update_bias()
    assert moe.balance_bias[0] < 0 and (moe.balance_bias[1:] > 0).all()
    moe(x)
    assert moe.last_load[0].item() == 0.0  # the bias now steers tokens away from expert 0


def test_moe_validation():
    with pytest.raises(ValueError, match="top_k must satisfy 1 <= top_k <= n_experts \\(4\\)"):
        MoE(8, 16, n_experts=4, top_k=5)


@pytest.mark.parametrize("q_rank", [None, 24])
def test_mla_absorbed_equals_expanded_and_cache(q_rank):
    torch.manual_seed(2)
    m = MultiHeadLatentAttention(32, 4, kv_rank=12, q_rank=q_rank, head_dim=8, rope_dim=4, v_head_dim=6)
    x = torch.randn(2, 9, 32)
    expanded, atol = m(x), float64_twin_atol(_call, m, x)
    m.absorbed = True
    torch.testing.assert_close(m(x), expanded, atol=atol, rtol=0)
    cache = ContiguousLayerCache()
    outs = [m(x[:, :5], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(outs, 1), expanded, atol=atol, rtol=0)
    c, k_r = cache.rows
    assert c.shape == (2, 9, 12) and k_r.shape == (2, 9, 4)  # d_c + d_R per token, not 2 h d_h


def test_mla_scores_written_out():
    """Expanded path == attention with k = [c U_K, k_R] and v = c U_V built by hand."""
    torch.manual_seed(3)
    m = MultiHeadLatentAttention(16, 2, kv_rank=8, head_dim=4, rope_dim=2)
    x = torch.randn(1, 5, 16)
    pos = torch.arange(5)
    q_c, q_r = m.queries(x, pos)
    c, k_r = m.latents(x, pos)
    out = []
    for i in range(2):
        kc = c @ m.k_up.weight[i * 4 : (i + 1) * 4].T
        v = c @ m.v_up.weight[i * 4 : (i + 1) * 4].T
        s = (q_c[:, i] @ kc.transpose(1, 2) + q_r[:, i] @ k_r.transpose(1, 2)) / (4 + 2) ** 0.5
        s = s.masked_fill(~torch.ones(5, 5).tril().bool(), float("-inf"))
        out.append(s.softmax(-1) @ v)
    torch.testing.assert_close(m(x), m.out(torch.cat(out, -1)), atol=float64_twin_atol(_call, m, x), rtol=0)


def _deepseek_v3_gates(moe: MoE, x):
    """DeepSeek-V3 routing written out token by token, with Python lists: (N, E) gate matrix."""
    out = torch.zeros(x.shape[0], moe.n_experts)
    size = moe.n_experts // moe.n_groups
    for n in range(x.shape[0]):
        s = [torch.sigmoid(x[n] @ moe.router.weight[e]).item() for e in range(moe.n_experts)]
        sel = [s[e] + moe.balance_bias[e].item() for e in range(moe.n_experts)]
        group_score = [sum(sorted(sel[g * size:(g + 1) * size])[-2:]) for g in range(moe.n_groups)]
        groups = sorted(range(moe.n_groups), key=lambda g: -group_score[g])[: moe.topk_groups]
        allowed = [e for e in range(moe.n_experts) if e // size in groups]
        chosen = sorted(allowed, key=lambda e: -sel[e])[: moe.top_k]
        total = sum(s[e] for e in chosen) if moe.norm_topk_prob else 1.0
        for e in chosen:
            out[n, e] = s[e] / total * moe.routed_scaling_factor
    return out


def _gates(moe: MoE, x):
    ids, gates, _ = moe.route(x)
    return torch.zeros(x.shape[0], moe.n_experts, dtype=x.dtype).scatter(-1, ids, gates)


@pytest.mark.parametrize(
    "groups,topk_groups,norm,scale", [(1, 1, True, 1.0), (4, 2, True, 2.5), (4, 1, False, 1.0), (2, 1, False, 1.5)]
)
def test_deepseek_v3_routing_matches_written_out_rule(groups, topk_groups, norm, scale):
    torch.manual_seed(2)
    moe = MoE(16, 24, n_experts=8, top_k=2, n_shared=1, router="sigmoid", bias_balancing=True,
              n_groups=groups, topk_groups=topk_groups, norm_topk_prob=norm, routed_scaling_factor=scale)
    moe.balance_bias.copy_(torch.randn(8) * 0.3)
    x = torch.randn(30, 16)
    ids, gates, _ = moe.route(x)
    dense = torch.zeros(30, 8).scatter(-1, ids, gates)
    atol = float64_twin_atol(_gates, moe, x)  # the router against the rule written out: two float32 computations
    torch.testing.assert_close(dense, _deepseek_v3_gates(moe, x), atol=atol, rtol=0)
    if topk_groups < groups:  # the group limit binds: some token's plain top k would leave its groups
        plain = (torch.sigmoid(x @ moe.router.weight.T) + moe.balance_bias).topk(2, -1).indices
        assert not torch.equal(plain.sort(-1).values, ids.sort(-1).values)
    y = moe(x)  # and the layer output is the gate-weighted sum of the experts plus the shared one
    ref = sum(dense[:, e : e + 1] * ex(x) for e, ex in enumerate(moe.experts)) + moe.shared[0](x)
    torch.testing.assert_close(y, ref, atol=float64_twin_atol(_call, moe, x), rtol=0)


def test_moe_routing_options_validated():
    with pytest.raises(ValueError, match="n_groups"):
        MoE(8, 16, n_experts=6, top_k=2, n_groups=4)
    with pytest.raises(ValueError, match="topk_groups"):
        MoE(8, 16, n_experts=8, top_k=2, n_groups=4, topk_groups=5)
    with pytest.raises(ValueError, match="top_k"):
        MoE(8, 16, n_experts=8, top_k=3, n_groups=4, topk_groups=1)
