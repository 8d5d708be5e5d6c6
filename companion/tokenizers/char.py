"""Character-level tokenizer: one id per Unicode character (the tokenizer of the first GPT chapter).

What this module provides
- ``CharTokenizer.train(texts, special_tokens, unk)``: the vocabulary is the sorted set of characters seen.
- ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``, ``special_tokens``
  (name -> id), ``save(path)`` / ``CharTokenizer.load(path)`` as JSON.

Ids: the special tokens first (0 .. k-1, in the order given), then the characters in code-point
order. Special-token strings that occur in the text are encoded as their single id. A character
outside the vocabulary is an error, unless an ``unk`` special token was given, which then stands for it
(and decoding cannot give the character back).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from companion.tokenizers.base import JsonTokenizer

__all__ = ["CharTokenizer"]


class CharTokenizer(JsonTokenizer):
    """Characters <-> ids. Build with ``CharTokenizer.train(texts)`` or from an explicit character list."""

    kind = "companion.CharTokenizer"

    def __init__(self, chars: Sequence[str], special_tokens: Sequence[str] = (), unk: str | None = None):
        if any(len(c) != 1 for c in chars):
            raise ValueError("chars must be single characters")
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat")
        if any(len(s) == 0 for s in special_tokens) or len(set(special_tokens)) != len(special_tokens):
            raise ValueError("special_tokens must be distinct non-empty strings")
        if unk is not None and unk not in special_tokens:
            raise ValueError(f"unk must be one of special_tokens {list(special_tokens)}; got {unk!r}")
        self.chars = list(chars)
        self.special_tokens = {token: i for i, token in enumerate(special_tokens)}
        self.unk = unk
        offset = len(self.special_tokens)
        self._char_to_id = {c: offset + i for i, c in enumerate(self.chars)}
        self._id_to_str = list(self.special_tokens) + self.chars
        ordered = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = re.compile("(" + "|".join(map(re.escape, ordered)) + ")") if ordered else None

    @classmethod
    def train(cls, texts: Iterable[str] | str, special_tokens: Sequence[str] = (), unk: str | None = None) -> CharTokenizer:
        """A tokenizer whose vocabulary is every character of ``texts`` (a string or an iterable of strings)."""
        texts = [texts] if isinstance(texts, str) else texts
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        if not seen:
            raise ValueError("texts must contain at least one character (the corpus is empty)")
        return cls(sorted(seen), special_tokens=special_tokens, unk=unk)

    @property
    def vocab_size(self) -> int:
        """Number of ids: special tokens + characters."""
        return len(self._id_to_str)

    def encode(self, text: str) -> list[int]:
        """One id per character (special-token strings become their id)."""
        pieces = self._special_re.split(text) if self._special_re else [text]
        ids: list[int] = []
        for index, piece in enumerate(pieces):
            if index % 2 == 1:  # the splitting pattern's captured special tokens sit at odd positions
                ids.append(self.special_tokens[piece])
                continue
            for char in piece:
                token = self._char_to_id.get(char)
                if token is None:
                    if self.unk is None:
                        missing = sorted(set(piece) - set(self._char_to_id))
                        raise ValueError(f"text contains characters outside the vocabulary: {missing[:10]!r} "
                                         "(train on them, or pass unk=...)")
                    token = self.special_tokens[self.unk]
                ids.append(token)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Concatenate the characters (and special-token strings) of ``ids``."""
        out = []
        for token in ids:
            token = int(token)
            if not 0 <= token < len(self._id_to_str):
                raise ValueError(f"ids must be in [0, {len(self._id_to_str)}); got {token}")
            out.append(self._id_to_str[token])
        return "".join(out)

    def _plain_cut(self, text: str) -> int:
        """Every character is its own id, so ordinary text may be cut anywhere."""
        return len(text)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "chars": self.chars, "special_tokens": list(self.special_tokens), "unk": self.unk}

    @classmethod
    def from_dict(cls, data: dict) -> CharTokenizer:
        return cls(data["chars"], data["special_tokens"], data["unk"])
