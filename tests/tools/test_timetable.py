"""The test suite's time table: the stage runner, the table, and the callback that times each play."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ansible_collections.sparkserve.deploy.plugins.callback import timetable as callback
from tests.scripts import ROOT, load_script

timetable = load_script("tools/timetable.py", "timetable")


def run_tool(table: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "tools/timetable.py"), *args], capture_output=True, text=True,
                          env={"SPARKSERVE_TIMETABLE": str(table), "PATH": "/usr/bin:/bin"}, check=False)


def test_a_stage_is_recorded_with_its_outcome_and_its_exit_status_passes_through(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    assert run_tool(table, "reset").returncode == 0 and table.read_text().startswith("# started\t")
    assert run_tool(table, "run", "pytest", "--", "true").returncode == 0
    failed = run_tool(table, "run", "lint", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3
    rows = timetable.read(table)
    assert [(stage, outcome) for stage, _, outcome in rows] == [("pytest", "ok"), ("lint", "FAILED (exit 3)")]
    assert all(seconds >= 0 for _, seconds, _ in rows)
    assert "time table" in failed.stdout and "lint" in failed.stdout  # a failing stage prints the table at once


def test_a_command_that_cannot_run_is_a_failed_stage(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    result = run_tool(table, "run", "x", "--", str(tmp_path / "no-such-program"))
    assert result.returncode == 127 and "cannot run" in result.stderr
    assert timetable.read(table)[0][2] == "FAILED (exit 127)"


def test_run_needs_a_command(tmp_path: Path) -> None:
    assert run_tool(tmp_path / "t.tsv", "run", "x").returncode == 2


def test_the_table_indents_nothing_and_totals_only_top_stages() -> None:
    text = timetable.render([("setup", 2.0, "ok"), ("molecule faults", 600.0, "ok"),
                             ("faults / Weights faults", 100.0, "ok"), ("pytest", 61.5, "ok")])
    lines = text.splitlines()
    assert lines[0] == "time table (wall time, m:ss):"
    assert any("faults / Weights faults" in line and "1:40.0" in line for line in lines)
    assert lines[-1].split() == ["total", "11:03.5"]  # 2 + 600 + 61.5; the fault inside its scenario is not added
    assert timetable.render([]) == "time table: no stage recorded"


def test_the_total_is_the_wall_time_since_reset_when_stages_ran_side_by_side(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    table.write_text("# started\t1000.0\npytest\t90.0\tok\nmolecule default\t300.0\tok\n")
    assert timetable.started_at(table) == 1000.0
    assert timetable.read(table) == [("pytest", 90.0, "ok"), ("molecule default", 300.0, "ok")]
    text = timetable.render(timetable.read(table), wall_s=310.0)
    assert text.splitlines()[-1].split() == ["total", "(wall", "time)", "5:10.0"]  # not 90 + 300
    printed = run_tool(table, "print")
    assert printed.returncode == 0 and "total (wall time)" in printed.stdout
    assert timetable.started_at(tmp_path / "none.tsv") is None


def test_unreadable_lines_are_skipped(tmp_path: Path) -> None:
    table = tmp_path / "t.tsv"
    table.write_text("setup\t1.0\tok\ngarbage\nlint\tnot-a-number\tok\npytest\t2.5\tok\n")
    assert [stage for stage, _, _ in timetable.read(table)] == ["setup", "pytest"]


def play(name: str) -> SimpleNamespace:
    return SimpleNamespace(get_name=lambda: name)


def test_the_callback_times_each_play_and_keeps_nested_runs_out(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "t.tsv"
    monkeypatch.setenv("SPARKSERVE_TIMETABLE", str(table))
    monkeypatch.setenv("SPARKSERVE_TIMETABLE_PREFIX", "faults")
    plugin = callback.CallbackModule()
    assert "SPARKSERVE_TIMETABLE" not in os.environ  # playbooks its tasks start do not write the table
    plugin.v2_playbook_on_play_start(play("Fabric faults\tare refused"))
    plugin.v2_runner_on_failed(SimpleNamespace(), ignore_errors=True)  # an expected failure is not the play's
    plugin.v2_playbook_on_play_start(play("Weights faults"))
    plugin.v2_runner_on_unreachable(SimpleNamespace())
    plugin.v2_playbook_on_stats(SimpleNamespace())
    rows = timetable.read(table)
    assert [(stage, outcome) for stage, _, outcome in rows] == [
        ("faults / Fabric faults are refused", "ok"), ("faults / Weights faults", "FAILED")]


def test_the_callback_does_nothing_without_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKSERVE_TIMETABLE", raising=False)
    monkeypatch.chdir(tmp_path)
    plugin = callback.CallbackModule()
    plugin.v2_playbook_on_play_start(play("A play"))
    plugin.v2_playbook_on_stats(SimpleNamespace())
    assert list(tmp_path.iterdir()) == []
