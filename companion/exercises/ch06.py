"""Checkers for chapter 6's exercises (pre-norm, RMSNorm, SwiGLU, the modern decoder).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch06.rms_norm``: ``fn(x (..., d), gain (d,), eps) -> (..., d)``, equation (6.3):
  x / sqrt(mean(x^2) + eps) * gain, the mean over the last dimension, no centring and no bias.
- ``ch06.swiglu``: ``fn(x (..., d), w_gate (d, f), w_up (d, f), w_down (f, d)) -> (..., d)``,
  equation (6.6): (SiLU(x W_gate) * (x W_up)) W_down with SiLU(z) = z sigmoid(z).
- ``ch06.decoder_parameters``: ``fn(vocab, d, n_layers, n_heads, n_kv_heads, d_ff, tied) -> int``,
  the parameters of a modern decoder (pre-RMSNorm, GQA without biases, SwiGLU without biases, a
  final RMSNorm, an output head tied to the embedding or not), checked against the parameters of
  ``companion.models.decoder.Decoder`` built with those shapes and counted.

Each checker draws fresh inputs from the generator it is given, runs the learner's function and an
independent reference (``torch.nn.functional``, a built ``Decoder``) and, on a mismatch, names the
case and, where it recognises a typical mistake, which one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.exercises import ExerciseFailed, call, diagnose, register
from companion.models.decoder import Decoder, DecoderConfig


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


def _int(gen: torch.Generator, low: int, high: int) -> int:
    """A random integer in [low, high]."""
    return int(torch.randint(low, high + 1, (), generator=gen))


# --- ch06.rms_norm -----------------------------------------------------------------------------


@register("ch06.rms_norm")
def _check_rms_norm(fn, gen: torch.Generator, report) -> None:
    # The offset (mean far from 0) is what separates RMSNorm from LayerNorm; the small scale of the
    # last case is where eps matters.
    cases = [((2, 3, 8), 1.0, 2.0, 1e-6), ((5, 16), 3.0, -1.0, 1e-5), ((1, 4, 32), 1e-3, 0.0, 1e-2)]
    for i, (shape, scale, offset, eps) in enumerate(cases, 1):
        d = shape[-1]
        x = _randn(gen, *shape, scale=scale) + offset * scale
        gain = 1.0 + 0.5 * _randn(gen, d)
        case = f"case {i} (x {tuple(shape)}, mean {offset * scale:g}, eps={eps:g})"
        got = call(case, fn, x.clone(), gain.clone(), eps)
        expected = F.rms_norm(x, (d,), gain, eps)
        ms = x.pow(2).mean(-1, keepdim=True)
        centred = x - x.mean(-1, keepdim=True)
        mistakes = {
            "LayerNorm: the mean was subtracted (RMSNorm does not centre)":
                centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * gain,
            "x / sqrt(sum of squares): divide by the mean of the squares, not their sum":
                x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * gain,
            "eps added outside the square root": x / (ms.sqrt() + eps) * gain,
            "the normalised row without the gain": x * torch.rsqrt(ms + eps),
            "the mean over the wrong dimension (not the last)":
                x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps) * gain,
        }
        diagnose(case, got, expected, mistakes, atol=1e-6, rtol=1e-5)
        report.cases.append(f"x {tuple(shape)}, eps={eps:g}")


# --- ch06.swiglu -------------------------------------------------------------------------------


@register("ch06.swiglu")
def _check_swiglu(fn, gen: torch.Generator, report) -> None:
    for i, (lead, d, f) in enumerate([((3,), 4, 6), ((2, 5), 8, 12), ((1, 3, 2), 16, 40)], 1):
        x = _randn(gen, *lead, d)
        w_gate, w_up, w_down = _randn(gen, d, f), _randn(gen, d, f), _randn(gen, f, d, scale=f ** -0.5)
        case = f"case {i} (x {(*lead, d)}, d_f={f})"
        got = call(case, fn, x.clone(), w_gate.clone(), w_up.clone(), w_down.clone())
        gate, up = x @ w_gate, x @ w_up
        expected = (F.silu(gate) * up) @ w_down
        mistakes = {
            "the SiLU on the up projection: W_gate and W_up swapped": (F.silu(up) * gate) @ w_down,
            "a sigmoid gate (GLU) instead of SiLU(z) = z sigmoid(z)": (torch.sigmoid(gate) * up) @ w_down,
            "GELU instead of SiLU (that is GeGLU)": (F.gelu(gate) * up) @ w_down,
            "no product: SiLU(x W_gate) W_down, the up projection unused": F.silu(gate) @ w_down,
            "SiLU applied after the product": F.silu(gate * up) @ w_down,
        }
        diagnose(case, got, expected, mistakes, atol=1e-6, rtol=1e-5)
        report.cases.append(f"x {(*lead, d)}, d_f={f}")


# --- ch06.decoder_parameters -------------------------------------------------------------------


def _counted(vocab: int, d: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int, tied: bool) -> int:
    """The parameters of a built Decoder with these shapes (the tied matrix counted once)."""
    config = DecoderConfig(vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                           d_ff=d_ff, tie_embeddings=tied, max_seq_len=8)
    with torch.device("meta"):  # shapes only: nothing is allocated or initialised
        model = Decoder(config)
    return sum(p.numel() for p in model.parameters())


@register("ch06.decoder_parameters")
def _check_decoder_parameters(fn, gen: torch.Generator, report) -> None:
    cases = [(100, 64, 2, 4, 2, 176, False), (256, 96, 3, 6, 1, 256, True), (1000, 128, 4, 8, 8, 344, False)]
    cases.append((_int(gen, 50, 5000), 32 * _int(gen, 1, 6), _int(gen, 1, 6), 4, 2, 64 * _int(gen, 1, 8),
                  bool(_int(gen, 0, 1))))
    for i, (V, d, L, h, g, f, tied) in enumerate(cases, 1):
        case = (f"case {i} (vocab={V}, d={d}, n_layers={L}, n_heads={h}, n_kv_heads={g}, d_ff={f}, "
                f"tied={tied})")
        got = call(case, fn, V, d, L, h, g, f, tied)
        expected = _counted(V, d, L, h, g, f, tied)
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        # math.isfinite first: int(NaN) and int(inf) raise, and the answer must fail, not crash
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got) or got != int(got):
            raise ExerciseFailed(f"{case}: expected a whole number of parameters, got {got!r}")
        got = int(got)
        if got == expected:
            report.cases.append(f"d={d}, L={L}, h={h}, g={g}, tied={tied}")
            continue
        dh = d // h
        mistakes = {
            "keys and values counted with n_heads heads (that is MHA; GQA has n_kv_heads of them)":
                expected + L * 2 * d * (h - g) * dh,
            "the tied embedding counted twice (input and output share one matrix)": expected + V * d,
            "the untied output head forgotten (V x d)": expected - V * d,
            "the RMSNorm gains forgotten (two per layer and a final one, d each)": expected - (2 * L + 1) * d,
            "the final RMSNorm forgotten": expected - d,
            "an FFN of two matrices (the 2017 MLP); SwiGLU has three": expected - L * d * f,
            "the output projection W_O forgotten": expected - L * d * d,
        }
        hint = next((why for why, wrong in mistakes.items() if wrong == got), None)
        raise ExerciseFailed(f"{case}: expected {expected:,} parameters, got {got:,} (off by {got - expected:+,})"
                             + (f" -- {hint}" if hint else ""))
