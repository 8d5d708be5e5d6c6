"""companion.exercises.check: a learner's function that never returns fails the check, naming the case."""

from __future__ import annotations

import threading
import time

import pytest

from companion.exercises import ExerciseFailed, TimeLimitExceeded, check


def forever(*args, **kwargs):
    while True:
        try:
            time.sleep(0.01)
        except Exception:  # a learner's broad except must not swallow the time limit
            pass


def test_a_function_that_never_returns_fails_within_the_time_limit():
    start = time.perf_counter()
    with pytest.raises(TimeLimitExceeded, match=r"^2-D scores \(4, 6\), random mask: your function did not return within "
                                                r"0\.3 s \(an endless loop\? check\(\.\.\., time_limit=\.\.\.\) "
                                                r"allows more\)"):
        check("ch01.masked_softmax", forever, seed=0, time_limit=0.3)
    assert time.perf_counter() - start < 5
    assert issubclass(TimeLimitExceeded, ExerciseFailed)


def test_the_time_limit_holds_outside_the_main_thread_too():
    caught = []

    def run():
        try:
            check("ch01.masked_softmax", forever, seed=0, time_limit=0.3)
        except TimeLimitExceeded as e:
            caught.append(str(e))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert caught and "did not return within 0.3 s" in caught[0]


def test_time_limit_is_validated_and_a_right_answer_still_passes():
    import torch

    def masked_softmax(scores, keep):
        return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)

    for bad in (0, -1, float("nan"), "5"):
        with pytest.raises(ValueError, match="time_limit must be a number of seconds > 0, or None"):
            check("ch01.masked_softmax", masked_softmax, time_limit=bad)
    assert check("ch01.masked_softmax", masked_softmax, seed=0, quiet=True, time_limit=None).cases


def swallows_everything(*args, **kwargs):
    while True:
        try:
            time.sleep(0.01)
        except:  # noqa: E722  (the point: a bare except catches every exception a signal can raise)
            pass


def loops_in_finally(*args, **kwargs):
    while True:
        try:
            time.sleep(0.01)
        finally:
            continue


@pytest.mark.parametrize("answer", [swallows_everything, loops_in_finally])
def test_an_answer_that_swallows_the_interruption_is_stopped_all_the_same(answer):
    start = time.perf_counter()
    with pytest.raises(TimeLimitExceeded, match=r"^2-D scores \(4, 6\), random mask: your function did not return "
                                                r"within 0\.3 s and caught the checker's interruption"):
        check("ch01.masked_softmax", answer, seed=0, time_limit=0.3)
    assert time.perf_counter() - start < 30  # the limit, the grace second and the process start on a busy machine


def test_an_answer_that_ends_the_process_fails_the_check_and_the_caller_lives():
    import os

    with pytest.raises(ExerciseFailed, match="your function ended the checker's process"):
        check("ch01.masked_softmax", lambda *args: os._exit(3), seed=0, time_limit=5)


def test_answers_of_the_wrong_kind_fail_the_check_instead_of_raising():
    import numpy as np

    from companion.exercises import checkers, integer_answer

    assert integer_answer("a count", np.int64(3)) == 3 and type(integer_answer("a count", np.int64(3))) is int
    for answer in ("a string", [1, 2], None):
        for name in checkers():
            with pytest.raises(ExerciseFailed):
                check(name, lambda *args, answer=answer, **kwargs: answer, seed=0, quiet=True, time_limit=None)
