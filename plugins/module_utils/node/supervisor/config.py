"""The supervisor's config file: its keys, checked (see roles/supervisor/files/sparkserve-supervisor.py)."""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import ConfigError, name_value, read_json

__all__ = ["CONFIG_KEYS", "OPTIONAL_CONFIG_KEYS", "Config", "ConfigError", "load_config", "parse_config"]

CONFIG_KEYS = ("deployment", "render_path", "head", "nodes", "rank_hosts", "ssh_argv", "meminfo_path",
               "lock_dir", "state_dir", "api_base", "wildcard_hosts")
# Keys that may be left out: an operator's pause file, the page-cache flusher unit run on every node during
# a restart's load, and the memory guard's unit armed on every node before the ranks, as the launch does.
# And the node-exporter textfile of its metrics, and the twins' RoCE devices every rank's NCCL must use.
OPTIONAL_CONFIG_KEYS = ("pause_file", "flusher_unit", "memguard_unit", "metrics_path", "rdma_devices")
UNIT_PATTERN = re.compile(r"[A-Za-z0-9:_.@-]+\.service")


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
    wildcard_hosts: tuple[str, ...]  # the addresses an API binds to listen on every interface
    pause_file: str | None = None
    flusher_unit: str | None = None
    memguard_unit: str | None = None
    metrics_path: str | None = None
    rdma_devices: tuple[str, ...] = ()


def _rdma_devices(raw: Mapping[str, Any]) -> tuple[str, ...]:
    value = raw.get("rdma_devices")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f'rdma_devices is {json.dumps(value)}; set a list of RoCE device names, like '
                          '["rocep1s0f1", "roceP2p1s0f1"]')
    return tuple(value)


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


def _wildcard_hosts(raw: Mapping[str, Any]) -> tuple[str, ...]:
    value = raw["wildcard_hosts"]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f'wildcard_hosts is {json.dumps(value)}; set the addresses that mean every interface, '
                          'like ["0.0.0.0", "::"] (sparkserve_wildcard_hosts)')
    return tuple(value)


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
        deployment=name_value(raw, "deployment"),
        render_path=_absolute_path(raw, "render_path"),
        head=head,
        nodes=nodes,
        rank_hosts=_rank_hosts(raw, nodes, head),
        ssh_argv=_ssh_argv(raw),
        meminfo_path=_absolute_path(raw, "meminfo_path"),
        lock_dir=_absolute_path(raw, "lock_dir"),
        state_dir=_absolute_path(raw, "state_dir"),
        api_base=_api_base(raw),
        wildcard_hosts=_wildcard_hosts(raw),
        pause_file=_absolute_path(raw, "pause_file") if raw.get("pause_file") is not None else None,
        flusher_unit=_unit(raw, "flusher_unit"),
        memguard_unit=_unit(raw, "memguard_unit"),
        metrics_path=_absolute_path(raw, "metrics_path") if raw.get("metrics_path") is not None else None,
        rdma_devices=_rdma_devices(raw),
    )


def load_config(path: str) -> Config:
    """Read and validate the config file; every problem is a ConfigError."""
    return parse_config(read_json(path))
