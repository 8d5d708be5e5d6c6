"""Tokenizers for the book: characters, byte-level BPE from scratch, and the same BPE through ``tokenizers``.

What this package provides (one concept per module)
- ``companion.tokenizers.base``: ``JsonTokenizer`` (the shared base: JSON ``save``/``load`` tagged with a
  ``kind``, ``encode_iterable``), ``TOKENIZER_KINDS`` (kind -> class) and ``tokenizer_from_json(path)``.
- ``companion.tokenizers.char``: ``CharTokenizer``.
- ``companion.tokenizers.bpe``: ``ByteBPE`` (train / encode / decode / save / load in readable Python),
  ``pretokenize`` and the GPT-2 byte table.
- ``companion.tokenizers.fast``: ``FastByteBPE``, the same interface on the Rust library.
- ``companion.tokenizers.word``: ``WordTokenizer``, lowercase words and punctuation (the translation chapter).

All four share: ``train(texts, ...)`` (a classmethod), ``encode(str) -> list[int]``,
``encode_iterable(iterable of str) -> iterator of ids`` (bounded memory, same ids as ``encode``),
``decode(list[int]) -> str``, ``vocab_size``, ``special_tokens`` (string -> id), ``save(path)`` and
``load(path)`` (JSON).
"""

from companion.tokenizers.base import TOKENIZER_KINDS, JsonTokenizer, tokenizer_from_json
from companion.tokenizers.bpe import GPT2_PATTERN, ByteBPE, bytes_to_unicode, pretokenize
from companion.tokenizers.char import CharTokenizer
from companion.tokenizers.fast import FastByteBPE
from companion.tokenizers.word import WordTokenizer, split_words

__all__ = [
    "JsonTokenizer", "TOKENIZER_KINDS", "tokenizer_from_json",
    "ByteBPE", "CharTokenizer", "FastByteBPE", "GPT2_PATTERN", "WordTokenizer", "bytes_to_unicode", "pretokenize", "split_words",
]
