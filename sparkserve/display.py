"""What a run shows while it runs: a live view on a terminal, lines in a log, or JSON lines.

Each display gets every event with the Notes RunModel.feed() made of it. The live view is drawn from the
model itself (rich refreshes it from its own thread, so model and view share a lock).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, tzinfo
from typing import IO, Any, Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from sparkserve.events import FAILED, OK, RUNNING, SKIPPED_ALL, Note, Probe, Progress, RunModel, Stage

SYMBOLS = {RUNNING: "●", OK: "✓", FAILED: "✗", SKIPPED_ALL: "–"}
STYLES = {RUNNING: "cyan", OK: "green", FAILED: "red", SKIPPED_ALL: "dim"}
PLAIN_WORDS = {RUNNING: "start", OK: "ok", FAILED: "FAILED", SKIPPED_ALL: "skipped"}
BAR_WIDTH = 16


# -- formatting ----------------------------------------------------------------------------------------

def duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m."""
    total = int(round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def clock(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour on."""
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _scaled(count: float) -> tuple[float, str]:
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1000:
            return value, unit
        value /= 1000
    return value, "TB"


def _number(value: float, unit: str) -> str:
    return f"{value:.0f}" if unit == "B" or abs(value) >= 100 else f"{value:.1f}"


def size(count: float) -> str:
    """Bytes in decimal units, three figures: 950 B, 1.2 MB, 12.0 GB, 123 GB."""
    value, unit = _scaled(count)
    return f"{_number(value, unit)} {unit}"


def amount(bar: Progress) -> str:
    """How far a bar is, in its unit: 1.2/12.0 GB, 3/8 shards, 40%."""
    if bar.unit == "bytes":
        if not bar.total:
            return size(bar.done)
        total, unit = _scaled(bar.total)
        done = bar.done * total / bar.total  # in the total's unit
        return f"{_number(done, unit)}/{_number(total, unit)} {unit}"
    if bar.unit == "percent":
        return f"{bar.done}%"
    unit = f" {bar.unit}" if bar.unit else ""
    return f"{bar.done}/{bar.total}{unit}" if bar.total else f"{bar.done}{unit}"


def rate(bar: Progress) -> str:
    value = bar.rate()
    if value is None:
        return ""
    if bar.unit == "bytes":
        return f"{size(value)}/s"
    if bar.unit == "percent":
        return f"{value:.1f}%/s"
    return f"{value:.1f} {bar.unit or 'units'}/s"


def eta(bar: Progress) -> str:
    value = bar.eta()
    return f"ETA {clock(value)}" if value is not None and bar.done < bar.total else ""


def percent(bar: Progress) -> str:
    fraction = bar.fraction
    return f"{math.floor(fraction * 100)}%" if fraction is not None else "?"


def bar_name(bar: Progress) -> str:
    """download spark-1 LABEL, or load rank 1 LABEL for a bar of one rank (whichever host reported it)."""
    who = f"rank {bar.rank}" if bar.rank is not None else bar.host
    label = f" {bar.label}" if bar.label else ""
    return f"{bar.kind} {who}{label}"


def probe_text(probe: Probe) -> str:
    who = f"rank {probe.rank} on {probe.host}" if probe.rank is not None else probe.host
    text = f"{who}: {probe.state}"
    if probe.detail:
        text += f" ({probe.detail})"
    if probe.attempt is not None:
        text += f", attempt {probe.attempt}" + (f"/{probe.attempts}" if probe.attempts else "")
    return text


def stage_detail(stage: Stage, now: datetime) -> str:
    detail = duration(stage.elapsed(now))
    if stage.changed:
        detail += f", {stage.changed} changed"
    return detail


# -- displays ------------------------------------------------------------------------------------------

class Display(Protocol):
    def start(self) -> None: ...

    def handle(self, event: Mapping[str, Any], notes: list[Note]) -> None: ...

    def stop(self) -> None: ...


def working_hosts(stage: Stage) -> list[tuple[str, str]]:
    """(host, task) of each host running a task; one line with no host when several share one task."""
    hosts = [(name, host.task) for name, host in sorted(stage.hosts.items()) if host.state == RUNNING and host.task]
    if len(hosts) > 1 and len({task for _, task in hosts}) == 1:
        return [(f"{len(hosts)} nodes", hosts[0][1])]
    return hosts


def live_view(model: RunModel, now: datetime) -> RenderableType:
    """The running stage, its hosts' tasks, its bars and the readiness line (finished stages print above)."""
    stage = model.current
    if stage is None:
        return Text("waiting for ansible-playbook…" if not model.finished else "", style="dim")
    lines = Table.grid(padding=(0, 1), expand=True)
    lines.add_column(width=1, no_wrap=True)
    lines.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
    lines.add_column(justify="right", no_wrap=True)
    lines.add_row(Text(SYMBOLS[RUNNING], style=STYLES[RUNNING]), Text(stage.name, style="bold"),
                  clock(stage.elapsed(now)))
    for host, task in working_hosts(stage):
        lines.add_row("", Text(f"  {host}: {task}", style="dim"), "")
    parts: list[RenderableType] = [lines]
    bars = model.active_progress()
    if bars:
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        table.add_column(width=BAR_WIDTH, no_wrap=True)
        table.add_column(width=4, justify="right", no_wrap=True)
        table.add_column(no_wrap=True, overflow="ellipsis", max_width=32)
        for bar in bars:
            fraction = bar.fraction
            graphic = ProgressBar(total=1.0, completed=fraction or 0.0, width=BAR_WIDTH, pulse=fraction is None)
            detail = "  ".join(p for p in (amount(bar), rate(bar), eta(bar)) if p)
            table.add_row(Text(f"  {bar_name(bar)}"), graphic, percent(bar), detail)
        parts.append(table)
    for probe in model.active_probes():
        parts.append(Text(f"  readiness: {probe_text(probe)}", style="yellow", no_wrap=True, overflow="ellipsis"))
    return Group(*parts)


class LiveDisplay:
    """A terminal view redrawn four times a second; finished stages and failures print above it."""

    def __init__(self, model: RunModel, console: Console, lock: threading.Lock,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.model, self.console, self.lock, self.now = model, console, lock, now
        self.live = Live(self, console=console, refresh_per_second=4, transient=True, redirect_stdout=False)

    def __rich__(self) -> RenderableType:
        with self.lock:
            return live_view(self.model, self.now())

    def start(self) -> None:
        self.live.start()

    def handle(self, event: Mapping[str, Any], notes: list[Note]) -> None:
        for note in notes:
            if note.kind == "stage_end" and note.state:
                stage = next((s for s in reversed(self.model.stages) if s.name == note.stage), None)
                detail = stage_detail(stage, note.time) if stage else ""
                line = Text(f"{SYMBOLS[note.state]} ", style=STYLES[note.state])
                line.append(note.stage or "")
                line.append(f"  {detail}", style="dim")
                self.console.print(line, no_wrap=True, overflow="ellipsis")
            elif note.kind == "failure" and note.failure:
                failure = note.failure
                self.console.print(Text(f"  ✗ {failure.host}: {failure.task}: {failure.message}", style="red"))

    def stop(self) -> None:
        self.live.stop()


class PlainDisplay:
    """Lines for a log: stage start and end, progress every 10 %, readiness changes, failures."""

    def __init__(self, model: RunModel, stream: IO[str], tz: tzinfo | None = None, echo: bool = False) -> None:
        self.model, self.stream, self.tz, self.echo = model, stream, tz, echo
        self.deciles: dict[tuple[Any, ...], int] = {}
        self.probe_states: dict[tuple[str, int | None], str] = {}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stream.flush()

    def _line(self, when: datetime, word: str, text: str) -> None:
        stamp = when.astimezone(self.tz).strftime("%H:%M:%S")
        self.stream.write(f"[{stamp}] {word:<8} {text}\n")

    def handle(self, event: Mapping[str, Any], notes: list[Note]) -> None:
        if self.echo and isinstance(event.get("stdout"), str) and event["stdout"]:
            self.stream.write(event["stdout"].rstrip("\n") + "\n")
        for note in notes:
            if note.kind == "stage_start":
                self._line(note.time, PLAIN_WORDS[RUNNING], note.stage or "")
            elif note.kind == "stage_end" and note.state:
                stage = next((s for s in reversed(self.model.stages) if s.name == note.stage), None)
                detail = f" ({stage_detail(stage, note.time)})" if stage else ""
                self._line(note.time, PLAIN_WORDS[note.state], f"{note.stage}{detail}")
            elif note.kind == "progress":
                for bar in note.progress:
                    self._progress(note.time, bar)
            elif note.kind == "probe" and note.probe:
                key = (note.probe.host, note.probe.rank)
                if self.probe_states.get(key) != note.probe.state:
                    self.probe_states[key] = note.probe.state
                    self._line(note.time, "ready?", probe_text(note.probe))
            elif note.kind == "failure" and note.failure:
                word = "UNREACH" if note.failure.unreachable else "FAILED"
                self._line(note.time, word, f"{note.failure.host}: {note.failure.task}: {note.failure.message}")
        self.stream.flush()

    def _progress(self, when: datetime, bar: Progress) -> None:
        """One line when a bar passes the next 10 % (and when it completes)."""
        fraction = bar.fraction
        if bar.complete:
            decile = 10
        elif fraction is None:
            return
        else:
            decile = min(9, math.floor(fraction * 10))
        key = (bar.key, bar.stage)
        if decile <= self.deciles.get(key, -1):
            return
        self.deciles[key] = decile
        detail = ", ".join(p for p in (amount(bar), rate(bar), eta(bar)) if p)
        self._line(when, "done" if bar.complete else "progress", f"{bar_name(bar)} {percent(bar)} ({detail})")


def note_json(note: Note) -> dict[str, Any]:
    """One JSON-lines record of a note."""
    record: dict[str, Any] = {
        "time": note.time.isoformat(), "event": note.kind, "stage": note.stage, "host": note.host,
        "state": note.state, "task": note.task,
    }
    if note.progress:
        record["progress"] = [bar.as_dict() for bar in note.progress]
    if note.probe:
        record["probe"] = note.probe.as_dict()
    if note.failure:
        record["message"] = note.failure.message
        record["role"] = note.failure.role
    if note.elapsed is not None:
        record["elapsed"] = round(note.elapsed, 3)
    return record


class JsonDisplay:
    """One JSON object a line for each note; the command adds a final {"summary": ...}."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stream.flush()

    def handle(self, event: Mapping[str, Any], notes: list[Note]) -> None:
        for note in notes:
            self.write(note_json(note))
        self.stream.flush()

    def write(self, record: Mapping[str, Any]) -> None:
        self.stream.write(json.dumps(record, default=str, sort_keys=False) + "\n")


class QuietDisplay:
    """Shows nothing while the run runs (status --json prints one document at the end)."""

    def start(self) -> None:
        pass

    def handle(self, event: Mapping[str, Any], notes: list[Note]) -> None:
        pass

    def stop(self) -> None:
        pass
