"""Chapter 10's exercise checkers accept the reference and reject typical wrong answers, saying why."""

import pytest
import torch

from companion.attention import scaled_dot_product_attention
from companion.exercises import ExerciseFailed, check, checkers
from companion.exercises.ch10 import reference_cache_bytes
from companion.models import from_preset

SEEDS = [0, 1, 2]


def test_chapter_10_checkers_are_registered():
    assert {"ch10.decode_step", "ch10.chunk_mask", "ch10.cache_bytes"} <= set(checkers())


# --- decode step -----------------------------------------------------------------------------------


def decode_step(q, k, v, cache_k, cache_v):
    cache_k, cache_v = torch.cat((cache_k, k), -2), torch.cat((cache_v, v), -2)
    return scaled_dot_product_attention(q, cache_k, cache_v), cache_k, cache_v


@pytest.mark.parametrize("seed", SEEDS)
def test_decode_step_accepts_append_then_attend(seed):
    assert len(check("ch10.decode_step", decode_step, seed=seed, quiet=True).cases) == 3


def _attend_first(q, k, v, ck, cv):
    out = scaled_dot_product_attention(q, ck, cv) if ck.shape[-2] else scaled_dot_product_attention(q, k, v)
    return out, torch.cat((ck, k), -2), torch.cat((cv, v), -2)


def _prepend(q, k, v, ck, cv):
    out, K, V = decode_step(q, k, v, ck, cv)
    return out, torch.cat((k, ck), -2), torch.cat((v, cv), -2)


def _unscaled(q, k, v, ck, cv):
    K, V = torch.cat((ck, k), -2), torch.cat((cv, v), -2)
    return scaled_dot_product_attention(q, K, V, scale=1.0), K, V


@pytest.mark.parametrize("wrong, message", [
    (_attend_first, "old rows only"), (_prepend, "new key put first"), (_unscaled, "sqrt"),
    (lambda q, k, v, ck, cv: decode_step(q, k, v, ck, cv)[0], "tuple of 3"),
])
def test_decode_step_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch10.decode_step", wrong, seed=0, quiet=True)


# --- chunk mask ------------------------------------------------------------------------------------


def chunk_mask(L, T, window=None):
    p, j = torch.arange(L, L + T), torch.arange(L + T)
    mask = j[None, :] <= p[:, None]
    if window is not None:
        mask &= (p[:, None] - j[None, :]) < window
    return p, mask


@pytest.mark.parametrize("seed", SEEDS)
def test_chunk_mask_accepts_positions_after_the_cache(seed):
    assert len(check("ch10.chunk_mask", chunk_mask, seed=seed, quiet=True).cases) == 4


def _from_zero(L, T, window=None):
    p, mask = chunk_mask(L, T, window)
    return torch.arange(T), mask


def _square(L, T, window=None):
    return torch.arange(L, L + T), torch.ones(T, T).tril().bool()


def _strict(L, T, window=None):
    p, j = torch.arange(L, L + T), torch.arange(L + T)
    return p, j[None, :] < p[:, None]


def _wide(L, T, window=None):
    return chunk_mask(L, T, None if window is None else window + 1)


@pytest.mark.parametrize("wrong, message", [
    (_from_zero, "positions counted from 0"), (_square, r"square \(T, T\)"), (_strict, "strict mask"),
    (_wide, "window one too wide"), (lambda L, T, w: chunk_mask(L, T, w)[1].float(), "tuple of 2"),
])
def test_chunk_mask_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch10.chunk_mask", wrong, seed=0, quiet=True)


# --- cache bytes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name, overrides", [("llama-like", {}), ("gemma3-like", {}), ("deepseek-like", {}),
                                             ("mistral-like", {"window": 6, "keep": 2})])
def test_reference_cache_bytes_equals_a_real_cache_after_prefill_and_decode(name, overrides):
    torch.manual_seed(0)
    model = from_preset(name, **overrides).eval()
    idx = torch.randint(0, model.config.vocab_size, (2, 23))
    cache = model.new_cache()
    with torch.no_grad():
        model(idx[:, :15], cache)
        for t in range(15, 23):
            model(idx[:, t : t + 1], cache)
    assert cache.nbytes() == reference_cache_bytes(model.config, 23, batch=2, bytes_per_value=4)


def cache_bytes(c, tokens, batch, b):
    return reference_cache_bytes(c, tokens, batch, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_cache_bytes_accepts_the_reference(seed):
    assert len(check("ch10.cache_bytes", cache_bytes, seed=seed, quiet=True).cases) == 5


def _n_heads(c, tokens, batch, b):
    return 2 * batch * c.n_layers * tokens * c.n_heads * c.attn_head_dim * b


def _no_windows(c, tokens, batch, b):
    if c.attention == "mla":
        return batch * c.n_layers * tokens * (c.kv_rank + c.rope_dim) * b
    return 2 * batch * c.n_layers * tokens * c.kv_heads * c.attn_head_dim * b


@pytest.mark.parametrize("wrong, message", [
    (_n_heads, "n_heads key/value heads"), (_no_windows, "every layer holding all tokens"),
    (lambda c, t, B, b: "many", "expected a number"),
])
def test_cache_bytes_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch10.cache_bytes", wrong, seed=0, quiet=True)
