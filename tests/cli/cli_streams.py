"""Event streams for the sparkserve command's tests: the recorded fixtures and small hand-made ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sparkserve.events import RunModel, load_events, replay

FIXTURES = Path(__file__).resolve().parent / "fixtures"
T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)


def stream(name: str) -> list[dict[str, Any]]:
    """A fixture's events: NAME.jsonl (JSON lines) or NAME/ (runner's job_events/ layout)."""
    path = FIXTURES / name
    return load_events(path if path.exists() else FIXTURES / f"{name}.jsonl")


def model_of(name: str) -> RunModel:
    return replay(stream(name))


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def play(name: str, t: float = 0) -> dict[str, Any]:
    return {"event": "playbook_on_play_start", "created": at(t), "event_data": {"play": name, "name": name}}


def host_event(event: str, play_name: str, host: str, task: str, *, role: str = "", t: float = 0,
               res: dict[str, Any] | None = None, ignore_errors: bool | None = None,
               action: str = "ansible.builtin.command") -> dict[str, Any]:
    data: dict[str, Any] = {"play": play_name, "task": task, "host": host, "res": res or {},
                            "task_action": action}
    if role:
        data["role"] = role
    if event == "runner_on_failed":
        data["ignore_errors"] = ignore_errors
    return {"event": event, "created": at(t), "event_data": data}


def stats(t: float = 100, artifact_data: dict[str, Any] | None = None, **counts: dict[str, int]) -> dict[str, Any]:
    data: dict[str, Any] = {"artifact_data": artifact_data or {}}
    data.update(counts)
    return {"event": "playbook_on_stats", "created": at(t), "event_data": data}


def failed_run(play_name: str, role: str, *, unreachable: bool = False) -> RunModel:
    """One play in which spark-1 fails (or is unreachable) in a task of `role`."""
    event = "runner_on_unreachable" if unreachable else "runner_on_failed"
    counts = {"dark": {"spark-1": 1}} if unreachable else {"failures": {"spark-1": 1}}
    return replay([
        play(play_name),
        host_event(event, play_name, "spark-1", "A task", role=role, t=1, res={"msg": "it broke"}),
        stats(2, **counts),
    ])
