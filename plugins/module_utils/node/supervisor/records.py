"""What the supervisor records and shows: times, its states' names, heal attempts, its metrics' families."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from ..textfile import MetricFamily

# The names of the supervisor's states, as each state's text starts: the metrics' state label.
STATE_NAMES = ("starting", "waiting for a launch", "disabled", "watching", "paused", "waiting for nodes",
               "healing", "backing off", "needs attention", "needs reboot")
GIB = 1024**3


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def compact_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def gib_text(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def backing_off(until: float, cause: str) -> str:
    return f"backing off until {iso(until)}: {cause}"


@dataclass
class Attempt:
    started: float
    ended: float


@dataclass(frozen=True)
class Pending:
    """A heal put off by the backoff: its cause, and when it may be attempted."""

    cause: str
    until: float


@dataclass
class Outcome:
    """How a heal attempt ended: healed, failed (why), reboot (needs reboot) or lock_lost."""

    kind: str
    why: str = ""
    holder: str = ""


def state_name(state: str) -> str | None:
    """The name of a state (the start of its text, one of STATE_NAMES); None for a text of no state."""
    for name in STATE_NAMES:
        if state == name or (state.startswith(name) and state[len(name)] in " :("):
            return name
    return None


def supervisor_families(deployment: str, state: str, restarts: int, paused: bool,
                        checked_at: float) -> list[MetricFamily]:
    """The supervisor's metrics (written with ..textfile.TextfileWriter)."""
    labels = {"deployment": deployment}
    current = state_name(state)
    return [
        MetricFamily("sparkserve_supervisor_state", "gauge",
                     "1 for the supervisor's current state, 0 for the others.",
                     [({**labels, "state": name}, 1 if name == current else 0) for name in STATE_NAMES]),
        MetricFamily("sparkserve_supervisor_restarts_total", "counter",
                     "Heal attempts (every rank restarted) the supervisor made since it started, plus those "
                     "its state file recorded when it started.", [(labels, restarts)]),
        MetricFamily("sparkserve_supervisor_paused", "gauge",
                     "1 when the operator's pause file exists, else 0.", [(labels, 1 if paused else 0)]),
        MetricFamily("sparkserve_supervisor_last_check_timestamp_seconds", "gauge",
                     "Unix time the supervisor's last check began.", [(labels, checked_at)]),
    ]
