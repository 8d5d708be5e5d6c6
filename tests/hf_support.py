"""Helpers shared by the companion.hf tests (tests/test_hf*.py): random weights far from the init,
token batches, and the logit comparison."""

import copy
from contextlib import contextmanager

import pytest
import torch

from tolerances import float32_paths_atol


@contextmanager
def seeded(seed):
    """Draws from torch's global generator inside (a constructor's init, transformers' or ours) come from
    ``seed``, and the caller's global state is as it was after: a test's inputs do not depend on which
    tests ran before it, nor change what later tests draw."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@pytest.fixture(autouse=True)
def order_free():
    """Imported by every tests/test_hf*.py module (an autouse fixture there): each test starts from the
    same global random state (seed 0) and leaves the caller's as it found it, so whatever a constructor
    draws from it is the same whichever tests ran before (tests/test_hf.py checks this)."""
    with seeded(0):
        yield


def randomise(model, seed, std=0.2):
    """Weights far from the init (std 0.02 makes every logit ~0 and hides mistakes); norms around 1.
    Routing biases of bias-balanced MoE layers random too, so that a missed bias changes the expert
    choice (elsewhere the bias is unused state and stays 0). Gemma-style gains 1 + w get w near 0."""
    g = torch.Generator().manual_seed(seed)
    config = getattr(model, "config", None)
    offset = bool(getattr(config, "norm_offset", False)) or getattr(config, "model_type", "").startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            is_gain = "norm" in name and name.endswith("weight")
            p.copy_(noise / 2 if is_gain and offset else (1.0 + noise / 2 if is_gain else noise))
        for m in model.modules():
            if getattr(m, "bias_balancing", False):
                m.balance_bias.copy_(torch.randn(m.balance_bias.shape, generator=g) * 0.5)
            elif hasattr(m, "e_score_correction_bias"):  # transformers' DeepSeek-V3 router
                m.e_score_correction_bias.copy_(torch.randn(m.e_score_correction_bias.shape, generator=g) * 0.5)
    return model.eval()


def tokens(vocab, T, seed, B=2):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def float64_twin(model):
    """The same model in float64 (weights exact in it): its output is the exact result to float32's eyes."""
    return copy.deepcopy(model).double()


def assert_same_logits(model, hf_model, idx):
    """Equal logits within ``float32_paths_atol`` (tests/tolerances.py): 4 times our own float32 error,
    measured against the same forward in float64, plus 8 ulps of the logit scale."""
    with torch.no_grad():
        ours, theirs = model(idx), hf_model(idx).logits
        exact = float64_twin(model)(idx)
    assert ours.abs().max() > 0.5  # a test with logits ~0 would pass for wrong weights
    atol = float32_paths_atol(ours, exact)  # tolerances: two float32 computations of one function
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)


def hf_model_of(config, seed, std=0.2):
    """A transformers causal LM built from ``config`` (eager attention, eager experts) with random weights."""
    import transformers

    config._attn_implementation = "eager"
    with seeded(seed):
        model = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)](config)
    return randomise(set_eager_experts(model), seed, std)


def set_eager_experts(hf_model):
    """transformers' MoE layers dispatch to a grouped matrix product by default, which on small shapes fails on
    some CPUs ("strides should be multiple of 16 bytes"); its eager loop over experts computes the same
    function and is what these tests compare against, explicitly."""
    if hasattr(hf_model.config, "_experts_implementation"):
        hf_model.config._experts_implementation = "eager"
    return hf_model


def transformers_atol(hf_model, idx, **inputs):
    """``float32_paths_atol`` measured on transformers' side: 4 times the difference between its model and
    its float64 twin (the same weights, ``.double()``) on these inputs, plus 8 ulps of the logit scale.
    For a float16 / bfloat16 model this is 4 times transformers' own low-precision error."""
    with torch.no_grad():
        theirs = hf_model(idx, **inputs).logits
        exact = set_eager_experts(float64_twin(hf_model))(idx, **inputs).logits
    return float32_paths_atol(theirs.double(), exact)


def max_logit_difference(model, hf_model, idx, positions=None):
    """max |ours - transformers| over the logits, ours at ``positions`` (their position_ids)."""
    inputs = {} if positions is None else dict(position_ids=positions[None].expand(idx.shape[0], -1))
    with torch.no_grad():
        ours = model(idx) if positions is None else model(idx, positions=positions)
        theirs = hf_model(idx, **inputs).logits
    return (ours.double() - theirs.double()).abs().max().item(), transformers_atol(hf_model, idx, **inputs)
