"""One writer per run folder: a lock file held for as long as a run (or a save) writes there.

What this module provides
- ``run_lock(run_dir)``: a context manager that holds ``run_dir/.run.lock`` while it is open.
- ``RunFolderLocked``: the ValueError raised when another live process holds the lock; its message
  names the folder, the process id and host that hold it, and since when.
- ``LOCK_NAME``: the lock file's name (``.run.lock``).

Why a lock and not a check. ``train --out DIR`` refuses a folder that already holds a run, but two
runs started together can both pass that check before either has written a checkpoint; each then
prunes the other's steps (``save_checkpoint``'s ``keep``). The lock closes that window: it is taken
before the check and held until the run ends, so the second run is refused.

How. The lock file is created with ``O_CREAT | O_EXCL`` (the operating system lets exactly one
process create it) and holds JSON: the owner's pid, host, a random token and the time it was taken.
A lock whose owner is dead (same host, no such pid: a run killed by SIGKILL or a power cut never
removes its lock) is stale: it is taken over, with a note on stderr. A lock of another host cannot be
checked and counts as held. The lock is re-entrant within a process (the ``train`` command holds it
for the whole run, and each ``save_checkpoint`` of that run takes it again), and a process started
by ``fork`` does not inherit it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path

__all__ = ["run_lock", "RunFolderLocked", "LOCK_NAME"]

LOCK_NAME = ".run.lock"
_HELD: dict[Path, tuple[int, str, int]] = {}  # lock file -> (owner pid, token, depth) held by this process
_UNREADABLE_GRACE_S = 5.0  # a lock file still empty after this long was left by a crash between create and write


class RunFolderLocked(ValueError):
    """Another live process holds the run folder's lock."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return True
    return True


def _read(lock: Path) -> dict | None:
    """The lock's owner record, or None while it is unreadable (being written, or left empty by a crash)."""
    try:
        record = json.loads(lock.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else None


def _create(lock: Path, record: dict) -> bool:
    """Create the lock file holding ``record``; False if it exists already."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(record) + "\n")
    return True


def _take_over(lock: Path, seen: str) -> None:
    """Remove a stale lock whose text was ``seen``. It is renamed aside first and checked: if another
    process replaced it in between with a fresh lock of its own, that lock is put back untouched."""
    aside = lock.with_name(f"{lock.name}.stale.{os.getpid()}")
    try:
        os.replace(lock, aside)
    except FileNotFoundError:  # another process took it over first
        return
    try:
        if aside.read_text() != seen:
            with contextlib.suppress(FileExistsError):
                os.link(aside, lock)
    finally:
        aside.unlink(missing_ok=True)


def _acquire(run_dir: Path) -> Path:
    lock = run_dir.resolve() / LOCK_NAME
    held = _HELD.get(lock)
    if held is not None and held[0] == os.getpid():
        _HELD[lock] = (held[0], held[1], held[2] + 1)
        return lock
    record = {"pid": os.getpid(), "host": socket.gethostname(), "token": secrets.token_hex(8),
              "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    first_unreadable = None
    while not _create(lock, record):
        try:
            seen = lock.read_text()
        except FileNotFoundError:
            continue  # released in between: try again
        owner = _read(lock)
        if owner is None:  # created but not yet written, or left empty by a crash
            first_unreadable = first_unreadable or time.monotonic()
            if time.monotonic() - first_unreadable < _UNREADABLE_GRACE_S:
                time.sleep(0.05)
                continue
            print(f"note: took over the lock of run folder {run_dir}: its lock file was unreadable",
                  file=sys.stderr)
            _take_over(lock, seen)
            continue
        same_host = owner.get("host") == record["host"]
        if same_host and not _alive(owner["pid"]):
            print(f"note: took over the lock of run folder {run_dir}: process {owner['pid']} on {owner['host']}, "
                  "which held it, is no longer running", file=sys.stderr)
            _take_over(lock, seen)
            continue
        raise RunFolderLocked(
            f"run folder {run_dir} is in use: process {owner['pid']} on {owner.get('host')} holds its lock "
            f"({lock}, since {owner.get('since')}), so another run or save writing there would replace its "
            "checkpoints. Wait for it to end, or choose another folder"
            + ("" if same_host else f"; if that process has ended, delete {lock}"))
    _HELD[lock] = (os.getpid(), record["token"], 1)
    return lock


def _release(lock: Path) -> None:
    pid, token, depth = _HELD[lock]
    if depth > 1:
        _HELD[lock] = (pid, token, depth - 1)
        return
    del _HELD[lock]
    owner = _read(lock)
    if owner is not None and owner.get("token") == token:  # never delete a lock taken over by another process
        with contextlib.suppress(OSError):
            lock.unlink()


@contextlib.contextmanager
def run_lock(run_dir: Path | str):
    """Hold ``run_dir``'s lock (the folder must exist) inside the ``with`` block; ``RunFolderLocked``
    (a ValueError naming the folder and the owner's pid) when another live process holds it."""
    run_dir = Path(run_dir)
    try:
        lock = _acquire(run_dir)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise ValueError(f"run folder {run_dir} is not writable: {e.strerror or e}") from None
        raise
    try:
        yield lock
    finally:
        _release(lock)
