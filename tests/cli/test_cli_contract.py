"""The CLI's side of the run's contract (plugins/module_utils/run_stats.py).

The recorded runs hold only what the contract says, and the command's readers (the summary, status, logs,
diagnose, --ask, the live bars and probes) read no field the contract does not name: each reader is fed the
recorded stats wrapped in mappings that note every field asked for.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_streams import FIXTURES, model_of, stream

from ansible_collections.sparkserve.deploy.plugins.module_utils import run_stats
from sparkserve.ask import AskError, complete
from sparkserve.events import RunModel, replay
from sparkserve.status import render_status, render_statuses, status_document
from sparkserve.summary import (
    FailureReport,
    classify,
    diagnose_lines,
    endpoint_lines,
    failure_lines,
    follow_argv,
    logs_lines,
    monitoring_lines,
)

RECORDED = sorted(p.stem for p in FIXTURES.glob("*.jsonl"))
# The stats no recorded run carries, as their writers write them (the monitoring stage, diagnose).
UNRECORDED = {
    run_stats.MONITORING: {"server": "spark-1", "url": "http://127.0.0.1:9090", "port": 9090, "loopback": True,
                           "address": "10.0.0.1", "ssh_user": "root", "targets_up": 4},
    run_stats.DIAGNOSE: {"archive": "/srv/sparkserve/artifacts/diagnose/lab-tp2-20261202T100000Z.tar.gz"},
    # Several deployments (the fleet scenario's): each one's endpoint and status by name, and what runs unlisted.
    run_stats.ENDPOINTS: {"lab-tp1": {"url": "http://172.30.77.11:8001", "loopback": False,
                                      "model_name": "tiny-model-1", "deployment": "lab-tp1", "api_port": 8001,
                                      "head": "lab-tp1@spark-1"}},
    run_stats.STATUSES: {"lab-tp1": {"recipe": "lab-tp1", "ranks": [{"rank": 0, "node": "lab-tp1@spark-1",
                                                                    "container": "lab-tp1-rank0", "running": True}]}},
    run_stats.UNMANAGED: {"spark-2": ["old-model"]},
    run_stats.GATEWAY: {"url": "http://10.0.0.1:4000", "open": False, "keys": ["alice"], "models": ["lab-tp2"],
                        "node": "spark-1", "address": "10.0.0.1", "ssh_user": "root", "port": 4000},
}


def schema_paths(kind: Any, path: str) -> Iterator[str]:
    """Every field path of a type of run_stats.py, a list's items as []."""
    origin = typing.get_origin(kind)
    if origin is typing.Union:
        for arg in typing.get_args(kind):
            yield from schema_paths(arg, path)
    elif origin is list:
        yield from schema_paths(typing.get_args(kind)[0], path + "[]")
    elif origin is dict:  # a mapping by name (a deployment's, a node's): any key, as *
        yield f"{path}.*"
        yield from schema_paths(typing.get_args(kind)[1], path + ".*")
    elif typing.is_typeddict(kind):
        for key, sub in run_stats.fields(kind).items():
            yield f"{path}.{key}"
            yield from schema_paths(sub, f"{path}.{key}")


SCHEMA = {p for key, kind in {**run_stats.STATS, **run_stats.RESULTS}.items() for p in schema_paths(kind, key)}
# The stats that are mappings by name: a path read in one names the key, the schema says *.
BY_NAME = tuple(key for key, kind in run_stats.STATS.items() if typing.get_origin(kind) is dict)


def by_name(path: str) -> str:
    """PATH with the name under a mapping-by-name stat as *."""
    head, _, rest = path.partition(".")
    if head not in BY_NAME or not rest:
        return path
    _, dot, tail = rest.partition(".")
    return f"{head}.*{dot}{tail}"


class Noted(dict[str, Any]):
    """A mapping that notes in READ the path of every field asked for."""

    def __init__(self, data: dict[str, Any], path: str, read: set[str]) -> None:
        super().__init__({k: noted(v, f"{path}.{k}", read) for k, v in data.items()})
        self.path, self.read = path, read

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(f"{self.path}.{key}")
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(f"{self.path}.{key}")
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(f"{self.path}.{key}")
        return super().__contains__(key)


def noted(value: Any, path: str, read: set[str]) -> Any:
    if isinstance(value, dict):
        return Noted(value, path, read)
    if isinstance(value, list):
        return [noted(v, path + "[]", read) for v in value]
    return value


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_stats_hold_the_contract(name: str) -> None:
    assert run_stats.stats_problems(model_of(name).stats) == []


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_results_hold_the_contract(name: str) -> None:
    results = [e["event_data"]["res"] for e in stream(name) if isinstance(e.get("event_data", {}).get("res"), dict)]
    assert [p for res in results for p in run_stats.result_problems(res)] == []


def test_the_unrecorded_stats_hold_the_contract() -> None:
    assert run_stats.stats_problems(UNRECORDED) == []


def test_the_recordings_carry_every_key_the_cli_reads() -> None:
    """Every key is fed to the readers: the recorded ones, and the unrecorded ones written out here."""
    stats = {key for name in RECORDED for key in model_of(name).stats}
    results = {key for name in RECORDED for e in stream(name)
               for key in run_stats.RESULTS if key in str(e.get("event_data", {}).get("res", ""))}
    assert stats | results | set(UNRECORDED) == set(run_stats.STATS) | set(run_stats.RESULTS)


def _stats_read(model: RunModel) -> set[str]:
    read: set[str] = set()
    model.stats = {key: noted(value, key, read) for key, value in model.stats.items()}
    model.stats.update({key: noted(value, key, read) for key, value in UNRECORDED.items()})
    endpoint_lines(model)
    monitoring_lines(model)
    logs_lines(model)
    follow_argv(model, 1)
    diagnose_lines(model)
    FailureReport.of(model)
    classify(model, 2)
    failure_lines(model, 2, 5, Path("/tmp/run"))
    status = model.stats.get(run_stats.STATUS)
    if status is not None:
        render_status(status)
    render_statuses(model.stats)
    status_document(model.stats)
    endpoint = model.stats.get(run_stats.ENDPOINT)
    if endpoint is not None:
        with pytest.raises(AskError):
            complete(noted(dict(endpoint, loopback=True), run_stats.ENDPOINT, read), "2+2=")
    return read


def _results_read(name: str) -> set[str]:
    read: set[str] = set()
    events = []
    for event in stream(name):
        res = event.get("event_data", {}).get("res")
        if isinstance(res, dict):
            res = dict(res, **{k: noted(v, k, read) for k, v in res.items() if k in run_stats.RESULTS})
            if isinstance(res.get("results"), list):
                res["results"] = [dict(r, **{k: noted(v, k, read) for k, v in r.items() if k in run_stats.RESULTS})
                                  if isinstance(r, dict) else r for r in res["results"]]
            event = dict(event, event_data=dict(event["event_data"], res=res))
        events.append(event)
    replay(events)
    return read


def test_the_readers_read_only_what_the_contract_names() -> None:
    read: set[str] = set()
    for name in RECORDED:
        read |= _stats_read(model_of(name)) | _results_read(name)
    assert {by_name(path) for path in read} - SCHEMA == set()
    # and the walk saw the readers at work: the fields each screen is built from
    assert {"sparkserve_endpoint.url", "sparkserve_failure.log_tail", "sparkserve_status.nodes[].fabric.links",
            "sparkserve_logs.ranks[].follow", "sparkserve_diagnose.archive", "sparkserve_monitoring.targets_up",
            "sparkserve_progress.done", "sparkserve_probe.state"} <= read
