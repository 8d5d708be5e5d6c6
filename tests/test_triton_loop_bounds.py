"""companion.kernels._triton.loop_bounds: the kernels' loop bounds are Python ints under the interpreter.

Triton 3.6's interpreter (what torch 2.11 pins) holds every scalar as a one-element array and turns a
``range`` bound into an index with ``int(array)``, which NumPy 2.4 and newer refuse; the H200 run of
chapter 11 failed there. These tests need no Triton: they hand ``loop_bounds`` what the interpreter
hands a helper. ``make triton-versions`` runs the real kernels under Triton 3.6.0 and the installed one.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from companion.kernels import _triton


def _interpreted_scalar(value: int):
    """What Triton's interpreter passes around for a scalar: a tensor whose handle holds a 1-element array."""
    return SimpleNamespace(handle=SimpleNamespace(data=np.array([value], dtype=np.int32)))


def test_interpreted_bounds_come_back_as_python_ints(monkeypatch):
    monkeypatch.setattr(_triton, "INTERPRET", True)
    helper = SimpleNamespace(fn=lambda start, stop, block: (start, stop, block))
    bounds = _triton.loop_bounds(helper)
    lo, hi, block = bounds(_interpreted_scalar(3), _interpreted_scalar(11), 4)
    assert (lo, hi, block) == (3, 11, 4) and {type(x) for x in (lo, hi, block)} == {int}
    assert list(range(lo, hi, block)) == [3, 7]
    assert bounds.fn is helper.fn  # chapter 11 prints the helper's source through .fn


def test_compiled_helpers_are_left_alone(monkeypatch):
    monkeypatch.setattr(_triton, "INTERPRET", False)
    helper = SimpleNamespace(fn=lambda: (0, 1))
    assert _triton.loop_bounds(helper) is helper


@pytest.mark.skipif(tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 4),
                    reason="NumPy before 2.4 still converts a 1-element array with int()")
def test_the_numpy_refusal_the_wrapper_avoids_is_real():
    # the planted failure: what Triton 3.6's interpreter does with a bound, on this NumPy
    with pytest.raises(TypeError, match="0-dimensional"):
        range(int(np.array([3], dtype=np.int32)), 5)
