"""The output folder of a cut: ``check_out`` refuses a folder inside the book, ``merge_course`` moves a
cut in, keeping what someone changed there (``OUT/.course-files.json`` records what each cut wrote)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

SOURCES = ("book", "_static", "tools", "_vendor", "companion")
RECORD = ".course-files.json"  # in OUT: the SHA-256 of every file the last cut wrote there


def check_out(out: Path, book: Path) -> None:
    """ValueError unless ``out`` (any spelling: resolved first, links followed) is a folder apart from the
    book: not the book's root, where the course's ``book/`` would overwrite the chapters it is cut
    from, and not inside a folder the course reads (``SOURCES``)."""
    here, root = out.resolve(), book.resolve()
    if here == root:
        raise ValueError(f"--out {out} is the book's root ({root}): the course's book/ would be written over "
                         "the chapters it is cut from. Name a folder of its own, e.g. --out course/")
    for name in SOURCES:
        source = root / name
        if here == source or source in here.parents:
            raise ValueError(f"--out {out} is inside the book's source folder {source}: the course must not be "
                             "written into the files it is cut from. Name a folder of its own, e.g. --out course/")


_SHA256 = re.compile(r"[0-9a-f]{64}")


def plain_relative(out: Path, rel: str) -> bool:
    """Whether ``rel`` is a plain relative path inside ``out``: forward slashes, no empty, ``.`` or ``..``
    part, not absolute, no backslash or NUL, and no link on the way that leads out of ``out``."""
    if not rel or "\\" in rel or "\0" in rel or rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        return False
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return False
    if any(out.joinpath(*parts[:i]).is_symlink() for i in range(1, len(parts) + 1)):
        return False
    return (out / rel).resolve().is_relative_to(out.resolve())


def read_record(out: Path) -> dict[str, str]:
    """``out/RECORD``, the files the last cut wrote there (relative path -> SHA-256), or {} when there is
    none. It is trusted only as far as it says something a cut could have written: a JSON object of
    plain relative paths inside ``out`` (``plain_relative``) to SHA-256 digests. Anything else (an
    absolute path, ``../thesis.txt``, a path through a link out of ``out``, a malformed file: a course
    folder shared through git can carry any record) is a ValueError naming the entry, raised before
    anything is moved or deleted: a cut never touches a file outside ``out``."""
    record_file = out / RECORD
    if not record_file.exists() and not record_file.is_symlink():
        return {}
    how = f"delete {record_file} to cut again (the files in {out} are then all kept as edited, in previous-N/)"
    if record_file.is_symlink() or not record_file.is_file():
        raise ValueError(f"--out {out}: its course record {RECORD} is not a plain file; {how}")
    try:
        written = json.loads(record_file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise ValueError(f"--out {out}: its course record {RECORD} is unreadable ({e}); {how}") from None
    if not isinstance(written, dict):
        raise ValueError(f"--out {out}: its course record {RECORD} must hold a JSON object (path -> SHA-256); "
                         f"got {type(written).__name__}; {how}")
    for rel, digest in written.items():
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ValueError(f"--out {out}: entry {rel!r} of its course record {RECORD} must map to a SHA-256 "
                             f"digest (64 hex digits); got {str(digest)[:80]!r}; {how}")
        if not plain_relative(out, rel):
            raise ValueError(f"--out {out}: entry {rel!r} of its course record {RECORD} is not a plain relative "
                             f"path inside {out} (a cut writes nothing else), so the record is not trusted and "
                             f"nothing was moved or deleted; {how}")
    return written


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Kept:
    """Files of OUT that a cut with --force kept in ``folder`` instead of replacing or deleting them."""

    folder: Path
    files: list[str]


def merge_course(staged: Path, out: Path) -> Kept | None:
    """Move the cut in ``staged`` into ``out``, keeping what someone changed there.

    A file of ``out`` that the cut replaces, or that the last cut wrote and this one does not (a chapter
    no longer chosen), is replaced or removed only when it is byte for byte what the last cut wrote
    (``RECORD``); any other (a student's edited notebook, a file no cut wrote) moves into
    ``out/previous-N/`` at the same relative path, as ``train --force`` keeps an old run. Returns what
    was kept (None: nothing)."""
    written = read_record(out)
    new = {p.relative_to(staged).as_posix(): _digest(p) for p in sorted(staged.rglob("*")) if p.is_file()}
    for rel in new:  # a file where the cut needs a folder (OUT/book a file): refused before anything moves
        for parent in list(PurePosixPath(rel).parents)[:-1]:
            if (out / parent).exists() and not (out / parent).is_dir():
                raise ValueError(f"--out {out}: {out / parent} is a file where the course needs a folder (for {rel}); "
                                 "move it away, or cut the course into another folder")
    keep: list[str] = []
    for rel in sorted(set(new) | set(written)):
        dest = out / rel
        if not dest.is_file() or dest.is_symlink():
            continue
        current = _digest(dest)
        if current != new.get(rel) and current != written.get(rel):
            keep.append(rel)
    kept = None
    if keep:
        n = 1
        while (out / f"previous-{n}").exists():
            n += 1
        kept = Kept(out / f"previous-{n}", keep)
        for rel in keep:
            (kept.folder / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(out / rel, kept.folder / rel)
    for rel in set(written) - set(new):  # the last cut's files this cut does not write, unedited
        (out / rel).unlink(missing_ok=True)
    for rel in new:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged / rel, out / rel)
    (out / RECORD).write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    return kept
