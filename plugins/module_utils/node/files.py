"""Writing files on a node: a whole file replaced atomically, and one line appended durably."""

from __future__ import annotations

import itertools
import os
from typing import Optional, Union

# Temporary names unique within this process (with its pid): chosen before the file is made, so that whatever
# interrupts the write (a signal raised at any bytecode) knows the name to remove.
_SERIAL = itertools.count()


def fsync_dir(path: str) -> None:
    """Make a rename in this folder durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: Union[bytes, str], mode: int = 0o644, sync: bool = True) -> None:
    """Replace the file at path by one holding data (text is written as UTF-8), so that a reader sees the old
    content or the new, never a part of it.

    The data goes to a hidden temporary file beside path (``.NAME.PID.N.tmp``, which no ``*.prom`` or
    ``*.json`` glob matches; a NAME that starts with a dot keeps its one dot, so ``.sparkserve-*`` stays
    ``.sparkserve-*``) with this mode whatever the umask, is renamed over path, and the temporary file
    is removed when anything fails (an interruption too). With sync (the default) the file and the rename are
    flushed to disk first; a file rewritten every few seconds that is worthless after a crash (a metrics
    textfile) passes sync=False. The folder is not made.
    """
    folder = os.path.dirname(path) or "."
    payload = data.encode("utf-8") if isinstance(data, str) else data
    base = os.path.basename(path)
    tmp = os.path.join(folder, f"{'' if base.startswith('.') else '.'}{base}.{os.getpid()}.{next(_SERIAL)}.tmp")
    try:
        if os.path.lexists(tmp):  # this process's own name: left by an earlier process of the same pid
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if sync:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    if sync:
        fsync_dir(folder)


def append_line(path: str, line: str) -> None:
    """Append one line (a JSON object of an events file) and flush it to disk: the node may die next.

    The folder is made when missing.
    """
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def size_text(count: float) -> str:
    """Bytes as a person reads them: ``512 B``, ``3.2 MiB``, ``41.0 GiB``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


def room_problem(folder: str, needed: int, what: str) -> Optional[str]:
    """Why ``needed`` more bytes of ``what`` do not fit on the file system of folder (or of the nearest folder above
    it that exists); None when they fit. Free space is what an unprivileged writer may use (``f_bavail``)."""
    existing = os.path.abspath(folder)
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    stats = os.statvfs(existing)
    free = stats.f_bavail * stats.f_frsize
    if needed <= free:
        return None
    return (f"no room for {what} under {folder}: {size_text(needed)} still to write, {size_text(free)} free on its "
            f"file system; free {size_text(needed - free)} or more there (old revisions, other files) and run again")
