"""companion.opcount.OpCount counts the ATen operations a block runs, by name, whatever their size."""

import torch
from torch import nn

from companion.opcount import OpCount


def test_counts_each_operation_once_by_name():
    x, y = torch.ones(3, 3), torch.full((3, 3), 2.0)
    with OpCount() as ops:
        z = (x + y) * y
        w = z @ x
    assert ops.n == 3 and ops.by_name == {"add": 1, "mul": 1, "mm": 1}
    assert torch.equal(w, torch.full((3, 3), 18.0))  # the operations still ran


def test_the_count_of_a_layer_does_not_grow_with_the_batch():
    """The premise chapter 12 uses: a pass over 16 rows dispatches what a pass over 1 row does."""
    layer = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    counts = []
    for rows in (1, 16):
        with OpCount() as ops:
            layer(torch.randn(rows, 8))
        counts.append(ops.by_name)
    assert counts[0] == counts[1] and sum(counts[0].values()) >= 3


def test_nothing_outside_the_block_and_backward_inside_it():
    x = torch.randn(4, requires_grad=True)
    (x * 2).sum()                         # outside: not counted
    with OpCount() as ops:
        (x * 2).sum().backward()
    assert ops.by_name["mul"] >= 2 and ops.by_name["sum"] == 1   # forward and backward's mul
    counted = ops.n
    torch.ones(2) + 1                     # after the block: no longer counted
    assert ops.n == counted


def test_the_count_does_not_depend_on_the_grad_mode():
    """Under inference_mode composite operations arrive whole; they are counted by their parts."""
    layer = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16))
    x = torch.randn(4, 8)
    counts = []
    for mode in (torch.no_grad, torch.inference_mode):
        with mode(), OpCount() as ops:
            layer(x)
        counts.append(dict(ops.by_name))
    assert counts[0] == counts[1] and "linear" not in counts[1]
