"""Shared by the checker tests: run a checker on a wrong answer and read its diagnosis."""

from __future__ import annotations

import pytest

from companion.exercises import ExerciseFailed, check


def fails(name, fn, *needles, seed=None):
    """Run the checker ``name`` on a wrong answer ``fn``: it must fail, and its message must contain
    every one of ``needles`` (the mistake named). Returns the message."""
    with pytest.raises(ExerciseFailed) as info:
        check(name, fn, quiet=True, seed=seed)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message
