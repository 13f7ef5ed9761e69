#!/usr/bin/python3
"""Memory guard of one sparkserve deployment on one node.

A DGX Spark shares its memory between the CPU and the GPU.  When a rank runs
the node out of memory the kernel stalls or kills something at random, so this
guard stops the node's own rank container first: once the watched value of
/proc/meminfo stayed below a floor for ``samples`` consecutive samples, it runs
the stop command of that one container, appends an event to a JSONL file and
logs one line.  It never stops anything else, the peer ranks included: they
fail on their own when their collective breaks, and the operator stops them.

``watch`` picks the value: ``MemAvailable``, ``MemFree`` or ``both``.  With
``both`` a sample is low when EITHER value is below the floor, because the page
cache of mmapped weights counts as available and can keep MemAvailable high
while the GPU runs out of memory.

Usage::

    sparkserve-memguard.py --config /etc/sparkserve/memguard/NAME.json
    sparkserve-memguard.py --config FILE --check-config   # validate, print OK
    sparkserve-memguard.py --config FILE --once           # one sample, then exit

Config (JSON object; unknown keys are refused)::

    {"deployment": "glm53",            # required, the deployment's name
     "container": "glm53-r0",          # required, this node's rank container
     "floor_bytes": 8589934592,        # required, int > 0
     "samples": 3,                     # required, int >= 1
     "watch": "both",                  # required, MemAvailable | MemFree | both
     "interval_s": 1.0,                # seconds between two samples
     "meminfo_path": "/proc/meminfo",
     "events_path": "/var/lib/sparkserve/memguard/glm53.events.jsonl",
     "stop_command": ["docker", "stop", "--time", "10", "{container}"]}

``{container}`` in an element of ``stop_command`` is replaced by the container
name; the command must name the container.  ``events_path`` defaults to
``/var/lib/sparkserve/memguard/DEPLOYMENT.events.jsonl``.

Behaviour:

* A sample at or above the floor (every watched value) resets the count.
* After ``samples`` consecutive low samples the guard stops the container once,
  then keeps watching; it stops again only after a sample at or above the
  floor and ``samples`` new low ones.
* A stop with exit status 0 is recorded as ``stopped``; any other status as
  ``stop-failed`` (a container that is gone: ``docker stop`` exits 1).  A stop
  command that cannot be started is recorded with status 127, one that does
  not end within 60 seconds with 124.
* The only state is the count of low samples, kept in memory.  A restart of
  the guard starts the count from zero, so a restart delays a stop by at most
  ``samples`` samples; a guard restarted after a stop may stop the same
  (already stopped) container again, which ``docker stop`` accepts.
* SIGTERM (or SIGINT) ends the guard with status 0; a stop already under way
  is finished and recorded first.

Exit status: 0 on SIGTERM or after ``--once``; 1 when /proc/meminfo cannot be
read or lacks a watched value; 2 for a bad config or bad arguments.  Log lines
go to stdout, one per event (journald adds the time); errors about the config
go to stderr.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Mapping, Sequence

WATCHES: dict[str, tuple[str, ...]] = {
    "MemAvailable": ("MemAvailable",),
    "MemFree": ("MemFree",),
    "both": ("MemAvailable", "MemFree"),
}
REQUIRED_KEYS = ("deployment", "container", "floor_bytes", "samples", "watch")
OPTIONAL_KEYS = ("interval_s", "meminfo_path", "events_path", "stop_command")
DEFAULT_INTERVAL_S = 1.0
DEFAULT_MEMINFO_PATH = "/proc/meminfo"
DEFAULT_EVENTS_DIR = "/var/lib/sparkserve/memguard"
DEFAULT_STOP_COMMAND = ("docker", "stop", "--time", "10", "{container}")
CONTAINER_PLACEHOLDER = "{container}"
# Docker's rule for container names; the deployment name becomes a file name.
NAME_PATTERN = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
STOP_TIMEOUT_S = 60.0
RC_NOT_STARTED = 127
RC_TIMED_OUT = 124
GIB = 1024**3


class ConfigError(Exception):
    """The config file is unusable; the message names the key and the fix."""


class MeminfoError(Exception):
    """/proc/meminfo could not be read or lacks a watched value."""


class Terminated(Exception):  # noqa: N818 (a signal to unwind, like KeyboardInterrupt; not an error)
    """SIGTERM or SIGINT arrived."""


class Action(enum.Enum):
    STOP = "stop"


@dataclass(frozen=True)
class Config:
    deployment: str
    container: str
    floor_bytes: int
    samples: int
    watch: str
    interval_s: float
    meminfo_path: str
    events_path: str
    stop_command: tuple[str, ...]


# --- config ---------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _name(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ConfigError(
            f"{key} is {json.dumps(value)}; set a name of letters, digits, '_', '.' and '-' "
            "that starts with a letter or digit"
        )
    return value


def _floor_bytes(raw: Mapping[str, Any]) -> int:
    value = raw["floor_bytes"]
    if not _is_int(value) or value <= 0:
        raise ConfigError(
            f"floor_bytes is {json.dumps(value)}; set a whole number of bytes above 0 "
            f"(8589934592 is 8 GiB)"
        )
    return int(value)


def _samples(raw: Mapping[str, Any]) -> int:
    value = raw["samples"]
    if not _is_int(value) or value < 1:
        raise ConfigError(f"samples is {json.dumps(value)}; set a whole number of at least 1")
    return int(value)


def _watch(raw: Mapping[str, Any]) -> str:
    value = raw["watch"]
    if not isinstance(value, str) or value not in WATCHES:
        raise ConfigError(f"watch is {json.dumps(value)}; set one of {', '.join(WATCHES)}")
    return value


def _interval_s(raw: Mapping[str, Any]) -> float:
    value = raw.get("interval_s", DEFAULT_INTERVAL_S)
    if not _is_number(value) or value <= 0:
        raise ConfigError(f"interval_s is {json.dumps(value)}; set a number of seconds above 0")
    return float(value)


def _path(raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} is {json.dumps(value)}; set a file path")
    return value


def _stop_command(raw: Mapping[str, Any], container: str) -> tuple[str, ...]:
    value = raw.get("stop_command", list(DEFAULT_STOP_COMMAND))
    if (not isinstance(value, list) or not value
            or not all(isinstance(part, str) and part for part in value)):
        raise ConfigError(
            f"stop_command is {json.dumps(value)}; set a list of non-empty strings, "
            'like ["docker", "stop", "--time", "10", "{container}"]'
        )
    command = tuple(part.replace(CONTAINER_PLACEHOLDER, container) for part in value)
    if not any(container in part for part in command):
        raise ConfigError(
            f"stop_command {json.dumps(value)} does not name the container; "
            "put {container} where the container name goes"
        )
    return command


def parse_config(raw: object) -> Config:
    """Validate a decoded config object and fill in the defaults."""
    if not isinstance(raw, dict):
        raise ConfigError("the config is not a JSON object; write {\"deployment\": ..., ...}")
    unknown = sorted(set(raw) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]}; the keys are {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}"
        )
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise ConfigError(f"{missing[0]} is missing; it is required")
    deployment = _name(raw, "deployment")
    container = _name(raw, "container")
    default_events = f"{DEFAULT_EVENTS_DIR}/{deployment}.events.jsonl"
    return Config(
        deployment=deployment,
        container=container,
        floor_bytes=_floor_bytes(raw),
        samples=_samples(raw),
        watch=_watch(raw),
        interval_s=_interval_s(raw),
        meminfo_path=_path(raw, "meminfo_path", DEFAULT_MEMINFO_PATH),
        events_path=_path(raw, "events_path", default_events),
        stop_command=_stop_command(raw, container),
    )


def load_config(path: str) -> Config:
    """Read and validate the config file; every problem is a ConfigError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read it: {err.strerror}") from err
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"not valid JSON: {err}") from err
    return parse_config(raw)


# --- meminfo and the guard ------------------------------------------------


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse /proc/meminfo; values with a ``kB`` unit become bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not fields or not fields[0].isdigit():
            continue
        unit = fields[1] if len(fields) > 1 else ""
        values[name.strip()] = int(fields[0]) * (1024 if unit == "kB" else 1)
    return values


def read_meminfo(path: str) -> dict[str, int]:
    try:
        return parse_meminfo(Path(path).read_text(encoding="ascii", errors="replace"))
    except OSError as err:
        raise MeminfoError(f"cannot read {path}: {err.strerror}") from err


def gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


class Guard:
    """Counts consecutive samples below the floor and says when to stop.

    The count is the only state; a sample at or above the floor (every watched
    value) resets it and re-arms the guard after a stop.
    """

    def __init__(self, floor_bytes: int, samples: int, watch: str) -> None:
        self.floor_bytes = floor_bytes
        self.samples = samples
        self.keys = WATCHES[watch]
        self.low_count = 0
        self.stopped = False

    def watched(self, values: Mapping[str, int]) -> dict[str, int]:
        """The watched values of a meminfo sample, in bytes."""
        missing = [key for key in self.keys if key not in values]
        if missing:
            raise MeminfoError(f"the sample has no {missing[0]}")
        return {key: values[key] for key in self.keys}

    def is_low(self, values: Mapping[str, int]) -> bool:
        return any(value < self.floor_bytes for value in self.watched(values).values())

    def observe(self, values: Mapping[str, int]) -> Action | None:
        if not self.is_low(values):
            self.low_count = 0
            self.stopped = False
            return None
        self.low_count += 1
        if self.low_count >= self.samples and not self.stopped:
            self.stopped = True
            return Action.STOP
        return None


# --- acting -----------------------------------------------------------------


def run_stop(command: Sequence[str]) -> tuple[int, str]:
    """Run the stop command; its exit status and its output on one line."""
    try:
        done = subprocess.run(
            list(command), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=STOP_TIMEOUT_S, check=False,
        )
    except OSError as err:
        return RC_NOT_STARTED, f"cannot run {command[0]}: {err.strerror}"
    except subprocess.TimeoutExpired:
        return RC_TIMED_OUT, f"no answer after {STOP_TIMEOUT_S:.0f} s"
    output = " ".join((done.stderr.strip() or done.stdout.strip()).split())
    return done.returncode, output


def make_event(config: Config, values: Mapping[str, int], stop_rc: int, now: datetime) -> dict[str, object]:
    return {
        "time": now.isoformat(timespec="seconds"),
        "deployment": config.deployment,
        "container": config.container,
        "watched": config.watch,
        "values": dict(values),
        "floor_bytes": config.floor_bytes,
        "samples": config.samples,
        "action": "stopped" if stop_rc == 0 else "stop-failed",
        "stop_rc": stop_rc,
    }


def append_event(path: str, event: Mapping[str, object]) -> None:
    """Append one JSON line and flush it to disk: the node may die next."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as events:
        events.write(json.dumps(event) + "\n")
        events.flush()
        os.fsync(events.fileno())


def describe(values: Mapping[str, int]) -> str:
    return ", ".join(f"{key} {gib(value)}" for key, value in values.items())


def stop_container(config: Config, values: Mapping[str, int]) -> None:
    """Stop the container, record the event and log it."""
    rc, output = run_stop(config.stop_command)
    event = make_event(config, values, rc, datetime.now(timezone.utc))
    low = f"{describe(values)}; below the floor of {gib(config.floor_bytes)} ({config.samples}/{config.samples})"
    if rc == 0:
        log(f"memguard {config.deployment}: {low}; stopped container {config.container}")
    else:
        log(f"memguard {config.deployment}: {low}; stopping container {config.container} "
            f"failed with status {rc} (is it still running?): {output}")
    try:
        append_event(config.events_path, event)
    except OSError as err:
        log(f"memguard {config.deployment}: cannot record the event in {config.events_path}: "
            f"{err.strerror}")


# --- the loop ---------------------------------------------------------------


def log(message: str) -> None:
    print(message, flush=True)


class Shutdown:
    """SIGTERM handler: raise at once, except while a stop is being recorded."""

    def __init__(self) -> None:
        self.requested = False
        self.deferred = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if not self.deferred:
            raise Terminated()


def observe_once(config: Config, guard: Guard, shutdown: Shutdown) -> None:
    """Take one sample, log a change of state, stop the container when due."""
    values = read_meminfo(config.meminfo_path)
    missing = [key for key in guard.keys if key not in values]
    if missing:
        raise MeminfoError(f"{config.meminfo_path} has no {missing[0]} value")
    sample = guard.watched(values)
    was_low = guard.low_count > 0
    action = guard.observe(sample)
    if action is Action.STOP:
        shutdown.deferred = True
        try:
            stop_container(config, sample)
        finally:
            shutdown.deferred = False
    elif 0 < guard.low_count <= guard.samples and not guard.stopped:
        log(f"memguard {config.deployment}: {describe(sample)}; below the floor of "
            f"{gib(config.floor_bytes)} ({guard.low_count}/{guard.samples})")
    elif guard.low_count == 0 and was_low:
        log(f"memguard {config.deployment}: {describe(sample)}; back at or above the floor")
    if shutdown.requested:
        raise Terminated()


def run(config: Config, once: bool, sleep: Callable[[float], None] = time.sleep) -> int:
    guard = Guard(config.floor_bytes, config.samples, config.watch)
    shutdown = Shutdown()
    previous = {sig: signal.signal(sig, shutdown.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    log(f"memguard {config.deployment}: watching {' and '.join(guard.keys)} in {config.meminfo_path} "
        f"for container {config.container}; floor {gib(config.floor_bytes)}, "
        f"{config.samples} samples of {config.interval_s:g} s")
    try:
        while True:
            observe_once(config, guard, shutdown)
            if once:
                return 0
            sleep(config.interval_s)
    except Terminated:
        shutdown.deferred = True
        log(f"memguard {config.deployment}: terminated; exiting")
        return 0
    except MeminfoError as err:
        log(f"memguard {config.deployment}: {err}; exiting")
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Stop this node's rank container when memory stays below a floor.")
    parser.add_argument("--config", required=True, help="the guard's JSON config file")
    parser.add_argument("--check-config", action="store_true", help="validate the config, print OK")
    parser.add_argument("--once", action="store_true", help="take one sample, then exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"memguard config {args.config}: {err}", file=sys.stderr, flush=True)
        return 2
    if args.check_config:
        print("OK", flush=True)
        return 0
    return run(config, once=args.once)


if __name__ == "__main__":
    sys.exit(main())
