"""Checkers for chapter 12's exercises (paged KV caches, quantisation, serving).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch12.slot``: ``fn(table, j, p) -> int``, the flat pool slot of token j of a sequence whose block
  table is ``table`` (a list of page ids), pages of p slots: table[floor(j / p)] * p + j mod p,
  equation (12.2). Checked against ``companion.kernels.paged_reference.page_slots``.
- ``ch12.paged_bytes``: ``fn(T, p, n_layers, kv_heads, head_dim, bits) -> int``, the bytes a
  sequence of T tokens holds in a paged cache: ceil(T / p) whole pages, K and V in every layer,
  ``bits`` in (32, 16, 8, 4) bits an element plus, for 8 and 4, one float32 scale per token and head
  (``companion.inference.kvquant.bytes_per_group``), equation (12.6).
- ``ch12.fake_quant``: ``fn(x (..., d), bits) -> x_hat (..., d)``, symmetric quantisation of every
  group x[..., :] (one scale per group, q_max = 2^(b-1) - 1, round to nearest) and back, equation
  (12.5). Checked against ``companion.inference.kvquant`` (quantize, then dequantize).
"""

from __future__ import annotations

import math

import torch

from companion.exercises import call, diagnose, diagnose_integer, integer_answer, register
from companion.inference.kvquant import bytes_per_group, dequantize, qmax, quantize
from companion.kernels.paged_reference import page_slots


# --- ch12.slot ---------------------------------------------------------------------------------


@register("ch12.slot")
def check_slot(fn, gen, report) -> None:
    for _ in range(4):
        p = int(torch.randint(2, 9, (), generator=gen))
        n = int(torch.randint(2, 6, (), generator=gen))
        table = torch.randperm(3 * n, generator=gen)[:n].tolist()  # scattered physical pages
        slots = page_slots(torch.tensor(table), p).tolist()
        case = f"table={table}, p={p}"
        for j in range(n * p):
            got = integer_answer(f"{case}, j={j}", call(case, fn, list(table), j, p))
            diagnose_integer(f"{case}, j={j}", got, slots[j], {
                "j itself (the block table was not used)": j,
                "table[j // p] + j % p (the page id not multiplied by p)": table[j // p] + j % p,
                "table[j % p] * p + j // p (page and offset swapped)":
                    table[j % p] * p + j // p if j % p < n else -1,
            })
        report.cases.append(f"{case}: all {n * p} positions")


# --- ch12.paged_bytes ---------------------------------------------------------------------------


def _paged_bytes(T, p, L, g, d, bits):
    per_token = bytes_per_group(d, bits) if bits in (8, 4) else d * bits // 8  # one head, K or V
    return math.ceil(T / p) * p * L * 2 * g * per_token


@register("ch12.paged_bytes")
def check_paged_bytes(fn, gen, report) -> None:
    cases = [(37, 16, 2, 2, 16, 32), (64, 16, 4, 1, 64, 16), (5, 8, 3, 4, 32, 8), (100, 32, 2, 2, 64, 4)]
    for _ in range(2):
        r = [int(torch.randint(lo, hi, (), generator=gen)) for lo, hi in ((1, 300), (1, 33), (1, 9), (1, 9))]
        cases.append((*r, 2 * int(torch.randint(4, 65, (), generator=gen)), (32, 16, 8, 4)[len(cases) % 4]))
    for T, p, L, g, d, bits in cases:
        case = f"T={T}, p={p}, n_layers={L}, kv_heads={g}, head_dim={d}, bits={bits}"
        got = integer_answer(case, call(case, fn, T, p, L, g, d, bits))
        pages = math.ceil(T / p)
        diagnose_integer(case, got, _paged_bytes(T, p, L, g, d, bits), {
            "T tokens' worth (the unused slots of the last page are held too)":
                T * L * 2 * g * (bytes_per_group(d, bits) if bits in (8, 4) else d * bits // 8),
            "K only (V takes as much again)": _paged_bytes(T, p, L, g, d, bits) // 2,
            "no scales (int8 and int4 pages store one float32 scale per token and head)":
                pages * p * L * 2 * g * d * bits // 8,
            "floor(T / p) pages (the partly filled last page is missing)":
                (T // p) * p * L * 2 * g * (bytes_per_group(d, bits) if bits in (8, 4) else d * bits // 8),
        })
        report.cases.append(case)


# --- ch12.fake_quant ----------------------------------------------------------------------------


@register("ch12.fake_quant")
def check_fake_quant(fn, gen, report) -> None:
    for bits in (8, 4):
        x = torch.randn(3, 5, 16, generator=gen)
        x[0, 1] = 0.0  # an all-zero group must come back as zeros, not NaN
        x[2, 3] *= 50.0  # one large group: its scale must not leak into the others
        case = f"bits={bits}, x of shape {tuple(x.shape)} with an all-zero and a large group"
        expected = dequantize(*quantize(x, bits), bits)
        m = qmax(bits)
        amax = x.abs().amax(-1, keepdim=True)
        s = torch.where(amax > 0, amax / m, torch.ones_like(amax))
        tensor_s = x.abs().max() / m
        got = call(case, fn, x.clone(), bits)
        diagnose(case, got, expected, {
            f"q_max = 2^(b-1) = {m + 1} (use 2^(b-1) - 1: the range must be symmetric)":
                (torch.round(x / (amax / (m + 1)).clamp_min(1e-30)).clamp(-m - 1, m + 1)) * amax / (m + 1),
            "truncation instead of rounding to nearest": torch.trunc(x / s) * s,
            "one scale for the whole tensor instead of one per group": torch.round(x / tensor_s) * tensor_s,
        }, atol=1e-6, rtol=1e-5)
        report.cases.append(case)
