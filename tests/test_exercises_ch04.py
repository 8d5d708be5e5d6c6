"""Chapter 4's exercise checkers accept the reference and reject typical wrong answers, saying why."""

import math

import pytest
import torch
import torch.nn.functional as F

from companion.exercises import ExerciseFailed, check, checkers

SEEDS = [0, 1, 2]


def test_chapter_4_checkers_are_registered():
    assert {"ch04.shift", "ch04.bits_per_char", "ch04.top_p_filter", "ch04.answer_loss"} <= set(checkers())


# --- shift -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_shift_accepts_slicing(seed):
    report = check("ch04.shift", lambda t: (t[:, :-1], t[:, 1:]), seed=seed, quiet=True)
    assert len(report.cases) == 3


@pytest.mark.parametrize("wrong, message", [
    (lambda t: (t[:, :-1], t[:, :-1]), "equals the inputs"),
    (lambda t: (t[:, 1:], t[:, :-1]), "inputs"),            # shifted the wrong way
    (lambda t: (t, t), "wrong shape"),
])
def test_shift_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch04.shift", wrong, seed=0, quiet=True)


# --- bits per char -----------------------------------------------------------------------------


def bpc(logits, targets, n_chars):
    log_p = torch.log_softmax(logits, -1).gather(-1, targets[:, None])
    return -log_p.sum().item() / n_chars / math.log(2)


@pytest.mark.parametrize("seed", SEEDS)
def test_bits_per_char_accepts_a_log_softmax_sum(seed):
    assert len(check("ch04.bits_per_char", bpc, seed=seed, quiet=True).cases) == 3


@pytest.mark.parametrize("wrong, message", [
    (lambda l, t, n: F.cross_entropy(l, t).item() / math.log(2), "bits per token"),
    (lambda l, t, n: F.cross_entropy(l, t, reduction="sum").item() / n, "nats per character"),
    (lambda l, t, n: "1.5", "expected a number"),
])
def test_bits_per_char_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch04.bits_per_char", wrong, seed=0, quiet=True)


# --- top-p -------------------------------------------------------------------------------------


def nucleus_by_loop(logits, p):
    """Row by row: sort, keep tokens until their mass reaches p (the crossing token included)."""
    out = torch.full_like(logits, float("-inf"))
    flat, flat_out = logits.reshape(-1, logits.shape[-1]), out.view(-1, logits.shape[-1])
    for r, row in enumerate(flat):
        probs = torch.softmax(row, -1)
        mass = 0.0
        for j in probs.argsort(descending=True).tolist():
            flat_out[r, j] = row[j]
            mass += probs[j].item()
            if mass >= p:
                break
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_top_p_accepts_a_loop_over_sorted_tokens(seed):
    assert len(check("ch04.top_p_filter", nucleus_by_loop, seed=seed, quiet=True).cases) == 4


def keep_while_below(logits, p):
    probs = torch.softmax(logits, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, sorted_p.cumsum(-1) > p)
    return logits.masked_fill(drop, float("-inf"))


def unsorted_cumsum(logits, p):
    probs = torch.softmax(logits, -1)
    return logits.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf"))


@pytest.mark.parametrize("wrong, message", [
    (keep_while_below, "dropping the token that crosses p"),
    (unsorted_cumsum, "vocabulary order"),
])
def test_top_p_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch04.top_p_filter", wrong, seed=0, quiet=True)


# --- answer-only loss --------------------------------------------------------------------------


def answer_loss_by_loop(logits, tokens, prompt_lengths, lengths):
    total, count = 0.0, 0
    for b in range(tokens.shape[0]):
        for t in range(int(prompt_lengths[b]) - 1, int(lengths[b]) - 1):
            if t < 0:
                continue
            total = total - torch.log_softmax(logits[b, t], -1)[tokens[b, t + 1]]
            count += 1
    return total / count


@pytest.mark.parametrize("seed", SEEDS)
def test_answer_loss_accepts_a_loop(seed):
    assert len(check("ch04.answer_loss", answer_loss_by_loop, seed=seed, quiet=True).cases) == 3


def loss_over_everything(logits, tokens, prompt_lengths, lengths):
    return answer_loss_by_loop(logits, tokens, torch.zeros_like(prompt_lengths), lengths)


def mask_not_shifted(logits, tokens, prompt_lengths, lengths):
    total, count = 0.0, 0
    for b in range(tokens.shape[0]):
        for t in range(int(prompt_lengths[b]), int(lengths[b])):
            if t + 1 < tokens.shape[1]:
                total = total - torch.log_softmax(logits[b, t], -1)[tokens[b, t + 1]]
                count += 1
    return total / count


@pytest.mark.parametrize("wrong, message", [
    (loss_over_everything, "prompt included"),
    (mask_not_shifted, "not shifted"),
])
def test_answer_loss_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch04.answer_loss", wrong, seed=0, quiet=True)


def test_top_p_refuses_the_logits_unfiltered():
    """Issue 40: the comparison skipped the entries where the reference is -inf, so returning the
    logits unchanged passed every case."""
    for seed in SEEDS:
        with pytest.raises(ExerciseFailed, match=r"entries should be -inf \(as in the reference: a filtered or masked "
                                                 r"entry\) but are not.*your result equals the logits unfiltered"):
            check("ch04.top_p_filter", lambda logits, p: logits, seed=seed, quiet=True)
    # nor a filter that keeps one token too many (-inf set on all but the nucleus and the next token)
    def one_too_many(logits, p):
        probs = torch.softmax(logits, -1)
        sorted_p, order = probs.sort(-1, descending=True)
        drop = torch.zeros_like(sorted_p, dtype=torch.bool).scatter(-1, order, sorted_p.cumsum(-1) - sorted_p >= p)
        drop_sorted = drop.gather(-1, order)
        first_dropped = drop_sorted.int().argmax(-1, keepdim=True)
        drop_sorted = drop_sorted.scatter(-1, first_dropped, False)
        return logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop_sorted), float("-inf"))

    with pytest.raises(ExerciseFailed, match="entries should be -inf"):
        check("ch04.top_p_filter", one_too_many, seed=0, quiet=True)


def test_top_p_accepts_the_books_solution():
    def top_p_filter(logits, p):  # book/ch04_gpt.ipynb's worked solution
        probs = torch.softmax(logits, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop_sorted = sorted_p.cumsum(-1) - sorted_p >= p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        return logits.masked_fill(drop, float("-inf"))

    for seed in SEEDS:
        assert len(check("ch04.top_p_filter", top_p_filter, seed=seed, quiet=True).cases) == 4
