"""Word-level tokenizer: lowercase words and punctuation marks, a capped vocabulary (chapter 3).

What this module provides
- ``split_words(text, lowercase)``: the pre-tokenization: runs of letters/digits (with inner
  apostrophes and hyphens, "l'homme", "well-known") and single punctuation marks.
- ``WordTokenizer.train(texts, max_size, min_count, special_tokens, unk)``: the most frequent words
  (ties broken alphabetically, so training is deterministic) after the special tokens.
- ``encode(text) -> list[int]``, ``decode(ids) -> str`` (words joined by single spaces, specials
  dropped when ``skip_special``), ``vocab_size``, ``special_tokens``, ``save``/``load`` as JSON.

Why words for the translation chapter: on a CPU budget of a minute or two, a model that predicts
whole (lowercased) words learns usable translations sooner than one that must first learn to spell
(characters) or to assemble sub-words (BPE); the price is an unknown-word token for rare words.
Decoding is not the inverse of encoding: case and original spacing are gone.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from companion.tokenizers.base import JsonTokenizer

__all__ = ["WordTokenizer", "split_words", "DEFAULT_SPECIALS"]

DEFAULT_SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
_WORD = re.compile(r"\w+(?:['’\-]\w+)*|[^\w\s]", re.UNICODE)


def split_words(text: str, lowercase: bool = True) -> list[str]:
    """Words (letters/digits with inner ' ’ -) and single punctuation marks, in order."""
    return _WORD.findall(text.lower() if lowercase else text)


class WordTokenizer(JsonTokenizer):
    """Words <-> ids. Ids: special tokens first, then words by decreasing training frequency."""

    kind = "companion.WordTokenizer"

    def __init__(self, words: Sequence[str], special_tokens: Sequence[str] = DEFAULT_SPECIALS, unk: str | None = "<unk>",
                 lowercase: bool = True):
        if len(set(special_tokens)) != len(special_tokens) or any(not s for s in special_tokens):
            raise ValueError("special_tokens must be distinct non-empty strings")
        if unk is not None and unk not in special_tokens:
            raise ValueError(f"unk must be one of special_tokens {list(special_tokens)}; got {unk!r}")
        if len(set(words)) != len(words) or set(words) & set(special_tokens):
            raise ValueError("words must be distinct and must not repeat a special token")
        self.words, self.unk, self.lowercase = list(words), unk, lowercase
        self.special_tokens = {tok: i for i, tok in enumerate(special_tokens)}
        self._id_to_str = list(special_tokens) + self.words
        self._word_to_id = {w: i for i, w in enumerate(self._id_to_str)}

    @classmethod
    def train(cls, texts: Iterable[str] | str, max_size: int | None = None, min_count: int = 1,
              special_tokens: Sequence[str] = DEFAULT_SPECIALS, unk: str | None = "<unk>", lowercase: bool = True) -> WordTokenizer:
        """Keep the ``max_size`` most frequent words seen at least ``min_count`` times (specials included in max_size)."""
        if max_size is not None and max_size <= len(special_tokens):
            raise ValueError(f"max_size must exceed the number of special tokens ({len(special_tokens)}); got {max_size}")
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1; got {min_count}")
        texts = [texts] if isinstance(texts, str) else texts
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(split_words(text, lowercase))
        for special in special_tokens:
            counts.pop(special, None)
        if not counts:
            raise ValueError("texts must contain at least one word (the corpus is empty)")
        ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        if max_size is not None:
            ranked = ranked[: max_size - len(special_tokens)]
        return cls(ranked, special_tokens, unk, lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_str)

    def id(self, token: str) -> int:
        """The id of a word or special token (raises ValueError if absent)."""
        if token not in self._word_to_id:
            raise ValueError(f"{token!r} is not in the vocabulary")
        return self._word_to_id[token]

    def encode(self, text: str) -> list[int]:
        """Ids of the words of ``text``; unknown words become ``unk`` (an error if there is none)."""
        ids = []
        for word in split_words(text, self.lowercase):
            token = self._word_to_id.get(word)
            if token is None:
                if self.unk is None:
                    raise ValueError(f"word {word!r} is outside the vocabulary and unk is None")
                token = self.special_tokens[self.unk]
            ids.append(token)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Words joined by single spaces; special tokens dropped unless ``skip_special=False``."""
        out = []
        for token in ids:
            token = int(token)
            if not 0 <= token < len(self._id_to_str):
                raise ValueError(f"ids must be in [0, {len(self._id_to_str)}); got {token}")
            if skip_special and token < len(self.special_tokens) and self._id_to_str[token] != self.unk:
                continue
            out.append(self._id_to_str[token])
        return " ".join(out)

    def normalize(self, text: str) -> str:
        """What a perfect round trip gives: ``decode(encode(text))`` when every word is known."""
        return " ".join(split_words(text, self.lowercase))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "words": self.words, "special_tokens": list(self.special_tokens),
                "unk": self.unk, "lowercase": self.lowercase}

    @classmethod
    def from_dict(cls, data: dict) -> WordTokenizer:
        return cls(data["words"], data["special_tokens"], data["unk"], data["lowercase"])
