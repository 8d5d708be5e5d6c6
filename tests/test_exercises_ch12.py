"""Chapter 12's exercise checkers accept the reference and reject typical wrong answers, saying why."""

import math

import pytest
import torch

from companion.exercises import ExerciseFailed, check, checkers
from companion.inference.kvquant import dequantize, quantize

SEEDS = [0, 1, 2]


def test_chapter_12_checkers_are_registered():
    assert {"ch12.slot", "ch12.paged_bytes", "ch12.fake_quant"} <= set(checkers())


# --- slot --------------------------------------------------------------------------------------


def good_slot(table, j, p):
    return table[j // p] * p + j % p


@pytest.mark.parametrize("seed", SEEDS)
def test_slot_accepts_the_formula(seed):
    assert check("ch12.slot", good_slot, seed=seed, quiet=True).cases


@pytest.mark.parametrize("wrong, hint", [
    (lambda table, j, p: table[j // p] + j % p, "not multiplied by p"),
    (lambda table, j, p: j, "block table was not used"),
    (lambda table, j, p: float(good_slot(table, j, p)), "must return an int"),
])
def test_slot_rejects_typical_mistakes(wrong, hint):
    with pytest.raises(ExerciseFailed, match=hint):
        check("ch12.slot", wrong, seed=0, quiet=True)


# --- paged_bytes ---------------------------------------------------------------------------------


def good_bytes(T, p, n_layers, kv_heads, head_dim, bits):
    per_head = head_dim * bits // 8 + (4 if bits in (8, 4) else 0)
    return math.ceil(T / p) * p * n_layers * 2 * kv_heads * per_head


@pytest.mark.parametrize("seed", SEEDS)
def test_paged_bytes_accepts_the_formula(seed):
    assert len(check("ch12.paged_bytes", good_bytes, seed=seed, quiet=True).cases) == 6


@pytest.mark.parametrize("wrong, hint", [
    (lambda T, p, L, g, d, b: T * L * 2 * g * (d * b // 8 + (4 if b in (8, 4) else 0)), "unused slots"),
    (lambda T, p, L, g, d, b: good_bytes(T, p, L, g, d, b) // 2, "K only"),
    (lambda T, p, L, g, d, b: math.ceil(T / p) * p * L * 2 * g * d * b // 8, "no scales"),
])
def test_paged_bytes_rejects_typical_mistakes(wrong, hint):
    with pytest.raises(ExerciseFailed, match=hint):
        check("ch12.paged_bytes", wrong, seed=0, quiet=True)


# --- fake_quant ----------------------------------------------------------------------------------


def good_fake_quant(x, bits):
    m = 2 ** (bits - 1) - 1
    amax = x.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, amax / m, torch.ones_like(amax))
    return torch.round(x / s).clamp(-m, m) * s


@pytest.mark.parametrize("seed", SEEDS)
def test_fake_quant_accepts_the_reference_and_an_independent_version(seed):
    assert check("ch12.fake_quant", good_fake_quant, seed=seed, quiet=True).cases
    check("ch12.fake_quant", lambda x, b: dequantize(*quantize(x, b), b), seed=seed, quiet=True)


def _truncating(x, bits):
    m = 2 ** (bits - 1) - 1
    amax = x.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, amax / m, torch.ones_like(amax))
    return torch.trunc(x / s) * s


def _per_tensor(x, bits):
    s = x.abs().max() / (2 ** (bits - 1) - 1)
    return torch.round(x / s) * s


def _no_zero_guard(x, bits):
    s = x.abs().amax(-1, keepdim=True) / (2 ** (bits - 1) - 1)
    return torch.round(x / s) * s


@pytest.mark.parametrize("wrong, hint", [
    (_truncating, "truncation"),
    (_per_tensor, "one scale for the whole tensor"),
    (_no_zero_guard, "NaN/inf"),
    (lambda x, bits: x[..., :-1], "wrong shape"),
])
def test_fake_quant_rejects_typical_mistakes(wrong, hint):
    with pytest.raises(ExerciseFailed, match=hint):
        check("ch12.fake_quant", wrong, seed=0, quiet=True)
