#!/usr/bin/python3
"""Supervisor of one sparkserve deployment, run on its head: it heals the deployment while it serves.

What it watches, every ``supervise.interval_s`` seconds (one *step*):

* the render the launch recorded on the head (``render_path``, re-read at every
  step): a new fingerprint or a new modification time means a launch (or a
  stop and start) happened, and the supervisor starts afresh.  Without a
  render there is nothing to supervise;
* the deployment's launch lock (``LOCK_DIR/NAME.lock``, the format of the
  ``deployment_lock`` module): while another run holds it, the supervisor does
  nothing at all;
* every rank's container, on its node (``docker inspect``): one that exited,
  that the kernel's out-of-memory killer ended, or that is gone;
* the ranks' log lines since the previous step (``docker logs --since``),
  against the engine adapter's fatal patterns (NCCL watchdog timeouts, a dead
  engine);
* real readiness of the API on the head, with the engine's own paths: the
  health path answers 200 without the adapter's dead pattern, the model list
  names the served model, and a one-token completion answers, within
  ``supervise.probe_timeout_s`` (a hung engine still answers its health path).

What it does: a rank that stopped, or a fatal log line, heals at once;
``supervise.failures_before_heal`` failed probes in a row heal too.  A heal
takes the launch lock, saves every rank's last log lines on the head, stops
every rank (the reverse of the start order), waits until every node's
MemAvailable is back to the recipe's ``memory.min_available_gib``, starts the
same containers again in the recipe's order (it never creates one: the render
and its fingerprint stay those of the launch), waits for real readiness, and
gives the lock back.  Attempts back off (``backoff_s``, doubled at each further
attempt within the hour, at most ``backoff_max_s``).  Past
``max_restarts_per_hour`` attempts, or when a rank's container is gone, it stops
every rank and holds ``needs attention: ...``; when memory does not come back
it holds ``needs reboot: NODE ...`` with every rank stopped.  A hold lasts until
the render changes (the operator runs site.yml).

Why ssh: the other nodes are reached with the ``ssh_argv`` the role gives (the
peer key, known hosts and user the ``access`` stage already set up), so the
nodes run no agent and open no port for the supervisor: it has the trust the
deployment already has, and no more.  A node whose ssh cannot connect (status
255) is waited for; after a reboot the supervisor acts once every node answers.

Usage::

    sparkserve-supervisor.py --config /etc/sparkserve/supervisor/DEPLOYMENT.json
    sparkserve-supervisor.py --config FILE --check-config   # validate, print OK
    sparkserve-supervisor.py --config FILE --once           # one step, then exit

Config (JSON object, unknown keys refused)::

    {"deployment": "lab-tp2",
     "render_path": "/var/lib/sparkserve/deployments/lab-tp2/current.json",
     "head": "spark-1",
     "nodes": {"spark-1": {"address": "10.77.1.11"}, "spark-2": {"address": "10.77.1.12"}},
     "rank_hosts": {"0": "spark-1", "1": "spark-2"},
     "ssh_argv": ["ssh", "-i", "KEY", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-l", "root"],
     "meminfo_path": "/proc/meminfo",
     "lock_dir": "/run/sparkserve/locks",
     "state_dir": "/var/lib/sparkserve/supervisor",
     "api_base": "http://127.0.0.1:8000",
     "pause_file": "/etc/sparkserve/supervisor/lab-tp2.paused",
     "flusher_unit": "sparkserve-flusher@lab-tp2.service",
     "memguard_unit": "sparkserve-memguard@lab-tp2.service",
     "metrics_path": "/var/lib/node_exporter/textfile/sparkserve-supervisor-lab-tp2.prom"}

``pause_file``, ``flusher_unit``, ``memguard_unit`` and ``metrics_path`` may be
left out.  While the pause file
exists the supervisor does nothing (an operator working on the nodes creates
it).  The flusher unit, when given, is started on every node before the ranks
start again and stopped once they are ready (or the attempt ends), as the
launch runs it: the page cache of the weights being read competes with the
GPU on unified memory during every load.  The memory guard's unit, when given,
is started on every node before the ranks (it is not running after a reboot
unless the recipe starts it at boot), so that it watches the load, as after a
launch.

States (the state file's ``state``)::

    waiting for a launch                      no render: nothing to supervise
    waiting for a launch: PATH is unusable: WHY
    disabled: the recipe's supervise.enabled is false
    watching                                  every check passed
    watching (K of N probes failed: CAUSE)
    paused: the deployment is locked by OWNER
    waiting for nodes: NODE, NODE             ssh (or docker there) does not answer
    healing (attempt K, PHASE): CAUSE         PHASE: saving the logs, stopping every rank,
                                              waiting for memory, starting the ranks, waiting for readiness
    backing off until TIME: CAUSE             TIME: ISO 8601 UTC, like 2027-01-15T08:00:30Z
    needs attention: rank N's container NAME is gone; run site.yml
    needs attention: restart limit reached (N in the last hour); last cause: CAUSE
    needs reboot: NODE (MemAvailable X GiB, needs Y GiB)[; NODE (...)]

Causes: ``rank N on NODE is not running (exited with code C | killed by the
kernel's out-of-memory killer | gone)``, ``rank N on NODE logged: LINE``,
``the head does not answer: DETAIL``, ``completions time out while /health
answers (hang)``.

Events (``event``, and its fields): ``render_changed`` (fingerprint, previous),
``node_unreachable`` (nodes: node -> why), ``container_gone`` (cause, rank,
node, container), ``heal_started`` (cause, attempt), ``healed`` (cause,
attempt, seconds, stopped_s, memory_s, ready_s: seconds from the heal's start
to ready, to every rank stopped, then waiting for memory, then from the first
start to ready), ``heal_failed`` (cause, attempt, why), ``needs_reboot``
(cause, nodes: node -> mem_available_bytes, needs_bytes) and ``gave_up``
(cause, restarts_last_hour).

Records, in ``STATE_DIR``: ``DEPLOYMENT.events.jsonl`` (one JSON object a line:
time, deployment, event, state and the event's fields; each line is printed
too, for the journal), ``DEPLOYMENT.state.json`` (the state, rewritten at every
step; it also keeps the render seen and the attempts of the last hour, so a
restarted supervisor keeps counting them for the same render; a hold is not
kept: a restarted supervisor finds its fault again) and the logs saved before
each restart, ``DEPLOYMENT/logs/TIME/rankN-NODE.log``.  The restart counts are
those of the current render (a launch sets them to 0).

Metrics: with ``metrics_path`` (an absolute path) the supervisor writes a
Prometheus node-exporter textfile (node_exporter's textfile collector reads
only files named ``*.prom``) after every step and whenever its state changes
(each phase of a heal, too).  Each write replaces the whole file (written to
``PATH.tmp.PID`` beside it, then renamed); the folder must exist.  A file that
cannot be written is said once on stderr and the supervisor carries on.
SIGTERM (or SIGINT) removes the file: a stopped supervisor leaves no figures;
an exit with status 1 leaves it, its timestamp no longer moving, and
``--once`` leaves the file of its one step.  Families, each with the label
``deployment``::

    sparkserve_supervisor_state                        gauge    label state too: one sample per
                                                                state name, 1 for the current one
    sparkserve_supervisor_restarts_total               counter  heal attempts (every rank restarted)
                                                                made since it started, plus the
                                                                restarts_total of the state file it
                                                                started from
    sparkserve_supervisor_paused                       gauge    1 when the pause file exists, else 0
    sparkserve_supervisor_last_check_timestamp_seconds gauge    unix time the last step began

The state names (the start of the states above): starting, waiting for a
launch, disabled, watching, paused (by the lock or by the operator's pause
file), waiting for nodes, healing, backing off, needs attention, needs reboot.

SIGTERM ends a heal where it is (the lock is given back); the supervisor, when
it runs again, finds the ranks stopped and heals them.

Exit status: 0 on SIGTERM (or SIGINT) and after ``--once``; 1 when the state
directory or the lock directory cannot be written; 2 for a bad config or bad
arguments (errors about the config go to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import http.client
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator, Mapping, Sequence

from sparkserve_textfile import MetricFamily, TextfileWriter

CONFIG_KEYS = ("deployment", "render_path", "head", "nodes", "rank_hosts", "ssh_argv", "meminfo_path",
               "lock_dir", "state_dir", "api_base")
UNIT_PATTERN = re.compile(r"[A-Za-z0-9:_.@-]+\.service")
# Keys that may be left out: an operator's pause file, the page-cache flusher unit run on every node during
# a restart's load, and the memory guard's unit armed on every node before the ranks, as the launch does.
# And the node-exporter textfile of its metrics.
OPTIONAL_CONFIG_KEYS = ("pause_file", "flusher_unit", "memguard_unit", "metrics_path")
# The names of the supervisor's states, as each state's text starts: the metrics' state label.
STATE_NAMES = ("starting", "waiting for a launch", "disabled", "watching", "paused", "waiting for nodes",
               "healing", "backing off", "needs attention", "needs reboot")
# What recipe.supervise holds; the role fills these in, a render of an older launch may lack them.
SUPERVISE_DEFAULTS: dict[str, Any] = {
    "enabled": True, "interval_s": 15, "probe_timeout_s": 30, "failures_before_heal": 3,
    "ready_timeout_s": None, "memory_wait_s": 300, "backoff_s": 30, "backoff_max_s": 600,
    "max_restarts_per_hour": 3, "start_on_boot": False, "log_lines": 200,
}
ORDERS = ("workers_first", "head_first")
# Docker's rule for container names; the deployment name also names files.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NO_SUCH_CONTAINER = re.compile(r"no such (container|object)", re.IGNORECASE)
# Docker's StartedAt: RFC 3339 with up to nanoseconds.
STARTED_AT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")

DEFAULT_INTERVAL_S = 15.0  # between steps while there is no render to read the interval from
HOUR_S = 3600.0
MEMORY_POLL_S = 5.0
READY_POLL_S = 2.0
LOCK_MARGIN_S = 300  # added to memory_wait_s and the ready timeout for the heal's lease
DEFAULT_LEASE_S = 1800  # of a lock file the deployment_lock module cannot read (its default lease)
UNREADABLE_OWNER = "an unknown run (the lock file is empty or not JSON)"
CAUSE_LINE_CHARS = 200
DETAIL_CHARS = 200
MAX_BODY = 64 * 1024
INSPECT_TIMEOUT_S = 30.0
LOGS_TIMEOUT_S = 60.0
CAT_TIMEOUT_S = 30.0
START_TIMEOUT_S = 120.0
SYSTEMCTL_TIMEOUT_S = 60.0
STOP_MARGIN_S = 60.0  # a docker stop may take its grace and this much more
RC_NOT_STARTED = 127
RC_TIMED_OUT = 124
RC_SSH_FAILED = 255  # ssh's own status when it could not connect
GIB = 1024**3
# The API runs on the head: never send the probe through an http_proxy of the environment.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# A command's exit status, stdout and stderr; the runner is given the argv and a timeout in seconds.
CommandResult = tuple[int, str, str]
Runner = Callable[[Sequence[str], float], CommandResult]
# An HTTP request: (method, url, JSON body or None, timeout) -> (status, body). An HTTP error status is an
# answer; no answer in time raises TimeoutError, any other failure to get an answer another OSError.
Http = Callable[[str, str, str | None, float], tuple[int, str]]
Holder = dict[str, Any]


class ConfigError(Exception):
    """The config file is unusable; the message names the key and the fix."""


class RenderError(Exception):
    """The render is unusable; the message says why."""


class LockLost(Exception):  # noqa: N818 (an outcome of the heal, not an error of the program)
    """The deployment's lock stopped being this supervisor's during a heal."""

    def __init__(self, owner: str) -> None:
        super().__init__(owner)
        self.owner = owner


class Terminated(Exception):  # noqa: N818 (a signal to unwind, like KeyboardInterrupt; not an error)
    """SIGTERM or SIGINT arrived."""


# --- config -------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    deployment: str
    render_path: str
    head: str
    nodes: dict[str, str]  # node -> address
    rank_hosts: dict[int, str]  # rank -> node
    ssh_argv: tuple[str, ...]
    meminfo_path: str
    lock_dir: str
    state_dir: str
    api_base: str
    pause_file: str | None = None
    flusher_unit: str | None = None
    memguard_unit: str | None = None
    metrics_path: str | None = None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _name(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ConfigError(f"{key} is {json.dumps(value)}; set a name of letters, digits, '_', '.' and '-' "
                          "that starts with a letter or digit")
    return value


def _absolute_path(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigError(f"{key} is {json.dumps(value)}; set an absolute path")
    return value


def _nodes(raw: Mapping[str, Any]) -> dict[str, str]:
    value = raw["nodes"]
    if not isinstance(value, dict) or not value:
        raise ConfigError(f'nodes is {json.dumps(value)}; set an object of nodes, like {{"spark-1": '
                          '{"address": "10.77.1.11"}}')
    nodes: dict[str, str] = {}
    for node, entry in value.items():
        address = entry.get("address") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or set(entry) != {"address"} or not isinstance(address, str) or not address:
            raise ConfigError(f'nodes.{node} is {json.dumps(entry)}; set {{"address": "ADDRESS"}}')
        nodes[node] = address
    return nodes


def _head(raw: Mapping[str, Any], nodes: Mapping[str, str]) -> str:
    value = raw["head"]
    if not isinstance(value, str) or value not in nodes:
        raise ConfigError(f"head is {json.dumps(value)}; set one of the nodes ({', '.join(nodes)})")
    return value


def _rank_hosts(raw: Mapping[str, Any], nodes: Mapping[str, str], head: str) -> dict[int, str]:
    value = raw["rank_hosts"]
    if not isinstance(value, dict) or not value:
        raise ConfigError(f'rank_hosts is {json.dumps(value)}; set an object of ranks, like {{"0": "spark-1"}}')
    hosts: dict[int, str] = {}
    for rank, node in value.items():
        if not isinstance(rank, str) or not rank.isdigit():
            raise ConfigError(f"rank_hosts has the key {json.dumps(rank)}; the keys are ranks: 0, 1, ...")
        if not isinstance(node, str) or node not in nodes:
            raise ConfigError(f"rank_hosts.{rank} is {json.dumps(node)}; set one of the nodes ({', '.join(nodes)})")
        hosts[int(rank)] = node
    if hosts.get(0) != head:
        raise ConfigError(f"rank_hosts.0 is {json.dumps(hosts.get(0))}; rank 0 runs on the head ({head})")
    return dict(sorted(hosts.items()))


def _ssh_argv(raw: Mapping[str, Any]) -> tuple[str, ...]:
    value = raw["ssh_argv"]
    if not isinstance(value, list) or not value or not all(isinstance(part, str) and part for part in value):
        raise ConfigError(f'ssh_argv is {json.dumps(value)}; set a list of non-empty strings, like '
                          '["ssh", "-o", "BatchMode=yes"]')
    return tuple(value)


def _api_base(raw: Mapping[str, Any]) -> str:
    value = raw["api_base"]
    url = urllib.parse.urlsplit(value) if isinstance(value, str) else None
    if url is None or url.scheme not in ("http", "https") or not url.netloc:
        raise ConfigError(f"api_base is {json.dumps(value)}; set the API's base URL, like http://127.0.0.1:8000")
    return str(value).rstrip("/")


def _unit(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not UNIT_PATTERN.fullmatch(value):
        raise ConfigError(f"{key} is {json.dumps(value)}; set a systemd unit name, like "
                          "sparkserve-flusher@lab-tp2.service")
    return value


def parse_config(raw: object) -> Config:
    """Validate a decoded config object."""
    if not isinstance(raw, dict):
        raise ConfigError('the config is not a JSON object; write {"deployment": ..., ...}')
    unknown = sorted(set(raw) - set(CONFIG_KEYS) - set(OPTIONAL_CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]}; the keys are {', '.join(CONFIG_KEYS + OPTIONAL_CONFIG_KEYS)}")
    missing = [key for key in CONFIG_KEYS if key not in raw]
    if missing:
        raise ConfigError(f"{missing[0]} is missing; it is required")
    nodes = _nodes(raw)
    head = _head(raw, nodes)
    return Config(
        deployment=_name(raw, "deployment"),
        render_path=_absolute_path(raw, "render_path"),
        head=head,
        nodes=nodes,
        rank_hosts=_rank_hosts(raw, nodes, head),
        ssh_argv=_ssh_argv(raw),
        meminfo_path=_absolute_path(raw, "meminfo_path"),
        lock_dir=_absolute_path(raw, "lock_dir"),
        state_dir=_absolute_path(raw, "state_dir"),
        api_base=_api_base(raw),
        pause_file=_absolute_path(raw, "pause_file") if raw.get("pause_file") is not None else None,
        flusher_unit=_unit(raw, "flusher_unit"),
        memguard_unit=_unit(raw, "memguard_unit"),
        metrics_path=_absolute_path(raw, "metrics_path") if raw.get("metrics_path") is not None else None,
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


# --- the render ---------------------------------------------------------------


@dataclass(frozen=True)
class Rank:
    rank: int
    node: str
    container: str


@dataclass(frozen=True)
class Supervise:
    enabled: bool
    interval_s: float
    probe_timeout_s: float
    failures_before_heal: int
    ready_timeout_s: float  # readiness.timeout_s when the recipe leaves it unset
    memory_wait_s: float
    backoff_s: float
    backoff_max_s: float
    max_restarts_per_hour: int
    log_lines: int


@dataclass(frozen=True)
class Render:
    fingerprint: str
    mtime: float
    ranks: tuple[Rank, ...]  # by rank
    served_name: str
    canary_prompt: str
    health_path: str
    models_path: str
    completions_path: str
    dead_pattern: re.Pattern[str] | None
    fatal_patterns: tuple[re.Pattern[str], ...]
    order: str
    head_delay_s: float
    stop_grace_s: int
    min_available_gib: float
    supervise: Supervise

    @property
    def key(self) -> tuple[str, float]:
        """What says a launch happened: the fingerprint and the file's modification time."""
        return self.fingerprint, self.mtime

    def start_order(self) -> list[Rank]:
        """workers_first: ranks N-1 .. 1, then rank 0; head_first: 0 .. N-1."""
        return sorted(self.ranks, key=lambda r: r.rank, reverse=self.order == "workers_first")

    def nodes(self) -> list[str]:
        """The nodes of the ranks, each once, in rank order."""
        return list(dict.fromkeys(rank.node for rank in self.ranks))


def dig(data: object, path: str, default: object = None) -> Any:
    """data["a"]["b"] for "a.b"; the default when a level is missing or not an object."""
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return default
        data = data[part]
    return data


def _number(value: object, path: str, minimum: float, whole: bool = False) -> float:
    if not (_is_int(value) if whole else _is_number(value)) or float(value) < minimum:  # type: ignore[arg-type]
        kind = "a whole number" if whole else "a number"
        raise RenderError(f"{path} is {json.dumps(value)}, not {kind} of at least {minimum:g}")
    return float(value)  # type: ignore[arg-type]


def _render_number(data: object, path: str, default: object, minimum: float, whole: bool = False) -> float:
    return _number(dig(data, path, default), path, minimum, whole)


def _render_text(data: object, path: str, default: str | None = None) -> str:
    value = dig(data, path, default)
    if not isinstance(value, str) or not value:
        raise RenderError(f"{path} is {json.dumps(value)}, not a non-empty string")
    return value


def _regex(pattern: object, path: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise RenderError(f"{path} is {json.dumps(pattern)}, not a regular expression")
    try:
        return re.compile(pattern)
    except re.error as err:
        raise RenderError(f"{path} {json.dumps(pattern)} is not a regular expression: {err}") from err


def _supervise(data: object) -> Supervise:
    raw = dig(data, "recipe.supervise", {})
    if not isinstance(raw, dict):
        raise RenderError(f"recipe.supervise is {json.dumps(raw)}, not an object")
    values = {**SUPERVISE_DEFAULTS, **raw}

    def number(key: str, minimum: float, whole: bool = False) -> float:
        return _number(values[key], f"recipe.supervise.{key}", minimum, whole)

    enabled = values["enabled"]
    if not isinstance(enabled, bool):
        raise RenderError(f"recipe.supervise.enabled is {json.dumps(enabled)}, not true or false")
    ready = (_render_number(data, "recipe.readiness.timeout_s", None, 1) if values["ready_timeout_s"] is None
             else number("ready_timeout_s", 1))
    return Supervise(
        enabled=enabled, interval_s=number("interval_s", 1), probe_timeout_s=number("probe_timeout_s", 1),
        failures_before_heal=int(number("failures_before_heal", 1, whole=True)), ready_timeout_s=ready,
        memory_wait_s=number("memory_wait_s", 0), backoff_s=number("backoff_s", 0),
        backoff_max_s=number("backoff_max_s", 0),
        max_restarts_per_hour=int(number("max_restarts_per_hour", 1, whole=True)),
        log_lines=int(number("log_lines", 1, whole=True)),
    )


def _ranks(data: object, config: Config) -> tuple[Rank, ...]:
    raw = dig(data, "ranks")
    if isinstance(raw, list):  # the render module's own form: a list of ranks, each with its number
        raw = {str(dig(entry, "rank", index)): entry for index, entry in enumerate(raw)}
    if not isinstance(raw, dict) or not raw:
        raise RenderError('ranks is not an object of ranks, like {"0": {"container_name": ...}}')
    ranks: list[Rank] = []
    for key, entry in raw.items():
        if not str(key).isdigit():
            raise RenderError(f"ranks has the key {json.dumps(key)}, not a rank")
        rank = int(key)
        if rank not in config.rank_hosts:
            raise RenderError(f"rank {rank} is not in the supervisor's rank_hosts; run site.yml")
        container = dig(entry, "container_name")
        if not isinstance(container, str) or not NAME_PATTERN.fullmatch(container):
            raise RenderError(f"ranks.{key}.container_name is {json.dumps(container)}, not a container name")
        ranks.append(Rank(rank, config.rank_hosts[rank], container))
    if 0 not in {rank.rank for rank in ranks}:
        raise RenderError("ranks has no rank 0")
    return tuple(sorted(ranks, key=lambda r: r.rank))


def parse_render(data: object, config: Config, mtime: float) -> Render:
    """Validate the render the launch recorded; every problem is a RenderError."""
    if not isinstance(data, dict):
        raise RenderError("it is not a JSON object")
    if data.get("deployment") != config.deployment:
        raise RenderError(f"it is the render of {json.dumps(data.get('deployment'))}, not of {config.deployment}")
    order = dig(data, "recipe.launch.order", "workers_first")
    if order not in ORDERS:
        raise RenderError(f"recipe.launch.order is {json.dumps(order)}, not one of {', '.join(ORDERS)}")
    dead = dig(data, "adapter.dead_health_pattern", "")
    fatal = dig(data, "adapter.fatal_log_patterns", [])
    if not isinstance(fatal, list):
        raise RenderError(f"adapter.fatal_log_patterns is {json.dumps(fatal)}, not a list")
    return Render(
        fingerprint=_render_text(data, "fingerprint"),
        mtime=mtime,
        ranks=_ranks(data, config),
        served_name=_render_text(data, "recipe.model.served_name"),
        canary_prompt=_render_text(data, "recipe.readiness.canary_prompt", "2+2="),
        health_path=_render_text(data, "adapter.endpoints.health", "/health"),
        models_path=_render_text(data, "adapter.endpoints.models", "/v1/models"),
        completions_path=_render_text(data, "adapter.endpoints.completions", "/v1/completions"),
        dead_pattern=_regex(dead, "adapter.dead_health_pattern") if dead else None,
        fatal_patterns=tuple(_regex(p, f"adapter.fatal_log_patterns[{i}]") for i, p in enumerate(fatal)),
        order=str(order),
        head_delay_s=_render_number(data, "recipe.launch.head_delay_s", 0, 0),
        stop_grace_s=int(_render_number(data, "recipe.launch.stop_grace_s", 10, 0, whole=True)),
        min_available_gib=_render_number(data, "recipe.memory.min_available_gib", 0, 0),
        supervise=_supervise(data),
    )


def read_render(config: Config) -> Render | None:
    """The render on the head; None when there is none (no launch yet)."""
    path = Path(config.render_path)
    try:
        mtime = path.stat().st_mtime
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise RenderError(f"cannot read it: {err.strerror}") from err
    try:
        data = json.loads(text)
    except ValueError as err:
        raise RenderError(f"not valid JSON: {err}") from err
    return parse_render(data, config, mtime)


# --- the deployment lock (the deployment_lock module's format) -----------------


def read_holder(path: str) -> Holder | None:
    """The lock file's holder, None when there is none; an unreadable or old-format file is held,
    renewed at its modification time with the default lease, as the deployment_lock module reads it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("owner"), str) or not _is_number(data.get("since")):
        return {"owner": UNREADABLE_OWNER, "renewed": mtime, "lease_s": DEFAULT_LEASE_S, "token": None}
    token, renewed, lease_s = data.get("token"), data.get("renewed"), data.get("lease_s")
    if not isinstance(token, str) or not token or not _is_number(renewed) or not _is_int(lease_s):
        return {"owner": data["owner"], "renewed": mtime, "lease_s": DEFAULT_LEASE_S, "token": None}
    return dict(data)


def lease_runs(holder: Holder, now: float) -> bool:
    return float(holder["renewed"]) + float(holder["lease_s"]) > now


def write_atomically(path: str, text: str) -> None:
    """Replace the file by one holding this text (a new file renamed over it)."""
    directory, base = os.path.split(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{base}.", suffix=".new", dir=directory)
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(temporary, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def holder_text(holder: Holder) -> str:
    return json.dumps(holder, sort_keys=True) + "\n"


class DeploymentLock:
    """The deployment's launch lock, taken by the supervisor for a heal.

    Every change is made under the flock on ``LOCK_DIR/.NAME.lock.guard``, as
    the deployment_lock module makes its own, so a launch and a heal never
    both take the lock.
    """

    def __init__(self, lock_dir: str, name: str, owner: str) -> None:
        self.lock_dir = lock_dir
        self.path = os.path.join(lock_dir, f"{name}.lock")
        self.guard_path = os.path.join(lock_dir, f".{name}.lock.guard")
        self.owner = owner
        self.token: str | None = None
        self.since = 0

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        os.makedirs(self.lock_dir, mode=0o755, exist_ok=True)
        fd = os.open(self.guard_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def other_holder(self, now: float) -> Holder | None:
        """Another run holding the lock with a lease that has not run out; None when nobody does.

        A lock this supervisor's owner left (an earlier run of it ended during a heal) is given back.
        """
        holder = read_holder(self.path)
        if holder is None or not lease_runs(holder, now):
            return None
        if holder["owner"] == self.owner and holder.get("token") and holder.get("token") != self.token:
            with self.guard():
                again = read_holder(self.path)
                if again is not None and again.get("token") == holder["token"]:
                    os.unlink(self.path)
            log(f"gave back the lock {self.path} an earlier run of the supervisor left")
            return None
        return holder

    def _holder(self, now: float, lease_s: int) -> Holder:
        assert self.token is not None
        renewed = int(now)
        return {"owner": self.owner, "since": self.since, "renewed": renewed, "lease_s": lease_s,
                "expires": renewed + lease_s, "token": self.token, "run": None}

    def take(self, now: float, lease_s: int) -> Holder | None:
        """Take the lock for a heal; the other holder when it holds it (and nothing is taken)."""
        with self.guard():
            before = read_holder(self.path)
            if before is not None and lease_runs(before, now):
                return before
            self.token, self.since = secrets.token_hex(8), int(now)
            mine = self._holder(now, lease_s)
            if before is None:
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:  # only a writer outside the guard gets here
                    self.token = None
                    return read_holder(self.path) or {"owner": UNREADABLE_OWNER}
                try:
                    os.write(fd, holder_text(mine).encode("utf-8"))
                    os.fsync(fd)
                finally:
                    os.close(fd)
            else:
                log(f"took over the lock {self.path} from {before['owner']}: its lease ran out")
                write_atomically(self.path, holder_text(mine))
            return None

    def renew(self, now: float, lease_s: int) -> None:
        """Renew the lease; LockLost when the lock is no longer this supervisor's."""
        with self.guard():
            holder = read_holder(self.path)
            if holder is None or self.token is None or holder.get("token") != self.token:
                raise LockLost(holder["owner"] if holder else "nobody (the lock file was removed)")
            write_atomically(self.path, holder_text(self._holder(now, lease_s)))

    def release(self) -> None:
        """Remove the lock file when it is still this supervisor's."""
        if self.token is None:
            return
        with self.guard():
            holder = read_holder(self.path)
            if holder is not None and holder.get("token") == self.token:
                os.unlink(self.path)
        self.token = None


# --- the nodes: commands over ssh, containers, memory --------------------------


def run_command(command: Sequence[str], timeout_s: float) -> CommandResult:
    """Run a command; its exit status, stdout and stderr (127: could not start, 124: timed out)."""
    try:
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout_s, check=False)
    except OSError as err:
        return RC_NOT_STARTED, "", f"cannot run {command[0]}: {err.strerror}"
    except subprocess.TimeoutExpired:
        return RC_TIMED_OUT, "", f"no answer after {timeout_s:.0f} s"
    return done.returncode, done.stdout, done.stderr


def one_line(text: str, limit: int = DETAIL_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


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


def parse_started_at(text: object) -> float | None:
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
class Seen:
    """What docker inspect told of one rank's container.

    status: running, exited, oom (killed by the kernel's out-of-memory killer), gone, unreachable (ssh did
    not connect), unknown (docker did not answer in a way that says).
    """

    rank: Rank
    status: str
    exit_code: int | None = None
    started_at: float | None = None
    detail: str = ""

    @property
    def stopped(self) -> bool:
        return self.status in ("exited", "oom", "gone")

    def cause(self) -> str:
        why = {"oom": "killed by the kernel's out-of-memory killer", "gone": "gone"}.get(
            self.status, f"exited with code {self.exit_code}")
        return f"rank {self.rank.rank} on {self.rank.node} is not running ({why})"


@dataclass(frozen=True)
class Memory:
    """A node's MemAvailable in bytes, or None and why it could not be read."""

    available: int | None
    error: str = ""


class Nodes:
    """Runs commands on the deployment's nodes: on the head directly, on the others over ssh."""

    def __init__(self, config: Config, runner: Runner) -> None:
        self.config = config
        self.runner = runner

    def argv(self, node: str, argv: Sequence[str]) -> list[str]:
        if node == self.config.head:
            return list(argv)
        return [*self.config.ssh_argv, self.config.nodes[node], "--", shlex.join(argv)]

    def run(self, node: str, argv: Sequence[str], timeout_s: float) -> CommandResult:
        return self.runner(self.argv(node, argv), timeout_s)

    def unreached(self, node: str, rc: int) -> bool:
        """Whether a command failed because ssh could not connect to the node."""
        return rc == RC_SSH_FAILED and node != self.config.head

    def inspect(self, rank: Rank) -> Seen:
        argv = ["docker", "inspect", "--type", "container", "--format", "{{json .State}}", rank.container]
        rc, out, err = self.run(rank.node, argv, INSPECT_TIMEOUT_S)
        words = one_line(err or out)
        if rc != 0:
            if NO_SUCH_CONTAINER.search(err + out):
                return Seen(rank, "gone")
            if self.unreached(rank.node, rc):
                return Seen(rank, "unreachable", detail=f"ssh could not connect: {words}")
            return Seen(rank, "unknown", detail=f"docker inspect failed with status {rc}: {words}")
        try:
            state = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            state = None
        if not isinstance(state, dict):
            return Seen(rank, "unknown", detail=f"docker inspect answered {json.dumps(one_line(out))}")
        started = parse_started_at(state.get("StartedAt"))
        if state.get("Running") is True:
            return Seen(rank, "running", started_at=started)
        code = state.get("ExitCode")
        return Seen(rank, "oom" if state.get("OOMKilled") else "exited",
                    exit_code=code if _is_int(code) else None, started_at=started)

    def memory(self, node: str) -> Memory:
        """The node's MemAvailable: the head's file read here, the others' with cat over ssh."""
        path = self.config.meminfo_path
        if node == self.config.head:
            try:
                text = Path(path).read_text(encoding="ascii", errors="replace")
            except OSError as err:
                return Memory(None, f"cannot read {path}: {err.strerror}")
        else:
            rc, text, errors = self.run(node, ["cat", path], CAT_TIMEOUT_S)
            if rc != 0:
                return Memory(None, f"cat {path} failed with status {rc}: {one_line(errors or text)}")
        available = parse_meminfo(text).get("MemAvailable")
        return Memory(available, "" if available is not None else f"{path} has no MemAvailable")


# --- the readiness probe ------------------------------------------------------


def http_request(method: str, url: str, body: str | None, timeout: float) -> tuple[int, str]:
    """One request to the API, never through a proxy of the environment; an HTTP error is an answer."""
    data = None if body is None else body.encode("utf-8")
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with OPENER.open(request, timeout=timeout) as response:
            return int(response.status), response.read(MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        try:
            text = err.read(MAX_BODY).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        return err.code, text
    except urllib.error.URLError as err:
        if isinstance(err.reason, OSError):
            raise err.reason from err
        raise ConnectionError(str(err.reason)) from err
    except http.client.HTTPException as err:
        raise ConnectionError(f"{type(err).__name__}: {err}") from err


def no_answer(err: OSError, timeout: float) -> str:
    if isinstance(err, TimeoutError):
        return f"no answer in {timeout:g} s"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    return one_line(str(err)) or type(err).__name__


def answer_text(method: str, path: str, status: int, body: str) -> str:
    text = f"{method} {path}: {status}"
    reason = http.client.responses.get(status, "")
    text += f" {reason}" if reason else ""
    return f"{text}: {one_line(body)}" if one_line(body) else text


def listed_models(body: str) -> list[str] | None:
    try:
        data = json.loads(body)["data"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]


def one_choice(body: str) -> bool:
    try:
        choices = json.loads(body)["choices"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(choices, list) and len(choices) == 1


def ask(http: Http, method: str, url: str, path: str, body: str | None, timeout: float,
        raise_timeout: bool = False) -> tuple[int, str] | str:
    """One request of the probe: its status and body when it answered 200, else what went wrong.

    With raise_timeout, a timeout is raised (TimeoutError) for the caller to tell a hang from a failure.
    """
    try:
        status, text = http(method, url + path, body, timeout)
    except TimeoutError as err:
        if raise_timeout:
            raise
        return f"{method} {path}: {no_answer(err, timeout)}"
    except OSError as err:
        return f"{method} {path}: {no_answer(err, timeout)}"
    return (status, text) if status == 200 else answer_text(method, path, status, text)


def probe(api_base: str, render: Render, http: Http, timeout: float) -> str:
    """The three requests of real readiness; the cause of the first that fails, empty when all pass."""
    def fail(detail: str) -> str:
        return f"the head does not answer: {detail}"

    health = ask(http, "GET", api_base, render.health_path, None, timeout)
    if isinstance(health, str):
        return fail(health)
    if render.dead_pattern is not None and render.dead_pattern.search(health[1]):
        return fail(f"GET {render.health_path}: 200 but the engine says it is dead: {one_line(health[1])}")
    models = ask(http, "GET", api_base, render.models_path, None, timeout)
    if isinstance(models, str):
        return fail(models)
    ids = listed_models(models[1])
    if ids is None or render.served_name not in ids:
        return fail(f"GET {render.models_path}: 200 but it does not list {render.served_name}: "
                    f"{one_line(models[1])}")
    payload = json.dumps({"model": render.served_name, "prompt": render.canary_prompt, "max_tokens": 1})
    try:
        answer = ask(http, "POST", api_base, render.completions_path, payload, timeout, raise_timeout=True)
    except TimeoutError:  # health answered: a hang
        return "completions time out while /health answers (hang)"
    if isinstance(answer, str):
        return fail(answer)
    if not one_choice(answer[1]):
        return fail(f"POST {render.completions_path}: 200 but not one choice: {one_line(answer[1])}")
    return ""


# --- records ------------------------------------------------------------------


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def compact_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def log(message: str) -> None:
    print(message, flush=True)


def append_line(path: str, line: str) -> None:
    """Append one line and flush it to disk: the node may die next."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as events:
        events.write(line + "\n")
        events.flush()
        os.fsync(events.fileno())


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


class Shutdown:
    """SIGTERM handler: raise at once, except while a record is being written."""

    def __init__(self) -> None:
        self.requested = False
        self.deferred = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if not self.deferred:
            raise Terminated()

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        was = self.deferred
        self.deferred = True
        try:
            yield
        finally:
            self.deferred = was
        if self.requested and not was:
            raise Terminated()


# --- metrics: a node_exporter textfile ------------------------------------------
# (the file, its text and its writer: sparkserve_textfile, installed beside this program)


def state_name(state: str) -> str | None:
    """The name of a state (the start of its text, one of STATE_NAMES); None for a text of no state."""
    for name in STATE_NAMES:
        if state == name or (state.startswith(name) and state[len(name)] in " :("):
            return name
    return None


def supervisor_families(deployment: str, state: str, restarts: int, paused: bool,
                        checked_at: float) -> list[MetricFamily]:
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


# --- the supervisor -------------------------------------------------------------


@dataclass
class Outcome:
    """How a heal attempt ended: healed, failed (why), reboot (needs reboot) or lock_lost."""

    kind: str
    why: str = ""
    holder: str = ""


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
        if isinstance(fingerprint, str) and _is_number(mtime):
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
            write_atomically(self.state_path, json.dumps(data, indent=2) + "\n")

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
                f"status {rc}: {one_line(err or out)}")
            return ""
        for line in (out + "\n" + err).splitlines():
            if any(pattern.search(line) for pattern in render.fatal_patterns):
                return f"rank {rank.rank} on {rank.node} logged: {line.strip()[:CAUSE_LINE_CHARS]}"
        return ""

    def probe_once(self, render: Render) -> None:
        supervise = render.supervise
        cause = probe(self.config.api_base, render, self.http, supervise.probe_timeout_s)
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
                why = self.wait_ready(render)
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
            if rc != 0 and not NO_SUCH_CONTAINER.search(err + out):
                problems.append(f"rank {rank.rank} on {rank.node} could not be stopped: docker stop failed with "
                                f"status {rc}: {one_line(err or out)}")
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
                    f"failed with status {rc}: {one_line(err or out)}")

    def start_all(self, render: Render) -> str:
        """Start the ranks in the recipe's order; what failed, empty when every rank started."""
        for rank in render.start_order():
            if (rank.rank == 0 and render.order == "workers_first" and render.head_delay_s > 0
                    and len(render.ranks) > 1):
                self.sleep(render.head_delay_s)
            rc, out, err = self.nodes.run(rank.node, ["docker", "start", rank.container], START_TIMEOUT_S)
            if rc != 0:
                return (f"rank {rank.rank} on {rank.node} could not be started: docker start failed with status "
                        f"{rc}: {one_line(err or out)}")
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
            cause = probe(self.config.api_base, render, self.http, timeout)
            if not cause:
                return ""
            if self.clock() >= deadline:
                return f"not ready after {supervise.ready_timeout_s:g} s: {cause}"
            self.sleep(READY_POLL_S)


# --- the program --------------------------------------------------------------


def run(config: Config, once: bool = False, runner: Runner = run_command, http: Http = http_request,
        clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> int:
    """Step until SIGTERM (or once); 0 then, 1 when the state or lock directory cannot be written."""
    supervisor = Supervisor(config, runner=runner, http=http, clock=clock, sleep=sleep)
    shutdown = supervisor.shutdown
    previous = {sig: signal.signal(sig, shutdown.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    log(f"supervisor {config.deployment}: supervising from {config.head} the render {config.render_path}")
    try:
        while True:
            delay = supervisor.step()
            if once:
                return 0
            sleep(delay)
    except Terminated:
        shutdown.deferred = True
        supervisor.remove_metrics()
        log(f"supervisor {config.deployment}: terminated; exiting")
        return 0
    except OSError as err:
        log(f"supervisor {config.deployment}: {err}; exiting")
        return 1
    finally:
        supervisor.lock.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Heal a serving sparkserve deployment from its head: watch, and restart every rank in order.")
    parser.add_argument("--config", required=True, help="the supervisor's JSON config file")
    parser.add_argument("--check-config", action="store_true", help="validate the config, print OK")
    parser.add_argument("--once", action="store_true", help="one step, then exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"supervisor config {args.config}: {err}", file=sys.stderr, flush=True)
        return 2
    if args.check_config:
        print("OK", flush=True)
        return 0
    return run(config, once=args.once)


if __name__ == "__main__":
    sys.exit(main())
