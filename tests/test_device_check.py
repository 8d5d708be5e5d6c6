"""companion.notebook.device_check: the dry run's second "device" on a CPU fails where CUDA would
(a tensor left on the CPU beside tensors on the device) and lets through what CUDA allows (CPU
scalars, copies between devices, CPU indices into a device tensor, computations on the CPU alone)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from companion.notebook.device_check import DEVICE, DeviceCheck, DevicePlacementError, on_device


@pytest.fixture
def check():
    with DeviceCheck() as mode:
        yield mode


def test_a_model_moved_to_the_device_rejects_ids_left_on_the_cpu(check):
    model = nn.Embedding(10, 4).to(DEVICE)
    assert on_device(model.weight) and model.weight.device == DEVICE
    with pytest.raises(DevicePlacementError, match=r"embedding mixes .* \(10, 4\) float32 .* CPU \(1, 3\) int64"):
        model(torch.tensor([[1, 2, 3]]))
    out = model(torch.tensor([[1, 2, 3]], device=DEVICE))
    assert on_device(out)
    assert on_device(model(torch.tensor([[1, 2, 3]]).to(DEVICE)))


def test_results_gradients_and_optimizer_state_stay_on_the_device(check):
    model = nn.Linear(4, 3).to(DEVICE)
    x = torch.randn(2, 4, device=DEVICE)
    loss = model(x).square().mean() * torch.tensor(2.0)     # a CPU scalar is fine, as on CUDA
    loss.backward()
    assert on_device(loss) and on_device(model.weight.grad)
    opt = torch.optim.AdamW(model.parameters())
    opt.step()                                               # would fail on unmarked state
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert on_device(opt.state[model.weight]["exp_avg"])


def test_factories_follow_the_device_of_their_arguments(check):
    x = torch.ones(3, device=DEVICE)
    assert on_device(torch.arange(3, device=x.device))      # device=x.device: x reports cpu:0
    assert on_device(torch.zeros_like(x)) and on_device(x.new_zeros(2))
    assert not on_device(torch.zeros_like(x, device="cpu"))
    assert on_device(nn.Parameter(x))                        # shares x's storage
    x + torch.arange(3, device=x.device)


def test_moving_to_the_device_copies_and_leaves_the_source_on_the_cpu(check):
    ids = torch.tensor([1, 2])
    moves = (ids.to(DEVICE), ids.to("cpu:0"), torch.as_tensor(ids, device=DEVICE),
             ids.to(torch.ones(1, device=DEVICE)))
    for moved in moves:
        assert on_device(moved) and not on_device(ids)
    back = moved.cpu()
    assert not on_device(back) and on_device(moved)
    assert not on_device(moved.to("cpu")) and on_device(moved.to(torch.float32))
    assert on_device(moved.to(DEVICE)) and on_device(moved.to(torch.float16, copy=True))


def test_copies_shapes_and_cpu_computations_pass(check):
    x = torch.ones(2, 3, device=DEVICE)
    cpu = torch.zeros(2, 3)
    cpu.copy_(x)                                             # a copy between devices
    assert not on_device(cpu)
    x.copy_(cpu)
    assert on_device(x.view_as(cpu)) and on_device(x.expand_as(cpu))
    assert (cpu + torch.ones(3)).sum() == 12                 # no device tensor: unchecked
    print(x, f"{x.sum():.1f}")                               # printing is not computation


def test_indexing_follows_cudas_rule(check):
    x = torch.arange(5.0, device=DEVICE)
    assert on_device(x[torch.tensor([0, 2])])                # CPU indices into a device tensor
    with pytest.raises(DevicePlacementError, match="indexes a tensor left on the CPU"):
        torch.arange(5.0)[torch.tensor([0, 2], device=DEVICE)]


@pytest.mark.parametrize("op", [
    lambda d, c: torch.cat([d, c]),
    lambda d, c: d * c,
    lambda d, c: torch.equal(d, c),
    lambda d, c: c.add_(d),
])
def test_mixing_a_device_tensor_with_a_cpu_tensor_fails(check, op):
    with pytest.raises(DevicePlacementError, match="Expected all tensors to be on the same device"):
        op(torch.ones(3, device=DEVICE), torch.ones(3))


def test_a_device_tensor_does_not_go_to_numpy(check):
    x = torch.ones(3, device=DEVICE)
    with pytest.raises(DevicePlacementError, match="numpy"):
        np.asarray(x)
    assert np.asarray(x.cpu()).sum() == 3


def test_assert_close_sees_two_devices(check):
    x = torch.ones(3, device=DEVICE)
    with pytest.raises(AssertionError, match="attribute 'device' do not match"):
        torch.testing.assert_close(x, torch.ones(3))


def test_outside_the_check_nothing_is_marked_or_checked():
    with DeviceCheck():
        x = torch.ones(3, device=DEVICE)
    assert (x + torch.ones(3)).sum() == 6                    # the mode is gone
