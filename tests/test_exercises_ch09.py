"""Chapter 9's exercise checkers accept the reference and reject typical wrong answers, saying why."""

import math

import pytest
import torch

from exercise_checks import fails
from companion.exercises import check, checkers

SEEDS = [0, 1, 2]


def test_chapter_9_checkers_are_registered():
    names = {"ch09.window_pairs", "ch09.reach", "ch09.sink_attention", "ch09.top_k_gates", "ch09.switch_aux_loss"}
    assert names <= set(checkers())


def _fails(name, fn, needle, seed=0):
    return fails(name, fn, needle, seed=seed)


# --- window pairs ------------------------------------------------------------------------------


def window_pairs(T, w):
    w = min(w, T)
    return T * w - w * (w - 1) // 2


@pytest.mark.parametrize("seed", SEEDS)
def test_window_pairs_accepts_the_closed_form(seed):
    assert len(check("ch09.window_pairs", window_pairs, seed=seed, quiet=True).cases) == 5


def test_window_pairs_names_the_missing_corner_and_the_cap():
    _fails("ch09.window_pairs", lambda T, w: T * w, "first w - 1 queries")
    _fails("ch09.window_pairs", lambda T, w: T * w - w * (w - 1) // 2, "cannot reach before position 0")
    _fails("ch09.window_pairs", lambda T, w: "many", "expected an int")


# --- reach -------------------------------------------------------------------------------------


def reach(windows, T):
    back = 0
    for w in windows:
        if w is None:
            return T
        back += w - 1
    return min(T, back + 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_reach_accepts_the_formula_with_global_layers(seed):
    assert len(check("ch09.reach", reach, seed=seed, quiet=True).cases) == 6


def test_reach_names_typical_mistakes():
    _fails("ch09.reach", lambda ws, T: min(T, sum(w for w in ws if w)), "looks back w - 1")
    _fails("ch09.reach", lambda ws, T: min(T, sum(w - 1 for w in ws if w)), "own position is missing")
    _fails("ch09.reach", lambda ws, T: sum(w - 1 for w in ws if w) + 1, "not capped at T")
    _fails("ch09.reach", lambda ws, T: min(T, sum(w - 1 for w in ws if w) + 1), "global layer reads every")


# --- sink attention ----------------------------------------------------------------------------


def sink_attention(q, k, v, sinks):
    T, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    sink = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    return weights @ v


@pytest.mark.parametrize("seed", SEEDS)
def test_sink_attention_accepts_the_extra_denominator_term(seed):
    assert len(check("ch09.sink_attention", sink_attention, seed=seed, quiet=True).cases) == 3


def test_sink_attention_names_a_missing_or_scaled_sink():
    def plain(q, k, v, sinks):
        return sink_attention(q, k, v, torch.full_like(sinks, -torch.inf))

    def scaled(q, k, v, sinks):
        return sink_attention(q, k, v, sinks / math.sqrt(q.shape[-1]))

    _fails("ch09.sink_attention", plain, "not in the denominator")
    _fails("ch09.sink_attention", scaled, "multiplied by 1/sqrt(d)")
    _fails("ch09.sink_attention", lambda q, k, v, s: q[..., :2], "wrong shape")


# --- top-k gates -------------------------------------------------------------------------------


def top_k_gates(logits, k):
    probs = logits.softmax(-1)
    gates, ids = probs.topk(k, dim=-1)
    return ids, gates / gates.sum(-1, keepdim=True)


@pytest.mark.parametrize("seed", SEEDS)
def test_top_k_gates_accepts_renormalised_probabilities_in_any_order(seed):
    assert len(check("ch09.top_k_gates", top_k_gates, seed=seed, quiet=True).cases) == 3

    def reversed_order(logits, k):
        ids, gates = top_k_gates(logits, k)
        return ids.flip(-1), gates.flip(-1)

    check("ch09.top_k_gates", reversed_order, seed=seed, quiet=True)


def test_top_k_gates_names_unnormalised_gates_and_wrong_choices():
    def raw(logits, k):
        gates, ids = logits.softmax(-1).topk(k, dim=-1)
        return ids, gates

    def smallest(logits, k):
        gates, ids = logits.softmax(-1).topk(k, dim=-1, largest=False)
        return ids, gates / gates.sum(-1, keepdim=True)

    _fails("ch09.top_k_gates", raw, "without renormalising")
    _fails("ch09.top_k_gates", smallest, "the k largest router probabilities")


# --- Switch auxiliary loss ---------------------------------------------------------------------


def switch_aux_loss(probs, ids, alpha):
    E = probs.shape[-1]
    f = torch.bincount(ids.flatten(), minlength=E).to(probs.dtype) / ids.numel()
    return alpha * E * (f * probs.mean(0)).sum()


@pytest.mark.parametrize("seed", SEEDS)
def test_switch_aux_loss_accepts_the_formula(seed):
    assert len(check("ch09.switch_aux_loss", switch_aux_loss, seed=seed, quiet=True).cases) == 3


def test_switch_aux_loss_names_counts_per_token_fractions_and_a_missing_factor():
    def counts(probs, ids, alpha):
        E = probs.shape[-1]
        return alpha * E * (torch.bincount(ids.flatten(), minlength=E).to(probs.dtype) * probs.mean(0)).sum()

    def per_token(probs, ids, alpha):
        return switch_aux_loss(probs, ids, alpha) * ids.shape[-1]

    def no_e(probs, ids, alpha):
        return switch_aux_loss(probs, ids, alpha) / probs.shape[-1]

    _fails("ch09.switch_aux_loss", counts, "token counts")
    _fails("ch09.switch_aux_loss", per_token, "divided by N instead of N k", seed=1)
    _fails("ch09.switch_aux_loss", no_e, "no factor E")
