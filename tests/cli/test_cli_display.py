"""The three displays: plain lines, JSON lines and the live terminal view."""

from __future__ import annotations

import io
import json
import threading
from datetime import UTC, timedelta

from cli_streams import T0, at, host_event, play, stream
from rich.console import Console

from sparkserve.display import JsonDisplay, LiveDisplay, PlainDisplay, amount, duration, live_view, size
from sparkserve.events import Progress, RunModel, replay

UP_PLAIN = """\
[10:00:00] start    Preflight the Sparks
[10:00:12] ok       Preflight the Sparks (12s)
[10:00:12] start    Overlays on the pinned image
[10:00:13] skipped  Overlays on the pinned image (1s)
[10:00:13] start    Weights on every Spark
[10:00:14] progress download spark-1 sparkserve-lab/tiny-model 0% (0.0/4.0 GB)
[10:00:24] progress download spark-1 sparkserve-lab/tiny-model 25% (1.0/4.0 GB, 100 MB/s, ETA 0:30)
[10:00:34] progress download spark-1 sparkserve-lab/tiny-model 50% (2.0/4.0 GB, 100 MB/s, ETA 0:20)
[10:00:54] done     download spark-1 sparkserve-lab/tiny-model 100% (4.0/4.0 GB, 100 MB/s)
[10:01:00] progress fanout spark-2 sparkserve-lab/tiny-model 50% (50%)
[10:01:10] done     fanout spark-2 sparkserve-lab/tiny-model 100% (100%, 5.0%/s)
[10:01:10] ok       Weights on every Spark (57s, 2 changed)
[10:01:10] start    Launch the engine
[10:01:20] progress load rank 0 weights 25% (2/8 shards)
[10:01:20] progress load rank 1 weights 12% (1/8 shards)
[10:01:20] ready?   spark-1: health (GET /health: 503 Service Unavailable: loading), attempt 1/90
[10:01:30] progress load rank 0 weights 100% (8/8 shards, 0.6 shards/s)
[10:01:30] progress load rank 1 weights 100% (8/8 shards, 0.7 shards/s)
[10:01:30] ready?   spark-1: completion (POST /v1/completions: 503), attempt 2/90
[10:01:35] done     load rank 0 weights 100% (8/8 shards, 0.4 shards/s)
[10:01:35] done     load rank 1 weights 100% (8/8 shards, 0.5 shards/s)
[10:01:35] ready?   spark-1: ready
[10:01:36] ok       Launch the engine (26s, 2 changed)
"""


def plain(name: str) -> str:
    model, out = RunModel(), io.StringIO()
    display = PlainDisplay(model, out, tz=UTC)
    for event in stream(name):
        display.handle(event, model.feed(event))
    return out.getvalue()


def test_plain_output_of_a_successful_up() -> None:
    assert plain("up_success") == UP_PLAIN


def test_plain_output_names_the_failures_as_they_happen() -> None:
    lines = plain("launch_failed").splitlines()
    assert lines[-3] == ("[10:00:31] FAILED   spark-1: Wait until the head answers a real completion: "
                         "rank 1 on spark-2 stopped (exited 1)")
    assert lines[-1] == "[10:00:33] FAILED   Launch the engine (21s, 2 changed)"
    unreachable = plain("unreachable").splitlines()
    assert unreachable[1].startswith("[10:00:11] UNREACH  spark-2: Check this Spark: Failed to connect")


def test_plain_progress_prints_at_most_every_ten_percent() -> None:
    play_name = "Weights on every Spark"
    events = [play(play_name)]
    for done in range(0, 101):
        res = {"sparkserve_progress": {"kind": "download", "label": "m", "done": done, "total": 100, "unit": "bytes"}}
        events.append(host_event("runner_retry", play_name, "spark-1", "Fetch", t=done, res=res))
    events.append(host_event("runner_on_ok", play_name, "spark-1", "Fetch", t=101, res={
        "sparkserve_progress": {"kind": "download", "label": "m", "done": 100, "total": 100, "unit": "bytes"}}))
    model, out = RunModel(), io.StringIO()
    display = PlainDisplay(model, out, tz=UTC)
    for event in events:
        display.handle(event, model.feed(event))
    percents = [line.split()[5] for line in out.getvalue().splitlines() if "download" in line]
    assert percents == ["0%", "10%", "20%", "30%", "40%", "50%", "60%", "70%", "80%", "90%", "100%"]
    assert out.getvalue().splitlines()[-1].split()[1] == "done"


def test_verbose_plain_output_echoes_ansible_playbook() -> None:
    model, out = RunModel(), io.StringIO()
    display = PlainDisplay(model, out, tz=UTC, echo=True)
    for event in stream("bad_input"):
        display.handle(event, model.feed(event))
    assert out.getvalue().startswith("[ERROR]: /srv/sparkserve/inventory/lab/cluster.sparks.yml: 1 problem")


def test_json_lines_carry_stage_host_state_task_and_progress() -> None:
    model, out = RunModel(), io.StringIO()
    display = JsonDisplay(out)
    for event in stream("up_success"):
        display.handle(event, model.feed(event))
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert all({"time", "stage", "host", "state", "task"} <= set(r) for r in records)
    assert records[0] == {"time": at(0), "event": "stage_start", "stage": "Preflight the Sparks", "host": None,
                          "state": "running", "task": None}
    download = [r for r in records if r["event"] == "progress" and r["progress"][0]["kind"] == "download"]
    assert download[2]["time"] == at(34) and download[2]["state"] == "retry"
    assert download[2]["progress"] == [{
        "host": "spark-1", "kind": "download", "label": "sparkserve-lab/tiny-model", "rank": None, "unit": "bytes",
        "done": 2_000_000_000, "total": 4_000_000_000, "fraction": 0.5, "rate": 100_000_000.0, "eta": 20.0,
        "complete": False}]
    assert download[-1]["progress"][0]["complete"] is True
    probes = [r["probe"] for r in records if r["event"] == "probe"]
    assert [p["state"] for p in probes] == ["health", "completion", "ready"]
    ends = [(r["stage"], r["state"], r["elapsed"]) for r in records if r["event"] == "stage_end"]
    assert ends == [("Preflight the Sparks", "ok", 12.0), ("Overlays on the pinned image", "skipped-all", 1.0),
                    ("Weights on every Spark", "ok", 57.0), ("Launch the engine", "ok", 26.0)]
    assert records[-1]["event"] == "stats" and records[-1]["state"] == "ok"


def test_json_lines_of_a_failure_carry_its_message_and_role() -> None:
    model, out = RunModel(), io.StringIO()
    display = JsonDisplay(out)
    for event in stream("launch_failed"):
        display.handle(event, model.feed(event))
    failures = [json.loads(line) for line in out.getvalue().splitlines() if '"event": "failure"' in line]
    assert [(f["host"], f["state"], f["role"]) for f in failures] == [("spark-1", "failed", "engine")] * 2
    assert failures[0]["message"] == "rank 1 on spark-2 stopped (exited 1)"


def view(model: RunModel, width: int = 80, seconds: float = 100) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(live_view(model, T0 + timedelta(seconds=seconds)))
    return console.export_text()


def model_until(name: str, counter: int) -> RunModel:
    return replay(e for e in stream(name) if e["counter"] <= counter)


def test_the_live_view_shows_the_running_stage_its_bars_and_readiness_in_80_columns() -> None:
    first_probe = next(e["counter"] for e in stream("up_success")
                       if e["event"] == "runner_retry" and "sparkserve_probe" in e["event_data"]["res"])
    text = view(model_until("up_success", first_probe))
    lines = text.rstrip("\n").splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("● Launch the engine") and lines[0].rstrip().endswith("0:30")
    assert lines[1].strip() == "spark-1: Wait until the head answers a real completion"
    assert lines[2].startswith("  load rank 0 weights") and lines[2].rstrip().endswith("25% 2/8 shards")
    assert lines[3].startswith("  load rank 1 weights") and lines[3].rstrip().endswith("12% 1/8 shards")
    assert lines[4].startswith("  readiness: spark-1: health (GET /health: 503 Service Unavailable")


def test_the_live_view_of_a_download_has_rate_and_eta() -> None:
    third = next(e["counter"] for e in stream("up_success")
                 if e["event"] == "runner_retry" and e["event_data"]["res"].get("attempts") == 3)
    lines = view(model_until("up_success", third)).splitlines()
    assert lines[0].startswith("● Weights on every Spark")
    assert lines[2].startswith("  download spark-1") and lines[2].rstrip().endswith(
        "50% 2.0/4.0 GB  100 MB/s  ETA 0:20")


def test_the_live_view_shows_one_line_per_node_when_their_tasks_differ() -> None:
    name = "Peer ssh between the Sparks, and node protection"
    model = replay([
        play(name),
        host_event("runner_on_start", name, "spark-1", "Write the peers' host keys", t=1),
        host_event("runner_on_start", name, "spark-2", "Write the peers' host keys", t=1),
    ])
    assert view(model).splitlines()[1].strip() == "2 nodes: Write the peers' host keys"
    model.feed(host_event("runner_on_ok", name, "spark-1", "Write the peers' host keys", t=2))
    model.feed(host_event("runner_on_start", name, "spark-1", "Protect the node", t=2))
    assert [line.strip() for line in view(model).splitlines()[1:3]] == [
        "spark-1: Protect the node", "spark-2: Write the peers' host keys"]


def test_the_live_display_prints_finished_stages_and_failures_above_the_view() -> None:
    out = io.StringIO()
    console = Console(file=out, width=240, force_terminal=False)
    model = RunModel()
    display = LiveDisplay(model, console, threading.Lock())
    for event in stream("launch_failed"):
        display.handle(event, model.feed(event))
    assert out.getvalue().splitlines() == [
        "✓ Preflight the Sparks  12s",
        "  ✗ spark-1: Wait until the head answers a real completion: rank 1 on spark-2 stopped (exited 1)",
        "  ✗ spark-1: Fail naming the rank and the cause: deployment lab-tp2 did not come up: rank 1 on spark-2 "
        "stopped (exit code 1). The logs show: rank 1 on spark-2: torch.OutOfMemoryError: CUDA out of memory.",
        "✗ Launch the engine  21s, 2 changed",
    ]


def test_units() -> None:
    assert [size(n) for n in (0, 950, 1234, 12_345_678, 123_456_789_012)] == [
        "0 B", "950 B", "1.2 kB", "12.3 MB", "123 GB"]
    assert [duration(s) for s in (0, 59.4, 61, 3599, 3600, 7325)] == ["0s", "59s", "1m01s", "59m59s", "1h00m", "2h02m"]
    bar = Progress(host="h", kind="load", label="", rank=0, unit="shards", total=8, stage="s", done=3)
    assert amount(bar) == "3/8 shards"
    bar = Progress(host="h", kind="download", label="", rank=None, unit="bytes", total=0, stage="s", done=5_000)
    assert amount(bar) == "5.0 kB"
