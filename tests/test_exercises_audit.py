"""Every exercise checker refuses the wrong answers a learner writes first (issue 40): the input given
back unchanged, transposed, zeros, None, NaN, a constant. A checker that accepts one teaches it; one
that crashes on it (instead of failing the answer) hides the diagnosis."""

from __future__ import annotations

import pytest
import torch

from companion.exercises import ExerciseFailed, check, checkers

pytestmark = pytest.mark.usefixtures("one_thread")


def _first(*args, **kwargs):
    return args[0]


def _transposed(*args, **kwargs):
    x = args[0]
    return x.transpose(-2, -1) if isinstance(x, torch.Tensor) and x.dim() >= 2 else x


def _zeros(*args, **kwargs):
    return torch.zeros_like(args[0]) if isinstance(args[0], torch.Tensor) else 0


def _nan(*args, **kwargs):
    x = args[0]
    return torch.full_like(x.double(), float("nan")) if isinstance(x, torch.Tensor) else float("nan")


WRONG = {"identity": _first, "transposed": _transposed, "zeros": _zeros, "none": lambda *a, **k: None,
         "nan": _nan, "zero": lambda *a, **k: 0, "one": lambda *a, **k: 1}


@pytest.mark.parametrize("name", checkers())
def test_every_checker_refuses_the_typical_wrong_answers_without_crashing(name):
    accepted = []
    for label, wrong in WRONG.items():
        for seed in (0, 1):
            try:
                check(name, wrong, seed=seed, quiet=True)
            except ExerciseFailed:
                continue  # refused, with a diagnosis: what a learner should see
            accepted.append(f"{label} (seed {seed})")
    assert not accepted, f"{name} accepted: {accepted}"


def test_a_count_checker_refuses_an_answer_off_by_one():
    from companion.exercises.ch11 import tiles_visited_reference

    with pytest.raises(ExerciseFailed, match="expected"):
        check("ch11.tiles_visited", lambda T, block, causal: tiles_visited_reference(T, block, causal) + 1,
              seed=0, quiet=True)
