"""The corpora as Hugging Face ``datasets`` objects, and the same shapes loaded from the hub by name.

What this module provides
- ``split_by_key(keys, fractions, seed)``: deterministic train/validation/test assignment from a hash
  of each row's key, so a row's split never depends on row order or on which other rows exist.
- ``shakespeare_dataset(fractions, seed) -> DatasetDict``: one row per scene, columns
  ``play, genre, scene, heading, text``; ``split_text(ds)`` joins a split into one training string.
- ``bible_dataset(src, tgt, max_words, min_words, max_ratio, fractions, seed) -> DatasetDict``: one row per
  aligned verse, columns ``id, book, chapter, verse, translation`` with ``translation = {src: ..., tgt: ...}``
  (the WMT layout on the hub), after ``companion.data.bible.length_filter``.
- ``load_hub_text(name, ...)`` and ``load_hub_pairs(name, src, tgt, ...)``: ``datasets.load_dataset``
  by name (a hub id such as ``"roneneldan/TinyStories"`` or ``"wmt14"`` when online, or a local
  folder of ``train.jsonl``/``validation.jsonl`` files), normalised to the column layout above
  (``text``; or ``translation`` from either a ``translation`` dict column or flat ``src``/``tgt`` columns,
  the Multi30k layout).
- ``load(name, **kwargs)``: the local corpora by name; an unknown name lists the valid ones.

Splits are (train, validation, test) with ``fractions`` summing to 1. Bible splits hash the chapter
("book:chapter"), not the verse, so neighbouring verses of one chapter land in the same split and the
validation set is not a paraphrase of training verses. Shakespeare splits hash "play / heading".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from companion.data.derived import ensure

if TYPE_CHECKING:  # datasets is imported lazily: it takes about a second
    from datasets import DatasetDict

__all__ = ["SPLITS", "split_by_key", "shakespeare_dataset", "bible_dataset", "split_text", "load_hub_text", "load_hub_pairs", "load",
           "LOCAL_DATASETS"]

SPLITS = ("train", "validation", "test")


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers (train, validation, test) summing to 1; "
                         f"got {tuple(fractions)}")
    if fractions[0] == 0:
        raise ValueError("fractions[0] (train) must be > 0")
    return tuple(float(f) for f in fractions)  # type: ignore[return-value]


def split_by_key(keys: Sequence[str], fractions: Sequence[float] = (0.9, 0.05, 0.05), seed: int = 0) -> list[str]:
    """The split name of each key: u = SHA-256(seed, key) as a number in [0, 1), compared to cumulative fractions."""
    train, validation, _ = _check_fractions(fractions)
    names = []
    for key in keys:
        digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        names.append("train" if u < train else "validation" if u < train + validation else "test")
    return names


def _dataset_dict(rows: list[dict], keys: list[str], fractions, seed: int) -> DatasetDict:
    from datasets import Dataset, DatasetDict

    assignment = split_by_key(keys, fractions, seed)
    out = {}
    for split in SPLITS:
        part = [row for row, name in zip(rows, assignment) if name == split]
        if part:
            out[split] = Dataset.from_list(part)
    return DatasetDict(out)


def _read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def shakespeare_dataset(fractions: Sequence[float] = (0.9, 0.05, 0.05), seed: int = 0) -> DatasetDict:
    """Shakespeare's scenes as a DatasetDict (columns ``play, genre, scene, heading, text``)."""
    rows = _read_jsonl(ensure("shakespeare"))
    keys = [f"{row['play']} / {row['scene']}" for row in rows]
    return _dataset_dict(rows, keys, fractions, seed)


def split_text(dataset, column: str = "text", separator: str = "\n") -> str:
    """All rows of ``dataset[column]`` joined by ``separator``: the string a character model trains on."""
    if column not in dataset.column_names:
        raise ValueError(f"column must be one of {dataset.column_names}; got {column!r}")
    return separator.join(dataset[column])


def bible_dataset(
    src: str = "en",
    tgt: str = "fr",
    max_words: int = 48,
    min_words: int = 1,
    max_ratio: float | None = 3.0,
    fractions: Sequence[float] = (0.9, 0.05, 0.05),
    seed: int = 0,
) -> DatasetDict:
    """Aligned verses ``src -> tgt`` (en with fr, es or de) as a DatasetDict in the WMT ``translation`` layout."""
    from companion.data.bible import VersePair, length_filter

    from companion.data.derived import CORPORA

    name = f"bible-en-{tgt if src == 'en' else src}"
    if "en" not in (src, tgt) or src == tgt or name not in CORPORA:
        raise ValueError(f"(src, tgt) must pair 'en' with one of ['de', 'es', 'fr']; got ({src!r}, {tgt!r})")
    rows = _read_jsonl(ensure(name))
    pairs = [VersePair(r["book"], r["chapter"], r["verse"], r["translation"][src], r["translation"][tgt]) for r in rows]
    kept = length_filter(pairs, max_words=max_words, min_words=min_words, max_ratio=max_ratio)
    out_rows = [
        {"id": f"{p.book}:{p.chapter}:{p.verse}", "book": p.book, "chapter": p.chapter, "verse": p.verse,
         "translation": {src: p.src, tgt: p.tgt}}
        for p in kept
    ]
    keys = [f"{p.book}:{p.chapter}" for p in kept]
    return _dataset_dict(out_rows, keys, fractions, seed)


def load_hub_text(name: str, config: str | None = None, text_column: str = "text", **kwargs) -> DatasetDict:
    """``datasets.load_dataset(name, config, **kwargs)`` with the text column renamed to ``text``.

    ``name`` is a hub id (``"roneneldan/TinyStories"``) when online, or a local folder/file in the same
    format. Other columns are dropped so the result looks like ``shakespeare_dataset()`` to a training loop.
    """
    from datasets import DatasetDict, load_dataset

    loaded = load_dataset(name, config, **kwargs)
    if not isinstance(loaded, DatasetDict):
        loaded = DatasetDict({kwargs.get("split") or "train": loaded})
    out = {}
    for split, ds in loaded.items():
        if text_column not in ds.column_names:
            raise ValueError(f"text_column must be one of {ds.column_names} (split {split!r}); got {text_column!r}")
        ds = ds.select_columns([text_column])
        out[split] = ds.rename_column(text_column, "text") if text_column != "text" else ds
    return DatasetDict(out)


def load_hub_pairs(name: str, src: str, tgt: str, config: str | None = None, **kwargs) -> DatasetDict:
    """``datasets.load_dataset`` normalised to one ``translation = {src: ..., tgt: ...}`` column.

    Accepts both hub layouts: a ``translation`` dict column (WMT: ``load_hub_pairs("wmt14", "en", "fr",
    "fr-en")``) and flat columns named by language (Multi30k: ``load_hub_pairs("bentrevett/multi30k", "en", "de")``).
    """
    from datasets import DatasetDict, load_dataset

    if src == tgt:
        raise ValueError(f"src and tgt must differ; both are {src!r}")
    loaded = load_dataset(name, config, **kwargs)
    if not isinstance(loaded, DatasetDict):
        loaded = DatasetDict({kwargs.get("split") or "train": loaded})
    out = {}
    for split, ds in loaded.items():
        if "translation" in ds.column_names:
            languages = set(ds.features["translation"].keys()) if hasattr(ds.features["translation"], "keys") else set()
            if not {src, tgt} <= languages:
                raise ValueError(f"src and tgt must be among the translation languages {sorted(languages)}; "
                                 f"got ({src!r}, {tgt!r})")
            ds = ds.map(lambda row: {"translation": {src: row["translation"][src], tgt: row["translation"][tgt]}},
                        remove_columns=ds.column_names)
        elif src in ds.column_names and tgt in ds.column_names:
            ds = ds.map(lambda row: {"translation": {src: row[src], tgt: row[tgt]}}, remove_columns=ds.column_names)
        else:
            raise ValueError(f"dataset {name!r} (split {split!r}) needs a 'translation' column or columns named "
                             f"{src!r} and {tgt!r}; it has {ds.column_names}")
        out[split] = ds
    return DatasetDict(out)


LOCAL_DATASETS = {
    "shakespeare": lambda **kw: shakespeare_dataset(**kw),
    "bible-en-fr": lambda **kw: bible_dataset("en", "fr", **kw),
    "bible-en-es": lambda **kw: bible_dataset("en", "es", **kw),
    "bible-en-de": lambda **kw: bible_dataset("en", "de", **kw),
}


def load(name: str, **kwargs) -> DatasetDict:
    """A local corpus by name (``shakespeare``, ``bible-en-fr``, ``bible-en-es``, ``bible-en-de``)."""
    if name not in LOCAL_DATASETS:
        raise ValueError(f"name must be one of {sorted(LOCAL_DATASETS)} (for hub datasets use load_hub_text or "
                         f"load_hub_pairs); got {name!r}")
    return LOCAL_DATASETS[name](**kwargs)
