#!/usr/bin/python3
"""Memory guard of one node: every sparkserve deployment with a rank on it, one program.

A DGX Spark shares its memory between the CPU and the GPU.  When the ranks run
the node out of memory the kernel stalls or kills something at random, so this
guard ends ONE local rank container first: once memory stayed below a floor for
``samples`` consecutive samples, it kills (or stops) the rank of lowest priority
on the node, appends an event to that deployment's JSONL file and logs one
line.  It never touches anything but the ranks its settings name, the peer ranks
on other nodes included: they fail on their own when their collective breaks,
and the operator stops them.

One guard runs per node (the unit ``sparkserve-memguard.service``), over every
settings file of its folder, one per deployment with a rank on the node
(``/etc/sparkserve/memguard/DEPLOYMENT.json``, written by each deployment's
memguard role run).  Each file says the deployment's rank container, its
priority, floor, samples, watched value, action and where its events and
figures go.

Which rank, and when (the order is also in roles/memguard/README.md):

* Each deployment has its own *window*: its floor, its ``samples`` and its
  ``watch``, counted on the node's samples.  The node acts when ANY
  deployment's window is full (its watched value stayed below its floor for its
  samples): the highest floor of the node is the one that fires first, and
  every rank on the node may be acted on for it, since memory is the node's.
* It acts on one rank: among the deployments whose rank runs, the one of
  lowest ``priority``; equal priorities in the order of the deployments' names.
  It uses THAT deployment's action (kill or stop, with its grace) and records
  the event in that deployment's events file and metrics.  Ranks that do not
  exist (yet, or any more) or do not run are passed over.
* After an action every window starts again: if memory is still low after a new
  full window (``samples`` more low samples), the guard acts on the next rank in
  the order, and so on.  A rank acted on is not acted on again until memory is
  back at or above every floor (a sample in which no window is low).
* With one deployment on the node this is the single-deployment guard it always
  was: one action per low spell, on its own rank.

The guard is started before the rank containers exist (it watches the load
too).  It looks at the containers only when it is due to act, with ``docker
container inspect``, in the order above, until one runs.

``watch`` picks the value: ``MemAvailable``, ``MemFree`` or ``both``.  With
``both`` a sample is low when EITHER value is below the floor, because the page
cache of mmapped weights counts as available and can keep MemAvailable high
while the GPU runs out of memory.

Usage::

    sparkserve-memguard.py --config /etc/sparkserve/memguard     # the node's unit: every DEPLOYMENT.json
    sparkserve-memguard.py --config /etc/sparkserve/memguard/NAME.json  # one deployment alone
    sparkserve-memguard.py --config PATH --check-config   # validate every file, print OK
    sparkserve-memguard.py --config PATH --once           # one sample, then exit

Settings (a JSON object per file; unknown keys are refused)::

    {"deployment": "glm53",            # required, the deployment's name (in a folder: the file is NAME.json)
     "container": "glm53-r0",          # required, this node's rank container of the deployment
     "priority": 0,                    # whole number: the lowest is acted on first (default 0)
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
     "metrics_interval_s": 15,         # number > 0: seconds between two metrics writes
     "at_boot": false}                 # whether the deployment wants the guard after a reboot (the role
                                       # enables the unit when one does); the program only checks it

``events_path`` defaults to ``/var/lib/sparkserve/memguard/DEPLOYMENT.events.jsonl``.  The node samples at
the smallest ``interval_s`` of its files; each file's ``meminfo_path`` is read once a sample.  Two files
may not name the same container.

The folder is looked at every sample: a file added, changed or removed takes
effect at the next sample, with no restart (a removed file drops that rank and
its metrics file; a changed floor, samples or watch starts that deployment's
window again).  A file that is not valid is said once on stderr and left out
(a changed one keeps its last valid settings), so that one deployment's bad file
never disarms the guard of the others; ``--check-config`` refuses it (status
2), and the role runs that check after writing a file.  With one file given
(not a folder) a bad file is refused at start with status 2, as before.
With no file at all the guard idles and keeps looking.

Metrics: for each deployment with ``metrics_path`` the guard writes a Prometheus
node-exporter textfile (node_exporter's textfile collector reads only files named
``*.prom``) at its first sample, then at most every ``metrics_interval_s``
seconds (default 15), with the figures of the sample just taken.  Each write
replaces the whole file (written to a hidden temporary file beside it, then
renamed); the folder must exist.  A file that cannot be written is said once on
stderr and the guard carries on.  SIGTERM (or SIGINT) removes every file, and a
removed settings file removes its deployment's: a stopped guard leaves no
figures; an exit with status 1 leaves them, their timestamp no longer moving,
and ``--once`` leaves the files of its one sample.  Families, each with the
label ``deployment``::

    sparkserve_memguard_floor_bytes                   gauge    floor_bytes
    sparkserve_memguard_mem_available_bytes           gauge    MemAvailable read from meminfo_path
    sparkserve_memguard_mem_free_bytes                gauge    MemFree read from meminfo_path
    sparkserve_memguard_actions_total                 counter  kills or stops of this deployment's rank
                                                               since the guard started (failed ones included)
    sparkserve_memguard_rank_running                  gauge    label container too: 1 when docker
                                                               says the container runs, 0 when it
                                                               does not run or does not exist; no
                                                               sample when docker cannot tell
    sparkserve_memguard_last_sample_timestamp_seconds gauge    unix time of the sample

The container's state for ``rank_running`` is asked (``docker container
inspect``, as when the guard is due) at each metrics write only, and not
while any window is below its floor (docker may be slow then; the write leaves
the sample out).

Behaviour:

* A sample at or above a deployment's floor (every value it watches) resets
  that deployment's window.
* When a window is full the guard is due: it asks docker for the state of each
  rank in the order above that was not acted on in this low spell.  The first
  that runs (or whose state docker cannot tell: the daemon may be slow when
  memory is short) is acted on: ``docker kill CONTAINER`` or ``docker stop -t
  GRACE CONTAINER``.  When none runs it does nothing, stays due and asks again
  at the next low sample, so a rank that appears while memory is low is acted
  on at once.  It logs one line when it becomes due and one when the
  containers' states change; nothing is recorded in the events files.  When
  every rank was acted on already it says so once and keeps watching.
* An action with exit status 0 is recorded as ``killed`` or ``stopped``; any
  other status as ``kill-failed`` or ``stop-failed`` (in ``stop_rc``).  A
  command that cannot be started is recorded with status 127, one that does
  not end in time (60 seconds, plus the grace for a stop) with 124.  The event
  (in the acted-on deployment's file) holds ``time``, ``deployment``,
  ``container``, ``watched``, ``values``, ``floor_bytes``, ``samples``,
  ``action`` and ``stop_rc`` as before, the watch, values, floor and samples being
  those of the window that fired, with ``trigger`` (the deployment of that
  window) and ``priority`` (the acted-on deployment's).
* The only state is the windows' counts and the ranks acted on, kept in memory.
  A restart of the guard starts from zero, so a restart delays an action by at
  most ``samples`` samples.
* SIGTERM (or SIGINT) ends the guard with status 0; an action already under
  way is finished and recorded first.

Exit status: 0 on SIGTERM or after ``--once``; 1 when a meminfo file cannot be
read or lacks a watched value; 2 for a bad config (one file given, or any file
with ``--check-config``) or bad arguments.  Log lines go to stdout, one per
event (journald adds the time); errors about the settings go to stderr.

The guard imports sparkserve's node library (``sparkserve_node``), which the
sparkserve role installs once per node in ``sparkserve_node_library_dir``; the
unit puts that folder on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable, Mapping, Sequence

from sparkserve_node.config import ConfigError
from sparkserve_node.docker import NO_SUCH_CONTAINER
from sparkserve_node.files import append_line
from sparkserve_node.lifecycle import Shutdown, Terminated, log, run_until_terminated
from sparkserve_node.memguard_config import (
    ACTION_DONE,
    ACTION_FAILED,
    DEFAULT_INTERVAL_S,
    GIB,
    SETTINGS_SUFFIX,
    WATCHES,
    Config,
    load_config,
    order_key,
)
from sparkserve_node.memguard_config import OPTIONAL_KEYS as OPTIONAL_KEYS  # the settings' keys, for the tests
from sparkserve_node.memguard_config import REQUIRED_KEYS as REQUIRED_KEYS
from sparkserve_node.memguard_config import parse_config as parse_config
from sparkserve_node.meminfo import MeminfoError, read_meminfo
from sparkserve_node.process import Runner, one_line, run_command
from sparkserve_node.textfile import MetricFamily, MetricSample, TextfileWriter

ACTION_TIMEOUT_S = 60.0
INSPECT_TIMEOUT_S = 10.0


class ContainerState(enum.Enum):
    """What docker says of a rank container when the guard is due."""

    RUNNING = "running"
    NOT_RUNNING = "there but not running"
    ABSENT = "not there"
    UNKNOWN = "of unknown state"


# --- the settings: a folder of files (or one), re-read when they change ----------


@dataclass
class _Read:
    """One settings file as last read: its signature, its last valid settings, and its problem if any."""

    signature: tuple[int, int, int]
    config: Config | None
    problem: str | None


class Settings:
    """The deployments the guard watches: every DEPLOYMENT.json of a folder (the node's unit), or one file.

    ``read`` gives the current settings by deployment, reading again only the files whose signature (mtime,
    size, inode) changed; the files are replaced whole (renamed into place), so a read never sees half of one.
    A file that is not valid is said once (on stderr) and left out, or keeps its last valid settings when it
    had some; a file that is gone is dropped.  ``fixed`` settings (one Config, no file) never change.
    """

    def __init__(self, path: str, folder: bool, fixed: Config | None = None) -> None:
        self.path = path
        self.folder = folder
        self.fixed = fixed
        self.files: dict[str, _Read] = {}
        self.listing_problem: str | None = None
        self.clashes: list[str] = []

    @classmethod
    def of(cls, config: Config) -> Settings:
        """Settings of one deployment given in memory (tests, and a program that loaded its file)."""
        return cls(f"<{config.deployment}>", folder=False, fixed=config)

    def paths(self) -> list[str]:
        """The settings files there are now: the folder's *.json (not hidden), sorted; or the one file."""
        if not self.folder:
            return [self.path] if os.path.exists(self.path) else []
        names = sorted(entry.name for entry in os.scandir(self.path)
                       if entry.name.endswith(SETTINGS_SUFFIX) and not entry.name.startswith("."))
        return [os.path.join(self.path, name) for name in names]

    def load(self, path: str) -> Config:
        """One file's settings; in a folder the file must be named after its deployment."""
        config = load_config(path)
        name = os.path.basename(path)
        if self.folder and name != config.deployment + SETTINGS_SUFFIX:
            raise ConfigError(f"deployment is {json.dumps(config.deployment)} but the file is {name}; "
                              f"name it {config.deployment}{SETTINGS_SUFFIX}")
        return config

    def check(self) -> list[tuple[str, str]]:
        """Every file read afresh, strictly: (path, why) for each one that is not valid, and for clashes."""
        try:
            paths = self.paths()
        except OSError as err:
            return [(self.path, f"cannot read the folder: {err.strerror}")]
        problems: list[tuple[str, str]] = []
        configs: list[tuple[str, Config]] = []
        for path in paths:
            try:
                configs.append((path, self.load(path)))
            except ConfigError as err:
                problems.append((path, str(err)))
        _, clashes = self.without_clashes(configs)
        return problems + clashes

    @staticmethod
    def without_clashes(configs: Iterable[tuple[str, Config]]) -> tuple[dict[str, Config], list[tuple[str, str]]]:
        """The settings by deployment, each container named once: a later file (by name) that names a container
        or a deployment already named is left out, with why."""
        kept: dict[str, Config] = {}
        owners: dict[str, str] = {}
        clashes: list[tuple[str, str]] = []
        for path, config in configs:
            if config.deployment in kept:
                clashes.append((path, f"deployment {config.deployment} has settings already"))
            elif config.container in owners:
                clashes.append((path, f"container {config.container} is deployment "
                                      f"{owners[config.container]}'s already; it is left out"))
            else:
                kept[config.deployment] = config
                owners[config.container] = config.deployment
        return kept, clashes

    def read(self) -> tuple[dict[str, Config], list[str]]:
        """The settings now, by deployment, and the problems newly found (one line each, to say once)."""
        if self.fixed is not None:
            return {self.fixed.deployment: self.fixed}, []
        problems: list[str] = []
        try:
            paths = self.paths()
            self.listing_problem = None
        except FileNotFoundError:
            paths = []
        except OSError as err:  # keep what was read; say it once
            why = f"memguard config {self.path}: cannot read the folder: {err.strerror}; keeping the settings read"
            if why != self.listing_problem:
                problems.append(why)
            self.listing_problem = why
            paths = list(self.files)
        files: dict[str, _Read] = {}
        for path in paths:
            try:
                status = os.stat(path)
            except FileNotFoundError:
                continue
            except OSError:
                if path in self.files:
                    files[path] = self.files[path]
                continue
            signature = (status.st_mtime_ns, status.st_size, status.st_ino)
            known = self.files.get(path)
            if known is not None and known.signature == signature:
                files[path] = known
                continue
            try:
                files[path] = _Read(signature, self.load(path), None)
            except ConfigError as err:
                kept = known.config if known is not None else None
                files[path] = _Read(signature, kept, str(err))
                problems.append(f"memguard config {path}: {err}; "
                                + ("keeping its last valid settings" if kept else "that deployment is not guarded"))
        self.files = files
        kept_configs, clashes = self.without_clashes(
            (path, read.config) for path, read in sorted(files.items()) if read.config is not None)
        lines = [f"memguard config {path}: {why}" for path, why in clashes]
        problems += [line for line in lines if line not in self.clashes]
        self.clashes = lines
        return kept_configs, problems


# --- meminfo and the windows ------------------------------------------------


def gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


class Guard:
    """One deployment's window: counts consecutive samples below its floor and says when the window is full.

    ``observe`` returns True for every low sample from the ``samples``-th on, until ``acted`` is called; after
    that, again from the ``samples``-th further low sample on (the next window).  A sample at or above the floor
    (every watched value) resets the count and the window.
    """

    def __init__(self, floor_bytes: int, samples: int, watch: str) -> None:
        self.floor_bytes = floor_bytes
        self.samples = samples
        self.keys = WATCHES[watch]
        self.low_count = 0
        self.due_at = samples

    def watched(self, values: Mapping[str, int]) -> dict[str, int]:
        """The watched values of a meminfo sample, in bytes."""
        missing = [key for key in self.keys if key not in values]
        if missing:
            raise MeminfoError(f"the sample has no {missing[0]}")
        return {key: values[key] for key in self.keys}

    def is_low(self, values: Mapping[str, int]) -> bool:
        return any(value < self.floor_bytes for value in self.watched(values).values())

    def observe(self, values: Mapping[str, int]) -> bool:
        """Count this sample; True when the window is full (the guard is due to act)."""
        if not self.is_low(values):
            self.low_count = 0
            self.due_at = self.samples
            return False
        self.low_count += 1
        return self.low_count >= self.due_at

    @property
    def progress(self) -> int:
        """How many low samples the current window holds (the count since the last action)."""
        return self.low_count - (self.due_at - self.samples)

    def acted(self) -> None:
        """The guard acted: the next window needs ``samples`` more low samples."""
        self.due_at = self.low_count + self.samples


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


def make_event(config: Config, values: Mapping[str, int], action_rc: int, now: datetime,
               trigger: Config | None = None) -> dict[str, object]:
    """The event of an action on config's rank; trigger: the deployment whose window fired (config's own when
    None), whose watch, floor and samples the event gives."""
    window = trigger or config
    return {
        "time": now.isoformat(timespec="seconds"),
        "deployment": config.deployment,
        "container": config.container,
        "watched": window.watch,
        "values": dict(values),
        "floor_bytes": window.floor_bytes,
        "samples": window.samples,
        "action": (ACTION_DONE if action_rc == 0 else ACTION_FAILED)[config.action],
        "stop_rc": action_rc,
        "trigger": window.deployment,
        "priority": config.priority,
    }


def describe(values: Mapping[str, int]) -> str:
    return ", ".join(f"{key} {gib(value)}" for key, value in values.items())


def below_floor(config: Config, values: Mapping[str, int], count: int) -> str:
    return f"{describe(values)}; below the floor of {gib(config.floor_bytes)} ({count}/{config.samples})"


def below_window(victim: Config, trigger: Config, values: Mapping[str, int]) -> str:
    """What fired, as the action's line says it: the victim's own floor, or another deployment's."""
    if trigger.deployment == victim.deployment:
        return below_floor(victim, values, victim.samples)
    return (f"{describe(values)}; below the floor of {gib(trigger.floor_bytes)} of deployment "
            f"{trigger.deployment} ({trigger.samples}/{trigger.samples})")


def act_on_container(config: Config, values: Mapping[str, int], runner: Runner,
                     trigger: Config | None = None, order: str = "") -> None:
    """Kill or stop the container, record the event in its deployment's file and log it.

    values: the sample of the window that fired (trigger's, config's own when None); order: what the log line
    adds on why this rank (empty with one deployment)."""
    window = trigger or config
    rc, out, err = runner(action_command(config), action_timeout_s(config))
    event = make_event(config, values, rc, datetime.now(timezone.utc), window)
    low = below_window(config, window, values)
    if rc == 0:
        log(f"memguard {config.deployment}: {low}; {ACTION_DONE[config.action]} container {config.container}"
            f"{order}")
    else:
        verb = "killing" if config.action == "kill" else "stopping"
        log(f"memguard {config.deployment}: {low}; {verb} container {config.container}{order} "
            f"failed with status {rc} (is it still running?): {one_line(err or out)}")
    try:
        append_line(config.events_path, json.dumps(event))
    except OSError as err:
        log(f"memguard {config.deployment}: cannot record the event in {config.events_path}: "
            f"{err.strerror}")


# --- metrics: a node_exporter textfile per deployment ------------------------------
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
    """One deployment's metrics for one sample (values: the sample's meminfo, in bytes)."""
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


@dataclass(eq=False)
class Member:
    """One deployment on the node: its settings, its window, its sample and its figures."""

    config: Config
    guard: Guard
    metrics: TextfileWriter | None
    actions: int = 0
    metrics_written_at: float | None = None
    sample: dict[str, int] = field(default_factory=dict)
    values: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, config: Config) -> Member:
        return cls(config, Guard(config.floor_bytes, config.samples, config.watch), writer(config))

    def remove_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.remove()


def writer(config: Config) -> TextfileWriter | None:
    return (TextfileWriter(config.metrics_path, f"memguard {config.deployment}")
            if config.metrics_path is not None else None)


def watching(config: Config) -> str:
    """The line that says what the guard watches for a deployment."""
    what = ("kill (docker kill)" if config.action == "kill"
            else f"stop (docker stop -t {config.stop_grace_s})")
    return (f"watching {' and '.join(WATCHES[config.watch])} in {config.meminfo_path} for container "
            f"{config.container} (priority {config.priority}); floor {gib(config.floor_bytes)}, "
            f"{config.samples} samples of {config.interval_s:g} s, then {what}")


def verb_of(members: Sequence[Member]) -> str:
    actions = {member.config.action for member in members}
    return actions.pop() if len(actions) == 1 else "kill or stop"


class Watch:
    """The node's guard across samples: the deployments' windows, the ranks acted on in this low spell, and the
    containers' states last said while due."""

    def __init__(self, settings: Settings, runner: Runner, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.runner = runner
        self.clock = clock  # for the metrics interval
        self.now = now  # the unix time of a sample
        self.shutdown = Shutdown()
        self.members: dict[str, Member] = {}
        self.acted_on: set[str] = set()  # deployments acted on since memory was last above every floor
        self.waiting: tuple[tuple[str, ContainerState], ...] | None = None  # states said while due, none running
        self.said_nothing_left = False
        self.said_idle = False

    # -- the settings

    def refresh(self) -> None:
        """Take in the settings as they are now: deployments added, changed and removed."""
        configs, problems = self.settings.read()
        for line in problems:
            print(line, file=sys.stderr, flush=True)
        for name in sorted(set(self.members) - set(configs)):
            gone = self.members.pop(name)
            gone.remove_metrics()
            self.acted_on.discard(name)
            log(f"memguard {name}: settings removed; no longer watching container {gone.config.container}")
        for name, config in sorted(configs.items()):
            member = self.members.get(name)
            if member is None:
                self.members[name] = Member.of(config)
                log(f"memguard {name}: {watching(config)}")
            elif member.config != config:
                self.change(member, config)

    def change(self, member: Member, config: Config) -> None:
        old = member.config
        if (old.floor_bytes, old.samples, old.watch) != (config.floor_bytes, config.samples, config.watch):
            member.guard = Guard(config.floor_bytes, config.samples, config.watch)
        if old.metrics_path != config.metrics_path:
            member.remove_metrics()
            member.metrics = writer(config)
            member.metrics_written_at = None
        if old.container != config.container:
            self.acted_on.discard(config.deployment)
        member.config = config
        log(f"memguard {config.deployment}: settings changed; {watching(config)}")

    def interval_s(self) -> float:
        """The node samples at the smallest interval of its deployments."""
        return min((m.config.interval_s for m in self.members.values()), default=DEFAULT_INTERVAL_S)

    def ordered(self) -> list[Member]:
        """The deployments in the order the guard acts on their ranks."""
        return sorted(self.members.values(), key=lambda member: order_key(member.config))

    # -- one sample

    def observe_once(self) -> None:
        """Re-read the settings, take one sample, log a change of state, act on one rank when due."""
        self.refresh()
        if not self.members:
            if not self.said_idle:
                log(f"memguard: no deployment's settings in {self.settings.path}; watching for some")
            self.said_idle = True
            self.acted_on.clear()
            self.waiting = None
            if self.shutdown.requested:
                raise Terminated()
            return
        self.said_idle = False
        members = [self.members[name] for name in sorted(self.members)]
        readings: dict[str, dict[str, int]] = {}
        for member in members:
            path = member.config.meminfo_path
            if path not in readings:
                readings[path] = read_meminfo(path)
            values = readings[path]
            missing = [key for key in member.guard.keys if key not in values]
            if missing:
                raise MeminfoError(f"{path} has no {missing[0]} value")
            member.values = values
            member.sample = member.guard.watched(values)
        sampled_at = self.now()
        due: list[Member] = []
        for member in members:
            was_low = member.guard.low_count > 0
            if member.guard.observe(member.sample):
                due.append(member)
            elif member.guard.low_count == 0 and was_low:
                log(f"memguard {member.config.deployment}: {describe(member.sample)}; back at or above the floor")
        left = [member for member in self.ordered() if member.config.deployment not in self.acted_on]
        if left:
            for member in members:
                if member not in due and 0 < member.guard.progress < member.guard.samples:
                    log(f"memguard {member.config.deployment}: "
                        f"{below_floor(member.config, member.sample, member.guard.progress)}")
        any_low = any(member.guard.low_count > 0 for member in members)
        if not any_low:  # back at or above every floor: the low spell is over
            self.acted_on.clear()
            self.said_nothing_left = False
        if due:
            self.when_due(due, left)
        else:
            self.waiting = None
        if self.shutdown.requested:
            raise Terminated()
        for member in members:
            self.write_metrics(member, sampled_at, any_low)

    @staticmethod
    def trigger(due: Sequence[Member], victim: Member | None) -> Member:
        """The window the action is told by: the victim's own when full, else the full one of highest floor."""
        if victim is not None and victim in due:
            return victim
        return sorted(due, key=lambda m: (-m.config.floor_bytes, m.config.deployment))[0]

    def when_due(self, due: Sequence[Member], left: Sequence[Member]) -> None:
        """Act on the first rank in the order that runs (or whose state docker cannot tell); otherwise say so
        once, and again when the containers' states change, and keep watching."""
        if not left:
            if not self.said_nothing_left:
                trigger = self.trigger(due, None)
                acted = ", ".join(self.members[name].config.container for name in sorted(self.acted_on))
                log(f"memguard {trigger.config.deployment}: {describe(trigger.sample)}; still below the floor of "
                    f"{gib(trigger.config.floor_bytes)} after acting on every rank of the node ({acted}): "
                    f"nothing left to {verb_of(list(self.members.values()))}; still watching")
            self.said_nothing_left = True
            return
        states: list[tuple[Member, ContainerState]] = []
        for member in left:
            config = member.config
            state, detail = container_state(config, self.runner)
            if state in (ContainerState.RUNNING, ContainerState.UNKNOWN):
                if state is ContainerState.UNKNOWN:
                    log(f"memguard {config.deployment}: container {config.container} is of unknown state "
                        f"({detail}); acting on it anyway")
                self.act(member, self.trigger(due, member), passed=[m for m, _ in states])
                return
            states.append((member, state))
        said = tuple((member.config.deployment, state) for member, state in states)
        if self.waiting is None or said != self.waiting:
            trigger = self.trigger(due, None)
            prefix = (below_floor(trigger.config, trigger.sample, trigger.config.samples) + "; "
                      if self.waiting is None else "")
            what = ", ".join(f"container {member.config.container} is {state.value}" for member, state in states)
            log(f"memguard {trigger.config.deployment}: {prefix}{what}: nothing to {verb_of(left)}; still watching")
        self.waiting = said

    def act(self, member: Member, trigger: Member, passed: Sequence[Member]) -> None:
        """Act on member's rank, told by trigger's window; then every window starts again."""
        config = member.config
        order = ""
        if len(self.members) > 1:
            order = f" (priority {config.priority}"
            if passed:
                order += "; not running: " + ", ".join(m.config.container for m in passed)
            if self.acted_on:
                order += "; acted on before: " + ", ".join(
                    self.members[name].config.container for name in sorted(self.acted_on))
            order += ")"
        self.shutdown.deferred = True
        try:
            act_on_container(config, trigger.sample, self.runner, trigger.config, order)
            member.actions += 1
        finally:
            self.shutdown.deferred = False
        self.acted_on.add(config.deployment)
        for each in self.members.values():
            each.guard.acted()
        self.waiting = None

    # -- metrics

    def write_metrics(self, member: Member, sampled_at: float, any_low: bool) -> None:
        """Write a deployment's metrics file at its first sample, then once metrics_interval_s has passed."""
        if member.metrics is None:
            return
        now = self.clock()
        if (member.metrics_written_at is not None
                and now - member.metrics_written_at < member.config.metrics_interval_s):
            return
        member.metrics_written_at = now
        # While memory is low the guard's samples come first: no docker call (it may be slow then), so the
        # figures are written without the rank's state.
        state = container_state(member.config, self.runner)[0] if not any_low else ContainerState.UNKNOWN
        member.metrics.write(memguard_families(member.config, member.values, member.actions,
                                               rank_running_value(state), sampled_at))

    def remove_metrics(self) -> None:
        for member in self.members.values():
            member.remove_metrics()


def run(source: Config | Settings, once: bool, sleep: Callable[[float], None] = time.sleep,
        runner: Runner = run_command, clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time) -> int:
    """Guard the deployments of source (a folder's settings, one file's, or one Config) until SIGTERM."""
    settings = source if isinstance(source, Settings) else Settings.of(source)
    watch = Watch(settings, runner, clock=clock, now=now)

    def step() -> float:
        watch.observe_once()
        return watch.interval_s()

    return run_until_terminated("memguard", watch.shutdown, step, once, sleep,
                                on_terminate=watch.remove_metrics, fatal=(MeminfoError,))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Kill (or stop) the rank of lowest priority on this node when memory stays below a floor.")
    parser.add_argument("--config", required=True,
                        help="the folder of every deployment's settings (DEPLOYMENT.json), or one settings file")
    parser.add_argument("--check-config", action="store_true", help="validate the settings, print OK")
    parser.add_argument("--once", action="store_true", help="take one sample, then exit")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if os.path.isdir(args.config):
        settings = Settings(args.config, folder=True)
        if args.check_config:
            problems = settings.check()
            for path, why in problems:
                print(f"memguard config {path}: {why}", file=sys.stderr, flush=True)
            if problems:
                return 2
            print("OK", flush=True)
            return 0
        return run(settings, once=args.once)
    try:
        load_config(args.config)
    except ConfigError as err:
        print(f"memguard config {args.config}: {err}", file=sys.stderr, flush=True)
        return 2
    if args.check_config:
        print("OK", flush=True)
        return 0
    return run(Settings(args.config, folder=False), once=args.once)


if __name__ == "__main__":
    sys.exit(main())
