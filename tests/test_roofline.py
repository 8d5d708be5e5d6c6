"""The decode roofline helpers of companion.accounting: FLOPs of a decode step counted against
torch's own FLOP counter on a real cached step, the roofline bound, and the two quick probes."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from companion.accounting import (attainable_flops, decode_step_bytes, decode_step_flops, measure_bandwidth,
                                  measure_matmul_flops, published_config)
from companion.models import from_preset


@pytest.mark.parametrize("name, overrides", [("llama-like", {}), ("mistral-like", {"window": 4}),
                                             ("qwen3-like", {})])
def test_decode_step_flops_equals_torch_flop_counter_on_a_cached_step(name, overrides):
    torch.manual_seed(0)
    model = from_preset(name, backend="reference", **overrides).eval()  # attention as plain matmuls
    B, n = 3, 10
    idx = torch.randint(0, model.config.vocab_size, (B, n))
    cache = model.new_cache()
    with torch.no_grad():
        model(idx[:, : n - 1], cache)
        with FlopCounterMode(display=False) as counter:
            model(idx[:, n - 1 :], cache)  # one decode step: B new tokens at position n - 1
    # the formula counts every parameter as a multiply-add, norm gains included; torch counts matmuls only
    norm_flops = 2 * B * sum(p.numel() for k, p in model.named_parameters() if "norm" in k)
    assert decode_step_flops(model.config, [n] * B) == counter.get_total_flops() + norm_flops


def test_decode_step_flops_grows_with_each_sequence_context():
    c = published_config("llama3-8b")
    one, longer = decode_step_flops(c, [100]), decode_step_flops(c, [101])
    assert longer - one == 2 * c.n_layers * c.n_heads * 2 * c.attn_head_dim  # one more key, every layer and head
    assert decode_step_flops(c, [100, 100]) == 2 * one


def test_decode_intensity_is_about_one_at_batch_one_and_rises_with_batch():
    c = published_config("llama3-8b")
    intensity = [decode_step_flops(c, [512] * B) / decode_step_bytes(c, [512] * B)["total"] for B in (1, 8, 64)]
    assert 0.9 < intensity[0] < 1.1  # 2 FLOPs per 2-byte weight: about one FLOP per byte
    assert intensity[0] < intensity[1] < intensity[2]


@pytest.mark.parametrize("bad", [[], [0], "12", [10**9]])
def test_decode_step_flops_rejects_bad_contexts(bad):
    with pytest.raises(ValueError, match="context_lengths"):
        decode_step_flops(published_config("llama3-8b"), bad)


def test_attainable_flops_is_the_lower_of_roof_and_slope():
    assert attainable_flops(1.0, peak=100.0, bandwidth=10.0) == 10.0  # memory-bound: I beta
    assert attainable_flops(50.0, peak=100.0, bandwidth=10.0) == 100.0  # compute-bound: pi
    assert attainable_flops(10.0, peak=100.0, bandwidth=10.0) == 100.0  # the ridge point I* = pi / beta
    with pytest.raises(ValueError, match="bandwidth"):
        attainable_flops(1.0, peak=1.0, bandwidth=0.0)


def test_probes_return_plausible_cpu_rates():
    flops = measure_matmul_flops("cpu", n=64, repeats=2)
    bandwidth = measure_bandwidth("cpu", nbytes=1 << 20, repeats=2)
    assert 1e6 < flops < 1e14 and 1e6 < bandwidth < 1e13
    with pytest.raises(ValueError, match="nbytes"):
        measure_bandwidth("cpu", nbytes=0)
