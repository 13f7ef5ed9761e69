"""A run's state, built from ansible-runner's event stream.

RunModel.feed() takes the event dicts runner hands to its event_handler (or that it keeps in
ARTIFACT_DIR/IDENT/job_events/) one at a time and keeps: one Stage per play, the progress bars and
readiness probes the playbooks report in task results, the failures, the debug messages and the custom
stats of the final playbook_on_stats event. Each call returns the Notes the displays print. Nothing here
reads the clock or a terminal, so a recorded stream gives the same model every time.

What a stage did (``Stage.did_something``, the summary lists only those stages): it failed, or it changed
something on some host, or it did work: a task that is not bookkeeping ran (ok) on some host. Bookkeeping
is a task of a context role (``CONTEXT_ROLES``: the inventory and the recipe, read again at the top of every
entry playbook) or of an action that only notes, says or includes (``BOOKKEEPING_ACTIONS``: argument
validation, set_fact, set_stats, debug, include/import, meta). So a stage whose every task was skipped, or
that only read its context, is not listed; a preflight whose checks passed is.

A failure's echoes (``RunModel.causes``): of the failures that stand (neither ignored nor rescued), a later
failure on a host that has already failed, or a later failure on an undefined variable (a fact the failed
host never set), follows from an earlier one and is not a cause of its own. The summary shows the first
cause and counts only the other causes.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ansible_collections.sparkserve.deploy.plugins.module_utils import run_stats

Event = Mapping[str, Any]
ProgressKey = tuple[str, str, str, int | None]

RUNNING = "running"
OK = "ok"
FAILED = "failed"
SKIPPED_ALL = "skipped-all"

# The roles every entry playbook starts from (the inventory and the recipe): their tasks are no stage's work.
CONTEXT_ROLES = frozenset({"recipe", "sparkserve"})
# Actions that only note, say or include: a task of these is no stage's work unless it changed something.
BOOKKEEPING_ACTIONS = frozenset({
    "validate_argument_spec", "set_fact", "set_stats", "debug", "include_tasks", "import_tasks", "include_role",
    "import_role", "include_vars", "meta", "add_host", "group_by", "noop",
})
# A failure on a variable or attribute that is not defined: after an earlier failure, its echo.
_UNDEFINED = re.compile(r"is undefined|has no attribute|AnsibleUndefined", re.IGNORECASE)

# Rate and ETA follow the last RATE_WINDOW_S seconds of a bar's samples (stream time, not wall time).
RATE_WINDOW_S = 30.0
# Messages that say a task failed without saying why; the task's stderr says more.
GENERIC_MESSAGES = frozenset({
    "non-zero return code",
    "module failure",
    "module failure\nsee stdout/stderr for the exact error",
    "one or more items failed",
})
STDOUT_TAIL = 200
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(value: object) -> datetime | None:
    """An event's ISO 8601 `created` as an aware datetime (UTC when it names no zone)."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    return str(value)


def _lines(value: object) -> list[str]:
    return [line.strip() for line in strip_ansi(_text(value)).splitlines() if line.strip()]


@dataclass
class HostState:
    """One host within a stage: its current (or last) task and how its results went."""

    task: str = ""
    state: str = RUNNING  # running, ok, failed, unreachable
    changed: int = 0


@dataclass
class Stage:
    """One play. Its state is running until the next play starts or the run ends."""

    name: str
    start: datetime
    end: datetime | None = None
    state: str = RUNNING
    hosts: dict[str, HostState] = field(default_factory=dict)
    changed: int = 0
    results: int = 0  # host results that ran (ok, failed, unreachable); skips are not counted
    skipped: int = 0
    failures: int = 0  # failures that were neither ignored nor rescued
    worked: int = 0  # host results of tasks that are not bookkeeping (see the module's docstring)
    changed_tasks: list[str] = field(default_factory=list)  # the tasks that changed something, in order

    @property
    def did_something(self) -> bool:
        """It failed, changed something, or ran a task that is not bookkeeping."""
        return bool(self.failures or self.changed or self.worked)

    @property
    def changed_hosts(self) -> list[str]:
        return sorted(name for name, host in self.hosts.items() if host.changed)

    def elapsed(self, now: datetime) -> float:
        return max(0.0, ((self.end or now) - self.start).total_seconds())

    def close(self, when: datetime) -> None:
        self.end = when
        self.settle()

    def settle(self) -> None:
        """Derive a closed stage's state from what happened in it."""
        if self.end is None:
            return
        if self.failures:
            self.state = FAILED
        elif self.results == 0:
            self.state = SKIPPED_ALL
        else:
            self.state = OK


@dataclass
class Progress:
    """One bar: (host, kind, label, rank) with the samples its rate and ETA come from."""

    host: str
    kind: str
    label: str
    rank: int | None
    unit: str
    total: int
    stage: str
    task: str = ""
    done: int = 0
    complete: bool = False
    samples: list[tuple[datetime, int]] = field(default_factory=list)

    @property
    def key(self) -> ProgressKey:
        return (self.host, self.kind, self.label, self.rank)

    @property
    def fraction(self) -> float | None:
        """done/total; a completed bar of unknown total is whole."""
        if self.total <= 0:
            return 1.0 if self.complete else None
        return max(0.0, min(1.0, self.done / self.total))

    def update(self, done: int, total: int, unit: str, when: datetime) -> None:
        if self.samples and done < self.samples[-1][1]:
            self.samples.clear()  # the transfer started over
        self.done, self.total, self.unit = done, total, unit or self.unit
        self.samples.append((when, done))
        horizon = when.timestamp() - RATE_WINDOW_S
        # Keep the newest sample at or before the window's start as the reference point.
        while len(self.samples) > 2 and self.samples[1][0].timestamp() <= horizon:
            self.samples.pop(0)

    def rate(self) -> float | None:
        """Units per second over the window, or None before two samples a moment apart."""
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        seconds = (t1 - t0).total_seconds()
        if seconds <= 0:
            return None
        return (d1 - d0) / seconds

    def eta(self) -> float | None:
        """Seconds left at the current rate, or None when unknown."""
        rate = self.rate()
        if self.complete or self.total <= 0 or rate is None or rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / rate)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "kind": self.kind, "label": self.label, "rank": self.rank, "unit": self.unit,
            "done": self.done, "total": self.total, "fraction": self.fraction, "rate": self.rate(),
            "eta": self.eta(), "complete": self.complete,
        }


@dataclass
class Probe:
    """The last readiness probe of one rank (or host)."""

    host: str
    rank: int | None
    state: str
    detail: str
    stage: str
    task: str
    time: datetime
    attempt: int | None = None
    attempts: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "state": self.state, "detail": self.detail,
                "attempt": self.attempt, "attempts": self.attempts}


@dataclass
class Failure:
    """A failed (not ignored) or unreachable task on one host."""

    stage: str
    stage_index: int
    task: str
    host: str
    role: str
    message: str
    time: datetime
    unreachable: bool = False
    rescued: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "task": self.task, "host": self.host, "role": self.role,
                "message": self.message, "unreachable": self.unreachable}


@dataclass
class Message:
    """What a debug (or a passing assert) task said on one host: render's command lines, bench's comparison."""

    host: str
    task: str
    lines: list[str]


@dataclass(frozen=True)
class Note:
    """One thing a display may show, as a fed event produced it.

    kind: stage_start, stage_end, task (a host began a task), result (ok, changed, skipped, ignored),
    progress, probe, failure, stats.
    """

    kind: str
    time: datetime
    stage: str | None = None
    host: str | None = None
    state: str | None = None
    task: str | None = None
    progress: tuple[Progress, ...] = ()
    probe: Probe | None = None
    failure: Failure | None = None
    elapsed: float | None = None


def failure_message(res: Mapping[str, Any]) -> str:
    """The line that says why a task failed: the failed loop items' messages, or the task's own."""
    results = res.get("results")
    if isinstance(results, list):
        found: list[str] = []
        for item in results:
            if not isinstance(item, Mapping) or not (item.get("failed") or item.get("unreachable")):
                continue
            text = _one_message(item)
            label = item.get("_ansible_item_label", item.get("item"))
            if isinstance(label, str | int) and not isinstance(label, bool):
                text = f"{label}: {text}"
            if text not in found:
                found.append(text)
        if found:
            return "; ".join(found)
    return _one_message(res)


def _one_message(res: Mapping[str, Any]) -> str:
    lines = _lines(res.get("msg"))
    message = lines[0] if lines else ""
    for prefix in ("Task failed: ", "Task failed:"):
        message = message.removeprefix(prefix)
    if not message or "\n".join(lines).lower() in GENERIC_MESSAGES or message.lower() in GENERIC_MESSAGES:
        for key in ("stderr", "module_stderr", "stdout", "module_stdout"):
            detail = _lines(res.get(key))
            if detail:
                return f"{message}: {detail[-1]}" if message else detail[-1]
    return message or "failed without a message"


def bookkeeping(data: Mapping[str, Any]) -> bool:
    """Whether the task of a host event is bookkeeping: a context role's, or of an action that only notes."""
    action = str(data.get("resolved_action") or data.get("task_action") or "")
    return str(data.get("role") or "") in CONTEXT_ROLES or action.rsplit(".", 1)[-1] in BOOKKEEPING_ACTIONS


def _res(data: Mapping[str, Any]) -> Mapping[str, Any]:
    res = data.get("res")
    return res if isinstance(res, Mapping) else {}


def _payloads(res: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """Every `key` payload of a result (a dict or a list of dicts), looking into a loop's results too."""
    found: list[Mapping[str, Any]] = []
    sources: list[object] = [res]
    if isinstance(res.get("results"), list):
        sources.extend(res["results"])
    for source in sources:
        if not isinstance(source, Mapping):
            continue
        value = source.get(key)
        items = value if isinstance(value, list) else [value]
        found.extend(item for item in items if isinstance(item, Mapping))
    return found


class RunModel:
    """Everything a display and the summary need, fed one event at a time."""

    def __init__(self) -> None:
        self.stages: list[Stage] = []
        self.progress: dict[ProgressKey, Progress] = {}
        self.probes: dict[tuple[str, int | None], Probe] = {}
        self.failures: list[Failure] = []
        self.messages: list[Message] = []
        self.stats: dict[str, Any] = {}
        self.host_stats: dict[str, dict[str, int]] = {}
        self.task_events = 0
        self.finished = False
        self.playbook_pid: int | None = None
        self.stdout_tail: deque[str] = deque(maxlen=STDOUT_TAIL)
        self.last_time: datetime | None = None

    # -- queries -----------------------------------------------------------------------------------

    @property
    def current(self) -> Stage | None:
        if self.stages and self.stages[-1].end is None:
            return self.stages[-1]
        return None

    def active_progress(self) -> list[Progress]:
        """Unfinished bars of the running stage."""
        stage = self.current
        return [p for p in self.progress.values() if not p.complete and stage is not None and p.stage == stage.name]

    def active_probes(self) -> list[Probe]:
        stage = self.current
        return [p for p in self.probes.values() if stage is not None and p.stage == stage.name]

    def open_failures(self) -> list[Failure]:
        return [f for f in self.failures if not f.rescued]

    def causes(self) -> list[Failure]:
        """The standing failures that are causes, not echoes of an earlier one (see the module's docstring)."""
        causes: list[Failure] = []
        failed_hosts: set[str] = set()
        for failure in self.open_failures():
            if failure.host not in failed_hosts and not (causes and _UNDEFINED.search(failure.message)):
                causes.append(failure)
            failed_hosts.add(failure.host)
        return causes

    def primary_failure(self) -> Failure | None:
        """The first failure that stopped something: later ones are often its consequences."""
        causes = self.causes()
        return causes[0] if causes else None

    # -- feeding -----------------------------------------------------------------------------------

    def feed(self, event: Event) -> list[Note]:
        name = event.get("event")
        data = event.get("event_data")
        data = data if isinstance(data, Mapping) else {}
        when = parse_time(event.get("created")) or self.last_time or _EPOCH
        self.last_time = when
        stdout = event.get("stdout")
        if isinstance(stdout, str) and stdout:
            self.stdout_tail.extend(strip_ansi(stdout).splitlines())
        pid = _int(event.get("pid"))
        if pid is not None and self.playbook_pid is None:
            self.playbook_pid = pid
        if data.get("task"):
            self.task_events += 1
        handler = _HANDLERS.get(str(name))
        return handler(self, data, when) if handler else []

    def _stage_for(self, data: Mapping[str, Any], when: datetime) -> tuple[Stage, list[Note]]:
        """The running stage, opening one when an event comes before any play start."""
        stage = self.current
        if stage is not None:
            return stage, []
        return self._open_stage(str(data.get("play") or "(no play)"), when)

    def _open_stage(self, name: str, when: datetime) -> tuple[Stage, list[Note]]:
        notes = self._close_stage(when)
        stage = Stage(name=name, start=when)
        self.stages.append(stage)
        notes.append(Note("stage_start", when, stage=name, state=RUNNING))
        return stage, notes

    def _close_stage(self, when: datetime) -> list[Note]:
        stage = self.current
        if stage is None:
            return []
        stage.close(when)
        self.probes.clear()
        return [Note("stage_end", when, stage=stage.name, state=stage.state, elapsed=stage.elapsed(when))]

    def _host(self, stage: Stage, host: str) -> HostState:
        return stage.hosts.setdefault(host, HostState())

    def _on_play_start(self, data: Mapping[str, Any], when: datetime) -> list[Note]:
        name = str(data.get("play") or data.get("name") or "(unnamed play)")
        return self._open_stage(name, when)[1]

    def _on_runner_start(self, data: Mapping[str, Any], when: datetime) -> list[Note]:
        stage, notes = self._stage_for(data, when)
        host, task = str(data.get("host", "")), str(data.get("task", ""))
        state = self._host(stage, host)
        state.task = task
        if state.state == OK:
            state.state = RUNNING
        return [*notes, Note("task", when, stage=stage.name, host=host, state=RUNNING, task=task)]

    def _on_ok(self, data: Mapping[str, Any], when: datetime) -> list[Note]:
        stage, notes = self._stage_for(data, when)
        host, task = str(data.get("host", "")), str(data.get("task", ""))
        res = _res(data)
        changed = bool(res.get("changed"))
        state = self._host(stage, host)
        state.task = task
        if state.state == RUNNING:
            state.state = OK
        stage.results += 1
        if not bookkeeping(data):
            stage.worked += 1
        if changed:
            stage.changed += 1
            state.changed += 1
            if task not in stage.changed_tasks:
                stage.changed_tasks.append(task)
        notes.append(Note("result", when, stage=stage.name, host=host, state="changed" if changed else OK, task=task))
        bars = self._progress(stage, host, task, res, when, complete=True)
        # The task is done: so are the bars its retries reported, whether or not its result repeats them.
        left = [b for b in self.progress.values() if b.host == host and b.task == task and not b.complete]
        for bar in left:
            bar.complete = True
        bars += tuple(left)
        if bars:
            notes.append(Note("progress", when, stage=stage.name, host=host, state=OK, task=task, progress=bars))
        probe = self._probe(stage, host, task, res, when)
        if probe is not None:
            notes.append(Note("probe", when, stage=stage.name, host=host, state=probe.state, task=task, probe=probe))
        self._message(host, task, data, res)
        return notes

    def _on_skipped(self, data: Mapping[str, Any], when: datetime) -> list[Note]:
        stage, notes = self._stage_for(data, when)
        host, task = str(data.get("host", "")), str(data.get("task", ""))
        stage.skipped += 1
        state = self._host(stage, host)
        state.task = task
        if state.state == RUNNING:
            state.state = OK
        return [*notes, Note("result", when, stage=stage.name, host=host, state="skipped", task=task)]

    def _on_retry(self, data: Mapping[str, Any], when: datetime) -> list[Note]:
        stage, notes = self._stage_for(data, when)
        host, task = str(data.get("host", "")), str(data.get("task", ""))
        res = _res(data)
        self._host(stage, host).task = task
        bars = self._progress(stage, host, task, res, when, complete=False)
        probe = self._probe(stage, host, task, res, when)
        if bars:
            notes.append(Note("progress", when, stage=stage.name, host=host, state="retry", task=task, progress=bars))
        if probe is not None:
            notes.append(Note("probe", when, stage=stage.name, host=host, state=probe.state, task=task, probe=probe))
        if not bars and probe is None:
            notes.append(Note("result", when, stage=stage.name, host=host, state="retry", task=task))
        return notes

    def _on_failed(self, data: Mapping[str, Any], when: datetime) -> list[Note]:
        stage, notes = self._stage_for(data, when)
        host, task = str(data.get("host", "")), str(data.get("task", ""))
        res = _res(data)
        state = self._host(stage, host)
        state.task = task
        stage.results += 1
        if not bookkeeping(data):
            stage.worked += 1
        if data.get("ignore_errors"):
            if state.state == RUNNING:
                state.state = OK
            return [*notes, Note("result", when, stage=stage.name, host=host, state="ignored", task=task)]
        return [*notes, self._fail(stage, host, task, data, failure_message(res), when, unreachable=False)]

    def _on_unreachable(self, data: Mapping[str, Any], when: datetime) -> list[Note]:
        stage, notes = self._stage_for(data, when)
        host, task = str(data.get("host", "")), str(data.get("task", ""))
        res = _res(data)
        stage.results += 1
        message = _one_message(res)
        return [*notes, self._fail(stage, host, task, data, message, when, unreachable=True)]

    def _fail(self, stage: Stage, host: str, task: str, data: Mapping[str, Any], message: str, when: datetime,
              *, unreachable: bool) -> Note:
        failure = Failure(stage=stage.name, stage_index=len(self.stages) - 1, task=task, host=host,
                          role=str(data.get("role") or ""), message=message, time=when, unreachable=unreachable)
        self.failures.append(failure)
        stage.failures += 1
        state = self._host(stage, host)
        state.task = task
        state.state = "unreachable" if unreachable else FAILED
        return Note("failure", when, stage=stage.name, host=host, state=state.state, task=task, failure=failure)

    def _on_stats(self, data: Mapping[str, Any], when: datetime) -> list[Note]:
        notes = self._close_stage(when)
        custom = data.get("artifact_data")
        self.stats = dict(custom) if isinstance(custom, Mapping) else {}
        for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored"):
            counts = data.get(key)
            if isinstance(counts, Mapping):
                self.host_stats[key] = {str(h): _int(n) or 0 for h, n in counts.items()}
        self._settle_rescues()
        self.finished = True
        notes.append(Note("stats", when, state=FAILED if self.open_failures() else OK))
        return notes

    def _settle_rescues(self) -> None:
        """Mark the failures a block's rescue caught.

        Ansible counts a rescued failure under `rescued`, not `failures`, and a host stops at its first failure
        that is not rescued: so of a host's failures, only its last failures+dark ones stand.
        """
        if not self.host_stats:
            return
        failed, dark = self.host_stats.get("failures", {}), self.host_stats.get("dark", {})
        by_host: dict[str, list[Failure]] = {}
        for failure in self.failures:
            by_host.setdefault(failure.host, []).append(failure)
        for host, failures in by_host.items():
            standing = failed.get(host, 0) + dark.get(host, 0)
            for index, failure in enumerate(failures):
                failure.rescued = index < len(failures) - standing
        for index, stage in enumerate(self.stages):
            stage.failures = sum(1 for f in self.open_failures() if f.stage_index == index)
            stage.settle()

    # -- channels ----------------------------------------------------------------------------------

    def _progress(self, stage: Stage, host: str, task: str, res: Mapping[str, Any], when: datetime,
                  *, complete: bool) -> tuple[Progress, ...]:
        bars: list[Progress] = []
        for payload in _payloads(res, run_stats.PROGRESS):
            kind, label = payload.get("kind"), payload.get("label", "")
            done, total = _int(payload.get("done")), _int(payload.get("total"))
            if not isinstance(kind, str) or not kind or done is None:
                continue
            rank = _int(payload.get("rank"))
            unit = str(payload.get("unit") or "")
            key: ProgressKey = (host, kind, str(label), rank)
            bar = self.progress.get(key)
            if bar is None or bar.complete:
                bar = Progress(host=host, kind=kind, label=str(label), rank=rank, unit=unit, total=total or 0,
                               stage=stage.name, task=task)
                self.progress[key] = bar
            bar.update(done, total if total is not None else bar.total, unit, when)
            if complete:
                bar.complete = True
            bars.append(bar)
        return tuple(bars)

    def _probe(self, stage: Stage, host: str, task: str, res: Mapping[str, Any], when: datetime) -> Probe | None:
        payload = res.get(run_stats.PROBE)
        if not isinstance(payload, Mapping):
            return None
        rank = _int(payload.get("rank"))
        probe = Probe(host=host, rank=rank, state=str(payload.get("state") or "waiting"),
                      detail=_text(payload.get("detail")).strip(), stage=stage.name, task=task, time=when,
                      attempt=_int(res.get("attempts")), attempts=_int(res.get("retries")))
        self.probes[(host, rank)] = probe
        return probe

    def _message(self, host: str, task: str, data: Mapping[str, Any], res: Mapping[str, Any]) -> None:
        action = str(data.get("task_action") or data.get("resolved_action") or "")
        short = action.rsplit(".", 1)[-1]
        if short not in ("debug", "assert") or "msg" not in res:
            return
        lines = [line for line in _text(res.get("msg")).splitlines() if line.strip()]
        if short == "assert" and lines == ["All assertions passed"]:
            return
        if lines:
            self.messages.append(Message(host=host, task=task, lines=lines))


_HANDLERS = {
    "playbook_on_play_start": RunModel._on_play_start,
    "runner_on_start": RunModel._on_runner_start,
    "runner_on_ok": RunModel._on_ok,
    "runner_on_skipped": RunModel._on_skipped,
    "runner_retry": RunModel._on_retry,
    "runner_on_failed": RunModel._on_failed,
    "runner_on_unreachable": RunModel._on_unreachable,
    "playbook_on_stats": RunModel._on_stats,
}


def load_events(path: Path) -> list[dict[str, Any]]:
    """Events recorded from a run, ordered by counter.

    path is a JSON-lines file (one event a line), runner's job_events/ folder (one event a file), or a
    run's artifact folder holding job_events/.
    """
    if path.is_dir():
        folder = path / "job_events" if (path / "job_events").is_dir() else path
        events = [json.loads(f.read_text(encoding="utf-8")) for f in folder.glob("*.json")
                  if not f.name.endswith("-partial.json")]
    else:
        events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted((e for e in events if isinstance(e, dict)), key=lambda e: _int(e.get("counter")) or 0)


def replay(events: Iterable[Event], model: RunModel | None = None) -> RunModel:
    """A model fed every event of a recorded run."""
    model = model or RunModel()
    for event in events:
        model.feed(event)
    return model
