"""One writer per run folder: an operating-system lock held for as long as a run (or a save) writes there.

What this module provides
- ``run_lock(run_dir)``: a context manager that holds ``run_dir/.run.lock`` while it is open.
- ``folder_lock(folder, what, why)``: the same lock for any folder one writer at a time may change
  (``python -m companion course`` holds it on its output folder); ``what`` and ``why`` word its refusal.
- ``RunFolderLocked``: the ValueError raised when another live process holds the lock; its message
  names the folder, the process id and host that hold it, and since when.
- ``LOCK_NAME``: the lock file's name (``.run.lock``).

Why a lock and not a check. ``train --out DIR`` refuses a folder that already holds a run, but two
runs started together can both pass that check before either has written a checkpoint; each then
prunes the other's steps (``save_checkpoint``'s ``keep``). The lock closes that window: it is taken
before the check and held until the run ends, so the second run is refused.

How: ``flock`` (``fcntl.flock(fd, LOCK_EX | LOCK_NB)``; ``msvcrt.locking`` on Windows) on the lock
file. The operating system releases it the moment its process ends, however it ends (SIGKILL, a
crash, a power cut), so nothing has to guess whether an owner is alive: the earlier PID file could
neither tell a dead owner from a live unrelated process that reused its PID, nor read a lock that
had become a folder. The file also holds JSON naming the owner (pid, host, since): only the refusal
message reads it. The owner removes the file when it releases the lock, while still holding it; a
process that locked a file which was removed in between sees that its file is no longer the one at
the path and locks again, so two processes never hold two different files of one folder.
Within a process the lock is re-entrant (the ``train`` command holds it for the whole run, and each
``save_checkpoint`` of that run takes it again). A process started by ``fork`` does not hold it: it
opens the file anew and is refused while its parent holds it (it inherits the parent's descriptor,
so the lock lasts until both have ended). Network filesystems without ``flock`` (some NFS mounts)
give a ValueError saying so: run the folder on a local disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

try:  # Unix
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
    import msvcrt

__all__ = ["run_lock", "folder_lock", "RunFolderLocked", "LOCK_NAME"]

LOCK_NAME = ".run.lock"
_HELD: dict[Path, tuple[int, int, int]] = {}  # lock file -> (owner pid, open descriptor, depth) held by this process
_RUN_WHY = "so another run or save writing there would replace its checkpoints"


class RunFolderLocked(ValueError):
    """Another live process holds the folder's lock."""


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock on ``fd`` without waiting; False when another process holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:  # pragma: no cover - Windows: the file's first byte
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):
        return False
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _owner(fd: int) -> dict:
    """The JSON the lock's holder wrote, {} while it is unreadable (being written, or from another tool)."""
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _open(lock: Path, folder: Path, what: str) -> int:
    if lock.is_dir() and not lock.is_symlink():
        raise ValueError(f"{what} {folder}: {lock} is a folder, where the lock file belongs; remove it "
                         f"(rmdir {lock}) and start again")
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{what} {folder}: {lock} is a symbolic link, where the lock file belongs; remove it "
                             "and start again") from None
        if e.errno in (errno.EISDIR, errno.ENOTDIR):
            raise ValueError(f"{what} {folder}: {lock} cannot be a lock file ({e.strerror}); remove it") from None
        raise


def _acquire(folder: Path, what: str, why: str) -> Path:
    lock = folder.resolve() / LOCK_NAME
    held = _HELD.get(lock)
    if held is not None and held[0] == os.getpid():
        _HELD[lock] = (held[0], held[1], held[2] + 1)
        return lock
    while True:
        fd = _open(lock, folder, what)
        try:
            got = _try_lock(fd)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise ValueError(f"{what} {folder} is on a filesystem without file locks ({e.strerror}): two "
                                 "writers could not be kept apart there; use a folder on a local disk") from None
            raise
        if not got:
            owner = _owner(fd)
            os.close(fd)
            who = (f"process {owner.get('pid')} on {owner.get('host')} holds its lock ({lock}, since "
                   f"{owner.get('since')})") if owner.get("pid") else f"another process holds its lock ({lock})"
            raise RunFolderLocked(
                f"{what} {folder} is in use: {who}, {why}. The operating system releases this lock the moment "
                "that process ends, so it is not stale: wait for it to end, or choose another folder")
        try:  # the file locked must still be the one at the path (its last holder may have removed it)
            same = os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = _owner(fd)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    data = (json.dumps(record) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    _HELD[lock] = (os.getpid(), fd, 1)
    if previous.get("pid") not in (None, os.getpid()):  # its holder ended without removing it (killed)
        print(f"note: took over the lock of {what} {folder}: process {previous['pid']} on {previous.get('host')}, "
              "which held it, is no longer running", file=sys.stderr)
    return lock


def _release(lock: Path) -> None:
    pid, fd, depth = _HELD[lock]
    if depth > 1:
        _HELD[lock] = (pid, fd, depth - 1)
        return
    del _HELD[lock]
    with contextlib.suppress(OSError):  # removed while still held: the next holder locks a file of its own
        lock.unlink()
    os.close(fd)  # releases the lock


@contextlib.contextmanager
def folder_lock(folder: Path | str, what: str = "run folder", why: str = _RUN_WHY):
    """Hold ``folder``'s lock (the folder must exist) inside the ``with`` block; ``RunFolderLocked``
    (a ValueError naming the folder and the owner's pid) when another live process holds it."""
    folder = Path(folder)
    try:
        lock = _acquire(folder, what, why)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise ValueError(f"{what} {folder} is not writable: {e.strerror or e}") from None
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ValueError(f"{what} {folder} does not exist (or a part of its path is a file)") from None
        raise
    try:
        yield lock
    finally:
        _release(lock)


def run_lock(run_dir: Path | str):
    """Hold ``run_dir``'s lock inside the ``with`` block (``folder_lock`` for a run folder)."""
    return folder_lock(run_dir)
