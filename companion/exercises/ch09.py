"""Checkers for chapter 9's exercises (local attention, sinks and mixtures of experts).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch09.window_pairs``: ``fn(T, w) -> int``, the number of (query, key) pairs a causal sliding
  window of w tokens lets attend in a sequence of T tokens, equation (9.2): T w - w (w - 1) / 2 when
  w <= T, the causal T (T + 1) / 2 otherwise.
- ``ch09.reach``: ``fn(windows, T) -> int``, how many of T input positions can influence the output at
  the last position through layers with the given windows (``None`` = a global layer), in order from
  the first layer to the last: L (w - 1) + 1 for L layers of window w (equation 9.3), all T once a
  global layer is among them.
- ``ch09.sink_attention``: ``fn(q (B, h, T, d), k, v, sinks (h,)) -> (B, h, T, d)``, causal attention
  whose softmax denominator also holds exp(s_h), one learned logit per head (equation 9.4): the
  weights of a row sum to less than 1 and the sink reads no value.
- ``ch09.top_k_gates``: ``fn(logits (N, E), k) -> (ids (N, k), gates (N, k))``, Mixtral's router:
  p = softmax(logits), the k largest p per token, renormalised to sum 1 (equation 9.5). The order of
  the k pairs within a row is free.
- ``ch09.switch_aux_loss``: ``fn(probs (N, E), ids (N, k), alpha) -> ()``, the Switch Transformer's
  load-balancing loss alpha E sum_e f_e P_e (equation 9.6), f_e the fraction of the N k assignments
  that went to expert e and P_e the mean router probability of e.

Each checker draws fresh inputs, compares with an independent reference (a boolean mask, a
reachability propagation through the masks, ``companion.kernels.attend.attend`` with ``sinks``,
``companion.moe.MoE.route``, the formula on counted assignments) and names a typical mistake when a
wrong answer reproduces one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from companion.attention import causal_mask, sliding_window_mask
from companion.exercises import ExerciseFailed, call, diagnose, register
from companion.kernels.attend import attend
from companion.moe import MoE


def _as_int(case: str, got) -> int:
    if isinstance(got, Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, float) and got.is_integer():
        got = int(got)
    if isinstance(got, bool) or not isinstance(got, int):
        raise ExerciseFailed(f"{case}: expected an int, got {type(got).__name__} ({got!r})")
    return got


def _int_answer(case: str, got, expected: int, mistakes: dict[str, int]) -> None:
    got = _as_int(case, got)
    if got != expected:
        hint = next((h for h, wrong in mistakes.items() if wrong == got and wrong != expected), None)
        raise ExerciseFailed(f"{case}: expected {expected}, got {got}" + (f" -- your result equals {hint}" if hint else ""))


# --- ch09.window_pairs ----------------------------------------------------------------------------


@register("ch09.window_pairs")
def check_window_pairs(fn, gen, report) -> None:
    T_big = int(torch.randint(200, 400, (), generator=gen))
    cases = [("T = 8, w = 3", 8, 3), ("T = 5, w = 1 (each query reads itself)", 5, 1),
             (f"T = {T_big}, w = 32", T_big, 32), ("T = 6, w = 10 (the window is longer than T)", 6, 10),
             ("T = 7, w = 7 (the window is exactly T)", 7, 7)]
    for case, T, w in cases:
        expected = int(sliding_window_mask(T, w).sum())  # count the allowed cells of the real mask
        got = call(case, fn, T, w)
        _int_answer(case, got, expected, {
            "T w: the first w - 1 queries have fewer than w keys to read": T * w,
            "T (T + 1) / 2: the causal count, as if there were no window": T * (T + 1) // 2,
            "T w - w (w + 1) / 2: the corner triangle counted one row too large": T * w - w * (w + 1) // 2,
            "T w - w (w - 1) / 2 also when w > T: the window cannot reach before position 0":
                T * w - w * (w - 1) // 2,
        })
        report.cases.append(case)


# --- ch09.reach ---------------------------------------------------------------------------------


def _reach_by_masks(windows, T: int) -> int:
    """Propagate 'can influence' from the last output down through each layer's mask."""
    live = torch.zeros(T, dtype=torch.bool)
    live[-1] = True
    for w in reversed(list(windows)):
        mask = causal_mask(T) if w is None else sliding_window_mask(T, w)  # (T, T): query i reads key j
        live = (live.float() @ mask.float()) > 0  # a key feeding any live query is live below
    return int(live.sum())


@register("ch09.reach")
def check_reach(fn, gen, report) -> None:
    w = int(torch.randint(3, 7, (), generator=gen))
    cases = [("one layer, w = 4, T = 20", [4], 20), (f"three layers, w = {w}, T = 40", [w] * 3, 40),
             ("windows 2, 5, 3 (mixed), T = 30", [2, 5, 3], 30),
             ("five layers of w = 8, T = 16 (the reach is cut at position 0)", [8] * 5, 16),
             ("5 local (w = 3) then 1 global, T = 50 (Gemma 3's pattern)", [3] * 5 + [None], 50),
             ("1 global then 2 local (w = 4), T = 30", [None, 4, 4], 30)]
    for case, windows, T in cases:
        expected = _reach_by_masks(windows, T)
        got = call(case, fn, list(windows), T)
        local = [x for x in windows if x is not None]
        mistakes = {
            "L w: each layer looks back w - 1, not w, beyond the query itself": min(T, sum(local)),
            "L (w - 1): the query's own position is missing (+ 1)": min(T, sum(x - 1 for x in local)),
        }
        if None in windows:
            mistakes["the local layers only: a global layer reads every earlier position"] = min(
                T, sum(x - 1 for x in local) + 1)
        else:
            mistakes["not capped at T: no layer can read before position 0"] = sum(x - 1 for x in local) + 1
        _int_answer(case, got, expected, mistakes)
        report.cases.append(case)


# --- ch09.sink_attention ------------------------------------------------------------------------


@register("ch09.sink_attention")
def check_sink_attention(fn, gen, report) -> None:
    cases = [("B = 1, h = 2, T = 5, d = 4", 1, 2, 5, 4), ("B = 2, h = 4, T = 9, d = 8", 2, 4, 9, 8),
             ("B = 1, h = 3, T = 6, d = 16, large sink logits", 1, 3, 6, 16)]
    for case, B, h, T, d in cases:
        q, k, v = (torch.randn(B, h, T, d, generator=gen, dtype=torch.float64) for _ in range(3))
        sinks = torch.randn(h, generator=gen, dtype=torch.float64) * (4.0 if "large" in case else 1.0)
        expected = attend(q, k, v, causal=True, sinks=sinks, backend="reference")
        got = call(case, fn, q.clone(), k.clone(), v.clone(), sinks.clone())
        mistakes = {
            "plain causal attention: the sink logit is not in the denominator":
                attend(q, k, v, causal=True, backend="reference"),
            "the sink logit multiplied by 1/sqrt(d) like a score; it is added as it is":
                attend(q, k, v, causal=True, sinks=sinks / math.sqrt(d), backend="reference"),
            "no causal mask": attend(q, k, v, sinks=sinks, backend="reference"),
        }
        diagnose(case, got, expected, mistakes)
        report.cases.append(case)


# --- ch09.top_k_gates ---------------------------------------------------------------------------


def _sorted_pairs(ids: Tensor, gates: Tensor) -> tuple[Tensor, Tensor]:
    order = ids.argsort(dim=-1)
    return ids.gather(-1, order), gates.gather(-1, order)


@register("ch09.top_k_gates")
def check_top_k_gates(fn, gen, report) -> None:
    cases = [("N = 4 tokens, E = 4 experts, k = 1", 4, 4, 1), ("N = 6, E = 8, k = 2 (Mixtral)", 6, 8, 2),
             ("N = 5, E = 16, k = 4", 5, 16, 4)]
    for case, N, E, k in cases:
        logits = torch.randn(N, E, generator=gen, dtype=torch.float64) * 2
        router = MoE(E, 4, E, k).double()
        with torch.no_grad():
            router.router.weight.copy_(torch.eye(E, dtype=torch.float64))  # x W_r^T = the logits themselves
            ids_ref, gates_ref, _ = router.route(logits)
        got = call(case, fn, logits.clone(), k)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise ExerciseFailed(f"{case}: expected a pair (ids, gates), got {type(got).__name__}")
        ids, gates = got
        if not isinstance(ids, Tensor) or tuple(ids.shape) != (N, k):
            raise ExerciseFailed(f"{case}: ids must be a ({N}, {k}) tensor; got "
                                 f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
        if not isinstance(gates, Tensor) or tuple(gates.shape) != (N, k):
            raise ExerciseFailed(f"{case}: gates must be a ({N}, {k}) tensor; got "
                                 f"{tuple(gates.shape) if isinstance(gates, Tensor) else type(gates).__name__}")
        ids_ref, gates_ref = _sorted_pairs(ids_ref, gates_ref)
        ids, gates = _sorted_pairs(ids.long(), gates.double())
        if not torch.equal(ids, ids_ref):
            row = int((ids != ids_ref).any(-1).nonzero()[0])
            raise ExerciseFailed(f"{case}: token {row} chose experts {ids[row].tolist()}, expected "
                                 f"{ids_ref[row].tolist()} (the k largest router probabilities)")
        probs = logits.softmax(-1)
        diagnose(f"{case}, gates", gates, gates_ref, {
            "the top-k probabilities without renormalising them to sum 1": probs.gather(-1, ids_ref),
            "the raw logits, without a softmax": logits.gather(-1, ids_ref),
        })
        report.cases.append(case)


# --- ch09.switch_aux_loss -----------------------------------------------------------------------


@register("ch09.switch_aux_loss")
def check_switch_aux_loss(fn, gen, report) -> None:
    cases = [("N = 8, E = 4, k = 1, alpha = 0.01", 8, 4, 1, 0.01), ("N = 32, E = 8, k = 2, alpha = 0.01", 32, 8, 2, 0.01),
             ("N = 16, E = 8, k = 2, alpha = 1, every token on experts 0 and 1", 16, 8, 2, 1.0)]
    for case, N, E, k, alpha in cases:
        probs = torch.randn(N, E, generator=gen, dtype=torch.float64).softmax(-1)
        if "every token" in case:
            ids = torch.tensor([[0, 1]] * N)
        else:
            ids = probs.topk(k, dim=-1).indices
        counts = torch.zeros(E, dtype=torch.float64)
        for e in ids.flatten().tolist():  # count the assignments one by one
            counts[e] += 1
        f, P = counts / (N * k), probs.mean(0)
        expected = torch.tensor(alpha * E * float((f * P).sum()), dtype=torch.float64)
        got = call(case, fn, probs.clone(), ids.clone(), alpha)
        if isinstance(got, (int, float)):
            got = torch.tensor(float(got), dtype=torch.float64)
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.reshape(())
        diagnose(case, got, expected, {
            "f_e as token counts, not fractions": alpha * E * (counts * P).sum(),
            "f_e divided by N instead of N k (a fraction of tokens, not of assignments)":
                alpha * E * (counts / N * P).sum(),
            "no factor E (the loss should be alpha when the load is uniform)": alpha * (f * P).sum(),
        })
        report.cases.append(case)
