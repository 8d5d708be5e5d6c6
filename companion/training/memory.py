"""The memory a training run needs, estimated before anything is allocated.

What this module provides
- ``estimate(model, batch_size, context, device) -> dict[str, int]``: bytes by part, for a model
  built on the meta device (shapes only): weights, gradients, optimizer state, activations,
  logits and, where they are materialised, attention scores.
- ``available_bytes(device) -> int | None``: what this machine can give the run now (CUDA: the free
  device memory; CPU: ``MemAvailable`` of /proc/meminfo), None when unknown.
- ``check(model, batch_size, context, device) -> str | None``: ValueError when the estimate exceeds
  what is available (naming the largest parts and the options that shrink them); a note to print
  when it takes more than ``WARN_FRACTION`` of it; None otherwise.

The estimate is rough on purpose (float32 everywhere, no allocator overhead): about 16 d_model-wide
tensors per block and token are kept for the backward pass (norm inputs, queries, keys, values,
attention output, the MLP's 4 d_model-wide hidden layer before and after its activation), the
logits three times (logits, log-probabilities, their gradient), and Adam-family optimizer state
(two tensors per weight). Attention scores (batch x heads x context^2, scores and probabilities,
per layer) are counted on the CPU, where the book's models materialise them; on CUDA, torch's SDPA
kernels do not. Its job is to catch the runs that cannot fit (``--context 100000``, ``--set
n_embd=1000000``) before they allocate gigabytes and die, not to predict the peak to the byte.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from companion.models import unwrap

__all__ = ["estimate", "available_bytes", "check", "human", "WARN_FRACTION"]

WARN_FRACTION = 0.7  # a note when the estimate takes more than this share of the available memory
_FLOAT = 4  # bytes: the estimate counts float32


def human(n: float) -> str:
    """Bytes as a short decimal size: 512 B, 3.2 MB, 12 TB."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"  # pragma: no cover


def _shape(model: nn.Module) -> tuple[int, int, int, int]:
    """(layers, d_model, heads, output vocabulary) of a Decoder, GPT or Seq2SeqTransformer config."""
    c = unwrap(model).config
    layers = getattr(c, "n_layers", None) or (getattr(c, "n_encoder_layers", 0) + getattr(c, "n_decoder_layers", 0))
    vocab = getattr(c, "vocab_size", None) or getattr(c, "tgt_vocab_size", 0)
    return int(layers), int(c.d_model), int(c.n_heads), int(vocab)


def estimate(model: nn.Module, batch_size: int, context: int, device: torch.device | str = "cpu") -> dict[str, int]:
    """Bytes a training step of ``model`` needs on ``device``, by part (see the module docstring)."""
    elements = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    layers, d, heads, vocab = _shape(model)
    tokens = batch_size * context
    parts = {
        "weights": _FLOAT * elements,
        "gradients": _FLOAT * elements,
        "optimizer state": 2 * _FLOAT * elements,
        "activations": _FLOAT * 16 * tokens * d * layers,
        "logits": _FLOAT * 3 * tokens * vocab,
    }
    if torch.device(device).type == "cpu":
        parts["attention scores"] = _FLOAT * 2 * batch_size * heads * context * context * layers
    return parts


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Memory this run can use on ``device`` now; None when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check(model: nn.Module, batch_size: int, context: int, device: torch.device | str = "cpu",
          available: int | None = None) -> str | None:
    """Refuse (ValueError) a run whose estimate exceeds the available memory; return a note when it
    is close (over ``WARN_FRACTION``), else None. ``available`` defaults to ``available_bytes(device)``."""
    parts = estimate(model, batch_size, context, device)
    total = sum(parts.values())
    available = available_bytes(device) if available is None else available
    if available is None:
        return None
    big = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    what = ", ".join(f"{name} {human(n)}" for name, n in big)
    where = f"{torch.device(device).type.upper()} memory" if torch.device(device).type == "cuda" else "memory"
    if total > available:
        raise ValueError(
            f"this run needs about {human(total)} of {where} ({what}; batch {batch_size} x context {context:,}), "
            f"more than the {human(available)} available here: lower --context or --batch-size, or --set a smaller "
            "model (--no-memory-check skips this estimate)")
    if total > WARN_FRACTION * available:
        return (f"note: this run needs about {human(total)} of the {human(available)} of {where} available "
                f"({what}); other programs may push it out")
    return None
