"""The same byte-level BPE through the Rust ``tokenizers`` library: the fast path for real corpora.

What this module provides
- ``FastByteBPE``: the interface of ``companion.tokenizers.bpe.ByteBPE`` (``train``, ``encode``,
  ``decode``, ``vocab_size``, ``special_tokens``, ``merges`` as byte pairs, ``save`` / ``load``) backed
  by a ``tokenizers.Tokenizer`` with the GPT-2 byte-level pre-tokenizer and decoder.
- ``FastByteBPE.backend``: the underlying ``tokenizers.Tokenizer``, for anything else it offers
  (batch encoding, offsets, padding).

Differences from the from-scratch ``ByteBPE`` that a reader may notice:
- ids: the library numbers special tokens first (0..k-1), then the 256 byte symbols in the code-point
  order of their GPT-2 stand-ins, then the merges; ``ByteBPE`` uses bytes 0..255, merges, then
  special tokens. The *merges* are the same when ``ByteBPE`` is trained with ``tie_break="hf"``, so
  both cut any text into the same byte strings.
- speed: training on all of Shakespeare takes well under a second here, versus seconds in Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import regex
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from companion.tokenizers.base import JsonTokenizer
from companion.tokenizers.bpe import bytes_to_unicode, special_pattern, split_special

__all__ = ["FastByteBPE"]

_CHAR_TO_BYTE = {char: byte for byte, char in bytes_to_unicode().items()}


def _to_bytes(token: str) -> bytes:
    return bytes(_CHAR_TO_BYTE[c] for c in token)


def _new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class FastByteBPE(JsonTokenizer):
    """Byte-level BPE backed by ``tokenizers``; same methods as ``ByteBPE``."""

    kind = "companion.FastByteBPE"
    _space_after = regex.compile(r"\S(?=\s)")  # whitespace as the GPT-2 pattern of the pre-tokenizer sees it

    def __init__(self, backend: Tokenizer, special_tokens: Sequence[str] = ()):
        self.backend = backend
        self.special_tokens = {}
        for token in special_tokens:
            token_id = backend.token_to_id(token)
            if token_id is None:
                raise ValueError(f"special_tokens must be in the backend's vocabulary; {token!r} is not")
            self.special_tokens[token] = token_id
        self._special_re = special_pattern(self.special_tokens)  # what encode_iterable must not cut

    @classmethod
    def train(
        cls,
        texts: Iterable[str] | str,
        vocab_size: int,
        special_tokens: Sequence[str] = (),
        min_frequency: int = 2,
    ) -> FastByteBPE:
        """Train with ``tokenizers.trainers.BpeTrainer`` on the full 256-byte alphabet.

        The texts are cut at ``special_tokens`` before they reach the trainer (which would otherwise
        count pairs across and inside them, learning merges such as ``(b'|', b'>')``).
        """
        if vocab_size < 256 + len(special_tokens):
            raise ValueError(f"vocab_size must be >= 256 + len(special_tokens) = {256 + len(special_tokens)}; got {vocab_size}")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not any(texts):
            raise ValueError("texts must not be empty (no pre-token to learn merges from)")
        tokenizer = _new_tokenizer()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(special_tokens),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        specials = special_pattern(special_tokens)
        parts = (part for text in texts for part in split_special(text, specials)[::2] if part)
        tokenizer.train_from_iterator(parts, trainer=trainer)
        return cls(tokenizer, special_tokens)

    @property
    def vocab_size(self) -> int:
        """Entries in the vocabulary, special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """The merges in the order learned, as (left bytes, right bytes)."""
        model = json.loads(self.backend.to_str())["model"]
        pairs = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        return [(_to_bytes(a), _to_bytes(b)) for a, b in pairs]

    def token_bytes(self, token: int) -> bytes:
        """The bytes an id stands for (a special token's UTF-8 string)."""
        for text, special in self.special_tokens.items():
            if special == token:
                return text.encode("utf-8")
        piece = self.backend.id_to_token(int(token))
        if piece is None:
            raise ValueError(f"token must be in [0, {self.vocab_size}); got {token}")
        return _to_bytes(piece)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings become their id)."""
        return self.backend.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, special tokens kept."""
        ids = [int(t) for t in ids]
        for t in ids:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"ids must be in [0, {self.vocab_size}); got {t}")
        return self.backend.decode(ids, skip_special_tokens=False)

    def to_dict(self) -> dict:
        """The library's own JSON plus our special-token list (``save`` writes it)."""
        return {"kind": self.kind, "special_tokens": list(self.special_tokens), "tokenizer": json.loads(self.backend.to_str())}

    @classmethod
    def from_dict(cls, data: dict) -> FastByteBPE:
        return cls(Tokenizer.from_str(json.dumps(data["tokenizer"])), data["special_tokens"])
