"""What every tokenizer of the book shares: a JSON file format with a ``kind``, and streaming encode.

What this module provides
- ``JsonTokenizer``: the base class. A subclass sets ``kind`` (a unique string written into its
  JSON), implements ``encode``, ``decode``, ``to_dict`` and ``from_dict``, and inherits ``save``,
  ``load`` and ``encode_iterable``. Defining the subclass registers it under its ``kind``.
- ``TOKENIZER_KINDS``: the registry, ``kind`` string -> class.
- ``tokenizer_from_json(path)``: read any tokenizer file written by ``save``, whatever its class.

Streaming. ``encode_iterable(chunks)`` encodes text that arrives in pieces (the lines of a file too
big for memory) and yields the same ids as ``encode("".join(chunks))``. It keeps a buffer and, after
each chunk, encodes and drops the longest prefix whose ids cannot change whatever text follows:
1. Special tokens: a special token starting at least ``len(longest special) - 1`` characters before
   the end of the buffer is certain; one starting later may still be completed by the next chunk.
2. Ordinary text after the last certain special token: each tokenizer says where it may be cut
   (``_plain_cut``). The default, for the regex pre-tokenizers of the book, is the last place where a
   non-space character is followed by a whitespace character; no pre-token spans such a place and
   none is chosen by looking past the whitespace (proof in ``_plain_cut``).
The buffer therefore holds at most one chunk plus the text since the last such place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import ClassVar

__all__ = ["JsonTokenizer", "TOKENIZER_KINDS", "tokenizer_from_json"]

TOKENIZER_KINDS: dict[str, type[JsonTokenizer]] = {}


class JsonTokenizer:
    """Base of the book's tokenizers: ``save``/``load`` as JSON tagged with ``kind``, ``encode_iterable``.

    Subclasses provide ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``,
    ``special_tokens`` (string -> id), ``to_dict() -> dict`` (JSON-ready, without ``kind``) and the
    classmethod ``from_dict(data) -> tokenizer``.
    """

    kind: ClassVar[str] = ""
    # Regex that matches the special tokens ``encode`` cuts out of the text first (None: it cuts none).
    _special_re = None
    # A non-space character followed by whitespace, in the regex flavour of the pre-tokenizer.
    _space_after = re.compile(r"\S(?=\s)")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.kind:
            raise TypeError(f"{cls.__name__} must set a class attribute kind (its JSON tag)")
        if cls.kind in TOKENIZER_KINDS and TOKENIZER_KINDS[cls.kind] is not cls:
            raise TypeError(f"tokenizer kind {cls.kind!r} is taken by {TOKENIZER_KINDS[cls.kind].__name__}")
        TOKENIZER_KINDS[cls.kind] = cls

    # ------------------------------------------------------------------ to implement
    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict) -> JsonTokenizer:
        raise NotImplementedError

    # ------------------------------------------------------------------ files
    def save(self, path: Path | str) -> None:
        """Write the tokenizer as JSON, ``{"kind": ..., **to_dict()}``."""
        data = {"kind": self.kind, **self.to_dict()}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: Path | str) -> JsonTokenizer:
        """Read a tokenizer written by ``save``; the file's ``kind`` must be this class's."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("kind") != cls.kind:
            raise ValueError(f"{path} holds {data.get('kind')!r}, not a {cls.kind}")
        return cls.from_dict(data)

    # ------------------------------------------------------------------ streaming
    def encode_iterable(self, texts: Iterable[str]) -> Iterator[int]:
        """Yield the ids of ``"".join(texts)``, the same as ``encode`` gives, without holding the text.

        ``texts``: any iterable of strings, e.g. an open file (its lines). Memory: one chunk plus the
        text since the last safe cut (see the module docstring).
        """
        buffer = ""
        for chunk in texts:
            if not isinstance(chunk, str):
                raise ValueError(f"texts must yield strings; got {type(chunk).__name__}")
            buffer += chunk
            cut = self._stream_cut(buffer)
            if cut > 0:
                yield from self.encode(buffer[:cut])
                buffer = buffer[cut:]
        if buffer:
            yield from self.encode(buffer)

    def _stream_cut(self, text: str) -> int:
        """The largest c such that encode(text[:c] + rest) == encode(text[:c]) + encode(text[c:] + rest)
        for every ``rest`` (0 when none is known)."""
        start, limit = 0, len(text)
        if self._special_re is not None:
            # A special token starting before ``limit`` is complete in ``text``: every alternative of the
            # regex fits, so what the regex picks there cannot change when text is appended.
            limit = len(text) - (max(len(s) for s in self.special_tokens) - 1)
            for match in self._special_re.finditer(text):
                if match.start() >= limit:
                    break
                start = match.end()  # cutting right after a certain special token is always safe
        if limit <= start:
            return start
        return start + self._plain_cut(text[start:limit])

    def _plain_cut(self, text: str) -> int:
        """A cut in special-token-free ``text`` that no continuation of ``text`` can move.

        The last i with text[i - 1] not whitespace and text[i] whitespace (0 if none). Why it is safe for
        the GPT-2 pattern and for the word pattern: a pre-token that starts with a non-space character
        never contains whitespace, and one that starts with whitespace contains only whitespace, so no
        pre-token crosses i. The regex scans left to right with no look-behind, so the pre-tokens
        after i do not depend on the text before it, and those before i look at most one character
        past their end (the ``(?!\\S)`` look-ahead, and the contractions that stop at the space).
        """
        last = None
        for last in self._space_after.finditer(text):
            pass
        return 0 if last is None else last.end()


def tokenizer_from_json(path: Path | str) -> JsonTokenizer:
    """Load a tokenizer file written by any registered tokenizer's ``save``, by the ``kind`` in it."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"{path}: unknown tokenizer kind {kind!r}; known: {sorted(TOKENIZER_KINDS)}")
    return TOKENIZER_KINDS[kind].from_dict(data)
