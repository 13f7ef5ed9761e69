"""A node program's log lines and its end on SIGTERM (or SIGINT)."""

from __future__ import annotations

import contextlib
from types import FrameType
from typing import Iterator, Optional


class Terminated(Exception):  # noqa: N818 (a signal to unwind, like KeyboardInterrupt; not an error)
    """SIGTERM or SIGINT arrived."""


def log(message: str) -> None:
    """One log line on stdout (journald adds the time)."""
    print(message, flush=True)


def on_signal(signum: int, frame: Optional[FrameType]) -> None:
    """A signal handler that unwinds at once."""
    raise Terminated()


class Shutdown:
    """SIGTERM handler: raise Terminated at once, except while a record is being written (deferred)."""

    def __init__(self) -> None:
        self.requested = False
        self.deferred = False

    def handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self.requested = True
        if not self.deferred:
            raise Terminated()

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """Defer a signal that arrives inside the block to its end."""
        was = self.deferred
        self.deferred = True
        try:
            yield
        finally:
            self.deferred = was
        if self.requested and not was:
            raise Terminated()
