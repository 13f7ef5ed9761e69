"""The render the launch recorded on the head, as the supervisor reads it: its ranks, probe and supervise settings."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api import head_api_base
from ..config import NAME_PATTERN, is_int, is_number
from ..release import Release, ReleaseError
from .config import Config

# What recipe.supervise holds; the role fills these in, a render of an older launch may lack them.
SUPERVISE_DEFAULTS: dict[str, Any] = {
    "enabled": True, "interval_s": 15, "probe_timeout_s": 30, "failures_before_heal": 3,
    "ready_timeout_s": None, "memory_wait_s": 300, "backoff_s": 30, "backoff_max_s": 600,
    "max_restarts_per_hour": 3, "start_on_boot": False, "log_lines": 200,
}
ORDERS = ("workers_first", "head_first")


class RenderError(Exception):
    """The render is unusable; the message says why."""


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
    api_base: str = ""  # where the head reaches this release's API (the record's launch, else the config's)
    require_rdma: bool = True  # the recipe's fabric.require_rdma: a heal over several nodes fails without RDMA
    nccl_reports: bool = False  # the ranks run with NCCL_DEBUG=INFO: their logs say which network NCCL chose

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
    if not (is_int(value) if whole else is_number(value)) or float(value) < minimum:  # type: ignore[arg-type]
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


def _api_base(data: object, config: Config) -> str:
    """Where the head reaches the API of the release the record names: its launch's api_host and api_port (an
    upgrade that moved the API, to the fabric address when the gateway moved away, has a record that says so
    before the supervisor's settings do), else the config's api_base (a record without them)."""
    host, port = dig(data, "recipe.launch.api_host"), dig(data, "recipe.launch.api_port")
    if not isinstance(host, str) or not host or not is_int(port):
        return config.api_base
    return head_api_base(host, int(port), config.wildcard_hosts)


def parse_render(data: object, config: Config, mtime: float) -> Render:
    """Validate the render the launch recorded; every problem is a RenderError.

    The record is first read as the release schema has it (node/release.py, the one every reader of the head's
    records uses), then for what the supervisor needs of it.
    """
    if not isinstance(data, dict):
        raise RenderError("it is not a JSON object")
    try:
        Release.from_dict(data, "it")
    except ReleaseError as err:
        raise RenderError(str(err)) from err
    if data.get("deployment") != config.deployment:
        raise RenderError(f"it is the render of {json.dumps(data.get('deployment'))}, not of {config.deployment}")
    order = dig(data, "recipe.launch.order", "workers_first")
    if order not in ORDERS:
        raise RenderError(f"recipe.launch.order is {json.dumps(order)}, not one of {', '.join(ORDERS)}")
    dead = dig(data, "adapter.dead_health_pattern", "")
    require_rdma = dig(data, "recipe.fabric.require_rdma", True)
    if not isinstance(require_rdma, bool):
        raise RenderError(f"recipe.fabric.require_rdma is {json.dumps(require_rdma)}, not true or false")
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
        api_base=_api_base(data, config),
        require_rdma=require_rdma,
        nccl_reports=any(str(dig(entry, "env.NCCL_DEBUG", "")).upper() == "INFO"
                         for entry in (dig(data, "ranks") or {}).values()),
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

