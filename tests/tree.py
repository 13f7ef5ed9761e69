"""A picture of a folder tree, to show that a run changed nothing under it."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Everything under root that a run could change: kind, mode, inode, mtime and content of each path."""
    found: dict[str, tuple[Any, ...]] = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        content = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
        found[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_ino,
                                              st.st_mtime_ns, content)
    return found
