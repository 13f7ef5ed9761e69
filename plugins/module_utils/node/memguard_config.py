"""The memory guard's settings: one deployment's file on a node (/etc/sparkserve/memguard/NAME.json), checked.

The guard program (roles/memguard/files/sparkserve-memguard.py) reads a folder of these, one per deployment
with a rank on the node; ``parse_config`` validates one decoded file and fills in the defaults,
``load_config`` reads one, ``order_key`` is the order the guard acts in (lowest priority first, then name).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .config import ConfigError, is_int, is_number, name_value, read_json

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
OPTIONAL_KEYS = ("priority", "action", "stop_grace_s", "interval_s", "meminfo_path", "events_path",
                 "docker_command", "metrics_path", "metrics_interval_s", "at_boot")
DEFAULT_PRIORITY = 0
DEFAULT_ACTION = "kill"
DEFAULT_STOP_GRACE_S = 10
DEFAULT_INTERVAL_S = 1.0
DEFAULT_MEMINFO_PATH = "/proc/meminfo"
DEFAULT_EVENTS_DIR = "/var/lib/sparkserve/memguard"
DEFAULT_DOCKER_COMMAND = ("docker",)
DEFAULT_METRICS_INTERVAL_S = 15.0
SETTINGS_SUFFIX = ".json"
GIB = 1024**3



@dataclass(frozen=True)
class Config:
    """One deployment's settings on this node."""

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
    priority: int = DEFAULT_PRIORITY
    at_boot: bool = False


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


def _priority(raw: Mapping[str, Any]) -> int:
    value = raw.get("priority", DEFAULT_PRIORITY)
    if not is_int(value):
        raise ConfigError(
            f"priority is {json.dumps(value)}; set a whole number (the guard acts on the lowest first)"
        )
    return int(value)


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
    if not is_number(value) or not math.isfinite(value) or value <= 0:
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


def _at_boot(raw: Mapping[str, Any]) -> bool:
    value = raw.get("at_boot", False)
    if not isinstance(value, bool):
        raise ConfigError(f"at_boot is {json.dumps(value)}; set true or false")
    return value


def parse_config(raw: object) -> Config:
    """Validate a decoded settings object and fill in the defaults."""
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
        priority=_priority(raw),
        at_boot=_at_boot(raw),
    )


def load_config(path: str) -> Config:
    """Read and validate one settings file; every problem is a ConfigError."""
    return parse_config(read_json(path))


def order_key(config: Config) -> tuple[int, str]:
    """The order in which the guard acts on the ranks: lowest priority first, then by deployment name."""
    return config.priority, config.deployment
