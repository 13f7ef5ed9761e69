"""A node program's log lines and its end on SIGTERM (or SIGINT)."""

from __future__ import annotations

import contextlib
import signal
from types import FrameType
from typing import Callable, Iterator, Optional, Tuple, Type


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


def run_until_terminated(name: str, shutdown: Shutdown, step: Callable[[], float], once: bool,
                         sleep: Callable[[float], None], on_terminate: Callable[[], None],
                         fatal: Tuple[Type[Exception], ...], cleanup: Callable[[], None] = lambda: None) -> int:
    """A daemon's loop: step, then sleep the seconds it returns, until SIGTERM or SIGINT (or after one step).

    Returns 0 when it ends so (on_terminate first: what the daemon leaves behind, such as its metrics), 1 when a
    step raises one of fatal (logged with name). cleanup runs in every case, then the signal handlers that were
    there before are put back.
    """
    previous = {sig: signal.signal(sig, shutdown.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            delay = step()
            if once:
                return 0
            sleep(delay)
    except Terminated:
        shutdown.deferred = True
        on_terminate()
        log(f"{name}: terminated; exiting")
        return 0
    except fatal as err:
        log(f"{name}: {err}; exiting")
        return 1
    finally:
        cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
