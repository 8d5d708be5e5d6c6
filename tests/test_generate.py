"""generate(): every decoder preset and GPT, every cache mode, against the no-cache forward."""

import pytest
import torch

from companion.inference.generate import SamplingParams, filter_logits, generate, sample
from companion.models import PRESETS, from_preset
from tolerances import float64_twin_atol

MODELS = list(PRESETS) + ["gpt2-tiny"]
PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [6, 5], [3] * 11]  # different lengths; 11 + new > every toy window


def _bounds(model, prompts, outputs):
    """Per prompt, the largest difference allowed between two float32 computations of the logits that predict
    its generated tokens (one cache mode against another, or against the plain forward): float64_twin_atol of
    the plain forward over prompt + output, i.e. 4 times its own float32 error measured against its float64
    twin, plus 8 ulps (tests/tolerances.py, float32_paths_atol)."""
    def logits(m, idx, n_prompt, n_out):
        return m(idx)[0, n_prompt - 1 : n_prompt - 1 + n_out]

    return [float64_twin_atol(logits, model, torch.tensor([p + o]), len(p), len(o)) for p, o in zip(prompts, outputs)]


def _model(name, seed=0):
    torch.manual_seed(seed)
    return from_preset(name).eval()


@pytest.mark.parametrize("name", MODELS)
def test_cache_modes_agree_with_the_full_forward(name):
    model = _model(name)
    res = {mode: generate(model, PROMPTS, cache=mode, max_new_tokens=6, page_size=4, keep_logits=True) for mode in ("none", "contiguous", "paged")}
    bounds = _bounds(model, PROMPTS, res["none"].tokens)
    for mode, r in res.items():
        assert r.tokens == res["none"].tokens, mode
        assert [len(t) for t in r.tokens] == [6, 6, 6] and r.finish_reasons == ["length"] * 3
        for a, b, atol in zip(r.logits, res["none"].logits, bounds):
            torch.testing.assert_close(a, b, atol=atol, rtol=0)
    assert res["paged"].extra["free_pages_after"] == res["paged"].extra["n_pages"]  # every page returned
    with torch.no_grad():  # independent reference: one plain forward over prompt + generated tokens
        for p, out, logits, atol in zip(PROMPTS, res["paged"].tokens, res["paged"].logits, bounds):
            full = model(torch.tensor([p + out]))[0, len(p) - 1 : len(p) - 1 + len(out)]
            torch.testing.assert_close(logits, full, atol=atol, rtol=0)
            assert out == full.argmax(-1).tolist()


def test_batch_equals_each_prompt_alone_and_streaming():
    model = _model("llama-like")
    params = SamplingParams(max_new_tokens=6, temperature=0.8, top_k=20, top_p=0.9, seed=7)
    batch = generate(model, PROMPTS, params, cache="contiguous")
    for p, out in zip(PROMPTS, batch.tokens):
        assert generate(model, p, params, cache="paged", page_size=3).tokens[0] == out
        assert generate(model, p, params, cache="none").tokens[0] == out
    streamed = [[] for _ in PROMPTS]
    for step in generate(model, PROMPTS, params, cache="contiguous", stream_tokens=True):
        for i, tok in step:
            streamed[i].append(tok)
    assert streamed == batch.tokens
    other_seed = generate(model, PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.8, top_k=20, top_p=0.9, seed=8))
    assert other_seed.tokens != batch.tokens  # the seed matters (3 x 6 draws from ~20 candidates)


def test_stop_tokens_and_context_limit():
    model = _model("mistral-like", seed=1)
    greedy = generate(model, PROMPTS[0], max_new_tokens=8).tokens[0]
    stop = greedy[3]
    first = greedy.index(stop)
    res = generate(model, PROMPTS[0], max_new_tokens=8, stop_tokens=[stop], cache="paged", page_size=2)
    assert res.tokens[0] == greedy[: first + 1] and res.finish_reasons == ["stop"]
    small = from_preset("llama-like", max_seq_len=10).eval()
    res = generate(small, [1, 2, 3, 4, 5, 6, 7], max_new_tokens=50)
    assert len(res.tokens[0]) == 3 and res.finish_reasons == ["context"]
    assert generate(model, PROMPTS, max_new_tokens=0).tokens == [[], [], []]


def test_sampling_filters():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    z = filter_logits(logits, 1.0, top_k=2)
    assert torch.isinf(z[2:]).all() and torch.isfinite(z[:2]).all()
    p = torch.softmax(logits, -1)  # [0.574, 0.211, 0.128, 0.078, 0.029]
    z = filter_logits(logits, 1.0, top_p=float(p[0] + p[1] - 1e-3))  # needs the first two to reach p
    assert torch.isfinite(z[:2]).all() and torch.isinf(z[2:]).all()
    assert torch.isfinite(filter_logits(logits, 1.0, top_p=float(p[0]) / 2)).sum() == 1  # never empty
    torch.testing.assert_close(filter_logits(logits, 0.5), logits * 2)
    g = torch.Generator().manual_seed(0)
    draws = [sample(logits, SamplingParams(temperature=1.0, top_k=2), g) for _ in range(200)]
    assert set(draws) == {0, 1}
    assert sample(logits, SamplingParams()) == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prompts=[[1, 2], []]), r"prompts\[1\] is empty"),
        (dict(prompts=[list(range(300))]), r"prompts\[0\] has 300 tokens, longer than the model's context \(256\)"),
        (dict(max_new_tokens=-1), "max_new_tokens must be >= 0"),
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(top_k=0), "top_k must be >= 1"),
        (dict(page_size=0, cache="paged"), "page_size must be >= 1"),
        (dict(cache="ring"), "cache must be one of"),
        (dict(cache="contiguous", kv_bits=8), r"kv_bits applies only to cache='paged'.*kv_bits=8 with cache='contiguous'"),
        (dict(cache="none", kv_bits=4), r"kv_bits applies only to cache='paged'.*kv_bits=4 with cache='none'"),
        (dict(cache="paged", kv_bits=3), r"kv_bits must be None or one of \(8, 4\); got 3"),
    ],
)
def test_bad_input(kwargs, match):
    model = _model("llama-like")
    prompts = kwargs.pop("prompts", [[1, 2, 3]])
    with pytest.raises(ValueError, match=match):
        generate(model, prompts, **kwargs)
    with pytest.raises(ValueError, match=match):  # the streaming iterator checks before its first step
        generate(model, prompts, stream_tokens=True, **kwargs)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(window=4, keep=2, global_every=2),  # StreamingLLM kept tokens on windowed layers
        dict(position="alibi", n_kv_heads=1),
        dict(position="learned", norm="layer", ffn="gelu", attn_bias=True),
        dict(rope_scaling="pi", rope_factor=2.0),
        dict(rope_scaling="ntk", rope_factor=2.0, window=5, sinks=True),
    ],
    ids=["keep", "alibi", "learned", "pi", "ntk-window-sinks"],
)
def test_variants_agree_across_cache_modes(overrides):
    torch.manual_seed(9)
    model = from_preset("llama-like", **overrides).eval()
    res = {mode: generate(model, PROMPTS, cache=mode, max_new_tokens=4, page_size=3, keep_logits=True) for mode in ("none", "contiguous", "paged")}
    bounds = _bounds(model, PROMPTS, res["none"].tokens)
    for r in res.values():
        assert r.tokens == res["none"].tokens
        for a, b, atol in zip(r.logits, res["none"].logits, bounds):
            torch.testing.assert_close(a, b, atol=atol, rtol=0)


def test_absorbed_mla_generation_matches():
    torch.manual_seed(10)
    model = from_preset("deepseek-like", mla_absorbed=True).eval()
    ref = from_preset("deepseek-like").eval()
    ref.load_state_dict(model.state_dict())
    a = generate(model, PROMPTS, cache="paged", max_new_tokens=4, page_size=4, keep_logits=True)
    b = generate(ref, PROMPTS, cache="none", max_new_tokens=4, keep_logits=True)
    assert a.tokens == b.tokens
    for x, y, atol in zip(a.logits, b.logits, _bounds(ref, PROMPTS, b.tokens)):
        torch.testing.assert_close(x, y, atol=atol, rtol=0)


def test_logits_are_kept_only_when_asked():
    model = _model("llama-like")
    plain = generate(model, PROMPTS, max_new_tokens=3)
    assert plain.logits is None  # no per-step host copy by default
    kept = generate(model, PROMPTS, max_new_tokens=3, keep_logits=True)
    assert kept.tokens == plain.tokens
    assert [tuple(x.shape) for x in kept.logits] == [(3, model.config.vocab_size)] * len(PROMPTS)
    assert all(x.device.type == "cpu" and x.dtype == torch.float32 for x in kept.logits)
    with pytest.raises(ValueError, match="keep_logits must be True or False"):
        generate(model, PROMPTS, max_new_tokens=3, keep_logits="yes")
