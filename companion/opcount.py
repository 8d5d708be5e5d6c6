"""Counting the operations PyTorch runs: the per-pass overhead half of counted work (chapter 12).

``OpCount``: inside ``with OpCount() as ops:`` every ATen operation that runs, forward or backward, on
any device, passes through ``__torch_dispatch__`` and is counted: ``ops.n`` in all, ``ops.by_name``
by operation. Each operation costs a roughly fixed overhead whatever its size (checking its
arguments, dispatching it, on a GPU launching its kernel), so when the tensors are small, as in this
book's CPU models, or a GPU's decode step, the count is the part of a forward pass's time that does not
grow with the batch. ``torch.utils.flop_counter.FlopCounterMode`` counts the part that does. Unlike a
timing, both counts are the same on every machine for the same code, inputs and PyTorch version.

The count sees ATen operations only: Python work between them (a scheduler's bookkeeping) is not
counted, and an operation that a compiled region fuses away is not seen at all. A composite operation
is counted as the operations it is made of, under ``no_grad`` and ``inference_mode`` alike. The count
is a property of the code and of the PyTorch version: the same on every machine, though a first call
that builds a cached table may count a few more than the next.
"""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCount"]


class OpCount(TorchDispatchMode):
    """``with OpCount() as ops:`` counts the ATen operations run inside the block (``ops.n``,
    ``ops.by_name``: operation name -> count, e.g. ``{"mm": 12, "add": 6}``)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()

    @property
    def n(self) -> int:
        return sum(self.by_name.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # A composite operation (linear, rms_norm, ...) reaches this mode whole under
        # torch.inference_mode but as its parts under no_grad: count its parts either way, as
        # FlopCounterMode does, so that the count does not depend on the grad mode.
        with self:
            parts = func.decompose(*args, **kwargs)
        if parts is not NotImplemented:
            return parts
        self.by_name[func.overloadpacket.__name__] += 1
        return func(*args, **kwargs)
