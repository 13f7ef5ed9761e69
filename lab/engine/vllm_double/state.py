"""The head's view of the engine: loading, serving or dead, and why.

The engine serves once the head's own weights are loaded and every worker
rank has joined and reported its weights loaded. After that, a worker whose
connection drops makes the engine dead for good: ``/health`` answers 503 and
completions fail, while ``/v1/models`` keeps answering, as vLLM does after an
EngineDeadError. A rank lost before the engine serves is fatal: the head exits.
"""

from __future__ import annotations

import enum
import threading

from .logs import Logger


class Phase(enum.Enum):
    LOADING = "loading"
    SERVING = "serving"
    DEAD = "dead"


class EngineState:
    """Thread-safe phase of the engine, fed by the loader and the rendezvous."""

    def __init__(self, nnodes: int, log: Logger) -> None:
        self.nnodes = nnodes
        self._log = log
        self._cond = threading.Condition()
        self._phase = Phase.LOADING
        self._local_loaded = False
        self._joined: set[int] = set()
        self._ready: set[int] = set()
        self.dead_reason = ""
        self.fatal_reason = ""

    @property
    def phase(self) -> Phase:
        with self._cond:
            return self._phase

    def missing_ranks(self) -> list[int]:
        """Worker ranks not yet joined and loaded."""
        with self._cond:
            return [rank for rank in range(1, self.nnodes) if rank not in self._ready]

    def joined(self) -> list[int]:
        """Worker ranks admitted so far."""
        with self._cond:
            return sorted(self._joined)

    def try_join(self, rank: object, nnodes: object) -> str | None:
        """Admit a worker rank; return why it is refused, or None."""
        with self._cond:
            if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank < self.nnodes:
                return "rank %r is out of range: worker ranks are 1 to %d" % (rank, self.nnodes - 1)
            if nnodes != self.nnodes:
                return "rank %d says --nnodes %r but the head has --nnodes %d" % (rank, nnodes, self.nnodes)
            if self._phase is not Phase.LOADING:
                return "the rendezvous is over (engine %s); restart every rank" % self._phase.value
            if rank in self._joined:
                return "rank %d has already joined" % rank
            self._joined.add(rank)
            return None

    def worker_ready(self, rank: int) -> None:
        with self._cond:
            self._ready.add(rank)
            self._maybe_serve()

    def local_loaded(self) -> None:
        with self._cond:
            self._local_loaded = True
            self._maybe_serve()

    def _maybe_serve(self) -> None:
        if self._phase is Phase.LOADING and self._local_loaded and len(self._ready) == self.nnodes - 1:
            self._phase = Phase.SERVING
            self._log.info("engine ready: %d of %d ranks joined and loaded" % (self.nnodes, self.nnodes))
            self._cond.notify_all()

    def rank_lost(self, rank: int, reason: str) -> None:
        """A worker's connection ended: dead engine if serving, fatal if loading."""
        with self._cond:
            if self._phase is Phase.SERVING:
                self._phase = Phase.DEAD
                self.dead_reason = "EngineDeadError: node rank %d is gone (%s)" % (rank, reason)
                self._log.error("engine dead: node rank %d is gone (%s); /health now answers 503" % (rank, reason))
            elif self._phase is Phase.LOADING:
                self._fail_locked("node rank %d was lost while loading (%s)" % (rank, reason))
            self._cond.notify_all()

    def fail(self, reason: str) -> None:
        """A fault that stops the head (exit 1)."""
        with self._cond:
            self._fail_locked(reason)

    def _fail_locked(self, reason: str) -> None:
        if not self.fatal_reason:
            self.fatal_reason = reason
        self._cond.notify_all()

    def wait(self, timeout: float) -> None:
        """Sleep until something changes or ``timeout`` seconds pass."""
        with self._cond:
            self._cond.wait(timeout)
