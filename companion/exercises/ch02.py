"""Checkers for chapter 2's exercises (positions).

What this module registers
- ``ch02.sinusoidal_table``: ``fn(positions (T,), d) -> (T, d)``, the table of equation (2.1).
- ``ch02.shift_matrix``: ``fn(k, d) -> (d, d)``, the rotation M_k of equation (2.3):
  P_{p+k} = M_k P_p.
- ``ch02.position_similarity``: ``fn(offsets (K,), d) -> (K,)``, P_p . P_{p+k} = sum_i cos(k w_i).
- ``ch02.attention_flops``: ``fn(n, d) -> int``, FLOPs of one self-attention layer (projections
  included), checked against PyTorch's FLOP counter on a real layer.
- ``ch02.dilated_stack``: ``fn() -> layer``, a stack of causal kernel-2 convolutions with
  dilations 1, 2, 4, ...: its receptive field is measured with autograd, layer by layer.
- ``ch02.rope_interleaved``: ``fn(x (..., T, d), positions (T,)) -> (..., T, d)``, RoPE with channel
  pairs (2i, 2i+1), checked against ``companion.positions.RotaryEmbedding`` (which pairs i with
  i + d/2) on permuted channels.

Each checker first compares with the reference; when that fails it tries the usual mistakes
(sin and cos swapped, sines and cosines in two halves, the exponent i/d instead of 2i/d, positions
ignored, a rotation the wrong way, a missing projection ...) and names the one that matches.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from companion.exercises import ExerciseFailed, call, compare, register
from companion.positions import RotaryEmbedding, sinusoidal_table

BASE = 10000.0


def _even(gen: torch.Generator, low: int, high: int) -> int:
    """A random even integer in [low, high]."""
    return 2 * int(torch.randint(low // 2, high // 2 + 1, (), generator=gen))


def _matches(got, expected: Tensor, atol: float = 1e-4) -> bool:
    return (isinstance(got, Tensor) and tuple(got.shape) == tuple(expected.shape)
            and torch.allclose(got.detach().double(), expected.double(), atol=atol, rtol=1e-4))


def _diagnose(case: str, got, expected: Tensor, mistakes: list[tuple[str, Tensor]],
              atol: float = 1e-4) -> None:
    """Pass if ``got`` matches ``expected``; else name the first known mistake it matches, else
    fall back to the generic diagnosis of ``compare`` (shape, NaN, largest difference)."""
    if _matches(got, expected, atol):
        return
    if isinstance(got, Tensor) and tuple(got.shape) == tuple(expected.shape):
        for message, wrong in mistakes:
            if _matches(got, wrong, atol):
                raise ExerciseFailed(f"{case}: {message}")
    compare(case, got, expected, atol=atol, rtol=1e-4)


def _frequencies(d: int, base: float = BASE) -> Tensor:
    """w_i = base^(-2i/d), i = 0 .. d/2 - 1, in float64."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _interleave(even: Tensor, odd: Tensor) -> Tensor:
    """(..., d/2), (..., d/2) -> (..., d): ``even`` in channels 0, 2, ..., ``odd`` in 1, 3, ..."""
    return torch.stack((even, odd), dim=-1).flatten(-2)


# ----------------------------------------------------------------------------- sinusoidal table


@register("ch02.sinusoidal_table")
def _check_sinusoidal_table(fn, gen: torch.Generator, report) -> None:
    sizes = [(1, 2), (7, 4)] + [(int(torch.randint(3, 40, (), generator=gen)), _even(gen, 6, 64))
                                for _ in range(3)]
    for i, (T, d) in enumerate(sizes):
        # Unsorted positions after the first case: a table that ignores them shows up.
        positions = (torch.arange(T) if i == 0 else torch.randint(0, 1000, (T,), generator=gen))
        case = f"case {i + 1} (T={T}, d={d}, positions={positions[:4].tolist()}...)"
        expected = sinusoidal_table(positions, d).double()
        angles = positions.double()[:, None] * _frequencies(d)  # (T, d/2)
        by_channel = positions.double()[:, None] * BASE ** (-torch.arange(d).double() / d)
        mistakes = [
            ("sin and cos are swapped: PE[p, 2i] must be sin(p w_i) and PE[p, 2i+1] cos(p w_i)",
             _interleave(angles.cos(), angles.sin())),
            (("the sines and cosines sit in two halves [sin | cos]; they must interleave, sin in "
              "the even channels 2i and cos in the odd channels 2i+1"),
             torch.cat((angles.sin(), angles.cos()), dim=-1)),
            (("the frequencies use the exponent i/d; with i the pair index it is 2i/d "
              "(w_i = 10000^(-2i/d))"),
             _interleave(*(f(positions.double()[:, None] * BASE ** (-torch.arange(d // 2)
                                                                    .double() / d))
                           for f in (torch.sin, torch.cos)))),
            (("each channel j got its own frequency 10000^(-j/d); the two channels of a pair "
              "(2i, 2i+1) must share w_i = 10000^(-2i/d)"),
             _interleave(by_channel[:, 0::2].sin(), by_channel[:, 1::2].cos())),
            ("your table ignores the positions argument (its rows are positions 0..T-1)",
             sinusoidal_table(torch.arange(T), d).double()),
            (("rows are off by one: row r must use the angle positions[r] * w_i, and the first "
              "position is 0"), sinusoidal_table(positions + 1, d).double()),
        ]
        got = call(case, fn, positions, d)
        if (isinstance(got, Tensor) and got.shape == expected.shape and d > 2
                and _matches(got[:, :2], expected[:, :2]) and not _matches(got, expected)):
            mistakes.append((("pair 0 (w_0 = 1) is right but the slower pairs are not: check the "
                              "base (10000) and the exponent -2i/d"), got.double()))
        _diagnose(case, got, expected, mistakes, atol=2e-4)
        report.cases.append(f"T={T}, d={d}")


# ----------------------------------------------------------------------------- shift matrix


def _shift_matrix(k: int, d: int) -> Tensor:
    """M_k, block-diagonal rotations [[cos, sin], [-sin, cos]] by k w_i, in float64."""
    c, s = torch.cos(k * _frequencies(d)), torch.sin(k * _frequencies(d))
    M = torch.zeros(d, d, dtype=torch.float64)
    idx = torch.arange(0, d, 2)
    M[idx, idx], M[idx, idx + 1], M[idx + 1, idx], M[idx + 1, idx + 1] = c, s, -s, c
    return M


@register("ch02.shift_matrix")
def _check_shift_matrix(fn, gen: torch.Generator, report) -> None:
    sizes = [(0, 4), (1, 2)] + [(int(torch.randint(-50, 50, (), generator=gen)), _even(gen, 4, 32))
                                for _ in range(3)]
    for i, (k, d) in enumerate(sizes):
        case = f"case {i + 1} (k={k}, d={d})"
        got = call(case, fn, k, d)
        expected = _shift_matrix(k, d)
        mistakes = [
            (("your matrix shifts by -k (it is M_k transposed, the inverse rotation): with "
              "P_{p+k} = M_k P_p the sin k w_i entry sits above the diagonal, -sin below"),
             _shift_matrix(-k, d)),
            ("the blocks hold the angle k instead of k w_i: pair i turns by k * 10000^(-2i/d)",
             _rotation_blocks(torch.full((d // 2,), float(k), dtype=torch.float64))),
        ]
        if isinstance(got, Tensor) and got.shape == expected.shape and not _matches(got, expected):
            # Say where the defining property fails: P_{p+k} = M_k P_p (as columns), p = 60..119.
            p = torch.arange(60, 120)
            shifted = sinusoidal_table(p, d).double() @ got.detach().double().T
            error = (shifted - sinusoidal_table(p + k, d).double()).abs().amax(-1)  # (60,)
            if bool((error > 1e-4).any()):
                first = int(p[int((error > 1e-4).nonzero()[0])])
                mistakes.append(((f"M_k P_p differs from P_(p+k) (first at p = {first}, by "
                                  f"{float(error.max()):.3g}); build M_k from the rotations of "
                                  "equation (2.3)"), got.detach().double()))
        _diagnose(case, got, expected, mistakes, atol=1e-5)
        report.cases.append(f"k={k}, d={d}")


def _rotation_blocks(angles: Tensor) -> Tensor:
    d = 2 * angles.shape[0]
    M = torch.zeros(d, d, dtype=torch.float64)
    idx = torch.arange(0, d, 2)
    c, s = angles.cos(), angles.sin()
    M[idx, idx], M[idx, idx + 1], M[idx + 1, idx], M[idx + 1, idx + 1] = c, s, -s, c
    return M


# ----------------------------------------------------------------------------- dot product


@register("ch02.position_similarity")
def _check_position_similarity(fn, gen: torch.Generator, report) -> None:
    for i in range(4):
        d = 2 if i == 0 else _even(gen, 4, 96)
        offsets = torch.cat((torch.tensor([0]), torch.randint(-300, 300, (7,), generator=gen)))
        case = f"case {i + 1} (d={d}, offsets={offsets.tolist()})"
        got = call(case, fn, offsets, d)
        per_pair = torch.cos(offsets.double()[:, None] * _frequencies(d))  # (K, d/2)
        expected = per_pair.sum(-1)
        # Measured on the table too: the formula is only the reference if it is the dot product.
        p = 37
        table = sinusoidal_table(torch.tensor([p]), d).double()
        shifted = sinusoidal_table(p + offsets.abs(), d).double()
        assert torch.allclose((table * shifted).sum(-1), expected, atol=1e-4)
        mistakes = [
            (("at offset 0 you return d, but P_p . P_p = d/2 (each pair adds sin^2 + cos^2 = 1): "
              "sum over the d/2 pairs, not the d channels"), 2 * expected),
            (("you return the cosine similarity (divided by |P_p|^2 = d/2); the exercise asks "
              "for the raw dot product"), expected / (d / 2)),
            ("the frequencies use the exponent i/d; it is 2i/d (w_i = 10000^(-2i/d))",
             torch.cos(offsets.double()[:, None]
                       * BASE ** (-torch.arange(d // 2).double() / d)).sum(-1)),
            (("sin and cos are mixed up: the dot product of two pairs is cos(k w_i), not "
              "sin(k w_i)"), torch.sin(offsets.double()[:, None] * _frequencies(d)).sum(-1)),
        ]
        _diagnose(case, got, expected, mistakes, atol=1e-4)
        report.cases.append(f"d={d}, {len(offsets)} offsets")


# ----------------------------------------------------------------------------- FLOPs


def _measured_flops(n: int, d: int) -> int:
    """FLOPs of one self-attention layer (four d x d projections, scores, weighted sum), counted by
    PyTorch on a real computation: the reference does not use the formula."""
    X = torch.zeros(n, d)
    Wq, Wk, Wv, Wo = (torch.zeros(d, d) for _ in range(4))
    with FlopCounterMode(display=False) as counter:
        scores = (X @ Wq) @ (X @ Wk).T / math.sqrt(d)
        (torch.softmax(scores, dim=-1) @ (X @ Wv)) @ Wo
    return counter.get_total_flops()


@register("ch02.attention_flops")
def _check_attention_flops(fn, gen: torch.Generator, report) -> None:
    # The first case tells the miscounts apart (they coincide when n = d or n = 2d); random
    # sizes follow, so that a count tuned to one size fails.
    sizes = [(16, 64), (1, 1)] + [(int(torch.randint(2, 200, (), generator=gen)),
                                   int(torch.randint(2, 100, (), generator=gen))) for _ in range(4)]
    for i, (n, d) in enumerate(sizes):
        case = f"case {i + 1} (n={n}, d={d})"
        got = call(case, fn, n, d)
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise ExerciseFailed(f"{case}: expected a number of FLOPs, got {type(got).__name__}")
        expected = _measured_flops(n, d)
        if got == expected:
            report.cases.append(f"n={n}, d={d}")
            continue
        mistakes = {
            4 * n * n * d: ("you counted only the scores and the weighted sum (4n^2 d); the four "
                            "projections W_Q, W_K, W_V, W_O add 2nd^2 FLOPs each"),
            8 * n * d * d: ("you counted only the four projections (8nd^2); QK^T and AV add "
                            "2n^2 d FLOPs each"),
            6 * n * d * d + 4 * n * n * d: ("three projections counted; the output projection "
                                            "W_O adds another 2nd^2"),
            8 * n * d * d + 2 * n * n * d: ("one of the two n x n products is missing: QK^T and "
                                            "the weighted sum AV cost 2n^2 d each"),
            expected // 2: ("you counted multiply-adds; count each as 2 FLOPs (one multiply, "
                            "one add), as PyTorch's counter does"),
        }
        if got in mistakes:
            raise ExerciseFailed(f"{case}: {mistakes[got]}")
        raise ExerciseFailed(f"{case}: expected {expected:,} FLOPs (PyTorch's counter on a real "
                             f"layer), got {got:,}")


# ----------------------------------------------------------------------------- interleaved RoPE


def _rope_interleaved(x: Tensor, positions: Tensor) -> Tensor:
    """Reference: the companion's RotaryEmbedding pairs channel i with i + d/2, so move the
    even channels to the first half and the odd ones to the second, rotate, and move back."""
    d = x.shape[-1]
    perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    rotated = RotaryEmbedding(d, base=BASE)(x[..., perm], positions)
    return rotated[..., torch.argsort(perm)]


def _rope_by_formula(x: Tensor, positions: Tensor, sign: float = 1.0) -> Tensor:
    """(x_2i, x_2i+1) rotated by sign * p theta_i, in float64 (for the diagnoses)."""
    angles = sign * positions.double()[:, None] * _frequencies(x.shape[-1])  # (T, d/2)
    x = x.double()
    even, odd = x[..., 0::2], x[..., 1::2]
    return _interleave(even * angles.cos() - odd * angles.sin(),
                       even * angles.sin() + odd * angles.cos())


@register("ch02.rope_interleaved")
def _check_rope_interleaved(fn, gen: torch.Generator, report) -> None:
    for i in range(4):
        T, d = int(torch.randint(2, 12, (), generator=gen)), _even(gen, 4, 32)
        lead = () if i == 0 else (int(torch.randint(1, 4, (), generator=gen)),)
        x = torch.randn(*lead, T, d, generator=gen)
        positions = torch.randint(0, 500, (T,), generator=gen)
        case = f"case {i + 1} (x {tuple(x.shape)}, positions={positions[:4].tolist()}...)"
        got = call(case, fn, x.clone(), positions)
        expected = _rope_interleaved(x, positions)
        half = RotaryEmbedding(d, base=BASE)(x, positions)
        mistakes = [
            (("your rotation turns the wrong way (by -p theta_i): x'_2i = x_2i cos - x_2i+1 sin, "
              "x'_2i+1 = x_2i sin + x_2i+1 cos"), _rope_by_formula(x, positions, -1.0)),
            (("you paired channel i with i + d/2 (the companion's layout); this exercise pairs "
              "2i with 2i+1"), half),
            ("your function ignores the positions argument (it rotates row t by t theta_i)",
             _rope_by_formula(x, torch.arange(T))),
            ("nothing was rotated: the output equals the input", x),
        ]
        _diagnose(case, got, expected, mistakes, atol=5e-4)
        report.cases.append(f"x {tuple(x.shape)}")


# ----------------------------------------------------------------------------- dilated convolutions


def _reach(out_row: Tensor, X: Tensor) -> Tensor:
    """Indices of the input rows that ``out_row`` depends on (non-zero gradient)."""
    (grad,) = torch.autograd.grad(out_row.sum(), X, retain_graph=True, allow_unused=True)
    if grad is None:
        return torch.zeros(0, dtype=torch.long)
    return (grad.abs().sum(-1) > 0).nonzero().flatten()


@register("ch02.dilated_stack")
def _check_dilated_stack(fn, gen: torch.Generator, report) -> None:
    """``fn()`` returns a fresh stack: a callable whose k-th call applies layer k (dilation 2^(k-1),
    kernel width 2, causal) to H of shape (n, 4). After L layers output i must read exactly the
    inputs i - (2^L - 1) .. i (clipped at 0), so the ends of n tokens meet after ceil(log2 n)."""
    lengths = [8, 9] + [int(torch.randint(10, 100, (), generator=gen)) for _ in range(3)]
    for i, n in enumerate(lengths):
        case = f"case {i + 1} (n={n})"
        layer = call(case, fn)
        if not callable(layer):
            raise ExerciseFailed(f"{case}: fn() must return the stack's layer function (a "
                                 f"callable), got {type(layer).__name__}")
        X = torch.randn(n, 4, generator=gen, requires_grad=True)
        H, middle = X, n // 2
        for depth in range(1, math.ceil(math.log2(n)) + 1):
            H = call(f"{case}, layer {depth}", layer, H)
            if not isinstance(H, Tensor) or tuple(H.shape) != (n, 4):
                shape = tuple(H.shape) if isinstance(H, Tensor) else type(H).__name__
                raise ExerciseFailed(f"{case}: layer {depth} returned {shape}, expected (n, 4) = "
                                     f"{(n, 4)}: pad on the left by the layer's dilation, "
                                     "nothing else")
            future = _reach(H[middle], X)
            future = future[future > middle]
            if future.numel():
                raise ExerciseFailed(f"{case}: after {depth} layer(s) output {middle} reads input "
                                     f"{int(future[0])}, a later position: the stack is not causal "
                                     "(pad on the left only)")
            reach = _reach(H[-1], X)
            lowest = max(0, n - 1 - (2**depth - 1))
            expected = torch.arange(lowest, n)
            if not torch.equal(reach, expected):
                first = int(reach.min()) if reach.numel() else n - 1
                raise ExerciseFailed(
                    f"{case}: after {depth} layer(s) output {n - 1} reads inputs {first}..{n - 1} "
                    f"({reach.numel()} of them); with dilations 1, 2, 4, ... it must read exactly "
                    f"{lowest}..{n - 1}: layer k has dilation 2^(k-1) and reads x_i and "
                    "x_(i - dilation)")
        report.cases.append(f"n={n}: ends meet after {math.ceil(math.log2(n))} layers")
