"""The precision policy: which arithmetic a device can do well, chosen once from its compute capability.

What this module provides
- ``cuda_capability(device)``: the (major, minor) compute capability of a CUDA device, or None.
- ``choose_precision(device_type, capability, requested)``: the training arithmetic as a ``Precision``.
- ``triton_refusal(dtype, capability)``: why a Triton kernel cannot run a dtype on a GPU, or None.
- ``tf32_matmuls(enabled)``: TF32 for float32 matmuls inside a ``with`` block only (the Trainer's steps).

The rule, by NVIDIA compute capability (what ``torch.cuda.get_device_capability`` returns):

1. 8.0 and newer (A100, A10, L4, RTX 30xx/40xx, H100): bf16 autocast. bf16 keeps float32's 8 exponent
   bits, so gradients neither underflow nor overflow and no loss scaling is needed.
2. 7.x (V100 = 7.0, T4 = 7.5, Colab's free GPU): no bf16 tensor cores, so fp16 autocast with a gradient
   scaler. fp16 has 5 exponent bits: the smallest normal value is 6.1e-5, and small gradients flush to
   zero unless the loss is multiplied up before ``backward`` and the gradients divided back before the
   step (``torch.amp.GradScaler``, which also skips steps whose gradients overflowed).
3. Older GPUs, the CPU and Apple's mps: float32 (``"auto"``). bf16 autocast may still be asked for on
   the CPU, where it is exact enough to demonstrate but rarely faster.

The same capability decides the attention kernels: torch's SDPA picks its own fused kernel per device
(its flash backend needs 8.0, and on a T4 it falls back to the memory-efficient one by itself), while
the book's Triton kernels take what Triton compiles well: fp16 from 7.0, bf16 only from 8.0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["Precision", "PRECISIONS", "DTYPES", "cuda_capability", "choose_precision", "triton_refusal",
           "tf32_matmuls"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # each name's dtype
BF16_CAPABILITY = (8, 0)
FP16_CAPABILITY = (7, 0)


@dataclass(frozen=True)
class Precision:
    """A training run's arithmetic: ``autocast_dtype`` None means plain float32."""

    name: str
    autocast_dtype: torch.dtype | None
    needs_scaler: bool = False

    def __str__(self) -> str:
        return self.name + (" + gradient scaler" if self.needs_scaler else "")


FP32 = Precision("fp32", None)
BF16 = Precision("bf16", torch.bfloat16)
FP16 = Precision("fp16", torch.float16, needs_scaler=True)


def cuda_capability(device: torch.device | str | None = None) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device; None for any other device or without CUDA."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))


def _named(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def choose_precision(device_type: str, capability: tuple[int, int] | None = None,
                     requested: str = "auto") -> Precision:
    """The arithmetic for training on ``device_type`` ("cuda", "cpu", "mps") of the given capability.

    ``requested`` is one of ``PRECISIONS``; "auto" applies the module's rule. An explicit request the
    device cannot honour is a ValueError that names the device, not a silent change of arithmetic.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {requested!r}")
    if device_type == "cuda" and capability is None:
        raise ValueError("capability is needed for a cuda device: pass cuda_capability(device)")
    if requested == "fp32":
        return FP32
    if device_type != "cuda":
        if requested == "fp16":
            raise ValueError(f"precision='fp16' needs a CUDA GPU (fp16 autocast with a gradient scaler); "
                             f"this device is {device_type}: use 'fp32' or 'bf16'")
        return BF16 if requested == "bf16" else FP32
    if requested == "bf16" and capability < BF16_CAPABILITY:
        raise ValueError(f"precision='bf16' needs compute capability 8.0 or newer; this GPU has "
                         f"{_named(capability)} (a T4 is 7.5): use 'fp16' (with a gradient scaler) or 'auto'")
    if requested == "fp16" and capability < FP16_CAPABILITY:
        raise ValueError(f"precision='fp16' needs compute capability 7.0 or newer; this GPU has "
                         f"{_named(capability)}: use 'fp32'")
    if requested == "bf16":
        return BF16
    if requested == "fp16":
        return FP16
    if capability >= BF16_CAPABILITY:
        return BF16
    return FP16 if capability >= FP16_CAPABILITY else FP32


def triton_refusal(dtype: torch.dtype, capability: tuple[int, int]) -> str | None:
    """Why the book's Triton kernels cannot run ``dtype`` on a GPU of ``capability``; None if they can."""
    if dtype == torch.bfloat16 and capability < BF16_CAPABILITY:
        return (f"the Triton kernels need compute capability 8.0+ for bfloat16; this GPU has {_named(capability)}"
                f" (a T4 is 7.5): pass float16 tensors, or use backend='sdpa'")
    if capability < FP16_CAPABILITY:
        return (f"the Triton kernels need compute capability 7.0+; this GPU has {_named(capability)}: "
                f"use backend='sdpa'")
    return None


@contextlib.contextmanager
def tf32_matmuls(enabled: bool = True) -> Iterator[None]:
    """Let CUDA run float32 matmuls and convolutions in TF32 inside the block, and restore the previous
    setting on leaving it.

    TF32 keeps float32's range but rounds the inputs of a product to 10 mantissa bits (relative error
    about 2^-11 per product instead of 2^-24), which is harmless for training and several times faster
    on tensor cores. Scoped, not global: a Trainer that switched it on for good would silently loosen
    every float32 comparison a reader makes afterwards (a cache against a fresh forward, two losses).
    """
    if not enabled:
        yield
        return
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
