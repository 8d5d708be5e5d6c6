"""Files that must never be half-written, and their digests (checkpoints, derived corpora).

What this module provides
- ``write_synced(file, data)``: write a new file, give it its permissions (0644 by default,
  whatever the umask) and fsync it: the one write sequence of every crash-safe save.
- ``atomic_write_bytes(path, data)``: ``write_synced`` to a temporary file beside ``path``, then
  ``os.replace`` it into place, so a crash leaves either the old file or the new one, never a mix.
- ``sha256_file(path)``: the hex SHA-256 digest of a file, read in 1 MiB chunks.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["write_synced", "atomic_write_bytes", "sha256_file"]


def write_synced(file: int | Path | str, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``file`` (a path, created or truncated, or the descriptor of a file open for
    writing, which is closed), set its permissions to ``mode`` whatever the umask (``mkstemp``
    creates 0600; readers of the data need more) and fsync it: when this returns, the bytes are on disk."""
    with os.fdopen(file, "wb") if isinstance(file, int) else open(file, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fchmod(handle.fileno(), mode)
        os.fsync(handle.fileno())


def atomic_write_bytes(path: Path | str, data: bytes, mode: int = 0o644,
                       before_replace: Callable[[], None] | None = None) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + fsync + ``os.replace``), with permissions
    ``mode``. ``before_replace`` is called between the fsync and the rename (a checkpoint's fault hook)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        write_synced(fd, data, mode)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def sha256_file(path: Path | str) -> str:
    """Hex SHA-256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
