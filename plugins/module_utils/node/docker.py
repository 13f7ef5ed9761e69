"""What ``docker inspect`` says of a container: the one reading of the readiness probe and the supervisor."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, List, Optional

# What docker says of a container that does not exist (the daemon's words, or the CLI's).
NO_SUCH_CONTAINER = re.compile(r"no such (container|object)", re.IGNORECASE)
# Docker's StartedAt: RFC 3339 with up to nanoseconds.
STARTED_AT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")

RUNNING, EXITED, OOM, GONE, FAILED = "running", "exited", "oom", "gone", "failed"


def inspect_argv(container: str) -> List[str]:
    """The container's state as one JSON line (``docker inspect --format '{{json .State}}'``)."""
    return ["docker", "inspect", "--type", "container", "--format", "{{json .State}}", container]


def parse_started_at(text: object) -> Optional[float]:
    """Docker's StartedAt as epoch seconds; None for a container never started or an unknown format."""
    match = STARTED_AT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return None
    day, fraction, zone = match.groups()
    stamp = datetime.fromisoformat(f"{day}.{(fraction or '0')[:6].ljust(6, '0')}"
                                   f"{'+00:00' if zone == 'Z' else zone}")
    epoch = stamp.timestamp()
    return epoch if epoch > 0 else None


@dataclass(frozen=True)
class Inspected:
    """One reading of ``docker inspect``.

    status: running; exited; oom (ended by the kernel's out-of-memory killer); gone (no such container);
    failed (docker, or ssh to its node, did not answer in a way that says: ``answer`` holds what it said and
    ``state`` is None).
    """

    status: str
    exit_code: Any = None  # the State's ExitCode, as docker gave it
    started_at: Optional[float] = None
    state: Optional[Dict[str, Any]] = None

    @property
    def stopped(self) -> bool:
        return self.status in (EXITED, OOM, GONE)


def read_inspect(rc: int, out: str, err: str = "") -> Inspected:
    """The container's state from the exit status, stdout and stderr of inspect_argv (a runner that gives both
    in one text passes it as out): the state is the last line of stdout."""
    if rc != 0:
        return Inspected(GONE if NO_SUCH_CONTAINER.search(err + out) else FAILED)
    try:
        state = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        state = None
    if not isinstance(state, dict):
        return Inspected(FAILED)
    started = parse_started_at(state.get("StartedAt"))
    if state.get("Running") is True:
        return Inspected(RUNNING, started_at=started, state=state)
    return Inspected(OOM if state.get("OOMKilled") else EXITED, exit_code=state.get("ExitCode"),
                     started_at=started, state=state)
