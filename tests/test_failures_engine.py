"""The engine under bad input and failing steps: every SamplingParams field validated at
construction, exact types (no silent rounding), and one failed step never poisons the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion.engine import Engine
from companion.inference.generate import SamplingParams, generate
from companion.models import from_preset

pytestmark = pytest.mark.usefixtures("one_thread")

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=NAN), r"temperature must be >= 0 \(0 = greedy\) and finite; got nan"),
        (dict(temperature=INF), "temperature must be >= 0 .* and finite; got inf"),
        (dict(temperature="0.5"), "temperature must be >= 0 .*; got '0.5'"),
        (dict(top_k=2.5), r"top_k must be >= 1 \(an integer\) or None; got 2.5"),
        (dict(top_k=True), "top_k must be >= 1 .*; got True"),
        (dict(top_p=NAN), r"top_p must be in \(0, 1\]; got nan"),
        (dict(max_new_tokens=2.5), "max_new_tokens must be >= 0 and an integer; got 2.5"),
        (dict(max_new_tokens=4.0), "max_new_tokens must be >= 0 and an integer; got 4.0"),
        (dict(stop_tokens=5), r"stop_tokens must be a sequence of token ids, e.g. \(5,\); got 5"),
        (dict(stop_tokens=(1.5,)), r"stop_tokens must hold integer token ids >= 0; got \(1.5,\)"),
        (dict(stop_tokens=(-1,)), "stop_tokens must hold integer token ids >= 0"),
        (dict(seed=1.5), "seed must be an integer, a torch.Generator or None; got 1.5"),
    ],
)
def test_sampling_params_check_every_field_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_accept_numpy_integers_and_lists_deliberately():
    sp = SamplingParams(max_new_tokens=np.int64(3), top_k=np.int32(5), stop_tokens=[np.int64(2), 7], seed=np.int64(1))
    assert (sp.max_new_tokens, sp.top_k, sp.stop_tokens) == (3, 5, (2, 7))
    assert type(sp.max_new_tokens) is int and type(sp.top_k) is int and all(type(t) is int for t in sp.stop_tokens)


def fail_on_call(model, n: int):
    """Make the model's n-th forward call raise (a stand-in for any bug or device error)."""
    real, calls = model.forward, [0]

    def forward(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise RuntimeError("injected failure in the forward")
        return real(*args, **kwargs)

    model.forward = forward
    return lambda: model.__dict__.pop("forward")


@pytest.mark.parametrize("cache", ["paged", "contiguous"])
def test_a_failed_step_finishes_its_requests_frees_their_pages_and_the_engine_serves_on(cache):
    torch.manual_seed(3)
    model = from_preset("llama-like").eval()
    engine = Engine(model, cache=cache, page_size=4, n_pages=12, max_seqs=2, max_batch_tokens=64)
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3], [9, 8, 7, 6]]
    params = SamplingParams(max_new_tokens=6)
    restore = fail_on_call(model, 2)  # step 0 prefills A and B; step 1 (both decoding) fails
    outs = engine.generate(prompts, params, arrivals=[0, 0, 1])
    restore()
    assert [o.finish_reason for o in outs] == ["error", "error", "length"]
    assert outs[0].error == outs[1].error == "RuntimeError: injected failure in the forward"
    assert outs[2].error is None and outs[2].tokens == generate(model, prompts[2], params, cache="none").tokens[0]
    assert [len(o.tokens) for o in outs[:2]] == [1, 1]  # what they had produced before the failure
    if cache == "paged":
        assert engine.kv.n_free == engine.kv.n_pages and sum(engine.kv.manager.ref) == 0  # zero pages held
    assert not engine.scheduler.has_work()
    (again,) = engine.generate([[4, 4, 2]], params)  # the next request on the same engine is served exactly
    assert again.finish_reason == "length" and again.tokens == generate(model, [4, 4, 2], params, cache="none").tokens[0]


def test_a_waiting_request_is_served_after_the_running_one_fails():
    torch.manual_seed(4)
    model = from_preset("llama-like").eval()
    engine = Engine(model, page_size=4, n_pages=8, max_seqs=1)
    params = SamplingParams(max_new_tokens=3)
    restore = fail_on_call(model, 1)  # the very first forward: request 0's prefill
    outs = engine.generate([[1, 2], [3, 4, 5]], params)
    restore()
    assert outs[0].finish_reason == "error" and outs[0].tokens == []
    assert outs[1].tokens == generate(model, [3, 4, 5], params, cache="none").tokens[0]
    assert engine.kv.n_free == 8 and sum(engine.kv.manager.ref) == 0


@pytest.mark.parametrize(
    "prompt, match",
    [
        ([1, 2.0], r"prompts\[0\] holds 2.0, which is not an integer token id"),
        ([1, 2.7], r"prompts\[0\] holds 2.7, which is not an integer token id"),
        (torch.tensor([1.0, 2.0]), "dtype torch.float32"),
        (torch.tensor([[1, 2]]), r"a tensor prompt must be 1-D \(T,\) token ids; got shape \(1, 2\)"),
        ([True, 3], r"prompts\[0\] holds True, which is not an integer token id"),
    ],
)
def test_float_token_ids_are_refused_not_rounded(prompt, match):
    engine = Engine(from_preset("llama-like").eval(), page_size=4, n_pages=8)
    with pytest.raises(ValueError, match=match):
        engine.add_request(prompt, SamplingParams(max_new_tokens=2))
    assert engine.sequences == [] and engine.kv.n_free == 8


def test_integer_tensor_prompts_are_accepted_deliberately():
    torch.manual_seed(8)
    model = from_preset("llama-like").eval()
    params = SamplingParams(max_new_tokens=3)
    as_lists = Engine(model, page_size=4).generate([[3, 1, 4], [1, 5, 9]], params)
    as_matrix = Engine(model, page_size=4).generate(torch.tensor([[3, 1, 4], [1, 5, 9]]), params)
    as_vector = Engine(model, page_size=4).generate(torch.tensor([3, 1, 4], dtype=torch.int32), params)
    assert [o.tokens for o in as_matrix] == [o.tokens for o in as_lists]
    assert as_vector[0].tokens == as_lists[0].tokens and as_vector[0].prompt == [3, 1, 4]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_pages=10.5), "n_pages must be >= 1 and an integer; got 10.5"),
        (dict(page_size=2.0), "page_size must be >= 1 and an integer; got 2.0"),
        (dict(max_seqs=True), "max_seqs must be >= 1 and an integer; got True"),
        (dict(max_batch_tokens="64"), "max_batch_tokens must be >= 1 and an integer; got '64'"),
        (dict(kv_bits=6), "kv_bits must be None, 8 or 4; got 6"),
    ],
)
def test_engine_sizes_must_be_integers(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Engine(from_preset("llama-like"), **kwargs)


def test_arrivals_must_be_integer_steps():
    engine = Engine(from_preset("llama-like").eval(), page_size=4, n_pages=8)
    with pytest.raises(ValueError, match=r"arrivals needs one step index >= 0 per prompt \(1\); got \[0.5\]"):
        engine.generate([[1, 2]], SamplingParams(max_new_tokens=1), arrivals=[0.5])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_requests=2.5), "n_requests must be >= 1 and an integer; got 2.5"),
        (dict(new_tokens=0), "new_tokens must be >= 1 and an integer; got 0"),
        (dict(prompt_range=(5, 2)), r"prompt_range must be two integers 1 <= lo <= hi; got \(5, 2\)"),
    ],
)
def test_serve_benchmark_checks_its_sizes(kwargs, match):
    from companion.engine.bench import serve_benchmark

    with pytest.raises(ValueError, match=match):
        serve_benchmark(from_preset("llama-like", d_model=32, n_layers=1), **kwargs)
