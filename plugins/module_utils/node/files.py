"""Writing files on a node: a whole file replaced atomically, one line appended durably, and a block of lines
between markers in a file others write too."""

from __future__ import annotations

import itertools
import os
import stat
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

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


def _markers(marker: str) -> Tuple[str, str]:
    return f"# BEGIN {marker}", f"# END {marker}"


def _marked_span(lines: List[str], begin: str, end: str) -> Optional[Tuple[int, int]]:
    """The index of the first BEGIN line and of the first END line after it; None when either is missing."""
    if begin in lines and end in lines[lines.index(begin):]:
        first = lines.index(begin)
        return first, lines.index(end, first)
    return None


def _block_body(marker: str, block: str) -> List[str]:
    """The lines BLOCK becomes with its markers; none for an empty BLOCK (it removes the markers)."""
    begin, end = _markers(marker)
    return [begin, *block.splitlines(), end] if block.strip() else []


def with_block(text: str, marker: str, block: str) -> str:
    """TEXT with the lines between # BEGIN MARKER and # END MARKER (the markers included) made BLOCK with its
    markers, added at the end when they are not there; an empty BLOCK removes them. Every line of the result
    ends with a newline."""
    lines = text.splitlines()
    span = _marked_span(lines, *_markers(marker))
    if span:
        lines[span[0]:span[1] + 1] = _block_body(marker, block)
    else:
        lines += _block_body(marker, block)
    return "".join(line + "\n" for line in lines)


def block_state(text: str, marker: str) -> Dict[str, Any]:
    """What tells, without TEXT itself, whether with_block would leave it as it is (block_in_place): whether
    TEXT is lines that each end with a newline (tidy), and its marked lines, the markers included (None when
    they are not there)."""
    lines = text.splitlines()
    span = _marked_span(lines, *_markers(marker))
    return {"tidy": text == "".join(line + "\n" for line in lines),
            "marked": lines[span[0]:span[1] + 1] if span else None}


def block_in_place(state: Mapping[str, Any], marker: str, block: str) -> bool:
    """Whether with_block(TEXT, MARKER, BLOCK) is TEXT itself, from block_state(TEXT, MARKER)."""
    body = _block_body(marker, block)
    marked = state.get("marked")
    return bool(state.get("tidy")) and (marked == body if marked is not None else not body)


def read_block(path: str, marker: str) -> Dict[str, Any]:
    """block_state of the file at PATH with its path, marker and mode (octal digits); exists is False when
    there is no file, and readable False (and no state) when it is not UTF-8 text or cannot be read."""
    found: Dict[str, Any] = {"path": path, "marker": marker, "exists": os.path.lexists(path), "readable": False}
    if not found["exists"]:
        return found
    try:
        with open(path, encoding="utf-8", newline="") as handle:  # its line ends as they are
            text = handle.read()
        found["mode"] = f"{stat.S_IMODE(os.stat(path).st_mode):04o}"
    except (OSError, UnicodeDecodeError):
        return found
    found.update(block_state(text, marker), readable=True)
    return found
