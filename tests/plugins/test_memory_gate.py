"""Tests for the memory_gate module: at once, after a wait, a bounded wait that fails, bad meminfo, check mode.

The clock moves only when the module sleeps: no real sleeping, nothing that depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.common import warnings as module_warnings
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import meminfo
from ansible_collections.sparkserve.deploy.plugins.modules import memory_gate as mg

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

GIB = 1024**3
FLOOR = 100 * GIB


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module's warnings are kept per process until its result is written: start each test with none."""
    monkeypatch.setattr(module_warnings, "_global_warnings", {})


def meminfo_text(available: int) -> str:
    return (f"MemTotal:       {128 * GIB // 1024} kB\n"
            f"MemFree:        {2 * GIB // 1024} kB\n"
            f"MemAvailable:   {available // 1024} kB\n"
            "HugePages_Total:       0\n")


class FakeNode:
    """A clock that moves only when the module sleeps; each sleep puts the next MemAvailable in meminfo."""

    def __init__(self, path: Path, figures: list[int]) -> None:
        self.path = path
        self.figures = figures
        self.now = 1000.0
        self.sleeps: list[float] = []
        path.write_text(meminfo_text(figures[0]), encoding="ascii")

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        following = self.figures[min(len(self.sleeps), len(self.figures) - 1)]
        self.path.write_text(meminfo_text(following), encoding="ascii")


def params(path: Path, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"min_available_bytes": FLOOR, "wait_s": 120, "interval_s": 1.0,
                            "meminfo_path": str(path), "node": "spark-2"}
    base.update(changes)
    return base


def run_main(args: dict[str, Any], node: FakeNode, capsys: pytest.CaptureFixture[str],
             check_mode: bool = False) -> dict[str, Any]:
    if check_mode:
        args = {**args, "_ansible_check_mode": True}
    with patch_module_args(args), pytest.raises(SystemExit):
        mg.main(clock=node.clock, sleep=node.sleep)
    return json.loads(capsys.readouterr().out)


def warnings(result: dict[str, Any]) -> list[str]:
    """The warnings' texts (ansible-core 2.19 writes each as a WarningSummary, older ones as a string)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


def test_passes_at_once_without_sleeping(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "meminfo", [110 * GIB])
    result = mg.wait_for_memory(params(node.path), clock=node.clock, sleep=node.sleep)
    assert result == {"passed": True, "mem_available_bytes": 110 * GIB, "min_available_bytes": FLOOR,
                      "waited_s": 0.0, "reads": 1}
    assert node.sleeps == []


def test_exactly_at_the_floor_passes(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "meminfo", [FLOOR])
    assert mg.wait_for_memory(params(node.path), clock=node.clock, sleep=node.sleep)["passed"] is True


def test_passes_when_memory_comes_back_on_the_third_read(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "meminfo", [40 * GIB, 80 * GIB, 105 * GIB])
    result = mg.wait_for_memory(params(node.path), clock=node.clock, sleep=node.sleep)
    assert result["passed"] is True
    assert (result["mem_available_bytes"], result["reads"], result["waited_s"]) == (105 * GIB, 3, 2.0)
    assert node.sleeps == [1.0, 1.0]


def test_fails_after_the_bounded_wait_naming_node_figure_floor_and_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    low = int(41.35 * GIB)
    node = FakeNode(tmp_path / "meminfo", [low])
    result = run_main(params(node.path), node, capsys)
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == (
        "spark-2: MemAvailable 41.3 GiB after 120 s, below the recipe's 100.0 GiB (memory.min_available_gib); "
        "memory did not come back after the ranks stopped: reboot spark-2, then run again")
    assert (result["passed"], result["mem_available_bytes"], result["waited_s"]) == (False, low // 1024 * 1024, 120.0)
    assert result["reads"] == 121  # at 0, 1, ... 120 s: the wait is bounded, and the last read is at the end
    assert sum(node.sleeps) == 120.0


def test_the_last_sleep_is_cut_to_the_end_of_the_wait(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "meminfo", [GIB])
    result = mg.wait_for_memory(params(node.path, wait_s=5, interval_s=2.0), clock=node.clock, sleep=node.sleep)
    assert node.sleeps == [2.0, 2.0, 1.0]
    assert result["msg"].startswith("spark-2: MemAvailable 1.0 GiB after 5 s, below the recipe's 100.0 GiB")


def test_a_figure_just_under_the_floor_is_not_printed_as_the_floor(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "meminfo", [FLOOR - 1024 * 1024])
    result = mg.wait_for_memory(params(node.path, wait_s=0), clock=node.clock, sleep=node.sleep)
    assert "MemAvailable 99.9 GiB after 0 s, below the recipe's 100.0 GiB" in result["msg"]
    assert node.sleeps == []


def test_the_node_defaults_to_the_host_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mg.socket, "gethostname", lambda: "spark-7")
    node = FakeNode(tmp_path / "meminfo", [GIB])
    result = mg.wait_for_memory(params(node.path, node=None, wait_s=0), clock=node.clock, sleep=node.sleep)
    assert result["msg"].startswith("spark-7: MemAvailable 1.0 GiB")
    assert result["msg"].endswith("reboot spark-7, then run again")


def test_a_meminfo_without_memavailable_fails_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = FakeNode(tmp_path / "meminfo", [GIB])
    node.path.write_text("MemTotal: 1000 kB\nMemFree: 10 kB\n", encoding="ascii")
    result = run_main(params(node.path), node, capsys)
    assert result["failed"] is True
    assert result["msg"] == (f"spark-2: {node.path}: meminfo has no MemAvailable line; "
                             "the gate needs the kernel's MemAvailable")
    assert node.sleeps == []


def test_a_missing_meminfo_fails_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = FakeNode(tmp_path / "meminfo", [GIB])
    node.path.unlink()
    result = run_main(params(node.path), node, capsys, check_mode=True)
    assert result["failed"] is True
    assert result["msg"] == f"spark-2: cannot read {node.path}: No such file or directory"


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"wait_s": -1}, "wait_s is -1"), ({"interval_s": 0}, "interval_s is 0.0"),
     ({"min_available_bytes": -5}, "min_available_bytes is -5")],
)
def test_bad_options_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 changes: dict[str, Any], message: str) -> None:
    node = FakeNode(tmp_path / "meminfo", [110 * GIB])
    result = run_main(params(node.path, **changes), node, capsys)
    assert result["failed"] is True and message in result["msg"]


def test_success_reports_the_figure_and_the_wait_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = FakeNode(tmp_path / "meminfo", [50 * GIB, 101 * GIB])
    result = run_main(params(node.path), node, capsys)
    assert result.get("failed") is not True and result["changed"] is False
    assert (result["mem_available_bytes"], result["waited_s"], result["passed"]) == (101 * GIB, 1.0, True)


def test_check_mode_reads_once_and_warns_instead_of_failing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A serving node in --check: its rank holds the memory, so below the floor is only a warning."""
    node = FakeNode(tmp_path / "meminfo", [20 * GIB, 110 * GIB])
    result = run_main(params(node.path), node, capsys, check_mode=True)
    assert result.get("failed") is not True and result["changed"] is False
    assert node.sleeps == []
    assert (result["passed"], result["reads"], result["waited_s"]) == (False, 1, 0.0)
    assert warnings(result) == [
        "spark-2: MemAvailable 20.0 GiB, below the recipe's 100.0 GiB (memory.min_available_gib); check mode "
        "reads once and does not wait: a real run waits up to 120 s for memory to come back once the ranks are "
        "stopped, then fails"]


def test_check_mode_above_the_floor_passes_without_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = FakeNode(tmp_path / "meminfo", [110 * GIB])
    result = run_main(params(node.path), node, capsys, check_mode=True)
    assert result["passed"] is True and warnings(result) == []


def test_the_shared_parser_gives_bytes_and_keeps_counts() -> None:
    values = meminfo.parse_meminfo(meminfo_text(110 * GIB))
    assert values["MemAvailable"] == 110 * GIB
    assert values["HugePages_Total"] == 0
    assert meminfo.mem_available(meminfo_text(3 * GIB)) == 3 * GIB
    with pytest.raises(ValueError, match="no MemAvailable line"):
        meminfo.mem_available("MemTotal: 1 kB\n")
