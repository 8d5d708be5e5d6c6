"""Byte-level BPE written from scratch, the way GPT-2 tokenizes (chapter on tokenization).

What this module provides
- ``GPT2_PATTERN`` and ``pretokenize(text)``: the regex that cuts text into words before BPE
  (contractions, letters with one optional leading space, numbers, punctuation, whitespace).
- ``bytes_to_unicode()``: GPT-2's table of 256 printable stand-ins for the 256 byte values (used only
  to compare with the ``tokenizers`` library and to print tokens; the algorithm works on bytes).
- ``ByteBPE.train(texts, vocab_size, special_tokens, min_frequency, tie_break)``, ``encode``,
  ``encode_iterable``, ``decode``, ``merges``, ``token_bytes``, ``save`` / ``ByteBPE.load`` (JSON, through
  ``companion.tokenizers.base.JsonTokenizer``).

The algorithm (Sennrich et al. 2016, on bytes as in GPT-2):
1. Cut the corpus at the special tokens (which are dropped: no merge ever crosses or enters one), cut
   the rest into pre-tokens with ``GPT2_PATTERN`` and count each distinct one; write each as its
   UTF-8 bytes, so the starting vocabulary is the 256 byte values (ids 0..255) and nothing is ever
   out of vocabulary.
2. Count every adjacent pair of symbols, weighted by the word counts. Merge the most frequent pair
   (a, b) into a new symbol ab with the next id (256, 257, ...) everywhere, update the counts, repeat
   until the vocabulary has ``vocab_size`` entries or no pair occurs ``min_frequency`` times.
3. Encoding a pre-token repeats: find the adjacent pair with the lowest merge rank, merge it; stop when
   no adjacent pair is a merge. Special tokens (ids after the merges) are matched in the text first.

Ties: when several pairs share the highest count, ``tie_break`` decides which is merged.
- ``"id"`` (default): the smallest (left id, right id); bytes order by value, merged symbols by
  creation.
- ``"hf"``: the same with the 256 bytes ordered by the code point of their GPT-2 stand-in (printable
  bytes first), the order of the ``tokenizers`` library, so it reproduces that library's merges.
- ``"lex"``: the lexicographically greatest pair of byte strings, ``max((left bytes, right bytes))``,
  the rule of common course reference implementations (e.g. Stanford CS336's).
The three differ only where counts tie (``tests/test_tokenizers.py`` pins each against a reference).

Step 2 keeps, for every pair, its count and the set of words containing it; a heap gives the most
frequent pair, and entries whose count went stale are re-pushed when popped. Only words containing
the merged pair are touched, which is what makes training on Shakespeare take seconds, not hours.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence

import regex

from companion.tokenizers.base import JsonTokenizer

__all__ = ["GPT2_PATTERN", "TIE_BREAKS", "pretokenize", "bytes_to_unicode", "special_pattern", "split_special", "ByteBPE"]

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PRETOKENIZER = regex.compile(GPT2_PATTERN)


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into GPT-2 pre-tokens; ``"".join(pretokenize(t)) == t`` always holds."""
    return _PRETOKENIZER.findall(text)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: printable Latin-1 bytes map to themselves, the other
    68 bytes (controls, space, soft hyphen, ...) to U+0100 onwards, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _hf_base_rank() -> list[int]:
    """Rank of each byte when the 256 stand-ins are sorted by code point (the ``tokenizers`` id order)."""
    table = bytes_to_unicode()
    order = sorted(range(256), key=lambda b: ord(table[b]))
    rank = [0] * 256
    for position, byte in enumerate(order):
        rank[byte] = position
    return rank


TIE_BREAKS = ("id", "hf", "lex")


class _Descending:
    """Wraps a pair of byte strings so that a min-heap pops the lexicographically greatest first."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[bytes, bytes]):
        self.key = key

    def __lt__(self, other: _Descending) -> bool:
        return self.key > other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key


def special_pattern(special_tokens: Iterable[str]) -> regex.Pattern | None:
    """A regex capturing any of ``special_tokens``, longest first (so "<a><b>" beats "<a>"); None if none."""
    ordered = sorted(special_tokens, key=len, reverse=True)
    return regex.compile("(" + "|".join(map(regex.escape, ordered)) + ")") if ordered else None


def split_special(text: str, pattern: regex.Pattern | None) -> list[str]:
    """``text`` cut at the special tokens: even positions hold ordinary text, odd ones a special token."""
    return pattern.split(text) if pattern is not None else [text]


class ByteBPE(JsonTokenizer):
    """A trained byte-level BPE: ids 0..255 are bytes, 256.. the merges in order, then the special tokens."""

    kind = "companion.ByteBPE"
    _space_after = regex.compile(r"\S(?=\s)")  # the same notion of whitespace as GPT2_PATTERN

    def __init__(self, merges: Sequence[tuple[bytes, bytes]] = (), special_tokens: Sequence[str] = ()):
        if any(len(s) == 0 for s in special_tokens) or len(set(special_tokens)) != len(special_tokens):
            raise ValueError("special_tokens must be distinct non-empty strings")
        self._vocab: list[bytes] = [bytes([b]) for b in range(256)]
        self._id_of: dict[bytes, int] = {token: i for i, token in enumerate(self._vocab)}
        self._rank: dict[tuple[int, int], int] = {}  # (left id, right id) -> id of the merged symbol
        for left, right in merges:
            if left not in self._id_of or right not in self._id_of:
                raise ValueError(f"merges must only combine earlier symbols; {left!r} + {right!r} does not")
            merged = left + right
            if merged in self._id_of:
                raise ValueError(f"merges must create new symbols; {merged!r} exists already")
            self._rank[(self._id_of[left], self._id_of[right])] = len(self._vocab)
            self._id_of[merged] = len(self._vocab)
            self._vocab.append(merged)
        self.special_tokens = {token: len(self._vocab) + i for i, token in enumerate(special_tokens)}
        self._special_re = special_pattern(self.special_tokens)
        self._cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        texts: Iterable[str] | str,
        vocab_size: int,
        special_tokens: Sequence[str] = (),
        min_frequency: int = 2,
        tie_break: str = "id",
    ) -> ByteBPE:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges (fewer if pairs run out) from ``texts``.

        ``texts`` are cut at ``special_tokens`` first: pairs are counted only inside the text between
        them. ``min_frequency``: stop when the best pair occurs fewer times. ``tie_break``: ``"id"``,
        ``"hf"`` or ``"lex"`` (see the module docstring). ``train_history`` on the result lists
        (pair, count) per merge.
        """
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"tie_break must be one of {TIE_BREAKS}; got {tie_break!r}")
        if vocab_size < 256 + len(special_tokens):
            raise ValueError(f"vocab_size must be >= 256 + len(special_tokens) = {256 + len(special_tokens)}; got {vocab_size}")
        texts = [texts] if isinstance(texts, str) else texts
        specials = special_pattern(special_tokens)
        word_counts: Counter[bytes] = Counter()
        for text in texts:
            for part in split_special(text, specials)[::2]:  # drop the special tokens themselves
                word_counts.update(piece.encode("utf-8") for piece in pretokenize(part))
        if not word_counts:
            raise ValueError("texts must not be empty (no pre-token to learn merges from)")

        words = [list(word) for word in word_counts]  # each word as a list of symbol ids
        counts = list(word_counts.values())
        rank = _hf_base_rank() if tie_break == "hf" else list(range(256))  # tie order of each symbol id
        vocab = [bytes([b]) for b in range(256)]

        def tie_key(pair: tuple[int, int]):
            """Among equal counts the heap pops the smallest key."""
            if tie_break == "lex":
                return _Descending((vocab[pair[0]], vocab[pair[1]]))
            return rank[pair[0]], rank[pair[1]]

        pair_count: Counter[tuple[int, int]] = Counter()
        where: dict[tuple[int, int], set[int]] = {}
        for w, (symbols, count) in enumerate(zip(words, counts)):
            for pair in zip(symbols, symbols[1:]):
                pair_count[pair] += count
                where.setdefault(pair, set()).add(w)
        heap = [(-c, tie_key(pair), pair) for pair, c in pair_count.items()]
        heapq.heapify(heap)

        merges: list[tuple[bytes, bytes]] = []
        history: list[tuple[tuple[bytes, bytes], int]] = []
        n_merges = vocab_size - 256 - len(special_tokens)
        while len(merges) < n_merges and heap:
            negative, _, pair = heapq.heappop(heap)
            current = pair_count.get(pair, 0)
            if -negative != current:  # stale entry: the count went down since it was pushed
                if current > 0:
                    heapq.heappush(heap, (-current, tie_key(pair), pair))
                continue
            if current < max(min_frequency, 1):
                break
            new_id = len(vocab)
            vocab.append(vocab[pair[0]] + vocab[pair[1]])
            rank.append(new_id)  # merged symbols order by creation in the "id" and "hf" orders
            merges.append((vocab[pair[0]], vocab[pair[1]]))
            history.append((merges[-1], current))
            changed: set[tuple[int, int]] = set()
            for w in where.pop(pair, set()):
                symbols, count = words[w], counts[w]
                for old in zip(symbols, symbols[1:]):  # remove this word's pairs ...
                    pair_count[old] -= count
                merged = _merge(symbols, pair, new_id)
                words[w] = merged
                for new in zip(merged, merged[1:]):  # ... and add back those of the merged word
                    pair_count[new] += count
                    where.setdefault(new, set()).add(w)
                    changed.add(new)
            del pair_count[pair]
            for new in changed:
                if new != pair and pair_count[new] > 0:
                    heapq.heappush(heap, (-pair_count[new], tie_key(new), new))
        tokenizer = cls(merges, special_tokens)
        tokenizer.train_history = history
        return tokenizer

    # ------------------------------------------------------------------ encoding
    @property
    def vocab_size(self) -> int:
        """256 bytes + merges + special tokens."""
        return len(self._vocab) + len(self.special_tokens)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """The merges in the order learned, as (left bytes, right bytes)."""
        by_id = sorted(self._rank.items(), key=lambda item: item[1])
        return [(self._vocab[a], self._vocab[b]) for (a, b), _ in by_id]

    def token_bytes(self, token: int) -> bytes:
        """The bytes an id stands for (a special token's UTF-8 string)."""
        if 0 <= token < len(self._vocab):
            return self._vocab[token]
        for text, special in self.special_tokens.items():
            if special == token:
                return text.encode("utf-8")
        raise ValueError(f"token must be in [0, {self.vocab_size}); got {token}")

    def _encode_word(self, word: str) -> list[int]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = list(word.encode("utf-8"))
        while len(symbols) > 1:
            # The adjacent pair that was merged earliest in training (lowest new id) goes first.
            best = min(zip(symbols, symbols[1:]), key=lambda p: self._rank.get(p, float("inf")))
            if best not in self._rank:
                break
            symbols = _merge(symbols, best, self._rank[best])
        if len(self._cache) < 100_000:
            self._cache[word] = symbols
        return symbols

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: special tokens first, then each pre-token through the merges."""
        ids: list[int] = []
        for index, piece in enumerate(split_special(text, self._special_re)):
            if index % 2 == 1:
                ids.append(self.special_tokens[piece])
            else:
                for word in pretokenize(piece):
                    ids.extend(self._encode_word(word))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Concatenate the bytes of ``ids`` and read them as UTF-8 (invalid sequences become U+FFFD)."""
        return b"".join(self.token_bytes(int(t)) for t in ids).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        """The merges as hex byte strings and the special tokens (``save`` writes it as JSON)."""
        return {"kind": self.kind, "special_tokens": list(self.special_tokens),
                "merges": [[a.hex(), b.hex()] for a, b in self.merges]}

    @classmethod
    def from_dict(cls, data: dict) -> ByteBPE:
        return cls([(bytes.fromhex(a), bytes.fromhex(b)) for a, b in data["merges"]], data["special_tokens"])


def _merge(symbols: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of ``pair`` in ``symbols``, left to right, by ``new_id``."""
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == pair[0] and symbols[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out
