"""Checkers for chapter 5's exercises (gradients, Adam and AdamW, schedules).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch05.smoothed_ce_grad``: ``fn(logits (N, V), targets (N,), eps) -> (N, V)``, the gradient of
  the mean label-smoothed cross-entropy, (p - q) / N with q = (1 - eps) onehot(y) + eps / V
  (equation 5.1 with a smoothed target).
- ``ch05.attention_backward``: ``fn(q, k, v, dout, mask) -> (dq, dk, dv)`` for
  O = softmax(Q K^T / sqrt(d_k), masked) V, equations (5.2)-(5.5); ``mask`` is boolean (..., T, S),
  True = may read.
- ``ch05.adam_step``: ``fn(p, g, m, v, t, lr, betas, eps, weight_decay, decoupled) -> (p, m, v)``,
  one Adam (decoupled=False: L2 added to the gradient) or AdamW (decoupled=True) update at step t
  (1-based), equations (5.6)-(5.10); the inputs are not to be modified in place.
- ``ch05.warmup_cosine``: ``fn(step, warmup, total, floor) -> float``, the factor of a linear warmup
  (step + 1) / warmup for the first ``warmup`` steps (0-based), then a cosine from 1 down to
  ``floor`` at ``total``, and ``floor`` after.

Each checker compares with an independent reference (autograd, ``torch.optim``, the companion's
schedule) and, on a mismatch, names the case and the typical mistake the answer reproduces.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.attention import causal_mask, scaled_dot_product_attention
from companion.exercises import ExerciseFailed, call, diagnose, register
from companion.training.optim import WarmupCosine


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


def _pair(case: str, got, n: int) -> tuple:
    if not isinstance(got, (tuple, list)) or len(got) != n:
        raise ExerciseFailed(f"{case}: expected a tuple of {n} tensors, got {type(got).__name__}"
                             + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""))
    return tuple(got)


# --- ch05.smoothed_ce_grad ---------------------------------------------------------------------


@register("ch05.smoothed_ce_grad")
def check_smoothed_ce_grad(fn, gen, report) -> None:
    cases = [("N = 4, V = 6, eps = 0 (plain cross-entropy)", 4, 6, 0.0),
             ("N = 5, V = 10, eps = 0.1", 5, 10, 0.1),
             ("N = 3, V = 50, eps = 0.3, large logits", 3, 50, 0.3)]
    for case, N, V, eps in cases:
        z = _randn(gen, N, V, scale=5.0 if V == 50 else 1.0).requires_grad_()
        y = torch.randint(0, V, (N,), generator=gen)
        F.cross_entropy(z, y, label_smoothing=eps).backward()
        zd = z.detach()
        got = call(case, fn, zd.clone(), y.clone(), eps)
        p, onehot = torch.softmax(zd, -1), F.one_hot(y, V).double()
        mistakes = {
            "p - y without the smoothing (q = onehot)": (p - onehot) / N,
            "the gradient of the sum, not of the mean (no division by N)":
                p - (1 - eps) * onehot - eps / V,
            "eps spread over the V - 1 wrong classes only":
                (p - (1 - eps) * onehot - eps / (V - 1) * (1 - onehot)) / N,
            "y - p (the sign flipped)": -z.grad,
        }
        diagnose(case, got, z.grad, mistakes, atol=1e-8, rtol=1e-6)
        report.cases.append(case)


# --- ch05.attention_backward -------------------------------------------------------------------


def _attention_cases(gen: torch.Generator):
    """(description, q, k, v, dout, mask)."""
    yield ("one head, T = S = 4, d = 3, no mask", _randn(gen, 4, 3), _randn(gen, 4, 3),
           _randn(gen, 4, 3), _randn(gen, 4, 3), None)
    yield ("(2, 3) batch x heads, T = S = 6, d_k = 8, d_v = 5, causal mask", _randn(gen, 2, 3, 6, 8),
           _randn(gen, 2, 3, 6, 8), _randn(gen, 2, 3, 6, 5), _randn(gen, 2, 3, 6, 5), causal_mask(6))
    keep = torch.ones(5, 7, dtype=torch.bool)
    keep[:, 5:] = False  # keys 5 and 6 are padding
    yield ("T = 5 queries over S = 7 keys, the last 2 keys padded", _randn(gen, 5, 4),
           _randn(gen, 7, 4, scale=2.0), _randn(gen, 7, 2), _randn(gen, 5, 2), keep)


def _wrong_attention(q, k, v, dout, mask):
    """What typical mistakes return, computed on the same inputs: name -> (dq, dk, dv)."""
    c = 1 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-2, -1)) * c
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    a = torch.softmax(s, -1)
    da = dout @ v.transpose(-2, -1)
    ds = a * (da - (a * da).sum(-1, keepdim=True))
    no_rowsum = a * da
    dv = a.transpose(-2, -1) @ dout
    wrong = {
        "dS = A * dA, without subtracting the row sum sum_u A_iu dA_iu":
            (c * no_rowsum @ k, c * no_rowsum.transpose(-2, -1) @ q, dv),
        "the 1 / sqrt(d_k) scale left out of dQ and dK":
            (ds @ k, ds.transpose(-2, -1) @ q, dv),
    }
    if a.shape[-1] == a.shape[-2]:  # the transposes can only be forgotten when T = S
        wrong["A dO instead of A^T dO (or dS Q instead of dS^T Q): a transpose forgotten"] = (
            c * ds @ k, c * ds @ q, a @ dout)
    return wrong


@register("ch05.attention_backward")
def check_attention_backward(fn, gen, report) -> None:
    for case, q, k, v, dout, mask in _attention_cases(gen):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        scaled_dot_product_attention(*leaves, mask).backward(dout)
        got = _pair(case, call(case, fn, q.clone(), k.clone(), v.clone(), dout.clone(), mask), 3)
        wrong = _wrong_attention(q, k, v, dout, mask)
        padded = None if mask is None or bool(mask.any(-2).all()) else ~mask.any(-2)  # (S,) keys
        for i, name in enumerate(("dq", "dk", "dv")):
            expected = leaves[i].grad
            zero = None
            if padded is not None and name != "dq":
                zero = padded[:, None].expand_as(expected)
            diagnose(f"{case}, {name}", got[i], expected,
                     {hint: w[i] for hint, w in wrong.items() if w[i].shape == expected.shape},
                     zero_where=zero, zero_what="gradients of masked (padding) keys",
                     atol=1e-8, rtol=1e-6)
        report.cases.append(case)


# --- ch05.adam_step ----------------------------------------------------------------------------


def _torch_adam_steps(p0: Tensor, grads: list[Tensor], lr, betas, eps, wd, decoupled) -> Tensor:
    p = p0.clone().requires_grad_()
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls([p], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


def _wrong_adam(p, g, m, v, t, lr, betas, eps, wd, decoupled):
    """name -> the new p that a typical mistake gives for one step from (p, m, v)."""
    b1, b2 = betas

    def step(grad, correct=True, eps_inside=False, shrink=0.0):
        m2 = b1 * m + (1 - b1) * grad
        v2 = b2 * v + (1 - b2) * grad * grad
        mh, vh = (m2 / (1 - b1**t), v2 / (1 - b2**t)) if correct else (m2, v2)
        denom = (vh + eps).sqrt() if eps_inside else vh.sqrt() + eps
        return p * (1 - shrink) - lr * mh / denom

    plain = g + wd * p if not decoupled else g
    return {
        "no bias correction (m and v used as they are)": step(plain, correct=False),
        "eps inside the square root, sqrt(v_hat + eps)": step(plain, eps_inside=True),
        "L2 in the gradient (Adam) where decoupled decay (AdamW) was asked":
            step(g + wd * p),
        "decoupled decay (AdamW) where L2 in the gradient (Adam) was asked":
            step(g, shrink=lr * wd),
    }


@register("ch05.adam_step")
def check_adam_step(fn, gen, report) -> None:
    cases = [("Adam, 5 steps, no weight decay", 5, 1e-2, (0.9, 0.999), 1e-8, 0.0, False),
             ("Adam + L2 (weight_decay 0.1), 6 steps", 6, 3e-3, (0.8, 0.99), 1e-8, 0.1, False),
             ("AdamW (weight_decay 0.5), 6 steps, eps 1e-3", 6, 1e-2, (0.9, 0.95), 1e-3, 0.5, True)]
    for case, n, lr, betas, eps, wd, decoupled in cases:
        p0 = _randn(gen, 3, 4)
        grads = [_randn(gen, 3, 4, scale=0.1 + i) for i in range(n)]
        expected = _torch_adam_steps(p0, grads, lr, betas, eps, wd, decoupled)
        p, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
        for t, g in enumerate(grads, start=1):
            before = (p.clone(), g.clone(), m.clone(), v.clone())
            wrong = _wrong_adam(p, g, m, v, t, lr, betas, eps, wd, decoupled)
            out = _pair(f"{case}, step {t}", call(case, fn, p, g, m, v, t, lr, betas, eps, wd,
                                                   decoupled), 3)
            if not all(torch.equal(a, b) for a, b in zip(before, (p, g, m, v))):
                raise ExerciseFailed(f"{case}, step {t}: your function modified its inputs in place; "
                                     "return new tensors (p, m, v) instead")
            ref = _torch_adam_steps(p0, grads[:t], lr, betas, eps, wd, decoupled)
            diagnose(f"{case}, step {t}, p", out[0], ref, wrong, atol=1e-10, rtol=1e-7)
            p, m, v = out
        diagnose(f"{case}, after {n} steps", p, expected, {}, atol=1e-10, rtol=1e-7)
        report.cases.append(case)


# --- ch05.warmup_cosine ------------------------------------------------------------------------


@register("ch05.warmup_cosine")
def check_warmup_cosine(fn, gen, report) -> None:
    for warmup, total, floor in [(10, 110, 0.1), (1, 50, 0.0), (25, 40, 0.5)]:
        case = f"warmup {warmup}, total {total}, floor {floor}"
        ref = WarmupCosine(warmup, total, floor)
        steps = sorted({0, warmup - 1, warmup, (warmup + total) // 2, total - 1, total, total + 7,
                        *torch.randint(0, total + 10, (5,), generator=gen).tolist()})
        for s in steps:
            got = call(case, fn, s, warmup, total, floor)
            if not isinstance(got, (int, float)) or isinstance(got, bool):
                if isinstance(got, Tensor) and got.numel() == 1:
                    got = got.item()
                else:
                    raise ExerciseFailed(f"{case}, step {s}: expected a number, got {type(got).__name__}")
            want = ref(s)
            if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
                hint = ""
                if s < warmup and math.isclose(got, s / warmup, abs_tol=1e-12):
                    hint = " -- your warmup starts at 0: step s (0-based) should give (s + 1) / warmup"
                elif s > total and math.isclose(got, floor + (1 - floor) * 0.5 * (1 + math.cos(
                        math.pi * (s - warmup) / (total - warmup))), abs_tol=1e-12):
                    hint = " -- after `total` the cosine must stay at the floor, not rise again"
                elif s >= warmup and math.isclose(got, 0.5 * (1 + math.cos(math.pi * min(1, (
                        s - warmup) / (total - warmup)))), abs_tol=1e-12):
                    hint = " -- the cosine decays to 0, not to the floor"
                raise ExerciseFailed(f"{case}, step {s}: expected {want:.6g}, got {got:.6g}{hint}")
        report.cases.append(case)
