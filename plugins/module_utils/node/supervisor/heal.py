"""The supervisor of one deployment: a step is one check, and a heal when one is due.

What it watches and does, its states, events and records: roles/supervisor/files/sparkserve-supervisor.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import docker, nccl_log
from ..api import http_request
from ..config import is_number
from ..files import append_line, write_atomic
from ..lifecycle import Shutdown, log
from ..process import Runner, one_line, run_command
from ..textfile import MetricFamily, TextfileWriter
from .config import Config
from .heal_lock import DeploymentLock, LockLost
from .nodes import Nodes, Seen
from .probe import Http, probe
from .records import (
    GIB,
    Attempt,
    Outcome,
    Pending,
    backing_off,
    compact_time,
    gib_text,
    iso,
    supervisor_families,
)
from .render import Render, RenderError, Supervise, read_render

DEFAULT_INTERVAL_S = 15.0  # between steps while there is no render to read the interval from
HOUR_S = 3600.0
MEMORY_POLL_S = 5.0
READY_POLL_S = 2.0
LOCK_MARGIN_S = 300  # added to memory_wait_s and the ready timeout for the heal's lease
CAUSE_LINE_CHARS = 200
DETAIL_CHARS = 200
LOGS_TIMEOUT_S = 60.0
START_TIMEOUT_S = 120.0
SYSTEMCTL_TIMEOUT_S = 60.0
STOP_MARGIN_S = 60.0  # a docker stop may take its grace and this much more


class Supervisor:
    """The supervisor of one deployment; ``step()`` is one check (and a heal when one is due)."""

    def __init__(self, config: Config, runner: Runner = run_command, http: Http = http_request,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.nodes = Nodes(config, runner)
        self.http = http
        self.clock = clock
        self.sleep = sleep
        self.shutdown = Shutdown()
        self.lock = DeploymentLock(config.lock_dir, config.deployment,
                                   f"sparkserve-supervisor on {config.head} (healing)")
        self.state_path = os.path.join(config.state_dir, f"{config.deployment}.state.json")
        self.events_path = os.path.join(config.state_dir, f"{config.deployment}.events.jsonl")
        self.state = "starting"
        self.state_since = clock()
        self.steps = 0
        self.render_key: tuple[str, float] | None = None
        self.failures = 0
        self.attempts: list[Attempt] = []
        self.restarts_total = 0
        self.hold: str | None = None
        self.pending: Pending | None = None
        self.away: tuple[str, ...] = ()
        self.last_check: float | None = None
        self.last_event: dict[str, Any] | None = None
        self.restore()
        # The metrics: the restarts the state file recorded, those of this run, and when a step began.
        self.restarts_at_start = self.restarts_total
        self.restarts_this_run = 0
        self.checked_at = 0.0
        self.metrics = (TextfileWriter(config.metrics_path, f"supervisor {config.deployment}")
                        if config.metrics_path is not None else None)

    # --- state and events

    def restore(self) -> None:
        """Take back the render seen and the attempts from the state file of an earlier run."""
        try:
            data = json.loads(Path(self.state_path).read_text(encoding="utf-8"))
            fingerprint, mtime = data["render"]["fingerprint"], data["render"]["mtime"]
            attempts = [Attempt(float(a), float(b)) for a, b in data["attempts"]]
            total = int(data["restarts_total"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if isinstance(fingerprint, str) and is_number(mtime):
            self.render_key = (fingerprint, float(mtime))
            self.attempts, self.restarts_total = attempts, total
            self.last_event = data.get("last_event") if isinstance(data.get("last_event"), dict) else None

    def recent_attempts(self, now: float) -> list[Attempt]:
        return [attempt for attempt in self.attempts if attempt.started > now - HOUR_S]

    def save_state(self) -> None:
        now = self.clock()
        self.attempts = self.recent_attempts(now)
        data = {
            "deployment": self.config.deployment, "state": self.state, "since": iso(self.state_since),
            "restarts_last_hour": len(self.attempts), "restarts_total": self.restarts_total,
            "last_event": self.last_event, "updated": iso(now), "pid": os.getpid(),
            "render": ({"fingerprint": self.render_key[0], "mtime": self.render_key[1]}
                       if self.render_key is not None else None),
            "attempts": [[attempt.started, attempt.ended] for attempt in self.attempts],
        }
        with self.shutdown.deferring():
            os.makedirs(self.config.state_dir, exist_ok=True)
            write_atomic(self.state_path, json.dumps(data, indent=2) + "\n")

    def set_state(self, state: str) -> None:
        if state != self.state:
            self.state, self.state_since = state, self.clock()
            log(f"supervisor {self.config.deployment}: {state}")
            self.save_state()
            self.write_metrics()
            return
        self.save_state()

    def write_metrics(self) -> None:
        if self.metrics is None:
            return
        pause_file = self.config.pause_file
        self.metrics.write(supervisor_families(
            self.config.deployment, self.state, self.restarts_at_start + self.restarts_this_run,
            pause_file is not None and os.path.exists(pause_file), self.checked_at))

    def remove_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.remove()

    def record(self, event: str, **fields: Any) -> None:
        entry = {"time": iso(self.clock()), "deployment": self.config.deployment, "event": event,
                 "state": self.state, **fields}
        line = json.dumps(entry)
        with self.shutdown.deferring():
            append_line(self.events_path, line)
            print(line, flush=True)
        self.last_event = entry
        self.save_state()

    # --- one step

    def step(self) -> float:
        """One check, and a heal when one is due; the seconds until the next step."""
        self.checked_at = self.clock()
        delay = self.check_step()
        self.write_metrics()
        return delay

    def check_step(self) -> float:
        self.steps += 1
        try:
            render = read_render(self.config)
        except RenderError as err:
            self.set_state(f"waiting for a launch: {self.config.render_path} is unusable: {err}")
            return DEFAULT_INTERVAL_S
        if render is None:
            self.set_state("waiting for a launch")
            return DEFAULT_INTERVAL_S
        self.note_render(render)
        self.check(render)
        return self.delay(render)

    def note_render(self, render: Render) -> None:
        """A new render (a launch, a stop and start): start afresh."""
        if render.key == self.render_key:
            return
        announce = self.render_key is not None or self.steps > 1
        previous = self.render_key[0] if self.render_key is not None else None
        self.render_key = render.key
        self.hold, self.pending, self.failures = None, None, 0
        self.attempts, self.restarts_total = [], 0
        self.away, self.last_check = (), None
        self.set_state("watching")
        if announce:
            self.record("render_changed", fingerprint=render.fingerprint, previous=previous)

    def delay(self, render: Render) -> float:
        interval = render.supervise.interval_s
        if self.pending is None:
            return interval
        return max(0.0, min(interval, self.pending.until - self.clock()))

    def check(self, render: Render) -> None:
        if not render.supervise.enabled:
            self.set_state("disabled: the recipe's supervise.enabled is false")
            return
        now = self.clock()
        other = self.lock.other_holder(now)
        if other is not None:
            self.set_state(f"paused: the deployment is locked by {other['owner']}")
            return
        if self.config.pause_file is not None and os.path.exists(self.config.pause_file):
            self.set_state(f"paused by the operator: {self.config.pause_file} exists")
            return
        if self.hold is not None:
            self.set_state(self.hold)
            return
        if self.pending is not None and now < self.pending.until:
            self.set_state(backing_off(self.pending.until, self.pending.cause))
            return
        seen = [self.nodes.inspect(rank) for rank in render.ranks]
        if self.nodes_away(seen):
            return
        gone = [s for s in seen if s.status == "gone"]
        if gone:
            self.container_gone(render, gone[0])
            return
        if self.pending is not None:
            self.heal(render, self.pending.cause)
            return
        stopped = [s for s in seen if s.stopped]
        cause = "; ".join(s.cause() for s in stopped) or self.fatal_log(render, seen, now)
        if cause:
            self.heal(render, cause)
            return
        self.probe_once(render)

    def nodes_away(self, seen: Sequence[Seen]) -> bool:
        """Say which nodes do not answer (ssh, or docker on them); True when any does not."""
        away: dict[str, str] = {}
        for s in seen:
            if s.status in ("unreachable", "unknown"):
                away.setdefault(s.rank.node, s.detail)
        if not away:
            if self.away:
                log(f"supervisor {self.config.deployment}: every node answers again")
            self.away = ()
            return False
        self.set_state(f"waiting for nodes: {', '.join(away)}")
        if tuple(away) != self.away:
            self.away = tuple(away)
            self.record("node_unreachable", nodes=away)
        return True

    def container_gone(self, render: Render, seen: Seen) -> None:
        """A container the launch created is gone: the supervisor never creates one."""
        self.stop_all(render)
        self.hold = (f"needs attention: rank {seen.rank.rank}'s container {seen.rank.container} is gone; "
                     "run site.yml")
        self.set_state(self.hold)
        self.record("container_gone", cause=seen.cause(), rank=seen.rank.rank, node=seen.rank.node,
                    container=seen.rank.container)

    def fatal_log(self, render: Render, seen: Sequence[Seen], now: float) -> str:
        """The first log line since the previous check matching a fatal pattern, as a cause; empty if none."""
        cause = ""
        if render.fatal_patterns:
            for s in seen:
                cause = self.scan_log(render, s, now)
                if cause:
                    break
        self.last_check = now
        return cause

    def scan_log(self, render: Render, seen: Seen, now: float) -> str:
        # The previous check; the first one, and one after a restart, from the container's start.
        known = [t for t in (self.last_check, seen.started_at) if t is not None]
        since = max(known) if known else now - render.supervise.interval_s
        rank = seen.rank
        rc, out, err = self.nodes.run(rank.node, ["docker", "logs", "--since", str(int(since)), rank.container],
                                      LOGS_TIMEOUT_S)
        if rc != 0:
            log(f"supervisor {self.config.deployment}: cannot read rank {rank.rank}'s log on {rank.node}: "
                f"status {rc}: {one_line(err or out, DETAIL_CHARS)}")
            return ""
        for line in (out + "\n" + err).splitlines():
            if any(pattern.search(line) for pattern in render.fatal_patterns):
                return f"rank {rank.rank} on {rank.node} logged: {line.strip()[:CAUSE_LINE_CHARS]}"
        return ""

    def probe_once(self, render: Render) -> None:
        supervise = render.supervise
        cause = probe(render.api_base, render, self.http, supervise.probe_timeout_s)
        if not cause:
            self.failures = 0
            self.set_state("watching")
            return
        self.failures += 1
        if self.failures >= supervise.failures_before_heal:
            self.heal(render, cause)
            return
        self.set_state(f"watching ({self.failures} of {supervise.failures_before_heal} probes failed: {cause})")

    # --- the heal

    def backoff_s(self, supervise: Supervise, attempt: int) -> float:
        """How long attempt number ``attempt`` of the hour waits after the previous one ended."""
        if attempt < 2:
            return 0.0
        return float(min(supervise.backoff_s * 2 ** (attempt - 2), supervise.backoff_max_s))

    def heal(self, render: Render, cause: str) -> None:
        """One heal attempt, unless the limit is reached or the backoff (or the lock) puts it off."""
        supervise = render.supervise
        now = self.clock()
        recent = self.recent_attempts(now)
        if len(recent) >= supervise.max_restarts_per_hour:
            self.give_up(render, cause, len(recent))
            return
        number = len(recent) + 1
        if recent:
            earliest = self.attempts[-1].ended + self.backoff_s(supervise, number)
            if now < earliest:
                self.pending = Pending(cause, earliest)
                self.set_state(backing_off(earliest, cause))
                return
        lease_s = int(supervise.memory_wait_s + supervise.ready_timeout_s + LOCK_MARGIN_S)
        other = self.lock.take(now, lease_s)
        if other is not None:
            self.set_state(f"paused: the deployment is locked by {other['owner']}")
            return
        attempt = Attempt(now, now)
        self.attempts.append(attempt)
        self.restarts_total += 1
        self.restarts_this_run += 1
        self.pending = None
        try:
            outcome = self.attempt(render, cause, number, lease_s)
            if outcome.kind == "failed":
                self.stop_all(render)
        finally:
            attempt.ended = self.clock()
            self.lock.release()
        if outcome.kind == "failed":
            until = attempt.ended + self.backoff_s(supervise, len(self.recent_attempts(attempt.ended)) + 1)
            self.pending = Pending(cause, until)
            self.set_state(backing_off(until, cause))
            self.record("heal_failed", cause=cause, attempt=number, why=outcome.why)
        elif outcome.kind == "lock_lost":
            self.set_state(f"paused: the deployment is locked by {outcome.holder}")
            self.record("heal_failed", cause=cause, attempt=number, why=outcome.why)

    def give_up(self, render: Render, cause: str, count: int) -> None:
        self.stop_all(render)
        self.pending = None
        self.hold = f"needs attention: restart limit reached ({count} in the last hour); last cause: {cause}"
        self.set_state(self.hold)
        self.record("gave_up", cause=cause, restarts_last_hour=count)

    def phase(self, number: int, what: str, cause: str) -> None:
        self.set_state(f"healing (attempt {number}, {what}): {cause}")

    def attempt(self, render: Render, cause: str, number: int, lease_s: int) -> Outcome:
        """Save the logs, stop every rank, wait for memory, start the ranks in order, wait for readiness."""
        started = self.clock()
        self.phase(number, "saving the logs", cause)
        self.record("heal_started", cause=cause, attempt=number)
        try:
            self.save_logs(render, started)
            self.lock.renew(self.clock(), lease_s)
            self.phase(number, "stopping every rank", cause)
            problems = self.stop_all(render)
            stopped_at = self.clock()
            if problems:
                return Outcome("failed", "; ".join(problems))
            self.lock.renew(stopped_at, lease_s)
            self.phase(number, "waiting for memory", cause)
            short = self.wait_memory(render, cause)
            memory_at = self.clock()
            if short is not None:
                return short
            self.lock.renew(memory_at, lease_s)
            self.phase(number, "starting the ranks", cause)
            self.systemctl(render, "start", self.config.memguard_unit)
            self.systemctl(render, "start", self.config.flusher_unit)
            try:
                problem = self.start_all(render)
                if problem:
                    return Outcome("failed", problem)
                self.lock.renew(self.clock(), lease_s)
                self.phase(number, "waiting for readiness", cause)
                why = self.wait_ready(render) or self.check_transport(render, started)
            finally:
                self.systemctl(render, "stop", self.config.flusher_unit)
        except LockLost as lost:
            return Outcome("lock_lost", f"the lock was taken by {lost.owner} during the heal", lost.owner)
        if why:
            return Outcome("failed", why)
        ready_at = self.clock()
        self.failures, self.last_check = 0, None
        self.set_state("watching")
        self.record("healed", cause=cause, attempt=number, seconds=round(ready_at - started, 1),
                    stopped_s=round(stopped_at - started, 1), memory_s=round(memory_at - stopped_at, 1),
                    ready_s=round(ready_at - memory_at, 1))
        return Outcome("healed")

    def check_transport(self, render: Render, since: float) -> str:
        """After a heal over several nodes, which network every rank's NCCL chose, as the launch reads it (its own
        lines since the heal began): recorded for Prometheus, and why the heal failed when a rank does not use
        RDMA over every twin and the recipe requires it; empty otherwise. A render launched without NCCL's
        report (before sparkserve asked for it) is not read."""
        if len(render.nodes()) < 2 or not render.nccl_reports:
            return ""
        ranks = []
        for rank in render.ranks:
            rc, out, err = self.nodes.run(rank.node, ["docker", "logs", "--since", str(int(since)), rank.container],
                                          LOGS_TIMEOUT_S)
            ranks.append({"rank": rank.rank, "node": rank.node,
                          **nccl_log.rank_report(rc, out, err, self.config.rdma_devices)})
        problems = [f"rank {r['rank']} on {r['node']}: {r['problem']}" for r in ranks if r["problem"]]
        if self.config.metrics_path is not None:
            # The series the launch writes (roles/engine, transport.yml), rewritten after every heal.
            path = os.path.join(os.path.dirname(self.config.metrics_path), f"transport-{self.config.deployment}.prom")
            TextfileWriter(path, f"supervisor {self.config.deployment}").write([MetricFamily(
                nccl_log.TRANSPORT_METRIC, "gauge", nccl_log.TRANSPORT_HELP,
                tuple(nccl_log.transport_samples(self.config.deployment, ranks)))])
        if problems:
            self.record("transport", problems=problems)
        if problems and render.require_rdma:
            return "NCCL does not use RDMA between the nodes: " + "; ".join(problems)
        return ""

    def save_logs(self, render: Render, now: float) -> None:
        """Every rank's last log lines, on the head, before anything is stopped."""
        folder = Path(self.config.state_dir) / self.config.deployment / "logs" / compact_time(now)
        lines = str(render.supervise.log_lines)
        for rank in render.ranks:
            rc, out, errors = self.nodes.run(rank.node, ["docker", "logs", "--tail", lines, rank.container],
                                             LOGS_TIMEOUT_S)
            text = out + errors
            if rc != 0:
                text += f"\n# docker logs failed with status {rc}\n"
            path = folder / f"rank{rank.rank}-{rank.node}.log"
            try:  # a full disk must not keep the deployment down
                folder.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            except OSError as err:
                log(f"supervisor {self.config.deployment}: cannot save rank {rank.rank}'s log in {path}: "
                    f"{err.strerror}")

    def stop_all(self, render: Render) -> list[str]:
        """Stop every rank, the reverse of the start order; the ranks that could not be stopped."""
        problems: list[str] = []
        grace = render.stop_grace_s
        for rank in reversed(render.start_order()):
            rc, out, err = self.nodes.run(rank.node, ["docker", "stop", "-t", str(grace), rank.container],
                                          grace + STOP_MARGIN_S)
            if rc != 0 and not docker.NO_SUCH_CONTAINER.search(err + out):
                problems.append(f"rank {rank.rank} on {rank.node} could not be stopped: docker stop failed with "
                                f"status {rc}: {one_line(err or out, DETAIL_CHARS)}")
        for problem in problems:
            log(f"supervisor {self.config.deployment}: {problem}")
        return problems

    def wait_memory(self, render: Render, cause: str) -> Outcome | None:
        """Wait until MemAvailable is back on every node; None when it is, else how the attempt ends."""
        need = int(render.min_available_gib * GIB)
        deadline = self.clock() + render.supervise.memory_wait_s
        waiting = render.nodes()
        while True:
            readings = {node: self.nodes.memory(node) for node in waiting}
            waiting = [node for node, m in readings.items() if m.available is None or m.available < need]
            if not waiting:
                return None
            if self.clock() >= deadline:
                break
            self.sleep(MEMORY_POLL_S)
        low = {node: readings[node] for node in waiting if readings[node].available is not None}
        if not low:
            return Outcome("failed", "; ".join(f"{node} did not answer: {readings[node].error}" for node in waiting))
        self.hold = "needs reboot: " + "; ".join(
            f"{node} (MemAvailable {gib_text(m.available or 0)}, needs {render.min_available_gib:g} GiB)"
            for node, m in low.items())
        self.set_state(self.hold)
        self.record("needs_reboot", cause=cause, nodes={node: {"mem_available_bytes": m.available,
                                                              "needs_bytes": need} for node, m in low.items()})
        return Outcome("reboot")

    def systemctl(self, render: Render, action: str, unit: str | None) -> None:
        """Start (or stop) a unit on every node: the guard before the load, the flusher around it."""
        if unit is None:
            return
        for node in render.nodes():
            rc, out, err = self.nodes.run(node, ["systemctl", action, unit], SYSTEMCTL_TIMEOUT_S)
            if rc != 0:  # the restart goes on: the units help the load, they do not gate it
                log(f"supervisor {self.config.deployment}: systemctl {action} {unit} on {node} "
                    f"failed with status {rc}: {one_line(err or out, DETAIL_CHARS)}")

    def start_all(self, render: Render) -> str:
        """Start the ranks in the recipe's order; what failed, empty when every rank started."""
        for rank in render.start_order():
            if (rank.rank == 0 and render.order == "workers_first" and render.head_delay_s > 0
                    and len(render.ranks) > 1):
                self.sleep(render.head_delay_s)
            rc, out, err = self.nodes.run(rank.node, ["docker", "start", rank.container], START_TIMEOUT_S)
            if rc != 0:
                return (f"rank {rank.rank} on {rank.node} could not be started: docker start failed with status "
                        f"{rc}: {one_line(err or out, DETAIL_CHARS)}")
        return ""

    def wait_ready(self, render: Render) -> str:
        """Wait for real readiness; why it did not come (a rank stopped again, or the timeout), empty when ready."""
        supervise = render.supervise
        deadline = self.clock() + supervise.ready_timeout_s
        while True:
            stopped = [s for s in (self.nodes.inspect(rank) for rank in render.ranks) if s.stopped]
            if stopped:
                return "; ".join(s.cause() for s in stopped) + " before the deployment was ready"
            timeout = min(supervise.probe_timeout_s, max(deadline - self.clock(), 1.0))
            cause = probe(render.api_base, render, self.http, timeout)
            if not cause:
                return ""
            if self.clock() >= deadline:
                return f"not ready after {supervise.ready_timeout_s:g} s: {cause}"
            self.sleep(READY_POLL_S)

