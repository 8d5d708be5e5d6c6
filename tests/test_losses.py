"""companion.training.losses: masked cross-entropy and label smoothing against torch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tolerances import reduction_atol

from companion.training.losses import IGNORE_INDEX, cross_entropy, lm_shift, prompt_mask


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_torch_with_ignore_index_and_smoothing(eps):
    torch.manual_seed(0)
    logits = torch.randn(3, 9, 13) * 3
    targets = torch.randint(0, 13, (3, 9))
    targets[1, 4:] = IGNORE_INDEX
    ours = cross_entropy(logits, targets, label_smoothing=eps)
    theirs = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1), label_smoothing=eps)
    # a row's loss (|z| + log V at most) is a logsumexp and a smoothing sum over V = 13 logits; then N <= 27
    # rows are summed (or averaged)
    n_rows, row = 27, logits.abs().max().item() + math.log(13)
    atol = reduction_atol(13, row, chain=2) + reduction_atol(n_rows, row)
    assert torch.allclose(ours, theirs, atol=atol)
    summed = cross_entropy(logits, targets, label_smoothing=eps, reduction="sum")
    assert torch.allclose(summed, F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1), label_smoothing=eps,
                                                  reduction="sum"), atol=n_rows * atol)


def test_smoothing_is_the_2017_target_distribution():
    torch.manual_seed(1)
    logits, target, eps, V = torch.randn(1, 7), torch.tensor([2]), 0.1, 7
    q = torch.full((1, V), eps / V)
    q[0, 2] += 1 - eps
    explicit = -(q * torch.log_softmax(logits, -1)).sum()
    # two logsumexp-and-weighted-sum chains over V = 7 logits; |log_softmax| <= 2 max|z| + log V bounds the terms
    atol = reduction_atol(V, 2 * logits.abs().max().item() + math.log(V), chain=2)
    assert torch.allclose(cross_entropy(logits, target, label_smoothing=eps), explicit, atol=atol, rtol=0)
    # Smoothing penalises over-confidence: a near one-hot prediction costs more than without it.
    confident = torch.tensor([[20.0, 0, 0, 0, 0, 0, 0]])
    assert cross_entropy(confident, torch.tensor([0]), label_smoothing=eps) > 1.0 > \
           cross_entropy(confident, torch.tensor([0]))


def test_loss_mask_excludes_the_prompt():
    torch.manual_seed(2)
    tokens = torch.randint(0, 11, (2, 8))
    mask = prompt_mask([3, 5], [8, 7], T=8)
    assert mask.tolist()[1] == [False] * 5 + [True, True, False]
    inputs, targets, target_mask = lm_shift(tokens, mask)
    logits = torch.randn(2, 7, 11)
    loss = cross_entropy(logits, targets, loss_mask=target_mask)
    per_position = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), reduction="none").view(2, 7)
    # as in the first test: a row is a logsumexp over V = 11 logits (terms |z| + log V at most), then a mean
    # over the n masked rows
    n, row = int(target_mask.sum()), logits.abs().max().item() + math.log(11)
    atol = reduction_atol(11, row, chain=2) + reduction_atol(n, row)
    assert torch.allclose(loss, per_position[target_mask].mean(), atol=atol, rtol=0)
    # Changing a prompt-position logit leaves the loss unchanged; a response position changes it.
    bumped = logits.clone()
    bumped[0, 0, targets[0, 0]] += 5
    assert torch.allclose(cross_entropy(bumped, targets, loss_mask=target_mask), loss)
    bumped[0, 4, targets[0, 4]] += 5
    assert not torch.allclose(cross_entropy(bumped, targets, loss_mask=target_mask), loss)
    none = cross_entropy(logits, targets, loss_mask=target_mask, reduction="none")
    assert (none[~target_mask] == 0).all() and (none[target_mask] > 0).all()
    nothing = torch.zeros_like(target_mask)
    assert cross_entropy(logits, targets, loss_mask=nothing) == 0


def test_gradients_flow_only_to_counted_positions():
    logits = torch.randn(1, 4, 5, requires_grad=True)
    targets = torch.tensor([[1, IGNORE_INDEX, 3, 0]])
    cross_entropy(logits, targets, loss_mask=torch.tensor([[True, True, True, False]])).backward()
    assert (logits.grad[0, 1] == 0).all() and (logits.grad[0, 3] == 0).all()
    assert logits.grad[0, 0].abs().sum() > 0 and logits.grad[0, 2].abs().sum() > 0


def test_bad_inputs():
    logits, targets = torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="logits must have shape targets.shape"):
        cross_entropy(logits, targets[:, :2])
    with pytest.raises(ValueError, match="label_smoothing must be in \\[0, 1\\)"):
        cross_entropy(logits, targets, label_smoothing=1.0)
    with pytest.raises(ValueError, match="targets must be in \\[0, 5\\)"):
        cross_entropy(logits, targets + 7)
    with pytest.raises(ValueError, match="loss_mask must be boolean"):
        cross_entropy(logits, targets, loss_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="each row needs 0 <= prompt_length <= length"):
        prompt_mask([4], [3], T=5)
    with pytest.raises(ValueError, match="T >= 2"):
        lm_shift(torch.zeros(2, 1, dtype=torch.long))


def test_cross_entropy_keeps_float64_and_upcasts_half():
    from companion.training.losses import cross_entropy

    logits = torch.randn(3, 5, dtype=torch.float64)
    targets = torch.tensor([0, 4, 2])
    assert cross_entropy(logits, targets).dtype == torch.float64
    assert cross_entropy(logits.bfloat16(), targets).dtype == torch.float32
