"""Chapter 1's exercise checkers accept the reference and reject typical wrong answers, saying why."""

import math

import pytest
import torch

from companion.attention import scaled_dot_product_attention, stable_softmax
from companion.exercises import ExerciseFailed, check, checkers

SEEDS = [0, 1, 2]


def test_chapter_1_checkers_are_registered():
    names = {"ch01.masked_softmax", "ch01.attention", "ch01.attention_backward",
             "ch01.score_matrix_bytes"}
    assert names <= set(checkers())


# --- masked softmax ----------------------------------------------------------------------------


def reference_masked_softmax(scores, keep):
    return stable_softmax(scores.masked_fill(~keep, float("-inf")))


def softmax_ignoring_mask(scores, keep):
    return torch.softmax(scores, -1)


def softmax_nan_on_empty_rows(scores, keep):  # -inf then torch.softmax: NaN when a row is all -inf
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)


def softmax_without_max_subtraction(scores, keep):
    e = torch.exp(scores) * keep
    return e / e.sum(-1, keepdim=True).clamp_min(1e-300)


def zero_after_softmax(scores, keep):
    return torch.softmax(scores, -1) * keep


@pytest.mark.parametrize("seed", SEEDS)
def test_masked_softmax_accepts_the_reference(seed):
    report = check("ch01.masked_softmax", reference_masked_softmax, seed=seed, quiet=True)
    assert len(report.cases) == 4 and "every key masked" in str(report)


@pytest.mark.parametrize("wrong, message", [
    (softmax_ignoring_mask, (r"masked entries \(keys the query may not read\) are non-zero.*"
                             r"a plain softmax that ignores the mask")),
    (softmax_nan_on_empty_rows, (r"row 2 has every key masked: a row whose keys are all masked "
                                 r"must be all zeros")),
    (softmax_without_max_subtraction, r"scores near 1000.*NaN/inf"),
    (zero_after_softmax, r"masked entries .* are non-zero|rows no longer sum to 1"),
])
def test_masked_softmax_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch01.masked_softmax", wrong, seed=0, quiet=True)


def test_masked_softmax_names_zeroing_after_the_softmax():
    # zero_after_softmax puts no weight on masked keys, so the diagnosis is the renormalisation.
    def zero_then_clean(scores, keep):
        return (torch.softmax(scores, -1) * keep).nan_to_num(0.0)

    with pytest.raises(ExerciseFailed, match="rows no longer sum to 1"):
        check("ch01.masked_softmax", zero_then_clean, seed=3, quiet=True)


def test_a_crashing_answer_is_reported_with_its_case():
    def broken(scores, keep):
        raise RuntimeError("boom")

    with pytest.raises(ExerciseFailed, match=r"2-D scores .* raised RuntimeError: boom"):
        check("ch01.masked_softmax", broken, seed=0, quiet=True)


# --- attention ---------------------------------------------------------------------------------


def attention_without_scale(q, k, v, keep=None):
    return scaled_dot_product_attention(q, k, v, keep, scale=1.0)


def attention_softmax_over_queries(q, k, v, keep=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -2).nan_to_num(0.0) @ v


def attention_returning_weights(q, k, v, keep=None):
    return scaled_dot_product_attention(q, k, v, keep, return_weights=True)[1]


@pytest.mark.parametrize("seed", SEEDS)
def test_attention_accepts_the_reference(seed):
    report = check("ch01.attention", scaled_dot_product_attention, seed=seed, quiet=True)
    assert len(report.cases) == 4


@pytest.mark.parametrize("wrong, message", [
    (attention_without_scale, r"one query .* attention without the 1/sqrt\(d_k\) scale"),
    (attention_softmax_over_queries, r"softmax over the queries \(dim=-2\)"),
    (attention_returning_weights, (r"wrong shape: expected \(1, 3\) = \(\.\.\., T, d_v\).*"
                                   r"not the weights")),
])
def test_attention_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch01.attention", wrong, seed=0, quiet=True)


def test_attention_reports_nan_on_a_fully_masked_row():
    def nan_rows(q, k, v, keep=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, -1) @ v

    with pytest.raises(ExerciseFailed, match=r"fully masked row .* NaN/inf values"):
        check("ch01.attention", nan_rows, seed=0, quiet=True)


# --- attention backward ------------------------------------------------------------------------


def attention_backward_by_hand(q, k, v, grad_out):
    scale = 1 / math.sqrt(q.shape[-1])
    A = torch.softmax(q @ k.transpose(-2, -1) * scale, -1)
    grad_A = grad_out @ v.transpose(-2, -1)
    grad_S = A * (grad_A - (grad_A * A).sum(-1, keepdim=True))  # softmax Jacobian (1.4)
    return grad_S @ k * scale, grad_S.transpose(-2, -1) @ q * scale, A.transpose(-2, -1) @ grad_out


def backward_forgetting_the_scale(q, k, v, grad_out):
    gq, gk, gv = attention_backward_by_hand(q, k, v, grad_out)
    return gq * math.sqrt(q.shape[-1]), gk * math.sqrt(q.shape[-1]), gv


def backward_skipping_the_softmax_jacobian(q, k, v, grad_out):
    scale = 1 / math.sqrt(q.shape[-1])
    A = torch.softmax(q @ k.transpose(-2, -1) * scale, -1)
    grad_S = grad_out @ v.transpose(-2, -1)  # treats the softmax as the identity
    return grad_S @ k * scale, grad_S.transpose(-2, -1) @ q * scale, A.transpose(-2, -1) @ grad_out


@pytest.mark.parametrize("seed", SEEDS)
def test_attention_backward_accepts_the_hand_derivation(seed):
    report = check("ch01.attention_backward", attention_backward_by_hand, seed=seed, quiet=True)
    assert len(report.cases) == 3


@pytest.mark.parametrize("wrong, message", [
    (backward_forgetting_the_scale, r"grad_q: values differ.*without the 1/sqrt\(d_k\) factor"),
    (backward_skipping_the_softmax_jacobian, r"grad_q: values differ.*skipping the softmax Jacobian"),
    (lambda q, k, v, g: q, r"return the three gradients"),
])
def test_attention_backward_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch01.attention_backward", wrong, seed=0, quiet=True)


# --- score matrix bytes ------------------------------------------------------------------------


def test_score_matrix_bytes_accepts_the_reference():
    report = check("ch01.score_matrix_bytes", lambda T, h, b: T * T * h * b, seed=0, quiet=True)
    assert report.cases[0] == "T = 4096, 32 heads, 2 bytes per value" and len(report.cases) == 4


@pytest.mark.parametrize("wrong, message", [
    (lambda T, h, b: T * h * b, r"expected 1,073,741,824 bytes, got 262,144 -- that is T entries"),
    (lambda T, h, b: T * T * b, r"got 33,554,432 -- that is one head instead of all of them"),
    (lambda T, h, b: T * T * h, r"a count of values, not of bytes"),
    (lambda T, h, b: str(T * T * h * b), r"expected a number of bytes, got str"),
])
def test_score_matrix_bytes_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch01.score_matrix_bytes", wrong, seed=0, quiet=True)
