"""Files that must never be half-written, and their digests (checkpoints, derived corpora).

What this module provides
- ``atomic_write_bytes(path, data)``: write to a temporary file beside ``path``, fsync, then
  ``os.replace`` it into place, so a crash leaves either the old file or the new one, never a mix.
- ``sha256_file(path)``: the hex SHA-256 digest of a file, read in 1 MiB chunks.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "sha256_file"]


def atomic_write_bytes(path: Path | str, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + fsync + ``os.replace``), with permissions ``mode``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)  # mkstemp creates 0600; readers of the data need more
            os.fsync(handle.fileno())
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
