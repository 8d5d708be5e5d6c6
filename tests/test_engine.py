"""The continuous-batching engine against running every request alone (the no-cache generate)."""

import random

import pytest
import torch

from companion.engine import Engine
from companion.inference.generate import SamplingParams, generate
from companion.models import from_preset


def _trace(rng, n, prefix):
    """Random requests: lengths 1..18, some starting with a shared prefix, max_new 0..9."""
    prompts = []
    for _ in range(n):
        own = [rng.randrange(256) for _ in range(rng.randint(1, 10))]
        prompts.append((prefix[: rng.randint(4, len(prefix))] + own) if rng.random() < 0.5 else own)
    return prompts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traces_equal_running_each_request_alone(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = from_preset(["llama-like", "gemma3-like", "deepseek-like"][seed]).eval()
    prefix = [rng.randrange(256) for _ in range(12)]
    prompts = _trace(rng, 9, prefix)
    params = []
    for i, p in enumerate(prompts):
        sp = SamplingParams(max_new_tokens=rng.randint(0, 9), temperature=0.0 if i % 3 else 0.9, top_k=50, seed=i)
        if i % 4 == 1 and sp.max_new_tokens > 2:  # early stop on a token the request will produce
            sp.stop_tokens = (generate(model, p, sp, cache="none").tokens[0][2],)
        params.append(sp)
    # a pool far smaller than the trace's total, tiny pages, a small token budget: forces chunked
    # prefill, waiting for pages and preemption
    n_pages = max(-(-(len(p) + sp.max_new_tokens) // 3) for p, sp in zip(prompts, params))  # just one request's worth
    engine = Engine(model, page_size=3, n_pages=n_pages, max_batch_tokens=10, max_seqs=5)
    outs = engine.generate(prompts, params, arrivals=[rng.randint(0, 6) for _ in prompts])
    for p, sp, out in zip(prompts, params, outs):
        alone = generate(model, p, sp, cache="none")
        assert out.tokens == alone.tokens[0] and out.finish_reason == alone.finish_reasons[0]
        if out.tokens:
            assert out.ttft_s > 0 and out.tokens_per_s > 0
    assert engine.kv.n_free == engine.kv.n_pages and sum(engine.kv.manager.ref) == 0  # no leaked page
    assert sum(o.preemptions for o in outs) > 0  # the pool really ran out


def test_prefix_sharing_saves_compute_and_matches():
    torch.manual_seed(5)
    model = from_preset("llama-like").eval()
    system = torch.randint(0, 256, (16,)).tolist()
    prompts = [system + [i, i + 1] for i in range(6)]
    params = SamplingParams(max_new_tokens=4)
    shared = Engine(model, page_size=4, n_pages=40, max_batch_tokens=64)
    outs = shared.generate(prompts[:1], params)  # registers the system prompt's pages
    outs += shared.generate(prompts[1:], params)
    plain = Engine(model, page_size=4, n_pages=40, max_batch_tokens=64, prefix_sharing=False)
    assert [o.tokens for o in outs] == [o.tokens for o in plain.generate(prompts, params)]
    assert shared.kv.n_free == 40
    # The saving, counted by the engines: without sharing every prompt token goes through the model;
    # with it, the later requests map the system prompt's 16 // 4 = 4 full pages and feed only their
    # own 2 tokens. Decoding is the same work in both (max_new_tokens - 1 fed tokens per request).
    assert plain.stats["prefill_tokens_fed"] == sum(map(len, prompts))
    assert shared.stats["prefill_tokens_fed"] == len(prompts[0]) + sum(len(p) - len(system) for p in prompts[1:])
    decode = len(prompts) * (params.max_new_tokens - 1)
    assert plain.stats["tokens_fed"] - plain.stats["prefill_tokens_fed"] == decode
    assert shared.stats["tokens_fed"] - shared.stats["prefill_tokens_fed"] == decode


def test_contiguous_engine_and_seeded_sampling():
    torch.manual_seed(6)
    model = from_preset("mistral-like", window=6).eval()
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9], [4, 4, 4]]
    params = [SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.8, seed=s) for s in (1, 2, 3)]
    outs = Engine(model, cache="contiguous", max_batch_tokens=5).generate(prompts, params)
    for p, sp, out in zip(prompts, params, outs):
        assert out.tokens == generate(model, p, sp, cache="contiguous").tokens[0]


@pytest.mark.parametrize(
    "prompt, kwargs, match",
    [
        ([], {}, "is empty"),
        (list(range(257)), {}, "longer than the model's context"),
        ([1, 2], dict(max_new_tokens=-1), "max_new_tokens must be >= 0"),
        ([1, 2], dict(temperature=-1.0), "temperature must be >= 0"),
        ([1, 2], dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        ([1, 2], dict(top_k=0), "top_k must be >= 1"),
        ([1, 2], dict(temperature=float("nan")), "temperature must be >= 0 .* and finite; got nan"),
        ([1, 2], dict(top_k=2.5), "top_k must be >= 1 .*; got 2.5"),
        ([1, 2], dict(max_new_tokens=2.5), "max_new_tokens must be >= 0 and an integer; got 2.5"),
        ([1, 2], dict(stop_tokens=5), "stop_tokens must be a sequence of token ids"),
        ([1] * 30, dict(max_new_tokens=10), "n_pages=4 is too small"),
    ],
)
def test_bad_requests_raise_and_leak_nothing(prompt, kwargs, match):
    model = from_preset("llama-like").eval()
    engine = Engine(model, page_size=4, n_pages=4)
    bad = SamplingParams(max_new_tokens=4)
    for k, v in kwargs.items():  # set after construction, so the ENGINE's check is what fails
        setattr(bad, k, v)
    with pytest.raises(ValueError, match=match):
        engine.generate([[5, 6], prompt], [SamplingParams(max_new_tokens=4), bad])
    assert engine.sequences == [] and engine.kv.n_free == 4  # nothing was queued, nothing held


def test_bad_engine_arguments():
    model = from_preset("llama-like")
    for kwargs, match in [
        (dict(page_size=0), "page_size must be >= 1"),
        (dict(max_batch_tokens=0), "max_batch_tokens must be >= 1"),
        (dict(n_pages=0), "n_pages must be >= 1"),
        (dict(cache="ring"), "cache must be one of"),
    ]:
        with pytest.raises(ValueError, match=match):
            Engine(model, **kwargs)


def test_cli_generate_and_bench_serve(capsys):
    from companion.__main__ import main

    assert main(["generate", "--ids", "1 2 3", "--max-new-tokens", "4", "--cache", "paged", "--page-size", "2", "--seed", "3"]) == 0
    printed = [int(t) for t in capsys.readouterr().out.split()]
    torch.manual_seed(3)  # the CLI seeds the random preset weights with --seed
    model = from_preset("llama-like").eval()
    assert printed == generate(model, [1, 2, 3], max_new_tokens=4, seed=3).tokens[0]
    assert main(["bench-serve", "--requests", "3", "--new-tokens", "2", "--d-model", "32", "--n-layers", "1"]) == 0
    report = capsys.readouterr().out
    assert '"identical": true' in report and '"generated_tokens": 6' in report
    with pytest.raises(SystemExit, match="2"):
        main(["generate", "--top-k", "0"])


def test_string_prompts_through_a_tokenizer():
    class Bytes:  # the smallest tokenizer: UTF-8 bytes are the ids (the toy models' vocabulary is 256)
        def encode(self, text):
            return list(text.encode("utf-8"))

        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    torch.manual_seed(7)
    model = from_preset("llama-like").eval()
    (out,) = Engine(model, Bytes(), page_size=4).generate(["hello"], SamplingParams(max_new_tokens=5))
    assert out.prompt == list(b"hello") and out.tokens == generate(model, list(b"hello"), max_new_tokens=5).tokens[0]
    assert out.text == Bytes().decode(out.tokens)
    with pytest.raises(ValueError, match="no tokenizer"):
        Engine(model).generate(["hello"])


def test_a_sampling_params_reused_and_changed_does_not_change_queued_requests():
    """Issue 40: one SamplingParams, changed between add_request calls, changed the requests already
    queued (asked for 3 tokens, got 10; set to -5 after validation, ran 1)."""
    torch.manual_seed(0)
    model = from_preset("llama-like").eval()
    engine = Engine(model, page_size=4)
    params = SamplingParams(max_new_tokens=3)
    first = engine.add_request([1, 2, 3], params)
    params.max_new_tokens = 10
    second = engine.add_request([4, 5], params)
    params.max_new_tokens = -5  # invalid, set after both were checked
    while engine.scheduler.has_work():
        engine.step()
    assert len(engine.output(first).tokens) == 3 and len(engine.output(second).tokens) == 10


def test_a_late_arrival_skips_the_idle_steps():
    """Issue 40 (item 12): arrivals=[10**9] spun through a billion empty steps."""
    import time

    torch.manual_seed(0)
    engine = Engine(from_preset("llama-like").eval(), page_size=4)
    start = time.perf_counter()
    (out,) = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2), arrivals=[10**9])
    assert len(out.tokens) == 2 and time.perf_counter() - start < 30
