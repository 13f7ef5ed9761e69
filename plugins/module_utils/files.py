"""Writing a file on a node so that a reader sees the old content or the new, never a part of it.

Pure standard library: this runs on the nodes.
"""

from __future__ import annotations

import os
import tempfile


def fsync_dir(path: str) -> None:
    """Make a rename in this folder durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write data to a temporary file beside path with mode, fsync it, rename it over path, fsync the folder."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
