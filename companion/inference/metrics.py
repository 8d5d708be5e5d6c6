"""Measures of generated text and of language-model loss (chapter 4).

What this module provides
- ``distinct_n(tokens, n)``: distinct n-grams / all n-grams of one sequence (Li et al. 2016). 1 means no
  n-gram repeats; a sampler stuck in a loop drives it towards 0.
- ``repetition_rate(tokens, window)``: the fraction of positions t >= 1 whose token already occurs among
  the ``window`` tokens before it (rep-w of Welleck et al. 2020).
- ``bits_per_char(total_nats, n_chars)``: a summed negative log-likelihood in nats turned into bits per
  character, total_nats / (n_chars ln 2), the unit in which models with different tokenizers compare.

The inputs are plain sequences (token ids, characters or words), so the same function measures a
character model's output and a BPE model's decoded text split into words.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

__all__ = ["distinct_n", "repetition_rate", "bits_per_char"]


def _items(tokens: Sequence[Hashable], name: str = "tokens") -> list:
    if isinstance(tokens, (str, bytes)):
        return list(tokens)
    try:
        return list(tokens)
    except TypeError:
        raise ValueError(f"{name} must be a sequence (ids, characters or words); got {type(tokens).__name__}") from None


def distinct_n(tokens: Sequence[Hashable], n: int = 2) -> float:
    """Distinct n-grams / total n-grams of ``tokens`` (length L >= n): L - n + 1 n-grams in all."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1; got {n!r}")
    items = _items(tokens)
    if len(items) < n:
        raise ValueError(f"tokens must hold at least n={n} items; got {len(items)}")
    grams = [tuple(items[i:i + n]) for i in range(len(items) - n + 1)]
    return len(set(grams)) / len(grams)


def repetition_rate(tokens: Sequence[Hashable], window: int = 16) -> float:
    """Fraction of positions t = 1..L-1 with tokens[t] in tokens[max(0, t - window):t] (rep-w)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1; got {window!r}")
    items = _items(tokens)
    if len(items) < 2:
        raise ValueError(f"tokens must hold at least 2 items; got {len(items)}")
    hits = sum(items[t] in items[max(0, t - window):t] for t in range(1, len(items)))
    return hits / (len(items) - 1)


def bits_per_char(total_nats: float, n_chars: int) -> float:
    """total_nats / (n_chars ln 2): the summed NLL of a text (any tokenizer) per character, in bits."""
    if isinstance(n_chars, bool) or not isinstance(n_chars, int) or n_chars < 1:
        raise ValueError(f"n_chars must be an int >= 1 (characters of the text scored); got {n_chars!r}")
    if not math.isfinite(total_nats) or total_nats < 0:
        raise ValueError(f"total_nats must be finite and >= 0 (a summed negative log-likelihood); got {total_nats!r}")
    return total_nats / (n_chars * math.log(2))
