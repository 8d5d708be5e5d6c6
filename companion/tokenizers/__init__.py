"""Tokenizers for the book: characters, byte-level BPE from scratch, and the same BPE through ``tokenizers``.

What this package provides (one concept per module)
- ``companion.tokenizers.char``: ``CharTokenizer``.
- ``companion.tokenizers.bpe``: ``ByteBPE`` (train / encode / decode / save / load in readable Python),
  ``pretokenize`` and the GPT-2 byte table.
- ``companion.tokenizers.fast``: ``FastByteBPE``, the same interface on the Rust library.
- ``companion.tokenizers.word``: ``WordTokenizer``, lowercase words and punctuation (the translation chapter).

All three share: ``train(texts, ...)`` (a classmethod), ``encode(str) -> list[int]``,
``decode(list[int]) -> str``, ``vocab_size``, ``special_tokens`` (string -> id), ``save(path)`` and
``load(path)`` (JSON).
"""

from companion.tokenizers.bpe import GPT2_PATTERN, ByteBPE, bytes_to_unicode, pretokenize
from companion.tokenizers.char import CharTokenizer
from companion.tokenizers.fast import FastByteBPE
from companion.tokenizers.word import WordTokenizer, split_words

__all__ = [
    "ByteBPE", "CharTokenizer", "FastByteBPE", "GPT2_PATTERN", "WordTokenizer", "bytes_to_unicode", "pretokenize", "split_words",
]
