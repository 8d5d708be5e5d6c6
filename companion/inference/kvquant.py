"""Quantised KV storage: symmetric int8 and packed int4 per (token, head) group (chapter 12).

Symmetric quantisation of one group x (a head's d_h numbers for one token):
    s = max_i |x_i| / q_max,   q_i = clamp(round(x_i / s), -q_max, q_max),   x_i ~= s q_i
with q_max = 2^(b-1) - 1 (127 for int8, 7 for int4). The rounding error per element is at most s / 2,
so the error of a group scales with its largest entry: that is why the group is small (one head of
one token) and the scale is stored beside it.

Storage: int8 keeps one signed byte per element; int4 stores q + 8 (in 1..15) as a nibble, two
elements per byte (element 2i in the low nibble, 2i+1 in the high one). Scales are float32, one per
group. Bytes per element: b/8 for the data plus 4 / d_h for the scale.

What this module provides
- ``quantize(x (..., d), bits) -> (data, scale (...))``, ``dequantize(data, scale, bits, dtype)``.
- ``bytes_per_group(d, bits)``: the storage formula the tests check against allocated tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BITS", "quantize", "dequantize", "bytes_per_group", "qmax"]

BITS = (8, 4)
SCALE_DTYPE = torch.float32


def qmax(bits: int) -> int:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}; got {bits}")
    return 2 ** (bits - 1) - 1


def quantize(x: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """x (..., d) float -> data (..., d) int8 [bits=8] or (..., d/2) uint8 [bits=4], scale (...) float32."""
    m = qmax(bits)
    if bits == 4 and x.shape[-1] % 2:
        raise ValueError(f"int4 packs two elements per byte: the last dimension must be even; got {x.shape[-1]}")
    amax = x.detach().abs().amax(dim=-1).to(SCALE_DTYPE)
    scale = torch.where(amax > 0, amax / m, torch.ones_like(amax))  # an all-zero group: any scale works
    q = torch.round(x.to(SCALE_DTYPE) / scale[..., None]).clamp_(-m, m)
    if bits == 8:
        return q.to(torch.int8), scale
    u = (q + 8).to(torch.uint8)  # 1..15: one nibble
    return u[..., 0::2] | (u[..., 1::2] << 4), scale


def dequantize(data: Tensor, scale: Tensor, bits: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Inverse of ``quantize``: (..., d or d/2) integers and (...) scales -> (..., d) in ``dtype``."""
    qmax(bits)
    if bits == 8:
        q = data.to(SCALE_DTYPE)
    else:
        lo = (data & 0x0F).to(SCALE_DTYPE) - 8
        hi = (data >> 4).to(SCALE_DTYPE) - 8
        q = torch.stack((lo, hi), dim=-1).flatten(-2)  # re-interleave: element 2i, then 2i+1
    return (q * scale[..., None]).to(dtype)


def bytes_per_group(d: int, bits: int) -> int:
    """Bytes one group of d elements occupies: d * bits / 8 of data + one float32 scale."""
    qmax(bits)
    return d * bits // 8 + torch.finfo(SCALE_DTYPE).bits // 8
