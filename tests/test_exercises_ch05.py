"""Chapter 5's exercise checkers accept the reference and reject typical wrong answers, saying why."""

import math

import pytest
import torch
import torch.nn.functional as F

from companion.attention_backward import attention_backward
from companion.exercises import ExerciseFailed, check, checkers
from companion.training.optim import WarmupCosine

SEEDS = [0, 1, 2]


def test_chapter_5_checkers_are_registered():
    names = {"ch05.smoothed_ce_grad", "ch05.attention_backward", "ch05.adam_step",
             "ch05.warmup_cosine"}
    assert names <= set(checkers())


# --- smoothed cross-entropy gradient -----------------------------------------------------------


def smoothed_grad(z, y, eps):
    V = z.shape[-1]
    q = (1 - eps) * F.one_hot(y, V).to(z.dtype) + eps / V
    return (torch.softmax(z, -1) - q) / z.shape[0]


def plain_grad(z, y, eps):
    return smoothed_grad(z, y, 0.0)


def summed_grad(z, y, eps):
    return smoothed_grad(z, y, eps) * z.shape[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_smoothed_ce_grad_accepts_p_minus_q(seed):
    assert len(check("ch05.smoothed_ce_grad", smoothed_grad, seed=seed, quiet=True).cases) == 3


@pytest.mark.parametrize("wrong, message", [
    (plain_grad, r"eps = 0.1: .* p - y without the smoothing"),
    (summed_grad, r"the gradient of the sum, not of the mean"),
    (lambda z, y, eps: -smoothed_grad(z, y, eps), r"y - p \(the sign flipped\)"),
])
def test_smoothed_ce_grad_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch05.smoothed_ce_grad", wrong, seed=0, quiet=True)


# --- attention backward ------------------------------------------------------------------------


def by_hand(q, k, v, dout, mask):
    return attention_backward(q, k, v, dout, mask)


def without_rowsum(q, k, v, dout, mask):
    c = q.shape[-1] ** -0.5
    s = (q @ k.transpose(-2, -1)) * c
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    a = torch.softmax(s, -1)
    ds = a * (dout @ v.transpose(-2, -1))
    return c * ds @ k, c * ds.transpose(-2, -1) @ q, a.transpose(-2, -1) @ dout


def without_scale(q, k, v, dout, mask):
    dq, dk, dv = attention_backward(q, k, v, dout, mask)
    c = q.shape[-1] ** -0.5
    return dq / c, dk / c, dv


def leaky_padding(q, k, v, dout, mask):
    dq, dk, dv = attention_backward(q, k, v, dout, mask)
    return dq, dk, dv + 0.5           # every key's value gets a gradient, padded ones too


@pytest.mark.parametrize("seed", SEEDS)
def test_attention_backward_accepts_the_equations(seed):
    report = check("ch05.attention_backward", by_hand, seed=seed, quiet=True)
    assert len(report.cases) == 3 and "padded" in str(report)


@pytest.mark.parametrize("wrong, message", [
    (without_rowsum, r"no mask, dq: .* without subtracting the row sum"),
    (without_scale, r"no mask, dq: .* scale left out"),
    (leaky_padding, r"no mask, dv: values differ"),
    (lambda *a: attention_backward(*a[:4], a[4])[:2], r"expected a tuple of 3 tensors"),
])
def test_attention_backward_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch05.attention_backward", wrong, seed=0, quiet=True)


def test_attention_backward_names_gradients_of_padded_keys():
    def leaks_only_on_padding(q, k, v, dout, mask):
        dq, dk, dv = attention_backward(q, k, v, dout, mask)
        if mask is not None and not bool(mask.any(-2).all()):
            dv = dv + (~mask.any(-2))[:, None] * 1.0
        return dq, dk, dv
    with pytest.raises(ExerciseFailed, match=r"2 keys padded, dv: .* gradients of masked"):
        check("ch05.attention_backward", leaks_only_on_padding, seed=0, quiet=True)


# --- Adam step ---------------------------------------------------------------------------------


def adam_step(p, g, m, v, t, lr, betas, eps, weight_decay, decoupled):
    b1, b2 = betas
    if decoupled:
        p = p * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    return p - lr * m_hat / (v_hat.sqrt() + eps), m, v


def adam_uncorrected(p, g, m, v, t, lr, betas, eps, weight_decay, decoupled):
    b1, b2 = betas
    if not decoupled:
        g = g + weight_decay * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr * m / (v.sqrt() + eps), m, v


def adam_always_l2(p, g, m, v, t, lr, betas, eps, weight_decay, decoupled):
    return adam_step(p, g, m, v, t, lr, betas, eps, weight_decay, False)


def adam_in_place(p, g, m, v, t, lr, betas, eps, weight_decay, decoupled):
    new_p, new_m, new_v = adam_step(p, g, m, v, t, lr, betas, eps, weight_decay, decoupled)
    m.copy_(new_m)
    return new_p, new_m, new_v


@pytest.mark.parametrize("seed", SEEDS)
def test_adam_step_accepts_the_update(seed):
    assert len(check("ch05.adam_step", adam_step, seed=seed, quiet=True).cases) == 3


@pytest.mark.parametrize("wrong, message", [
    (adam_uncorrected, r"no weight decay, step 1, p: .* no bias correction"),
    (adam_always_l2, r"AdamW .* L2 in the gradient \(Adam\) where decoupled decay"),
    (adam_in_place, r"modified its inputs in place"),
])
def test_adam_step_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch05.adam_step", wrong, seed=0, quiet=True)


# --- warmup + cosine ---------------------------------------------------------------------------


def warmup_cosine(step, warmup, total, floor):
    return WarmupCosine(warmup, total, floor)(step)


def from_zero(step, warmup, total, floor):
    return step / warmup if step < warmup else warmup_cosine(step, warmup, total, floor)


def to_zero(step, warmup, total, floor):
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))


def test_warmup_cosine_accepts_the_schedule():
    assert len(check("ch05.warmup_cosine", warmup_cosine, seed=0, quiet=True).cases) == 3


@pytest.mark.parametrize("wrong, message", [
    (from_zero, r"warmup starts at 0"),
    (to_zero, r"decays to 0, not to the floor"),
    (lambda s, w, t, f: "one", r"expected a number, got str"),
])
def test_warmup_cosine_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch05.warmup_cosine", wrong, seed=0, quiet=True)
