"""The mixture-of-experts layer (chapter 9): routing, the weighted sum of the chosen experts, the
two load-balancing methods, the imbalance measure and the total / active parameter counts."""

import pytest
import torch

from companion.accounting import decoder_parameters, published_config
from companion.models import from_preset
from companion.moe import MoE, load_imbalance


def _moe(**kw):
    torch.manual_seed(0)
    return MoE(8, 16, 6, 2, **kw).double()


def test_route_takes_the_k_largest_softmax_probabilities_renormalised():
    moe = _moe()
    x = torch.randn(10, 8, dtype=torch.float64)
    ids, gates, probs = moe.route(x)
    p = torch.softmax(x @ moe.router.weight.T, -1)
    torch.testing.assert_close(probs, p)
    for n in range(10):  # one token at a time, by sorting
        order = p[n].argsort(descending=True)[:2]
        assert set(ids[n].tolist()) == set(order.tolist())
        torch.testing.assert_close(gates[n].sum(), torch.tensor(1.0, dtype=torch.float64))
        torch.testing.assert_close(gates[n], p[n, ids[n]] / p[n, ids[n]].sum())


def test_forward_is_the_gate_weighted_sum_of_the_chosen_experts():
    moe = _moe(n_shared=1)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    ids, gates, _ = moe.route(x.reshape(-1, 8))
    rows = []
    for n, token in enumerate(x.reshape(-1, 8)):
        y = moe.shared[0](token)
        for slot in range(2):
            y = y + gates[n, slot] * moe.experts[int(ids[n, slot])](token)
        rows.append(y)
    torch.testing.assert_close(moe(x), torch.stack(rows).view(2, 5, 8))
    assert moe.last_load.sum() == 10 * 2  # N k assignments


def test_aux_loss_is_alpha_for_a_uniform_router_and_grows_with_imbalance():
    moe = _moe(aux_loss_coef=0.5)
    with torch.no_grad():
        moe.router.weight.zero_()  # every probability 1/E; top-k then picks the first k ids
    moe(torch.randn(12, 8, dtype=torch.float64))
    f = torch.zeros(6, dtype=torch.float64)
    f[:2] = 0.5  # all assignments on experts 0 and 1
    torch.testing.assert_close(moe.aux_loss, 0.5 * 6 * (f * (1 / 6)).sum())  # = alpha: P is uniform
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 5.0  # expert 0 now also gets most of the probability
    moe(torch.ones(12, 8, dtype=torch.float64))
    assert moe.aux_loss > 0.5 + 0.1


def test_bias_update_moves_against_the_load_and_steers_selection_only():
    moe = _moe(bias_balancing=True, bias_update_rate=0.1)
    x = torch.randn(40, 8, dtype=torch.float64)
    moe(x)
    load = moe.last_load.clone()
    moe.update_bias()
    expected = 0.1 * torch.sign(load.mean() - load)
    torch.testing.assert_close(moe.balance_bias, expected.to(moe.balance_bias.dtype))
    ids, gates, probs = moe.route(x)
    torch.testing.assert_close(gates, probs.gather(-1, ids) / probs.gather(-1, ids).sum(-1, keepdim=True))


def test_load_imbalance_is_one_when_even_and_e_when_one_expert_takes_all():
    assert load_imbalance(torch.tensor([3.0, 3.0, 3.0])).item() == 1.0
    assert load_imbalance(torch.tensor([0, 0, 12, 0])).item() == 4.0
    torch.testing.assert_close(load_imbalance(torch.tensor([[1.0, 3.0], [2.0, 2.0]])),
                               torch.tensor([1.5, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="load must be non-negative"):
        load_imbalance(torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="load must be a tensor"):
        load_imbalance(torch.tensor(3.0))


def test_toy_mixtral_counts_match_the_formula_total_and_active():
    model = from_preset("mixtral-like")
    c = model.config
    assert model.num_parameters() == decoder_parameters(c)
    assert model.num_parameters(active=True) == decoder_parameters(c, active=True)
    per_expert = sum(p.numel() for p in model.layers[0].ffn.experts[0].parameters())
    assert decoder_parameters(c) - decoder_parameters(c, active=True) == c.n_layers * (c.n_experts - c.top_k) * per_expert


def test_mixtral_8x7b_is_about_47b_total_and_13b_active():
    c = published_config("mixtral-8x7b")
    assert abs(decoder_parameters(c) - 46.7e9) < 0.05e9  # Mistral AI: 46.7B total
    assert abs(decoder_parameters(c, active=True) - 12.9e9) < 0.05e9  # 12.9B used per token
    dense = published_config("mistral-7b")
    assert abs(decoder_parameters(dense) - 7.24e9) < 0.01e9


def test_top1_switch_gates_carry_the_router_gradient_and_renormalised_ones_do_not():
    # Switch Transformer gating (norm_topk_prob=False): y = p_e E_e(x), so the language-model
    # loss reaches the router through p_e. Renormalising a single gate gives p_e / p_e = 1, a
    # constant: the router then gets no gradient at all (issue 37).
    x = torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for norm in (False, True):
        torch.manual_seed(0)
        moe = MoE(8, 16, 6, 1, norm_topk_prob=norm).double()
        ids, gates, probs = moe.route(x)
        if norm:
            torch.testing.assert_close(gates, torch.ones_like(gates))
        else:
            torch.testing.assert_close(gates, probs.gather(-1, ids))
            assert (gates < 1).all()
        moe(x).pow(2).sum().backward()
        router_grad = moe.router.weight.grad.abs().max().item()
        expert_grad = max(p.grad.abs().max().item() for p in moe.experts.parameters()
                          if p.grad is not None)
        # d(p/p)/dp = 1/p - p/p^2 is 0 up to float64 rounding: a few ulps of 1/p (measured
        # 3e-16 on the no-SIMD path, 0 on AVX2); Switch gates give the router 0.5 to 1.4
        # times the experts' largest gradient (seeds 0-4), far above the 1e-3 asked
        bound = 1e-12 * expert_grad if norm else 1e-3 * expert_grad
        assert (router_grad < bound) if norm else (router_grad > bound), (norm, router_grad)
    assert "norm_topk_prob=False" in repr(MoE(8, 16, 6, 1, norm_topk_prob=False))
