"""RunModel: stages, progress, probes, failures and stats from recorded event streams."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_streams import FIXTURES, T0, host_event, model_of, play, stats, stream

from sparkserve.events import (
    FAILED,
    OK,
    RUNNING,
    SKIPPED_ALL,
    Progress,
    RunModel,
    failure_message,
    load_events,
    replay,
)


def test_a_successful_up_has_one_stage_per_play_with_its_state_and_time() -> None:
    model = model_of("up_success")
    assert [(s.name, s.state) for s in model.stages] == [
        ("Preflight the Sparks", OK),
        ("Overlays on the pinned image", SKIPPED_ALL),
        ("Weights on every Spark", OK),
        ("Launch the engine", OK),
    ]
    assert [s.elapsed(T0) for s in model.stages] == [12.0, 1.0, 57.0, 26.0]
    assert [s.changed for s in model.stages] == [0, 0, 2, 2]
    assert model.finished and model.current is None
    assert model.open_failures() == []


def test_an_ignored_failure_neither_fails_its_stage_nor_the_run() -> None:
    model = model_of("up_success")
    preflight = model.stages[0]
    assert preflight.state == OK and preflight.failures == 0
    assert model.failures == []
    assert model.host_stats["ignored"] == {"spark-2": 1}


def test_custom_stats_and_debug_messages_are_kept() -> None:
    model = model_of("up_success")
    assert model.stats["sparkserve_endpoint"]["url"] == "http://172.30.77.11:8000"
    assert [(m.host, m.task) for m in model.messages] == [("spark-1", "Say where the deployment serves")]
    assert model.messages[0].lines[0].startswith("lab-tp2 serves tiny-model")


def replay_until(name: str, counter: int) -> RunModel:
    """The model as it stood right after event number `counter` of a fixture."""
    return replay(e for e in stream(name) if e["counter"] <= counter)


def counter_of(name: str, predicate: Callable[[dict[str, Any]], bool]) -> int:
    return int(next(e["counter"] for e in stream(name) if predicate(e)))


def test_a_download_bar_has_rate_and_eta_from_the_event_times() -> None:
    third = counter_of("up_success", lambda e: e["event"] == "runner_retry"
                       and e["event_data"]["res"].get("attempts") == 3 and e["event_data"]["host"] == "spark-1")
    model = replay_until("up_success", third)
    assert model.current is not None and model.current.name == "Weights on every Spark"
    [bar] = model.active_progress()
    assert (bar.host, bar.kind, bar.label, bar.rank, bar.unit) == (
        "spark-1", "download", "sparkserve-lab/tiny-model", None, "bytes")
    # 0 B at 10:00:14, 1 GB at :24, 2 GB at :34 -> 100 MB/s; 2 GB left -> 20 s.
    assert bar.fraction == 0.5
    assert bar.rate() == pytest.approx(100_000_000)
    assert bar.eta() == pytest.approx(20.0)


def test_the_ok_event_with_the_same_key_completes_the_bar() -> None:
    model = model_of("up_success")
    download = model.progress[("spark-1", "download", "sparkserve-lab/tiny-model", None)]
    assert download.complete and download.done == 4_000_000_000 and download.fraction == 1.0
    assert download.eta() is None
    assert model.active_progress() == []


def test_load_bars_are_per_rank_and_the_probe_gives_the_readiness_line() -> None:
    first = counter_of("up_success", lambda e: e["event"] == "runner_retry"
                       and "sparkserve_probe" in e["event_data"]["res"])
    model = replay_until("up_success", first)
    bars = {bar.rank: bar for bar in model.active_progress()}
    assert set(bars) == {0, 1}
    assert (bars[0].done, bars[0].total, bars[0].unit, bars[0].fraction) == (2, 8, "shards", 0.25)
    assert bars[1].fraction == 0.125
    [probe] = model.active_probes()
    assert (probe.host, probe.rank, probe.state) == ("spark-1", None, "health")
    assert probe.detail == "GET /health: 503 Service Unavailable: loading"
    assert (probe.attempt, probe.attempts) == (1, 90)


def test_probes_end_with_their_stage() -> None:
    model = model_of("up_success")
    assert model.probes == {} and model.active_probes() == []


def test_hosts_keep_their_current_task() -> None:
    fetch = counter_of("up_success", lambda e: e["event"] == "runner_on_start"
                       and e["event_data"].get("task") == "Fan the weights out over the fabric")
    model = replay_until("up_success", fetch)
    assert model.current is not None
    tasks = {host: state.task for host, state in model.current.hosts.items()}
    assert tasks == {"spark-1": "Fetch the pinned weights once", "spark-2": "Fan the weights out over the fabric"}
    assert model.current.state == RUNNING


def test_progress_rate_over_a_sliding_window() -> None:
    bar = Progress(host="h", kind="download", label="m", rank=None, unit="bytes", total=1000, stage="s")
    for second, done in [(0, 0), (10, 100), (20, 200), (30, 300), (40, 700), (50, 900)]:
        bar.update(done, 1000, "bytes", T0 + timedelta(seconds=second))
    # The window is the last 30 s: from the sample at 20 s (200) to 50 s (900) -> 700/30.
    assert bar.rate() == pytest.approx(700 / 30)
    assert bar.eta() == pytest.approx(100 / (700 / 30))


def test_a_bar_that_starts_over_forgets_its_old_samples() -> None:
    bar = Progress(host="h", kind="download", label="m", rank=None, unit="bytes", total=1000, stage="s")
    bar.update(800, 1000, "bytes", T0)
    bar.update(100, 1000, "bytes", T0 + timedelta(seconds=5))
    assert bar.rate() is None
    bar.update(300, 1000, "bytes", T0 + timedelta(seconds=15))
    assert bar.rate() == pytest.approx(20.0)


def test_rate_and_eta_are_unknown_until_they_can_be_computed() -> None:
    bar = Progress(host="h", kind="load", label="", rank=0, unit="shards", total=0, stage="s")
    bar.update(3, 0, "shards", T0)
    assert bar.rate() is None and bar.eta() is None and bar.fraction is None
    bar.update(4, 0, "shards", T0)  # same instant
    assert bar.rate() is None
    bar.update(6, 0, "shards", T0 + timedelta(seconds=2))
    assert bar.rate() == pytest.approx(1.5)
    assert bar.eta() is None  # no total


def test_a_launch_failure_rescued_into_a_stat() -> None:
    model = model_of("launch_failed")
    assert [(s.name, s.state) for s in model.stages] == [("Preflight the Sparks", OK), ("Launch the engine", FAILED)]
    first, last = model.failures
    # The block's rescue caught the probe's failure; the host ends on the rescue's own fail task.
    assert first.rescued and not last.rescued
    primary = model.primary_failure()
    assert primary is not None
    assert (primary.stage, primary.task, primary.role, primary.host) == (
        "Launch the engine", "Fail naming the rank and the cause", "engine", "spark-1")
    assert model.stats["sparkserve_failure"]["rank"] == 1


def test_a_failure_that_a_rescue_recovered_leaves_the_run_ok() -> None:
    model = replay([
        play("Fabric between the Sparks"),
        host_event("runner_on_failed", "Fabric between the Sparks", "spark-1", "Set the MTU", role="fabric", t=1,
                   res={"msg": "device busy"}),
        host_event("runner_on_ok", "Fabric between the Sparks", "spark-1", "Set the MTU again", role="fabric", t=2),
        stats(3, failures={}, rescued={"spark-1": 1}),
    ])
    assert model.failures[0].rescued
    assert model.open_failures() == [] and model.primary_failure() is None
    assert model.stages[0].state == OK


def test_an_unreachable_host() -> None:
    model = model_of("unreachable")
    [failure] = model.open_failures()
    assert failure.unreachable and failure.host == "spark-2" and failure.stage == "Preflight the Sparks"
    assert failure.message == ("Failed to connect to the host via ssh: ssh: connect to host 172.30.77.12 port 22: "
                               "No route to host")
    assert model.stages[0].state == FAILED
    assert model.stages[0].hosts["spark-2"].state == "unreachable"


def test_a_run_refused_before_any_play_has_no_stage_and_keeps_its_output() -> None:
    model = model_of("bad_input")
    assert model.stages == [] and model.task_events == 0 and not model.finished
    assert model.stdout_tail[0].startswith("[ERROR]: /srv/sparkserve/inventory/lab/cluster.sparks.yml")


@pytest.mark.parametrize(("res", "message"), [
    ({"msg": "Task failed: Error while evaluating conditional\nmore detail"}, "Error while evaluating conditional"),
    ({"msg": "non-zero return code", "rc": 1, "stderr": "warning: x\nnvidia-smi: not found\n"},
     "non-zero return code: nvidia-smi: not found"),
    ({"msg": "MODULE FAILURE\nSee stdout/stderr for the exact error", "module_stderr": "Traceback\nKeyError: 'x'"},
     "MODULE FAILURE: KeyError: 'x'"),
    ({"msg": ["first of a list", "second"]}, "first of a list"),
    ({}, "failed without a message"),
    ({"msg": "One or more items failed", "results": [
        {"item": "spark-1", "failed": False, "msg": "fine"},
        {"item": "spark-2", "failed": True, "msg": "MemAvailable 3.1 GiB is below the floor of 4 GiB"},
        {"item": {"name": "x"}, "failed": True, "msg": "a dict item has no short label"},
    ]}, "spark-2: MemAvailable 3.1 GiB is below the floor of 4 GiB; a dict item has no short label"),
])
def test_the_failure_message_is_the_line_that_says_why(res: dict[str, object], message: str) -> None:
    assert failure_message(res) == message


def test_the_loader_reads_runner_job_events_in_counter_order(tmp_path: Path) -> None:
    events = stream("up_success")
    folder = tmp_path / "20261202T100000Z-up" / "job_events"
    folder.mkdir(parents=True)
    shuffled = list(events)
    random.Random(7).shuffle(shuffled)
    for event in shuffled:
        (folder / f"{event['counter']}-{event['uuid']}.json").write_text(json.dumps(event), encoding="utf-8")
    (folder / "999-left-partial.json").write_text("{not json", encoding="utf-8")
    assert load_events(folder) == events
    assert load_events(folder.parent) == events


def test_a_recorded_render_run_in_the_job_events_layout() -> None:
    assert (FIXTURES / "render_ok" / "job_events").is_dir()
    model = model_of("render_ok")
    assert [(s.name, s.state) for s in model.stages] == [("Render every rank's engine command", OK)]
    assert sorted(m.host for m in model.messages) == ["spark-1", "spark-2"]
    assert any("rank 0 on spark-1: container lab-tp2-rank0" in line for m in model.messages for line in m.lines)
    assert model.playbook_pid is not None


def test_a_recorded_unknown_recipe_fails_in_the_recipe_role() -> None:
    model = model_of("render_unknown_recipe")
    failure = model.primary_failure()
    assert failure is not None
    assert (failure.role, failure.task) == ("recipe", "Check the recipe exists")
    assert 'recipe "no-such" is unknown' in failure.message


def test_events_before_any_play_open_a_stage_of_their_own() -> None:
    model = replay([host_event("runner_on_ok", "", "localhost", "Prepare", t=1), stats(2)])
    assert [(s.name, s.state) for s in model.stages] == [("(no play)", OK)]


def test_a_task_that_ends_completes_the_bars_its_retries_reported() -> None:
    name = "Launch the engine"
    res = {"sparkserve_progress": [{"kind": "load", "label": "weights", "rank": 0, "done": 3, "total": 8,
                                    "unit": "shards"}]}
    model = replay([play(name), host_event("runner_retry", name, "spark-1", "Wait", t=1, res=res)])
    assert len(model.active_progress()) == 1
    notes = model.feed(host_event("runner_on_ok", name, "spark-1", "Wait", t=2, res={"ready": True}))
    assert model.active_progress() == []
    [note] = [n for n in notes if n.kind == "progress"]
    assert [(b.rank, b.complete, b.done) for b in note.progress] == [(0, True, 3)]
