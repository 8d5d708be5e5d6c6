"""Chapter 11's exercise checkers accept the reference and reject typical wrong answers, saying why."""

import math

import pytest
import torch

from companion.exercises import ExerciseFailed, check, checkers

SEEDS = [0, 1, 2]


def test_chapter_11_checkers_are_registered():
    names = {"ch11.merge", "ch11.tiles_visited", "ch11.tiled_attention", "ch11.backward_from_lse"}
    assert names <= set(checkers())


# --- merge -------------------------------------------------------------------------------------


def _factors(a, b):
    m = torch.maximum(a[0], b[0])
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return m, torch.exp(a[0] - shift), torch.exp(b[0] - shift)


def good_merge(a, b):
    m, fa, fb = _factors(a, b)
    return m, fa * a[1] + fb * b[1], fa[:, None] * a[2] + fb[:, None] * b[2]


def merge_without_rescaling_u(a, b):
    m, fa, fb = _factors(a, b)
    return m, fa * a[1] + fb * b[1], a[2] + b[2]


def merge_nan_on_empty(a, b):  # exp(m_A - m) with m = -inf gives NaN for an all-masked row
    m = torch.maximum(a[0], b[0])
    fa, fb = torch.exp(a[0] - m), torch.exp(b[0] - m)
    return m, fa * a[1] + fb * b[1], fa[:, None] * a[2] + fb[:, None] * b[2]


def merge_returning_output(a, b):
    m, l, u = good_merge(a, b)
    return u / l[:, None]


@pytest.mark.parametrize("seed", SEEDS)
def test_merge_accepts_the_reference(seed):
    report = check("ch11.merge", good_merge, seed=seed, quiet=True)
    assert len(report.cases) == 4 and "both sides empty" in str(report)


@pytest.mark.parametrize("wrong, message", [
    (merge_without_rescaling_u, r"random split.*, u: .*u added without rescaling"),
    (merge_nan_on_empty, r"row 2 has every key masked.*NaN"),
    (merge_returning_output, r"must return a tuple \(m, l, u\)"),
])
def test_merge_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch11.merge", wrong, seed=0, quiet=True)


# --- tiles visited -----------------------------------------------------------------------------


def good_tiles(T, block, causal):
    n = math.ceil(T / block)
    return n * (n + 1) // 2 if causal else n * n  # T = S: whole lower triangle with the diagonal


def tiles_without_diagonal(T, block, causal):
    n = math.ceil(T / block)
    return n * (n - 1) // 2 if causal else n * n


def tiles_floor(T, block, causal):
    n = T // block
    return n * (n + 1) // 2 if causal else n * n


@pytest.mark.parametrize("seed", SEEDS)
def test_tiles_visited_accepts_the_reference(seed):
    assert len(check("ch11.tiles_visited", good_tiles, seed=seed, quiet=True).cases) == 8


@pytest.mark.parametrize("wrong, message", [
    (tiles_without_diagonal, r"causal = True: expected 10 tiles, got 6 -- you left out the diagonal"),
    (tiles_floor, r"T = 100, block = 32.*partial block"),
    (lambda T, b, c: good_tiles(T, b, False), r"causal = True.*tiles above the diagonal are skipped"),
    (lambda T, b, c: float(good_tiles(T, b, c)), r"expected an int"),
])
def test_tiles_visited_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch11.tiles_visited", wrong, seed=0, quiet=True)


# --- tiled attention ---------------------------------------------------------------------------


def good_tiled(q, k, v, block, causal):
    T, S = q.shape[0], k.shape[0]
    out = torch.empty(T, v.shape[1], dtype=q.dtype)
    for qs in range(0, T, block):
        rows = torch.arange(qs, min(T, qs + block)) + S - T
        m = torch.full((len(rows),), -math.inf, dtype=q.dtype)
        l = torch.zeros(len(rows), dtype=q.dtype)
        u = torch.zeros(len(rows), v.shape[1], dtype=q.dtype)
        for ks in range(0, S, block):
            s = q[qs:qs + block] @ k[ks:ks + block].T / math.sqrt(q.shape[1])
            if causal:
                s = s.masked_fill(torch.arange(ks, min(S, ks + block))[None, :] > rows[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            alpha = torch.exp(m - m_new)
            l, u, m = alpha * l + p.sum(-1), alpha[:, None] * u + p @ v[ks:ks + block], m_new
        out[qs:qs + block] = u / l[:, None]
    return out


def dense_inside(q, k, v, block, causal):
    from companion.attention import causal_mask, scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, causal_mask(q.shape[0], k.shape[0]) if causal else None)


def causal_from_the_first_key(q, k, v, block, causal):
    if q.shape[0] == k.shape[0]:
        return good_tiled(q, k, v, block, causal)
    T, S = q.shape[0], k.shape[0]
    pad = torch.zeros(S - T, q.shape[1], dtype=q.dtype)  # pretends the rows are the first T positions
    return good_tiled(torch.cat([q, pad]), k, v, block, causal)[:T]


@pytest.mark.parametrize("seed", SEEDS)
def test_tiled_attention_accepts_the_reference(seed):
    # a generous time limit: the reference takes well under a second, but the default 10 s
    # failed on a 2-core machine shared by six jobs (a memory-counting checker is slow under load)
    assert len(check("ch11.tiled_attention", good_tiled, seed=seed, quiet=True,
                     time_limit=120).cases) == 4


@pytest.mark.parametrize("wrong, message", [
    (dense_inside, r"T = S = 128, block 16, no mask: your function held \d+ bytes .* whole T x S matrix"),
    (lambda q, k, v, b, c: good_tiled(q, k, v, b, False), r"causal.*attention without the causal mask"),
    (causal_from_the_first_key, r"T = 37, S = 50.*aligned at the first key"),
])
def test_tiled_attention_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch11.tiled_attention", wrong, seed=0, quiet=True)


# --- backward from the logsumexp ---------------------------------------------------------------


def good_backward(q, k, v, o, lse, d_out):
    scale = 1 / math.sqrt(q.shape[1])
    p = torch.exp(q @ k.T * scale - lse[:, None])
    dp = d_out @ v.T
    ds = p * (dp - (d_out * o).sum(-1, keepdim=True))
    return scale * ds @ k, scale * ds.T @ q, p.T @ d_out


def backward_without_delta(q, k, v, o, lse, d_out):
    scale = 1 / math.sqrt(q.shape[1])
    p = torch.exp(q @ k.T * scale - lse[:, None])
    ds = p * (d_out @ v.T)
    return scale * ds @ k, scale * ds.T @ q, p.T @ d_out


def backward_without_scale(q, k, v, o, lse, d_out):
    dq, dk, dv = good_backward(q, k, v, o, lse, d_out)
    return dq * math.sqrt(q.shape[1]), dk, dv


@pytest.mark.parametrize("seed", SEEDS)
def test_backward_from_lse_accepts_the_reference(seed):
    assert len(check("ch11.backward_from_lse", good_backward, seed=seed, quiet=True).cases) == 3


@pytest.mark.parametrize("wrong, message", [
    (backward_without_delta, r"T = 6, d = 4, dq: .*without the - D term"),
    (backward_without_scale, r"dq: .*without the 1/sqrt\(d\) scale"),
    (lambda *a: good_backward(*a)[:2], r"return a tuple \(dq, dk, dv\)"),
])
def test_backward_from_lse_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch11.backward_from_lse", wrong, seed=0, quiet=True)
