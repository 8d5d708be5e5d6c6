"""What the two Triton kernel modules share: the optional import, the interpreter switch, base-2 exp.

What this module provides
- ``triton`` and ``tl``: the ``triton`` package and ``triton.language``, or None for both when triton is
  not installed (it is optional: ``pip install 'companion[triton]'``), so the package still imports.
- ``INTERPRET``: True when ``TRITON_INTERPRET=1`` was set before import. Triton reads the variable when
  a kernel is decorated, so the kernel modules copy this value at their import and never re-read it.
- ``LOG2E``: log2(e). The kernels compute exp(x) as exp2(x * log2 e), the exponential the hardware has.
- ``loop_bounds(helper)``: wraps a ``@triton.jit`` helper that returns loop bounds so that the bounds
  are Python ints under the interpreter (the compiled kernel gets the helper unchanged).
- ``runnable(interpret)``: triton is installed and a kernel can run (CUDA present, or the interpreter).
- ``require_runtime(q, interpret, what=, cpu_choice=, module=)``: the checks every kernel entry point
  makes first: a ValueError for tensors off CUDA (outside the interpreter) or a dtype the GPU's compute
  capability cannot run (``companion.precision.triton_refusal``: bf16 needs 8.0), then an ImportError
  naming the package to install.

``companion.kernels.triton_flash`` and ``companion.kernels.triton_paged`` each re-export ``triton``,
``tl``, ``INTERPRET`` and ``triton_available()``; their ``INTERPRET`` is their own module attribute
(the tests set it on one module to pretend the interpreter is on), so they pass it in here.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import Tensor

from companion.precision import cuda_capability, triton_refusal

try:  # optional dependency: the rest of the package must import without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

__all__ = ["triton", "tl", "INTERPRET", "LOG2E", "loop_bounds", "runnable", "require_runtime"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2 e)


def loop_bounds(helper):
    """``helper`` (a ``@triton.jit`` function returning a tuple of loop bounds) for the kernels' ``range``.

    Compiled, the helper is returned unchanged and inlined. Under the interpreter every scalar is a
    one-element array, and Triton 3.6's interpreter turns a bound into an index with ``int(array)``, which
    NumPy 2.4 and newer refuse for an array of one dimension ("only 0-dimensional arrays can be converted
    to Python scalars"), so ``for start in range(lo, hi, BLOCK)`` failed there (Triton 3.9 squeezes the
    array itself). Interpreted, the helper's body runs as Python and its bounds come back as Python ints,
    which every Triton version's ``range`` takes. ``.fn`` stays the helper's source, for printing.
    """
    if not INTERPRET:
        return helper

    def bounds(*args):
        return tuple(int(np.asarray(_data(x)).reshape(-1)[0]) for x in helper.fn(*args))

    bounds.fn = helper.fn
    return bounds


def _data(x):
    """The number inside an interpreted scalar (its handle's array), or ``x`` itself when it is a plain value."""
    handle = getattr(x, "handle", None)
    return x if handle is None else handle.data


def runnable(interpret: bool) -> bool:
    """True when triton is importable and its kernels can run: on CUDA, or under the interpreter."""
    return triton is not None and (torch.cuda.is_available() or interpret)


def require_runtime(q: Tensor, interpret: bool, *, what: str, cpu_choice: str, module: str) -> None:
    """Fail before any launch: ``q`` off CUDA without the interpreter (ValueError naming ``what``, e.g.
    "backend='triton'", and the CPU alternative), or triton not installed (ImportError)."""
    if not (q.is_cuda or interpret):
        raise ValueError(
            f"{what} needs CUDA tensors; q is on {q.device}. Use {cpu_choice} on a CPU, or set TRITON_INTERPRET=1 "
            f"before importing {module} to run the kernels slowly under Triton's interpreter."
        )
    if q.is_cuda and not interpret:
        refusal = triton_refusal(q.dtype, cuda_capability(q.device))  # bf16 needs 8.0: a T4 is 7.5
        if refusal is not None:
            raise ValueError(f"{what}: {refusal}")
    if triton is None:
        raise ImportError(f"{what} needs the triton package: pip install 'companion[triton]' (or pip install triton)")
