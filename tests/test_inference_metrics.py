"""companion.inference.metrics against hand counts and brute-force definitions."""

import math
import random

import pytest

from companion.inference.metrics import bits_per_char, distinct_n, repetition_rate


def test_distinct_n_counts_by_hand():
    assert distinct_n("abab", 1) == 2 / 4
    assert distinct_n("abab", 2) == 2 / 3          # ab, ba, ab
    assert distinct_n("abcd", 2) == 1.0
    assert distinct_n(["to", "be", "or", "not", "to", "be"], 2) == 4 / 5


def test_distinct_n_matches_a_set_of_slices():
    rng = random.Random(0)
    seq = [rng.randrange(5) for _ in range(200)]
    for n in (1, 2, 3):
        grams = {tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)}
        assert distinct_n(seq, n) == len(grams) / (len(seq) - n + 1)


def test_repetition_rate_by_hand_and_by_loop():
    assert repetition_rate("aaaa", 1) == 1.0
    assert repetition_rate("abcd", 3) == 0.0
    assert repetition_rate("abca", 2) == 0.0        # the 'a' 3 back is outside a window of 2
    assert repetition_rate("abca", 3) == 1 / 3
    rng = random.Random(1)
    seq = [rng.randrange(7) for _ in range(100)]
    loop = sum(any(seq[s] == seq[t] for s in range(max(0, t - 5), t)) for t in range(1, 100)) / 99
    assert repetition_rate(seq, 5) == loop


def test_bits_per_char_converts_nats():
    assert math.isclose(bits_per_char(100 * math.log(2), 100), 1.0)
    assert math.isclose(bits_per_char(math.log(71) * 10, 10), math.log2(71))


@pytest.mark.parametrize("call, message", [
    (lambda: distinct_n("ab", 0), "n must be an int >= 1"),
    (lambda: distinct_n("ab", 3), "at least n=3"),
    (lambda: repetition_rate("a"), "at least 2"),
    (lambda: repetition_rate("ab", 0), "window must be"),
    (lambda: bits_per_char(1.0, 0), "n_chars must be"),
    (lambda: bits_per_char(float("nan"), 3), "total_nats must be"),
])
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
