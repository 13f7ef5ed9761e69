#!/usr/bin/python3
"""Page-cache flusher of a sparkserve node while the ranks load their weights.

On a DGX Spark the page cache of the weights being read competes with the GPU
for the same unified memory, and loads run out of memory without a flusher.
Each pass syncs, then writes ``3`` to /proc/sys/vm/drop_caches, and logs how
much page cache it freed and how much memory is available afterwards.

Modes:

* ``unconditional`` (default): flush at every pass.  A flusher that waited for
  a threshold still let loads run out of memory.
* ``threshold``: flush only when Cached exceeds the threshold; a pass below it
  does nothing and logs nothing.

The node's flusher
------------------
A node may carry ranks of several deployments.  It runs ONE flusher, the unit
``sparkserve-flusher.service``, for the loads of all of them::

    sparkserve-flusher.py --config /etc/sparkserve/flusher --holds /run/sparkserve/flusher
        --unit sparkserve-flusher.service                                   # one line

* Settings: each deployment's flusher role run writes
  ``/etc/sparkserve/flusher/DEPLOYMENT.json`` (below).
* Holds: a load *holds* the flusher.  Before its ranks start, the launch (or
  the supervisor's heal) starts the deployment's hold unit,
  ``sparkserve-flusher-hold@DEPLOYMENT.service``, which runs ``--hold
  DEPLOYMENT``: it puts the deployment's marker
  ``/run/sparkserve/flusher/DEPLOYMENT.load`` (a JSON object: deployment, pid
  of the hold, since: unix time), starts the node's unit, tells systemd it is
  ready, and waits.  When the load ends (the deployment serves, the launch
  failed, the heal healed or gave up) its launch stops the hold: the marker
  goes, and the node's unit is stopped only when no other deployment's live
  marker is left (``--release DEPLOYMENT``, which the hold runs as it ends and
  the hold unit runs again as its ExecStopPost, so that a hold killed with
  SIGKILL is released too).  A marker is put and the unit started, or a marker
  removed and the unit stopped, under an flock on
  ``/run/sparkserve/flusher/.lock``: one deployment's load ending never stops
  the flusher under another's.
* Stale markers: a hold ends by itself after its deployment's ``timeout_s``
  (the readiness timeout: no load takes longer).  A marker whose hold no
  longer runs (its pid is gone) or that is older than its deployment's
  ``timeout_s`` is stale: the flusher leaves it out, and when no live marker
  is left it removes the stale ones, asks systemd to stop its unit (``systemctl
  stop --no-block``, under the lock, so that a hold that comes next starts it
  again) and exits with status 0.  A run that died never keeps it running.
* Merged settings: when the deployments that hold it ask different things,
  the node flushes as the most demanding one asks: ``unconditional`` when any
  of them is (else ``threshold`` at the lowest threshold), at the shortest
  ``interval_s``.  ``drop_caches_path`` and ``meminfo_path`` are the node's:
  those of the first holding deployment by name (a difference is logged).
* The markers, and the settings of the deployments that hold it, are read
  again before every pass.  A settings file that is missing or not valid is
  logged once and its load is flushed as the defaults ask (unconditional,
  every 2 s, for 3600 s at most); ``--check-config`` refuses it (status 2) and
  the role runs that check.

Settings (a JSON object per file, ``DEPLOYMENT.json``; unknown keys refused)::

    {"deployment": "glm53",          # required: the name the file is named after
     "mode": "unconditional",        # required: unconditional | threshold
     "interval_s": 2.0,              # required: seconds between two passes, > 0
     "threshold_bytes": null,        # threshold mode only, and required there: bytes of Cached, >= 0
     "timeout_s": 3600,              # required: the longest a load of it holds the flusher, > 0
     "drop_caches_path": "/proc/sys/vm/drop_caches",
     "meminfo_path": "/proc/meminfo",
     "metrics_path": "/var/lib/sparkserve/metrics/flusher-glm53.prom"}   # null: no metrics

Holds, by hand or from the hold unit::

    sparkserve-flusher.py --config DIR --holds RUNDIR --unit UNIT --hold NAME      # its ExecStart (Type=notify)
    sparkserve-flusher.py --config DIR --holds RUNDIR --unit UNIT --release NAME   # its ExecStopPost
    sparkserve-flusher.py --config DIR --check-config                              # validate, print OK

``--hold`` needs NAME's settings (status 2 without valid ones), sends
``READY=1`` to $NOTIFY_SOCKET once its marker is there and the unit started,
and exits 0 on SIGTERM or after NAME's ``timeout_s``, releasing its own
marker; it exits 1 when ``systemctl start UNIT`` fails (its marker goes).
``--release`` removes NAME's marker (a stale one too), removes the stale
markers of others and stops the unit when no live marker is left; it exits 1
when ``systemctl stop UNIT`` fails.  ``--systemctl PATH`` names another
systemctl (the tests' double).

One flusher by hand
-------------------
Without ``--config`` the flusher takes its settings as arguments and runs for
one load, as the per-deployment unit of before did.  It stops by itself, with
status 0, when the ``--until-file`` exists (checked before every pass, the
first one included), when ``--timeout-s`` seconds have passed, after
``--passes`` passes (skipped ones count), or on SIGTERM; it logs why::

    sparkserve-flusher.py --until-file /run/sparkserve/NAME.loaded
    sparkserve-flusher.py --mode threshold --threshold-bytes 17179869184
    sparkserve-flusher.py --until-file /run/sparkserve/NAME.loaded --deployment NAME
        --metrics-path /var/lib/node_exporter/textfile/sparkserve-flusher-NAME.prom   # one line

Either way it exits 1 when it cannot write the drop-caches file (it must run as
root) or cannot read Cached and MemAvailable, and 2 for bad arguments.  Log
lines go to stdout, one per event.

Metrics: a Prometheus node-exporter textfile (node_exporter's textfile
collector reads only files named ``*.prom``) per deployment: by hand with
``--metrics-path PATH`` (which needs ``--deployment NAME``, the value of the
``deployment`` label); on the node, at each holding deployment's
``metrics_path``.  It is written when the deployment's load starts holding the
flusher, after every pass made for it, and when its hold ends or the flusher
exits, for whatever reason, with ``running`` 0; the file is left in place, so
that its counters stay visible.  The counters are those of the passes made
while the deployment's load held the flusher, since the flusher started (a
pass made for two loads counts for both).  Each write replaces the whole file
(written to a hidden temporary file beside it, then renamed); the folder must
exist.  A file that cannot be written is said once on stderr and the flusher
carries on.  Families, each with the label ``deployment``::

    sparkserve_flusher_passes_total                  counter  passes done (skipped ones count)
    sparkserve_flusher_freed_bytes_total             counter  page cache its passes freed, bytes
    sparkserve_flusher_running                       gauge    1 while it runs (for this deployment's load),
                                                              0 once it exited (or the hold ended)
    sparkserve_flusher_last_pass_timestamp_seconds   gauge    unix time the last pass ended; 0 before

The flusher imports sparkserve's node library (``sparkserve_node``), which the
sparkserve role installs once per node in ``sparkserve_node_library_dir``; the
units put that folder on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from sparkserve_node.config import NAME_PATTERN, NAME_RULE, ConfigError, is_int, is_number, read_json
from sparkserve_node.files import write_atomic
from sparkserve_node.lifecycle import Terminated, log, on_signal
from sparkserve_node.meminfo import MeminfoError, read_meminfo
from sparkserve_node.process import Runner, one_line, run_command
from sparkserve_node.textfile import MetricFamily, TextfileWriter

MODES = ("unconditional", "threshold")
DEFAULT_INTERVAL_S = 2.0
DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_DROP_CACHES_PATH = "/proc/sys/vm/drop_caches"
DEFAULT_MEMINFO_PATH = "/proc/meminfo"
GIB = 1024**3
# The node's flusher: the settings folder, the loads' markers and the unit (the flusher role's layout).
DEFAULT_CONFIG_DIR = "/etc/sparkserve/flusher"
DEFAULT_HOLDS_DIR = "/run/sparkserve/flusher"
DEFAULT_UNIT = "sparkserve-flusher.service"
MARKER_SUFFIX = ".load"
LOCK_FILE = ".lock"  # in the holds folder; no *.load glob matches it
SYSTEMCTL_TIMEOUT_S = 120.0
DETAIL_CHARS = 300

Reader = Callable[[str], Mapping[str, int]]


class FlushError(Exception):
    """The drop-caches file cannot be written."""


@dataclass(frozen=True)
class Options:
    mode: str
    interval_s: float
    threshold_bytes: int | None
    drop_caches_path: str
    meminfo_path: str
    until_file: str | None
    timeout_s: float
    passes: int | None
    metrics_path: str | None = None  # None: no metrics
    deployment: str | None = None  # the metrics' deployment label; given with metrics_path


@dataclass(frozen=True)
class Sample:
    cached: int
    available: int


# --- meminfo ----------------------------------------------------------------


def take_sample(read: Reader, path: str) -> Sample:
    values = read(path)
    for key in ("Cached", "MemAvailable"):
        if key not in values:
            raise MeminfoError(f"{path} has no {key} value")
    return Sample(cached=values["Cached"], available=values["MemAvailable"])


def gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


# --- one pass ---------------------------------------------------------------


def drop_caches(path: str) -> None:
    try:
        with open(path, "w", encoding="ascii") as drop:
            drop.write("3")
    except PermissionError as err:
        raise FlushError(f"cannot write 3 to {path}: {err.strerror}; run the flusher as root") from err
    except OSError as err:
        raise FlushError(f"cannot write 3 to {path}: {err.strerror}; check --drop-caches-path") from err


def should_flush(options: Options | Plan, before: Sample) -> bool:
    if options.mode == "unconditional" or options.threshold_bytes is None:
        return True
    return before.cached > options.threshold_bytes


@dataclass(frozen=True)
class Flush:
    """The memory before and after a pass that flushed."""

    before: Sample
    after: Sample

    @property
    def freed(self) -> int:
        """The bytes of page cache the pass freed; 0 when the cache grew meanwhile."""
        return max(0, self.before.cached - self.after.cached)

    def line(self, number: int) -> str:
        return (f"flusher: pass {number} freed {gib(self.freed)} of page cache "
                f"(Cached {gib(self.before.cached)} -> {gib(self.after.cached)}); "
                f"MemAvailable {gib(self.after.available)}")


def flush_pass(options: Options | Plan, read: Reader, sync: Callable[[], None]) -> Flush | None:
    """One pass; None when the threshold skipped it."""
    before = take_sample(read, options.meminfo_path)
    if not should_flush(options, before):
        return None
    sync()
    drop_caches(options.drop_caches_path)
    return Flush(before, take_sample(read, options.meminfo_path))


# --- metrics: a node_exporter textfile ------------------------------------------
# (the file, its text and its writer: sparkserve_node.textfile)


@dataclass
class Tally:
    """What the flusher did so far, for its metrics."""

    passes: int = 0
    freed_bytes: int = 0
    last_pass_at: float = 0.0  # unix time; 0 before the first pass


def flusher_families(deployment: str, tally: Tally, running: bool) -> list[MetricFamily]:
    labels = {"deployment": deployment}
    return [
        MetricFamily("sparkserve_flusher_passes_total", "counter",
                     "Passes the flusher made since it started, those the threshold skipped included.",
                     [(labels, tally.passes)]),
        MetricFamily("sparkserve_flusher_freed_bytes_total", "counter",
                     "Bytes of page cache the flusher's passes freed since it started.",
                     [(labels, tally.freed_bytes)]),
        MetricFamily("sparkserve_flusher_running", "gauge",
                     "1 while the flusher runs, 0 once it exited.", [(labels, 1 if running else 0)]),
        MetricFamily("sparkserve_flusher_last_pass_timestamp_seconds", "gauge",
                     "Unix time the flusher's last pass ended; 0 before the first pass.",
                     [(labels, tally.last_pass_at)]),
    ]


# --- the loop ---------------------------------------------------------------


def stop_reason(options: Options, passes_done: int, elapsed_s: float) -> str | None:
    if options.until_file is not None and os.path.exists(options.until_file):
        return f"{options.until_file} exists"
    if elapsed_s >= options.timeout_s:
        return f"the timeout of {options.timeout_s:g} s is reached"
    if options.passes is not None and passes_done >= options.passes:
        return f"{options.passes} passes are done"
    return None


def describe(options: Options) -> str:
    when = ("at every pass" if options.mode == "unconditional"
            else f"when Cached exceeds {gib(options.threshold_bytes or 0)}")
    until = f"until {options.until_file} exists or " if options.until_file else "for "
    return (f"flusher: flushing {when}, every {options.interval_s:g} s, "
            f"{until}{options.timeout_s:g} s at most")


def run(options: Options, read: Reader = read_meminfo, sync: Callable[[], None] = os.sync,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic, now: Callable[[], float] = time.time) -> int:
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    start = clock()
    tally = Tally()
    metrics = TextfileWriter(options.metrics_path, "flusher") if options.metrics_path is not None else None
    deployment = options.deployment or ""

    def write_metrics(running: bool) -> None:
        if metrics is not None:
            metrics.write(flusher_families(deployment, tally, running))

    log(describe(options))
    try:
        write_metrics(running=True)
        while True:
            reason = stop_reason(options, tally.passes, clock() - start)
            if reason is not None:
                log(f"flusher: stopping after {tally.passes} passes: {reason}")
                return 0
            flush = flush_pass(options, read, sync)
            tally.passes += 1  # counted before it is logged: the log never runs ahead of the count
            tally.freed_bytes += flush.freed if flush is not None else 0
            tally.last_pass_at = now()
            if flush is not None:
                log(flush.line(tally.passes))
            write_metrics(running=True)
            if options.passes is None or tally.passes < options.passes:
                remaining = options.timeout_s - (clock() - start)
                sleep(max(0.0, min(options.interval_s, remaining)))
    except Terminated:
        log(f"flusher: terminated after {tally.passes} passes; exiting")
        return 0
    except (FlushError, MeminfoError) as err:
        log(f"flusher: {err}")
        return 1
    finally:
        for sig in previous:  # a second signal does not cut the last write short
            signal.signal(sig, signal.SIG_IGN)
        write_metrics(running=False)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- the node's flusher: settings ------------------------------------------------

SETTINGS_KEYS = ("deployment", "mode", "interval_s", "threshold_bytes", "timeout_s", "drop_caches_path",
                 "meminfo_path", "metrics_path")
REQUIRED_KEYS = ("deployment", "mode", "interval_s", "timeout_s")


@dataclass(frozen=True)
class Settings:
    """What one deployment's load asks of the node's flusher (its DEPLOYMENT.json); the defaults are what a load
    whose settings are missing or not valid is flushed with."""

    deployment: str
    mode: str = "unconditional"
    interval_s: float = DEFAULT_INTERVAL_S
    threshold_bytes: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    drop_caches_path: str = DEFAULT_DROP_CACHES_PATH
    meminfo_path: str = DEFAULT_MEMINFO_PATH
    metrics_path: str | None = None


def _positive(raw: Mapping[str, object], key: str) -> float:
    value = raw[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ConfigError(f"{key} is {json.dumps(value)}; set a number of seconds above 0")
    return float(value)


def _path(raw: Mapping[str, object], key: str, default: str | None) -> str | None:
    value = raw.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(f"{key} is {json.dumps(value)}; set a file path"
                          + (" or null" if default is None else ""))
    return value


def parse_settings(raw: object, name: str) -> Settings:
    """Validate the decoded settings of the deployment name (the file NAME.json)."""
    if not isinstance(raw, dict):
        raise ConfigError('the settings are not a JSON object; write {"deployment": ..., "mode": ..., ...}')
    unknown = sorted(set(raw) - set(SETTINGS_KEYS))
    if unknown:
        raise ConfigError(f"{unknown[0]} is not a setting; the settings are {', '.join(SETTINGS_KEYS)}")
    for key in REQUIRED_KEYS:
        if key not in raw:
            raise ConfigError(f"{key} is missing; it is required")
    deployment = raw["deployment"]
    if not isinstance(deployment, str) or not NAME_PATTERN.fullmatch(deployment):
        raise ConfigError(f"deployment is {json.dumps(deployment)}; set {NAME_RULE}")
    if deployment != name:
        raise ConfigError(f"deployment is {json.dumps(deployment)} in the file of {name}; "
                          "the settings of deployment NAME are NAME.json")
    mode = raw["mode"]
    if mode not in MODES:
        raise ConfigError(f"mode is {json.dumps(mode)}; set {' or '.join(MODES)}")
    threshold = raw.get("threshold_bytes")
    if mode == "threshold" and not (is_int(threshold) and isinstance(threshold, int) and threshold >= 0):
        raise ConfigError(f"threshold_bytes is {json.dumps(threshold)}; mode threshold needs a whole number "
                          "of bytes, 0 or more")
    if mode == "unconditional" and threshold is not None:
        raise ConfigError(f"threshold_bytes is {json.dumps(threshold)}; it applies only to mode threshold "
                          "(write null)")
    return Settings(
        deployment=deployment, mode=mode, interval_s=_positive(raw, "interval_s"),
        threshold_bytes=threshold, timeout_s=_positive(raw, "timeout_s"),
        drop_caches_path=_path(raw, "drop_caches_path", DEFAULT_DROP_CACHES_PATH) or DEFAULT_DROP_CACHES_PATH,
        meminfo_path=_path(raw, "meminfo_path", DEFAULT_MEMINFO_PATH) or DEFAULT_MEMINFO_PATH,
        metrics_path=_path(raw, "metrics_path", None),
    )


def settings_path(config_dir: str, name: str) -> str:
    return os.path.join(config_dir, f"{name}.json")


def load_settings(config_dir: str, name: str) -> Settings:
    """The settings of deployment name; ConfigError when its file is missing or not valid."""
    return parse_settings(read_json(settings_path(config_dir, name)), name)


def settings_files(config_dir: str) -> list[tuple[str, str]]:
    """(deployment, path) of every settings file of the folder, by name."""
    return [(entry[: -len(".json")], os.path.join(config_dir, entry)) for entry in sorted(os.listdir(config_dir))
            if entry.endswith(".json") and not entry.startswith(".")]


# --- the node's flusher: the loads' markers -----------------------------------------


@dataclass(frozen=True)
class Marker:
    """A load's hold on the node's flusher: HOLDS_DIR/DEPLOYMENT.load."""

    deployment: str
    path: str
    pid: int | None  # the hold's process; None when the marker does not say (it is then judged by its age)
    since: float  # unix time the hold began (the file's modification time when the marker does not say)


def marker_path(holds_dir: str, name: str) -> str:
    return os.path.join(holds_dir, f"{name}{MARKER_SUFFIX}")


def marker_text(name: str, pid: int, since: float) -> str:
    return json.dumps({"deployment": name, "pid": pid, "since": round(since, 3)}) + "\n"


def read_marker(path: str, name: str) -> Marker | None:
    """The marker at path, None when there is none. One that is not a JSON object of the hold (written by hand)
    is a marker all the same, of no pid, since the file's modification time."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    pid = data.get("pid") if isinstance(data, dict) else None
    since = data.get("since") if isinstance(data, dict) else None
    return Marker(name, path, pid if is_int(pid) and isinstance(pid, int) and pid > 0 else None,
                  float(since) if is_number(since) and isinstance(since, (int, float)) else mtime)


def read_markers(holds_dir: str) -> list[Marker]:
    """Every marker of the folder, by deployment; none when there is no folder (after a reboot)."""
    try:
        entries = sorted(os.listdir(holds_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        name = entry[: -len(MARKER_SUFFIX)]
        if entry.endswith(MARKER_SUFFIX) and NAME_PATTERN.fullmatch(name):
            marker = read_marker(os.path.join(holds_dir, entry), name)
            if marker is not None:
                found.append(marker)
    return found


def pid_runs(pid: int) -> bool:
    """Whether the process runs: it exists (as another user too) and is not a zombie nobody reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def stale_reason(marker: Marker, timeout_s: float, now: float) -> str | None:
    """Why the marker no longer holds the flusher; None while it does."""
    if marker.pid is not None and not pid_runs(marker.pid):
        return f"its hold (pid {marker.pid}) no longer runs"
    if now - marker.since >= timeout_s:
        return f"it is older than the deployment's timeout_s of {timeout_s:g} s"
    return None


@dataclass(frozen=True)
class Holds:
    """The markers of the holds folder, judged."""

    live: list[tuple[Marker, Settings]]
    stale: list[tuple[Marker, str]]
    bad: dict[str, str]  # a live or stale marker's deployment -> why its settings are not used


def look(config_dir: str, holds_dir: str, now: float) -> Holds:
    """The holds of the folder, each with its deployment's settings (the defaults when they are not valid)."""
    live: list[tuple[Marker, Settings]] = []
    stale: list[tuple[Marker, str]] = []
    bad: dict[str, str] = {}
    for marker in read_markers(holds_dir):
        try:
            settings = load_settings(config_dir, marker.deployment)
        except ConfigError as err:
            bad[marker.deployment] = f"{settings_path(config_dir, marker.deployment)}: {err}"
            settings = Settings(marker.deployment)
        why = stale_reason(marker, settings.timeout_s, now)
        if why is None:
            live.append((marker, settings))
        else:
            stale.append((marker, why))
    return Holds(live, stale, bad)


@contextlib.contextmanager
def holds_lock(holds_dir: str) -> Iterator[None]:
    """The holds folder's flock: markers are put, removed and judged, and the unit started or stopped, under it."""
    os.makedirs(holds_dir, mode=0o755, exist_ok=True)
    fd = os.open(os.path.join(holds_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove(path: str) -> bool:
    """Remove a file; whether it was there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def drop_stale(holds: Holds, who: str) -> None:
    for marker, why in holds.stale:
        if remove(marker.path):
            log(f"{who}: removed the stale marker {marker.path}: {why}")


# --- the node's flusher: merged settings ----------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How the node flushes for the loads that hold it: as the most demanding one asks."""

    mode: str
    threshold_bytes: int | None
    interval_s: float
    drop_caches_path: str
    meminfo_path: str
    deployments: tuple[str, ...]


def merge(settings: Sequence[Settings]) -> Plan:
    """unconditional when any asks it (else threshold at the lowest threshold), at the shortest interval; the
    paths of the first deployment by name. settings must not be empty."""
    ordered = sorted(settings, key=lambda one: one.deployment)
    first = ordered[0]
    unconditional = any(one.mode == "unconditional" for one in ordered)
    return Plan(
        mode="unconditional" if unconditional else "threshold",
        threshold_bytes=None if unconditional else min(one.threshold_bytes or 0 for one in ordered),
        interval_s=min(one.interval_s for one in ordered),
        drop_caches_path=first.drop_caches_path, meminfo_path=first.meminfo_path,
        deployments=tuple(one.deployment for one in ordered),
    )


def path_conflicts(settings: Sequence[Settings]) -> list[str]:
    """What the node's paths leave out: a holding deployment whose drop_caches_path or meminfo_path is not the
    first one's."""
    ordered = sorted(settings, key=lambda one: one.deployment)
    first, lines = ordered[0], []
    for one in ordered[1:]:
        for key in ("drop_caches_path", "meminfo_path"):
            if getattr(one, key) != getattr(first, key):
                lines.append(f"flusher: {one.deployment}'s {key} {getattr(one, key)} is not {first.deployment}'s "
                             f"{getattr(first, key)}; the node's flusher uses {first.deployment}'s")
    return lines


def describe_plan(plan: Plan) -> str:
    when = ("at every pass" if plan.mode == "unconditional"
            else f"when Cached exceeds {gib(plan.threshold_bytes or 0)}")
    return (f"flusher: flushing {when}, every {plan.interval_s:g} s, "
            f"for the load{'s' if len(plan.deployments) > 1 else ''} of {', '.join(plan.deployments)}")


# --- the node's flusher: the commands ----------------------------------------------


@dataclass(frozen=True)
class NodeCommand:
    """The node's flusher (--config): run, hold, release or check."""

    action: str  # run | hold | release | check
    config_dir: str
    holds_dir: str = DEFAULT_HOLDS_DIR
    unit: str = DEFAULT_UNIT
    systemctl: str = "systemctl"
    deployment: str = ""  # hold and release
    passes: int | None = None  # run: stop after this many passes (the tests)


def systemctl(command: NodeCommand, run: Runner, action: str, *flags: str) -> str:
    """systemctl ACTION [FLAGS] UNIT; why it failed, empty when it did not."""
    rc, out, err = run([command.systemctl, action, *flags, command.unit], SYSTEMCTL_TIMEOUT_S)
    if rc == 0:
        return ""
    return (f"systemctl {action} {command.unit} failed with status {rc}: "
            f"{one_line(err or out, DETAIL_CHARS) or 'no message'}")


def notify_ready() -> None:
    """Tell systemd the hold is in place (Type=notify): READY=1 on $NOTIFY_SOCKET; nothing outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    target = "\0" + address[1:] if address.startswith("@") else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(target)
            sock.sendall(b"READY=1")
    except OSError as err:
        log(f"flusher: cannot tell systemd the hold is ready on {address}: {err.strerror or err}")


def release(command: NodeCommand, run: Runner = run_command, now: Callable[[], float] = time.time,
            own_pid: int | None = None) -> int:
    """Remove the deployment's marker (only the one of pid own_pid when given: a hold releasing itself) and the
    stale ones, and stop the unit when no live marker is left."""
    name = command.deployment
    who = f"flusher release {name}"
    with holds_lock(command.holds_dir):
        marker = read_marker(marker_path(command.holds_dir, name), name)
        if marker is not None and (own_pid is None or marker.pid == own_pid) and remove(marker.path):
            log(f"{who}: removed {marker.path}")
        holds = look(command.config_dir, command.holds_dir, now())
        drop_stale(holds, who)
        if holds.live:
            others = ", ".join(sorted({one.deployment for _, one in holds.live}))
            log(f"{who}: {command.unit} runs on: the load of {others} holds it")
            return 0
        why = systemctl(command, run, "stop")
        if why:
            log(f"{who}: {why}")
            return 1
        log(f"{who}: no load holds {command.unit} any more: stopped")
        return 0


def hold(command: NodeCommand, run: Runner = run_command, now: Callable[[], float] = time.time,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
         notify: Callable[[], None] = notify_ready) -> int:
    """Hold the node's flusher for the deployment's load until SIGTERM or its timeout_s, then release it."""
    name = command.deployment
    who = f"flusher hold {name}"
    try:
        settings = load_settings(command.config_dir, name)
    except ConfigError as err:
        log(f"{who}: {settings_path(command.config_dir, name)}: {err}; run the flusher role for {name} (site.yml)")
        return 2
    pid = os.getpid()
    path = marker_path(command.holds_dir, name)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        try:
            with holds_lock(command.holds_dir):
                write_atomic(path, marker_text(name, pid, now()), sync=False)
                why = systemctl(command, run, "start")
                if why:
                    remove(path)
                    log(f"{who}: {why}")
                    return 1
            log(f"{who}: the load of {name} holds {command.unit} ({path}) until it ends, "
                f"{settings.timeout_s:g} s at most")
            notify()
            deadline = clock() + settings.timeout_s
            while clock() < deadline:
                sleep(deadline - clock())
            ended = f"the timeout of {settings.timeout_s:g} s is reached"
        except Terminated:
            ended = "terminated"
        except OSError as err:
            ended, status = f"it failed: {err}", 1
        finally:
            for sig in previous:  # a second signal does not cut the release short
                signal.signal(sig, signal.SIG_IGN)
        log(f"{who}: the hold ends: {ended}")
        return max(status, release(command, run, now, own_pid=pid))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Account:
    """One deployment's figures in this run of the node's flusher."""

    tally: Tally = field(default_factory=Tally)
    writer: TextfileWriter | None = None
    metrics_path: str | None = None
    holding: bool = False


class NodeFlusher:
    """The node's flusher: it flushes while a live marker holds it, as the most demanding load asks."""

    def __init__(self, command: NodeCommand, run: Runner, now: Callable[[], float]) -> None:
        self.command = command
        self.run = run
        self.now = now
        self.accounts: dict[str, Account] = {}
        self.said: set[str] = set()
        self.plan: Plan | None = None
        self.passes = 0

    def say_once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            log(line)

    def write(self, name: str, account: Account) -> None:
        if account.writer is not None:
            account.writer.write(flusher_families(name, account.tally, account.holding))

    def look(self) -> Holds:
        """The holds now; the figures of a load that starts or stops holding the flusher are written."""
        holds = look(self.command.config_dir, self.command.holds_dir, self.now())
        for name, why in holds.bad.items():
            self.say_once(f"bad {name} {why}", f"flusher: {why}; the load of {name} is flushed as the defaults ask")
        for marker, why in holds.stale:
            self.say_once(f"stale {marker.path} {marker.since} {why}",
                          f"flusher: leaving out the hold of {marker.deployment} ({marker.path}): {why}")
        holding = {settings.deployment: settings for _, settings in holds.live}
        for name, account in self.accounts.items():
            if account.holding and name not in holding:
                account.holding = False
                self.write(name, account)
        for name, settings in holding.items():
            account = self.accounts.setdefault(name, Account())
            if account.metrics_path != settings.metrics_path:
                account.metrics_path = settings.metrics_path
                account.writer = (TextfileWriter(settings.metrics_path, f"flusher {name}")
                                  if settings.metrics_path is not None else None)
                account.holding = False
            if not account.holding:
                account.holding = True
                self.write(name, account)
        return holds

    def counted(self, holds: Holds, flush: Flush | None) -> None:
        """A pass made for the loads that hold the flusher: counted for each one."""
        self.passes += 1
        stamp = self.now()
        for _, settings in holds.live:
            account = self.accounts[settings.deployment]
            account.tally.passes += 1
            account.tally.freed_bytes += flush.freed if flush is not None else 0
            account.tally.last_pass_at = stamp
            self.write(settings.deployment, account)

    def unheld(self) -> bool:
        """Under the lock, with no live hold: the stale markers go and systemd is asked to stop the unit (a hold
        that comes next starts it again after the stop); whether it is so. False when a hold came meanwhile."""
        with holds_lock(self.command.holds_dir):
            holds = self.look()
            if holds.live:
                return False
            drop_stale(holds, "flusher")
            log(f"flusher: stopping after {self.passes} passes: no load holds it")
            why = systemctl(self.command, self.run, "stop", "--no-block")
            if why:
                log(f"flusher: {why}")
            return True

    def finish(self) -> None:
        for name, account in self.accounts.items():
            if account.holding:
                account.holding = False
                self.write(name, account)


def run_node(command: NodeCommand, read: Reader = read_meminfo, sync: Callable[[], None] = os.sync,
             sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = time.time,
             run: Runner = run_command) -> int:
    """The node's flusher: a pass every interval while a load holds it, then it stops (status 0)."""
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    node = NodeFlusher(command, run, now)
    log(f"flusher: the node's flusher, for the loads that hold it ({command.holds_dir}/DEPLOYMENT{MARKER_SUFFIX}; "
        f"their settings in {command.config_dir})")
    try:
        while True:
            holds = node.look()
            if not holds.live:
                if node.unheld():
                    return 0
                continue
            plan = merge([settings for _, settings in holds.live])
            if plan != node.plan:
                log(describe_plan(plan))
                for line in path_conflicts([settings for _, settings in holds.live]):
                    node.say_once(line, line)
                node.plan = plan
            flush = flush_pass(plan, read, sync)
            node.counted(holds, flush)
            if flush is not None:
                log(flush.line(node.passes))
            if command.passes is not None and node.passes >= command.passes:
                log(f"flusher: stopping after {node.passes} passes: {command.passes} passes are done")
                return 0
            sleep(plan.interval_s)
    except Terminated:
        log(f"flusher: terminated after {node.passes} passes; exiting")
        return 0
    except (FlushError, MeminfoError) as err:
        log(f"flusher: {err}")
        return 1
    finally:
        for sig in previous:  # a second signal does not cut the last writes short
            signal.signal(sig, signal.SIG_IGN)
        node.finish()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_config(command: NodeCommand) -> int:
    """Every settings file of the folder valid: OK (0); else each one's error on stderr (2)."""
    try:
        files = settings_files(command.config_dir)
    except OSError as err:
        print(f"flusher config {command.config_dir}: cannot read the folder: {err.strerror}", file=sys.stderr,
              flush=True)
        return 2
    bad = 0
    for name, path in files:
        try:
            parse_settings(read_json(path), name)
        except ConfigError as err:
            print(f"flusher config {path}: {err}", file=sys.stderr, flush=True)
            bad += 1
    if bad:
        return 2
    print("OK", flush=True)
    return 0


# --- arguments --------------------------------------------------------------


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
    return value


def whole_number(text: str, minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is below {minimum}")
    return value


def pass_count(text: str) -> int:
    return whole_number(text, minimum=1)


def file_path(text: str) -> str:
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file path")
    return text


def deployment_name(text: str) -> str:
    if not NAME_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {NAME_RULE}")
    return text


# The settings of one flusher by hand, which a node's settings file gives with --config; and the options of the
# node's flusher, which need --config.
BY_HAND = (("--mode", "mode"), ("--interval-s", "interval_s"), ("--threshold-bytes", "threshold_bytes"),
           ("--drop-caches-path", "drop_caches_path"), ("--meminfo-path", "meminfo_path"),
           ("--until-file", "until_file"), ("--timeout-s", "timeout_s"), ("--metrics-path", "metrics_path"),
           ("--deployment", "deployment"))
NODE_ONLY = (("--holds", "holds"), ("--unit", "unit"), ("--systemctl", "systemctl"), ("--hold", "hold"),
             ("--release", "release"), ("--check-config", "check_config"))


def unit_name(text: str) -> str:
    if not NAME_PATTERN.fullmatch(text.replace("@", "-")) or not text.endswith(".service"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a systemd service name (NAME.service)")
    return text


def parse_args(argv: Sequence[str]) -> Options | NodeCommand:
    parser = argparse.ArgumentParser(
        description="Sync and drop the page cache while the ranks load their weights: the node's flusher, for "
                    "the loads that hold it (--config), or one flusher by hand.")
    parser.add_argument("--mode", choices=MODES,
                        help="flush at every pass (default), or only above --threshold-bytes")
    parser.add_argument("--interval-s", type=positive_float,
                        help="seconds between two passes (default 2)")
    parser.add_argument("--threshold-bytes", type=whole_number,
                        help="threshold mode: flush only when Cached exceeds this many bytes")
    parser.add_argument("--drop-caches-path", help=f"default {DEFAULT_DROP_CACHES_PATH}")
    parser.add_argument("--meminfo-path", help=f"default {DEFAULT_MEMINFO_PATH}")
    parser.add_argument("--until-file", help="stop when this file exists")
    parser.add_argument("--timeout-s", type=positive_float,
                        help="stop after this many seconds (default 3600)")
    parser.add_argument("--passes", type=pass_count,
                        help="stop after this many passes")
    parser.add_argument("--metrics-path", type=file_path,
                        help="write a node-exporter textfile (*.prom) here at start, after every pass and at exit "
                             "(needs --deployment)")
    parser.add_argument("--deployment", type=deployment_name,
                        help="the deployment's name, the metrics' deployment label")
    node = parser.add_argument_group("the node's flusher")
    node.add_argument("--config", type=file_path, metavar="DIR",
                      help=f"the folder of every deployment's settings (DEPLOYMENT.json; {DEFAULT_CONFIG_DIR}): "
                           "flush while a load holds the flusher, as the most demanding one asks")
    node.add_argument("--holds", type=file_path, metavar="RUNDIR",
                      help=f"the folder of the loads' markers (DEPLOYMENT{MARKER_SUFFIX}; default {DEFAULT_HOLDS_DIR})")
    node.add_argument("--unit", type=unit_name, help=f"the node's flusher unit (default {DEFAULT_UNIT})")
    node.add_argument("--systemctl", type=file_path, help="the systemctl program (default systemctl)")
    actions = node.add_mutually_exclusive_group()
    actions.add_argument("--hold", type=deployment_name, metavar="NAME",
                         help="put NAME's marker, start the unit, wait for SIGTERM or NAME's timeout_s, release")
    actions.add_argument("--release", type=deployment_name, metavar="NAME",
                         help="remove NAME's marker; stop the unit when no other load holds it")
    actions.add_argument("--check-config", action="store_true", help="validate every settings file, print OK")
    args = parser.parse_args(argv)
    if args.config is not None:
        by_hand = [flag for flag, key in BY_HAND if getattr(args, key) is not None]
        if by_hand:
            parser.error(f"{by_hand[0]} is a setting of one flusher by hand; with --config each deployment's "
                         "settings file gives it")
        action = "hold" if args.hold else "release" if args.release else "check" if args.check_config else "run"
        if args.passes is not None and action != "run":
            parser.error(f"--passes does not apply to --{'check-config' if action == 'check' else action}")
        return NodeCommand(action=action, config_dir=args.config, holds_dir=args.holds or DEFAULT_HOLDS_DIR,
                           unit=args.unit or DEFAULT_UNIT, systemctl=args.systemctl or "systemctl",
                           deployment=args.hold or args.release or "", passes=args.passes)
    node_only = [flag for flag, key in NODE_ONLY if getattr(args, key) not in (None, False)]
    if node_only:
        parser.error(f"{node_only[0]} needs --config DIR (the settings folder of the node's flusher)")
    mode = args.mode or "unconditional"
    if args.metrics_path is not None and args.deployment is None:
        parser.error("--metrics-path needs --deployment NAME (the metrics' deployment label)")
    if mode == "threshold" and args.threshold_bytes is None:
        parser.error("--mode threshold needs --threshold-bytes")
    if mode == "unconditional" and args.threshold_bytes is not None:
        parser.error("--threshold-bytes applies only to --mode threshold")
    return Options(
        mode=mode, interval_s=args.interval_s or DEFAULT_INTERVAL_S, threshold_bytes=args.threshold_bytes,
        drop_caches_path=args.drop_caches_path or DEFAULT_DROP_CACHES_PATH,
        meminfo_path=args.meminfo_path or DEFAULT_MEMINFO_PATH,
        until_file=args.until_file, timeout_s=args.timeout_s or DEFAULT_TIMEOUT_S, passes=args.passes,
        metrics_path=args.metrics_path, deployment=args.deployment,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parsed = parse_args(sys.argv[1:] if argv is None else argv)
    if isinstance(parsed, Options):
        return run(parsed)
    if parsed.action == "check":
        return check_config(parsed)
    if parsed.action == "hold":
        return hold(parsed)
    if parsed.action == "release":
        return release(parsed)
    return run_node(parsed)


if __name__ == "__main__":
    sys.exit(main())
