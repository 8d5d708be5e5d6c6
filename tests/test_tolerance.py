"""companion.tolerance: the bounds hold where they should, and are tight enough to catch a real mistake."""

import pytest
import torch
from torch import nn

from companion.tolerance import U, float32_paths_atol, float64_twin_atol, gamma, reduction_atol


def test_gamma_is_highams_and_refuses_a_reduction_too_long_to_bound():
    assert gamma(1) == pytest.approx(U[torch.float32] / (1 - U[torch.float32]))
    assert gamma(1000, torch.float64) == pytest.approx(1000 * 2.0 ** -53, rel=1e-9)
    with pytest.raises(ValueError, match="too long a reduction"):
        gamma(2 ** 24)


def test_two_orders_of_a_float32_sum_stay_within_reduction_atol():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        x = torch.randn(4096, generator=gen) * torch.rand(4096, generator=gen) * 100
        forward = x.sum()
        shuffled = x[torch.randperm(4096, generator=gen)]
        pairwise = shuffled.view(64, 64).sum(0).sum()     # another order and blocking
        assert abs(forward.item() - pairwise.item()) <= reduction_atol(4096, x.abs().sum().item())


def test_the_twin_tolerance_passes_rounding_and_catches_a_real_difference():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)).eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        batched, rows = model(x), torch.cat([model(r[None]) for r in x])
    tol = float64_twin_atol(lambda m, v: m(v), model, x)
    assert (batched - rows).abs().max().item() <= tol           # rounding only
    assert tol < 1e-5                                            # and tight
    with torch.no_grad():                                        # planted: a weight off by 1e-4
        model[2].weight[0, 0] += 1e-4
        moved = model(x)
    assert (moved - batched).abs().max().item() > tol


def test_the_twin_leaves_its_arguments_alone():
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    float64_twin_atol(lambda m, v: m(v), model, x)
    assert model.weight.dtype == torch.float32 and x.dtype == torch.float32


def test_paths_atol_has_a_floor_of_a_few_ulps():
    same = torch.ones(3)
    assert float32_paths_atol(same, same.double()) == pytest.approx(8 * torch.finfo(torch.float32).eps)
