"""The multi-node rendezvous over TCP, in place of torch.distributed's store.

The head (node rank 0) listens on ``--master-port`` on every interface, as
vLLM's store does. Each worker (``--headless``, rank > 0) connects to
``--master-addr:--master-port``, retrying until VLLM_DOUBLE_JOIN_TIMEOUT_S,
and sends ``join`` with its rank and ``--nnodes``. The head refuses a rank out
of range, a rank already joined, a different node count, or any join once the
engine serves. An admitted worker loads its weights, sends ``ready`` (or
``failed``), then both sides exchange heartbeats over the open connection; the
end of that connection is how each side learns the other is gone.

While serving, a request's first step and its last (the answer) are a
collective, as every forward step of a real engine is: the head sends ``step``
to every worker and goes on only when each has answered ``step-done``. A
worker that is stopped (SIGSTOP) or hung holds every completion until it
answers again or the heartbeat timeout counts it lost (the engine is then
dead), so the head never answers from a model part of which is not running.

Messages are JSON objects, one per line.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable

from .logs import Logger
from .state import EngineState, Phase

# How often a collective step that waits for a worker looks whether the engine died meanwhile.
STEP_POLL_S = 0.1


class JoinError(Exception):
    """A worker could not join the head."""


class Channel:
    """JSON lines over a connected socket; ``recv`` returns None at end of stream."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        sock.settimeout(timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._buffer = b""
        self._send_lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n"
        with self._send_lock:
            self.sock.sendall(data)

    def recv(self) -> dict[str, Any] | None:
        """The next message; None when the peer closed; raises OSError (incl. timeout) or ValueError."""
        while b"\n" not in self._buffer:
            block = self.sock.recv(65536)
            if not block:
                return None
            self._buffer += block
        line, _, self._buffer = self._buffer.partition(b"\n")
        message = json.loads(line.decode("utf-8"))
        if not isinstance(message, dict):
            raise ValueError("message is not a JSON object")
        return message

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def heartbeat(channel: Channel, period_s: float, stop: threading.Event) -> None:
    """Send a heartbeat every period until stopped or the connection fails."""
    while not stop.wait(period_s):
        try:
            channel.send({"type": "heartbeat", "at": time.time()})
        except OSError:
            return


def start_heartbeat(channel: Channel, period_s: float, stop: threading.Event) -> None:
    threading.Thread(target=heartbeat, args=(channel, period_s, stop), daemon=True, name="heartbeat").start()


def _lost_reason(exc: BaseException | None) -> str:
    if exc is None:
        return "connection closed"
    if isinstance(exc, TimeoutError):
        return "no heartbeat"
    return "connection error: %s" % exc


# --- head side -------------------------------------------------------------


def listen(master_addr: str, port: int) -> socket.socket:
    """The head's rendezvous socket, bound on every interface of the master address's family."""
    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    sock.listen(64)
    return sock


class HeadRendezvous:
    """Accepts workers on the master port and keeps their connections."""

    def __init__(self, state: EngineState, log: Logger, heartbeat_s: float, timeout_s: float,
                 stop: threading.Event, on_all_joined: Callable[[], None] | None = None) -> None:
        self.state = state
        self.log = log
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.stop = stop
        # Run once, when the last worker rank has joined, before any worker thread reads its "ready": the head's
        # distributed-group init (NCCL's log lines).
        self.on_all_joined = on_all_joined
        self._all_joined_lock = threading.Lock()
        self._all_joined_done = False
        # The worker ranks whose join is logged (_announce).
        self._announced: set[int] = set()
        # The collective: each worker's channel, the last step sent and the last step each worker answered.
        self._steps = threading.Condition()
        self._channels: dict[int, Channel] = {}
        self._step_sent = 0
        self._step_done: dict[int, int] = {}

    def start(self, listener: socket.socket) -> None:
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True, name="rendezvous").start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self.stop.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_worker, args=(conn, peer), daemon=True, name="worker-conn").start()

    def _admit(self, channel: Channel, peer: str) -> int | None:
        """Read the join message and answer it; the admitted rank, or None."""
        try:
            message = channel.recv()
        except (OSError, ValueError) as exc:
            self.log.warning("rendezvous: bad join from %s (%s)" % (peer, exc))
            return None
        if message is None or message.get("type") != "join":
            self.log.warning("rendezvous: %s sent no join message" % peer)
            return None
        rank, nnodes = message.get("rank"), message.get("nnodes")
        refusal = self.state.try_join(rank, nnodes)
        if refusal is not None:
            self.log.warning("rendezvous: refused %s: %s" % (peer, refusal))
            try:
                channel.send({"type": "refuse", "reason": refusal})
            except OSError:
                pass
            return None
        assert isinstance(rank, int)
        try:
            channel.send({"type": "accept", "nnodes": self.state.nnodes})
        except OSError as exc:
            self.state.rank_lost(rank, "connection error during the join: %s" % exc)
            return None
        self._announce(rank, peer)
        return rank

    def _announce(self, rank: int, peer: str) -> None:
        """Log a rank's join, and run on_all_joined once every worker rank's join is logged.

        One lock holds both, so the last join's line comes before what all joined starts (a second worker
        admitted meanwhile is counted only once its own line is out); a thread that comes while it runs waits.
        """
        with self._all_joined_lock:
            self._announced.add(rank)
            self.log.info("rendezvous: node rank %d joined from %s (%d of %d worker ranks)"
                          % (rank, peer, len(self._announced), self.state.nnodes - 1))
            if self.on_all_joined is None or self._all_joined_done or len(self._announced) < self.state.nnodes - 1:
                return
            self._all_joined_done = True
            self.on_all_joined()

    def _serve_worker(self, conn: socket.socket, address: Any) -> None:
        peer = "%s:%s" % (address[0], address[1])
        channel = Channel(conn, self.timeout_s)
        rank = self._admit(channel, peer)
        if rank is None:
            channel.close()
            return
        with self._steps:
            self._channels[rank] = channel
        start_heartbeat(channel, self.heartbeat_s, self.stop)
        self._follow(channel, rank)
        with self._steps:
            self._channels.pop(rank, None)
            self._steps.notify_all()
        channel.close()

    def _follow(self, channel: Channel, rank: int) -> None:
        """Read a worker's messages until its connection ends."""
        error = _read_until_closed(channel, lambda message: self._on_message(rank, message), self.stop)
        if not self.stop.is_set():
            self.state.rank_lost(rank, _lost_reason(error))

    def _on_message(self, rank: int, message: dict) -> None:
        kind = message.get("type")
        if kind == "ready":
            self.log.info("rendezvous: node rank %d is ready (%s)" % (rank, message.get("summary", "weights loaded")))
            self.state.worker_ready(rank)
        elif kind == "failed":
            self.state.fail("node rank %d failed: %s" % (rank, message.get("reason", "unknown")))
        elif kind == "step-done" and isinstance(message.get("step"), int):
            with self._steps:
                self._step_done[rank] = max(self._step_done.get(rank, 0), message["step"])
                self._steps.notify_all()

    def step(self) -> bool:
        """One collective step with every worker: True once each has answered it; False when the engine died
        (or the head stops) first. Steps of concurrent requests overlap; each waits for its own."""
        with self._steps:
            self._step_sent += 1
            number = self._step_sent
            channels = dict(self._channels)
        for channel in channels.values():
            try:
                channel.send({"type": "step", "step": number})
            except OSError:
                pass  # the worker's reader sees its connection end and counts the rank lost
        with self._steps:
            while not all(self._step_done.get(rank, 0) >= number for rank in range(1, self.state.nnodes)):
                if self.stop.is_set() or self.state.phase is not Phase.SERVING:
                    return False
                self._steps.wait(STEP_POLL_S)
        return True


def _read_until_closed(channel: Channel, on_message: Callable[[dict], None],
                       stop: threading.Event | None = None) -> BaseException | None:
    """Hand each message to ``on_message`` until the connection ends (or ``stop`` is set).

    Returns the error that ended the connection, or None when it closed cleanly.
    """
    while stop is None or not stop.is_set():
        try:
            message = channel.recv()
        except (OSError, ValueError) as exc:
            return exc
        if message is None:
            return None
        on_message(message)
    return None


# --- worker side -----------------------------------------------------------


def _connect_until(addr: str, port: int, deadline: float, log: Logger, stop: threading.Event) -> socket.socket:
    """Connect to the head, retrying until the deadline."""
    next_note = time.monotonic()
    while True:
        try:
            return socket.create_connection((addr, port), timeout=2.0)
        except OSError as exc:
            now = time.monotonic()
            if now >= deadline:
                raise JoinError("could not reach the head at %s:%d within the join timeout "
                                "(VLLM_DOUBLE_JOIN_TIMEOUT_S): %s" % (addr, port, exc.strerror or exc)) from exc
            if now >= next_note:
                log.info("waiting for the head at %s:%d (%s)" % (addr, port, exc.strerror or exc))
                next_note = now + 5.0
            if stop.wait(min(0.2, max(0.0, deadline - now))):
                raise JoinError("stopped while waiting for the head") from None


def join_head(addr: str, port: int, rank: int, nnodes: int, timeout_s: float, channel_timeout_s: float,
              log: Logger, stop: threading.Event) -> Channel:
    """Join the head as ``rank``; return the open channel or raise JoinError."""
    deadline = time.monotonic() + timeout_s
    sock = _connect_until(addr, port, deadline, log, stop)
    channel = Channel(sock, channel_timeout_s)
    try:
        channel.send({"type": "join", "rank": rank, "nnodes": nnodes})
        answer = channel.recv()
    except (OSError, ValueError) as exc:
        channel.close()
        raise JoinError("the head at %s:%d did not answer the join (%s)" % (addr, port, exc)) from None
    if answer is None or answer.get("type") != "accept":
        channel.close()
        reason = answer.get("reason", "no reason given") if answer else "connection closed"
        raise JoinError("the head at %s:%d refused node rank %d: %s" % (addr, port, rank, reason))
    return channel


def watch_head(channel: Channel, lost: threading.Event, reason: list[str]) -> None:
    """Read the head's messages until the connection ends, then set ``lost``: answer each collective step,
    ignore heartbeats."""
    def on_message(message: dict) -> None:
        if message.get("type") == "step":
            try:
                channel.send({"type": "step-done", "step": message.get("step")})
            except OSError:
                pass  # the read that follows sees the connection end
    reason.append(_lost_reason(_read_until_closed(channel, on_message)))
    lost.set()
