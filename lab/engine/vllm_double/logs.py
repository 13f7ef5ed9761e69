"""Log lines on stdout in vLLM's shape: ``INFO 11-29 23:00:00 [rank 0] message``."""

from __future__ import annotations

import sys
import threading
import time


class Logger:
    """Writes timestamped lines for one rank; safe to use from many threads."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lock = threading.Lock()

    def _write(self, level: str, message: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        line = "%s %s [rank %d] %s\n" % (level, stamp, self.rank, message)
        with self._lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    def info(self, message: str) -> None:
        self._write("INFO", message)

    def warning(self, message: str) -> None:
        self._write("WARNING", message)

    def error(self, message: str) -> None:
        self._write("ERROR", message)
