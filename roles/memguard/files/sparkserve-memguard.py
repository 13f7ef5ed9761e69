#!/usr/bin/python3
"""Memory guard of one sparkserve deployment on one node.

A DGX Spark shares its memory between the CPU and the GPU.  When a rank runs
the node out of memory the kernel stalls or kills something at random, so this
guard ends the node's own rank container first: once the watched value of
/proc/meminfo stayed below a floor for ``samples`` consecutive samples, it
kills (or stops) that one container, appends an event to a JSONL file and logs
one line.  It never touches anything else, the peer ranks included: they fail
on their own when their collective breaks, and the operator stops them.

The guard is started before the rank container exists (it watches the load
too).  It looks at the container only when it is due to act, with
``docker container inspect``: a container that does not exist (yet, or any
more), or exists but does not run, is left alone and the guard keeps sampling.

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
     "action": "kill",                 # kill (docker kill: SIGKILL, at once) | stop
     "stop_grace_s": 10,               # int >= 0; stop only: docker stop -t GRACE
     "interval_s": 1.0,                # seconds between two samples
     "meminfo_path": "/proc/meminfo",
     "events_path": "/var/lib/sparkserve/memguard/glm53.events.jsonl",
     "docker_command": ["docker"],     # the docker client (tests give a fake one)
     "metrics_path": "/var/lib/node_exporter/textfile/sparkserve-memguard-glm53.prom",
                                       # non-empty string; absent or null: no metrics
     "metrics_interval_s": 15}         # number > 0: seconds between two metrics writes

``events_path`` defaults to ``/var/lib/sparkserve/memguard/DEPLOYMENT.events.jsonl``.

Metrics: with ``metrics_path`` the guard writes a Prometheus node-exporter
textfile (node_exporter's textfile collector reads only files named ``*.prom``)
at its first sample, then at most every ``metrics_interval_s`` seconds (default
15), with the figures of the sample just taken.  Each write replaces the whole
file (written to a hidden temporary file beside it, then renamed); the folder
must exist.  A file that cannot be written is said once on stderr and the guard
carries on.  SIGTERM (or SIGINT) removes the file: a stopped guard leaves no
figures; an exit with status 1 leaves it, its timestamp no longer moving, and
``--once`` leaves the file of its one sample.  Families, each with the label
``deployment``::

    sparkserve_memguard_floor_bytes                   gauge    floor_bytes
    sparkserve_memguard_mem_available_bytes           gauge    MemAvailable read from meminfo_path
    sparkserve_memguard_mem_free_bytes                gauge    MemFree read from meminfo_path
    sparkserve_memguard_actions_total                 counter  kills or stops run since the guard
                                                               started (failed ones included)
    sparkserve_memguard_rank_running                  gauge    label container too: 1 when docker
                                                               says the container runs, 0 when it
                                                               does not run or does not exist; no
                                                               sample when docker cannot tell
    sparkserve_memguard_last_sample_timestamp_seconds gauge    unix time of the sample

The container's state for ``rank_running`` is asked (``docker container
inspect``, as when the guard is due) at each metrics write only, and not
while a sample is below the floor (docker may be slow then; the write leaves
the sample out).

Behaviour:

* A sample at or above the floor (every watched value) resets the count.
* After ``samples`` consecutive low samples the guard is due: it asks docker
  for the container's state.  Running (or a state docker cannot tell: the
  daemon may be slow when memory is short) -> it acts once: ``docker kill
  CONTAINER`` or ``docker stop -t GRACE CONTAINER``, then keeps watching and
  acts again only after a sample at or above the floor and ``samples`` new low
  ones.  Absent or not running -> it does nothing, stays due and asks again at
  the next low sample, so a rank that appears while memory is low is acted on
  at once.  It logs one line when it becomes due and one when the container's
  state changes; nothing is recorded in the events file.
* An action with exit status 0 is recorded as ``killed`` or ``stopped``; any
  other status as ``kill-failed`` or ``stop-failed`` (in ``stop_rc``).  A
  command that cannot be started is recorded with status 127, one that does
  not end in time (60 seconds, plus the grace for a stop) with 124.
* The only state is the count of low samples, kept in memory.  A restart of
  the guard starts the count from zero, so a restart delays an action by at
  most ``samples`` samples.
* SIGTERM (or SIGINT) ends the guard with status 0; an action already under
  way is finished and recorded first.

Exit status: 0 on SIGTERM or after ``--once``; 1 when /proc/meminfo cannot be
read or lacks a watched value; 2 for a bad config or bad arguments.  Log lines
go to stdout, one per event (journald adds the time); errors about the config
go to stderr.

The guard imports sparkserve's node library (``sparkserve_node``), which the
sparkserve role installs once per node in ``sparkserve_node_library_dir``; the
unit puts that folder on PYTHONPATH.
"""

from __future__ import annotations

import enum
import json
import math
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from sparkserve_node.config import ConfigError, is_int, is_number, name_value, read_json, run_config_program
from sparkserve_node.docker import NO_SUCH_CONTAINER
from sparkserve_node.files import append_line
from sparkserve_node.lifecycle import Shutdown, Terminated, log, run_until_terminated
from sparkserve_node.meminfo import MeminfoError, read_meminfo
from sparkserve_node.process import Runner, one_line, run_command
from sparkserve_node.textfile import MetricFamily, MetricSample, TextfileWriter

WATCHES: dict[str, tuple[str, ...]] = {
    "MemAvailable": ("MemAvailable",),
    "MemFree": ("MemFree",),
    "both": ("MemAvailable", "MemFree"),
}
ACTIONS = ("kill", "stop")
# What the event's "action" says: done, and failed.
ACTION_DONE = {"kill": "killed", "stop": "stopped"}
ACTION_FAILED = {"kill": "kill-failed", "stop": "stop-failed"}
REQUIRED_KEYS = ("deployment", "container", "floor_bytes", "samples", "watch")
OPTIONAL_KEYS = ("action", "stop_grace_s", "interval_s", "meminfo_path", "events_path", "docker_command",
                 "metrics_path", "metrics_interval_s")
DEFAULT_ACTION = "kill"
DEFAULT_STOP_GRACE_S = 10
DEFAULT_INTERVAL_S = 1.0
DEFAULT_MEMINFO_PATH = "/proc/meminfo"
DEFAULT_EVENTS_DIR = "/var/lib/sparkserve/memguard"
DEFAULT_DOCKER_COMMAND = ("docker",)
DEFAULT_METRICS_INTERVAL_S = 15.0
ACTION_TIMEOUT_S = 60.0
INSPECT_TIMEOUT_S = 10.0
GIB = 1024**3


class ContainerState(enum.Enum):
    """What docker says of the rank container when the guard is due."""

    RUNNING = "running"
    NOT_RUNNING = "there but not running"
    ABSENT = "not there"
    UNKNOWN = "of unknown state"


@dataclass(frozen=True)
class Config:
    deployment: str
    container: str
    floor_bytes: int
    samples: int
    watch: str
    action: str
    stop_grace_s: int
    interval_s: float
    meminfo_path: str
    events_path: str
    docker_command: tuple[str, ...]
    metrics_path: str | None = None  # None: no metrics
    metrics_interval_s: float = DEFAULT_METRICS_INTERVAL_S


# --- config ---------------------------------------------------------------


def _floor_bytes(raw: Mapping[str, Any]) -> int:
    value = raw["floor_bytes"]
    if not is_int(value) or value <= 0:
        raise ConfigError(
            f"floor_bytes is {json.dumps(value)}; set a whole number of bytes above 0 "
            f"(8589934592 is 8 GiB)"
        )
    return int(value)


def _samples(raw: Mapping[str, Any]) -> int:
    value = raw["samples"]
    if not is_int(value) or value < 1:
        raise ConfigError(f"samples is {json.dumps(value)}; set a whole number of at least 1")
    return int(value)


def _watch(raw: Mapping[str, Any]) -> str:
    value = raw["watch"]
    if not isinstance(value, str) or value not in WATCHES:
        raise ConfigError(f"watch is {json.dumps(value)}; set one of {', '.join(WATCHES)}")
    return value


def _action(raw: Mapping[str, Any]) -> str:
    value = raw.get("action", DEFAULT_ACTION)
    if not isinstance(value, str) or value not in ACTIONS:
        raise ConfigError(
            f"action is {json.dumps(value)}; set kill (docker kill, at once) or stop (docker stop -t stop_grace_s)"
        )
    return value


def _stop_grace_s(raw: Mapping[str, Any]) -> int:
    value = raw.get("stop_grace_s", DEFAULT_STOP_GRACE_S)
    if not is_int(value) or value < 0:
        raise ConfigError(f"stop_grace_s is {json.dumps(value)}; set a whole number of seconds, 0 or more")
    return int(value)


def _interval_s(raw: Mapping[str, Any]) -> float:
    value = raw.get("interval_s", DEFAULT_INTERVAL_S)
    if not is_number(value) or value <= 0:
        raise ConfigError(f"interval_s is {json.dumps(value)}; set a number of seconds above 0")
    return float(value)


def _path(raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} is {json.dumps(value)}; set a file path")
    return value


def _docker_command(raw: Mapping[str, Any]) -> tuple[str, ...]:
    value = raw.get("docker_command", list(DEFAULT_DOCKER_COMMAND))
    if (not isinstance(value, list) or not value
            or not all(isinstance(part, str) and part for part in value)):
        raise ConfigError(
            f'docker_command is {json.dumps(value)}; set a list of non-empty strings, like ["docker"]'
        )
    return tuple(value)


def _metrics_path(raw: Mapping[str, Any]) -> str | None:
    value = raw.get("metrics_path")
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(
            f"metrics_path is {json.dumps(value)}; set the path of the node-exporter textfile, like "
            "/var/lib/node_exporter/textfile/sparkserve-memguard-glm53.prom, or null for no metrics"
        )
    return value


def _metrics_interval_s(raw: Mapping[str, Any]) -> float:
    value = raw.get("metrics_interval_s", DEFAULT_METRICS_INTERVAL_S)
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"metrics_interval_s is {json.dumps(value)}; set a number of seconds above 0")
    return float(value)


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
    deployment = name_value(raw, "deployment")
    container = name_value(raw, "container")
    default_events = f"{DEFAULT_EVENTS_DIR}/{deployment}.events.jsonl"
    return Config(
        deployment=deployment,
        container=container,
        floor_bytes=_floor_bytes(raw),
        samples=_samples(raw),
        watch=_watch(raw),
        action=_action(raw),
        stop_grace_s=_stop_grace_s(raw),
        interval_s=_interval_s(raw),
        meminfo_path=_path(raw, "meminfo_path", DEFAULT_MEMINFO_PATH),
        events_path=_path(raw, "events_path", default_events),
        docker_command=_docker_command(raw),
        metrics_path=_metrics_path(raw),
        metrics_interval_s=_metrics_interval_s(raw),
    )


def load_config(path: str) -> Config:
    """Read and validate the config file; every problem is a ConfigError."""
    return parse_config(read_json(path))


# --- meminfo and the guard ------------------------------------------------


def gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


class Guard:
    """Counts consecutive samples below the floor and says when the guard is due to act.

    ``observe`` returns True for every low sample from the ``samples``-th on,
    until ``acted`` is called; a sample at or above the floor (every watched
    value) resets the count and re-arms the guard after an action.
    """

    def __init__(self, floor_bytes: int, samples: int, watch: str) -> None:
        self.floor_bytes = floor_bytes
        self.samples = samples
        self.keys = WATCHES[watch]
        self.low_count = 0
        self.has_acted = False

    def watched(self, values: Mapping[str, int]) -> dict[str, int]:
        """The watched values of a meminfo sample, in bytes."""
        missing = [key for key in self.keys if key not in values]
        if missing:
            raise MeminfoError(f"the sample has no {missing[0]}")
        return {key: values[key] for key in self.keys}

    def is_low(self, values: Mapping[str, int]) -> bool:
        return any(value < self.floor_bytes for value in self.watched(values).values())

    def observe(self, values: Mapping[str, int]) -> bool:
        """Count this sample; True when the guard is due to act."""
        if not self.is_low(values):
            self.low_count = 0
            self.has_acted = False
            return False
        self.low_count += 1
        return self.low_count >= self.samples and not self.has_acted

    def acted(self) -> None:
        """The action was taken: no other until memory comes back above the floor."""
        self.has_acted = True


# --- docker -----------------------------------------------------------------


def inspect_command(config: Config) -> tuple[str, ...]:
    return (*config.docker_command, "container", "inspect", "--format", "{{.State.Running}}", config.container)


def action_command(config: Config) -> tuple[str, ...]:
    """docker kill CONTAINER, or docker stop -t GRACE CONTAINER."""
    if config.action == "stop":
        return (*config.docker_command, "stop", "-t", str(config.stop_grace_s), config.container)
    return (*config.docker_command, "kill", config.container)


def action_timeout_s(config: Config) -> float:
    return ACTION_TIMEOUT_S + (config.stop_grace_s if config.action == "stop" else 0)


def container_state(config: Config, runner: Runner) -> tuple[ContainerState, str]:
    """The rank container's state, and docker's words when it could not tell."""
    rc, out, err = runner(inspect_command(config), INSPECT_TIMEOUT_S)
    if rc == 0:
        answer = out.strip()
        if answer == "true":
            return ContainerState.RUNNING, ""
        if answer == "false":
            return ContainerState.NOT_RUNNING, ""
        return ContainerState.UNKNOWN, f"docker answered {json.dumps(one_line(out))}"
    words = one_line(err or out)
    if rc == 1 and NO_SUCH_CONTAINER.search(words):
        return ContainerState.ABSENT, ""
    return ContainerState.UNKNOWN, f"docker container inspect failed with status {rc}: {words}"


# --- acting -----------------------------------------------------------------


def make_event(config: Config, values: Mapping[str, int], action_rc: int, now: datetime) -> dict[str, object]:
    return {
        "time": now.isoformat(timespec="seconds"),
        "deployment": config.deployment,
        "container": config.container,
        "watched": config.watch,
        "values": dict(values),
        "floor_bytes": config.floor_bytes,
        "samples": config.samples,
        "action": (ACTION_DONE if action_rc == 0 else ACTION_FAILED)[config.action],
        "stop_rc": action_rc,
    }


def describe(values: Mapping[str, int]) -> str:
    return ", ".join(f"{key} {gib(value)}" for key, value in values.items())


def below_floor(config: Config, values: Mapping[str, int], count: int) -> str:
    return f"{describe(values)}; below the floor of {gib(config.floor_bytes)} ({count}/{config.samples})"


def act_on_container(config: Config, values: Mapping[str, int], runner: Runner) -> None:
    """Kill or stop the container, record the event and log it."""
    rc, out, err = runner(action_command(config), action_timeout_s(config))
    event = make_event(config, values, rc, datetime.now(timezone.utc))
    low = below_floor(config, values, config.samples)
    if rc == 0:
        log(f"memguard {config.deployment}: {low}; {ACTION_DONE[config.action]} container {config.container}")
    else:
        verb = "killing" if config.action == "kill" else "stopping"
        log(f"memguard {config.deployment}: {low}; {verb} container {config.container} "
            f"failed with status {rc} (is it still running?): {one_line(err or out)}")
    try:
        append_line(config.events_path, json.dumps(event))
    except OSError as err:
        log(f"memguard {config.deployment}: cannot record the event in {config.events_path}: "
            f"{err.strerror}")


# --- metrics: a node_exporter textfile ------------------------------------------
# (the file, its text and its writer: sparkserve_node.textfile)


def rank_running_value(state: ContainerState) -> int | None:
    """rank_running: 1 running, 0 not running or absent, None (no sample) when docker cannot tell."""
    if state is ContainerState.RUNNING:
        return 1
    if state in (ContainerState.NOT_RUNNING, ContainerState.ABSENT):
        return 0
    return None


def memguard_families(config: Config, values: Mapping[str, int], actions: int, rank_running: int | None,
                      sampled_at: float) -> list[MetricFamily]:
    """The guard's metrics for one sample (values: the sample's meminfo, in bytes)."""
    deployment = {"deployment": config.deployment}

    def meminfo(key: str) -> list[MetricSample]:
        return [(deployment, values[key])] if key in values else []

    running: list[MetricSample] = ([] if rank_running is None
                                   else [({**deployment, "container": config.container}, rank_running)])
    return [
        MetricFamily("sparkserve_memguard_floor_bytes", "gauge",
                     "The guard's floor in bytes: it acts when a watched value stays below it.",
                     [(deployment, config.floor_bytes)]),
        MetricFamily("sparkserve_memguard_mem_available_bytes", "gauge",
                     "MemAvailable in bytes, as the guard read it from its meminfo file.", meminfo("MemAvailable")),
        MetricFamily("sparkserve_memguard_mem_free_bytes", "gauge",
                     "MemFree in bytes, as the guard read it from its meminfo file.", meminfo("MemFree")),
        MetricFamily("sparkserve_memguard_actions_total", "counter",
                     "Kills or stops of the rank container the guard ran since it started, failed ones included.",
                     [(deployment, actions)]),
        MetricFamily("sparkserve_memguard_rank_running", "gauge",
                     "1 when docker says the rank container runs, 0 when it does not run or does not exist; "
                     "no sample when docker cannot tell.", running),
        MetricFamily("sparkserve_memguard_last_sample_timestamp_seconds", "gauge",
                     "Unix time of the sample these figures come from.", [(deployment, sampled_at)]),
    ]


# --- the loop ---------------------------------------------------------------


class Watch:
    """The guard's state across samples: the count, and the container's state last seen when due."""

    def __init__(self, config: Config, runner: Runner, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], float] = time.time) -> None:
        self.config = config
        self.runner = runner
        self.clock = clock  # for the metrics interval
        self.now = now  # the unix time of a sample
        self.guard = Guard(config.floor_bytes, config.samples, config.watch)
        self.shutdown = Shutdown()
        self.container_seen: ContainerState | None = None
        self.actions = 0
        self.metrics = (TextfileWriter(config.metrics_path, f"memguard {config.deployment}")
                        if config.metrics_path is not None else None)
        self.metrics_written_at: float | None = None

    def observe_once(self) -> None:
        """Take one sample, log a change of state, act on the container when due and it runs."""
        config, guard = self.config, self.guard
        values = read_meminfo(config.meminfo_path)
        sampled_at = self.now()
        missing = [key for key in guard.keys if key not in values]
        if missing:
            raise MeminfoError(f"{config.meminfo_path} has no {missing[0]} value")
        sample = guard.watched(values)
        was_low = guard.low_count > 0
        if guard.observe(sample):
            self.when_due(sample)
        elif 0 < guard.low_count < guard.samples:
            log(f"memguard {config.deployment}: {below_floor(config, sample, guard.low_count)}")
        elif guard.low_count == 0 and was_low:
            log(f"memguard {config.deployment}: {describe(sample)}; back at or above the floor")
        if self.shutdown.requested:
            raise Terminated()
        self.write_metrics(values, sampled_at)

    def write_metrics(self, values: Mapping[str, int], sampled_at: float) -> None:
        """Write the metrics file at the first sample, then once metrics_interval_s has passed."""
        if self.metrics is None:
            return
        now = self.clock()
        if self.metrics_written_at is not None and now - self.metrics_written_at < self.config.metrics_interval_s:
            return
        self.metrics_written_at = now
        # While memory is low the guard's samples come first: no docker call (it may be slow then), so the
        # figures are written without the rank's state.
        state = (container_state(self.config, self.runner)[0] if self.guard.low_count == 0
                 else ContainerState.UNKNOWN)
        self.metrics.write(memguard_families(self.config, values, self.actions, rank_running_value(state),
                                             sampled_at))

    def remove_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.remove()

    def when_due(self, sample: Mapping[str, int]) -> None:
        """Act when the container runs (or docker cannot tell); otherwise say so once and keep watching."""
        config = self.config
        state, detail = container_state(config, self.runner)
        if state in (ContainerState.RUNNING, ContainerState.UNKNOWN):
            if state is ContainerState.UNKNOWN:
                log(f"memguard {config.deployment}: container {config.container} is of unknown state "
                    f"({detail}); acting on it anyway")
            self.container_seen = state
            self.guard.acted()
            self.shutdown.deferred = True
            try:
                act_on_container(config, sample, self.runner)
                self.actions += 1
            finally:
                self.shutdown.deferred = False
            return
        first_due = self.guard.low_count == config.samples
        if first_due or state is not self.container_seen:
            prefix = below_floor(config, sample, config.samples) + "; " if first_due else ""
            log(f"memguard {config.deployment}: {prefix}container {config.container} is {state.value}: "
                f"nothing to {config.action}; still watching")
        self.container_seen = state


def run(config: Config, once: bool, sleep: Callable[[float], None] = time.sleep,
        runner: Runner = run_command, clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time) -> int:
    watch = Watch(config, runner, clock=clock, now=now)
    what = ("kill (docker kill)" if config.action == "kill"
            else f"stop (docker stop -t {config.stop_grace_s})")
    log(f"memguard {config.deployment}: watching {' and '.join(watch.guard.keys)} in {config.meminfo_path} "
        f"for container {config.container}; floor {gib(config.floor_bytes)}, "
        f"{config.samples} samples of {config.interval_s:g} s, then {what}")

    def step() -> float:
        watch.observe_once()
        return config.interval_s

    return run_until_terminated(f"memguard {config.deployment}", watch.shutdown, step, once, sleep,
                                on_terminate=watch.remove_metrics, fatal=(MeminfoError,))


def main(argv: Sequence[str] | None = None) -> int:
    return run_config_program(
        argv, "memguard", "Kill (or stop) this node's rank container when memory stays below a floor.",
        "the guard's JSON config file", "take one sample, then exit", load_config,
        lambda config, once: run(config, once=once))


if __name__ == "__main__":
    sys.exit(main())
