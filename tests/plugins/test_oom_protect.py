"""Tests for the oom_protect module: a proc file system and a systemd folder in a temporary folder, and a
double of systemctl that names each service's main process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import oom_protect as op
from tests.tree import snapshot

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

WITH_CAP = "0000003fffffffff"  # every capability, CAP_SYS_RESOURCE (24) among them
WITHOUT_CAP = "0000003ffeffffff"  # the lab's nodes: CAP_SYS_RESOURCE dropped
DROP_IN = ("# Written by sparkserve (node_protect): spare this service when a rank runs the node out of memory.\n"
           "[Service]\nOOMScoreAdjust=-900\n")


class Systemd:
    """systemctl show --property=MainPID and daemon-reload; records every call."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        self.calls.append(list(argv[1:]))
        if argv[1] == "daemon-reload":
            return 0, "", ""
        return 0, f"{self.pids.get(argv[-1].removesuffix('.service'), 0)}\n", ""


@pytest.fixture
def node(tmp_path: Path) -> Path:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "status").write_text(f"Name:\tpython3\nCapInh:\t0\nCapEff:\t{WITH_CAP}\n")
    for pid, score in ((91, 0), (85, -900)):
        (tmp_path / "proc" / str(pid)).mkdir()
        (tmp_path / "proc" / str(pid) / "oom_score_adj").write_text(f"{score}\n")
    (tmp_path / "systemd").mkdir()
    return tmp_path


def run_main(node: Path, systemd: Systemd, capsys: pytest.CaptureFixture[str], **more: Any) -> dict[str, Any]:
    args = {"services": ["ssh", "docker", "containerd"], "systemd_dir": str(node / "systemd"),
            "proc_root": str(node / "proc"), **more}
    with patch_module_args(args), pytest.raises(SystemExit):
        op.main(runner=systemd)
    return json.loads(capsys.readouterr().out)


def score_of(node: Path, pid: int) -> str:
    return (node / "proc" / str(pid) / "oom_score_adj").read_text().strip()


def test_drop_ins_are_written_and_the_running_processes_scored_once(node: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    systemd = Systemd({"ssh": 91, "docker": 85})  # containerd does not run
    result = run_main(node, systemd, capsys)
    assert result["changed"] is True and result["protected"] is True
    assert result["changed_paths"] == [str(node / "systemd" / f"{s}.service.d" / "sparkserve-oom.conf")
                                       for s in ("ssh", "docker", "containerd")]
    assert all(Path(p).read_text() == DROP_IN for p in result["changed_paths"])
    assert result["adjusted"] == ["ssh (pid 91)"]  # docker's process already had the score
    assert score_of(node, 91) == "-900" and score_of(node, 85) == "-900"
    assert ["daemon-reload"] in systemd.calls and not [c for c in systemd.calls if c[0] in ("restart", "start")]
    systemd.calls.clear()
    again = run_main(node, systemd, capsys)
    assert again["changed"] is False and again["changed_paths"] == [] and again["adjusted"] == []
    assert ["daemon-reload"] not in systemd.calls


def test_check_mode_says_what_it_would_do_and_does_nothing(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(node)
    systemd = Systemd({"ssh": 91})
    result = run_main(node, systemd, capsys, _ansible_check_mode=True)
    assert result["changed"] is True and len(result["changed_paths"]) == 3 and result["adjusted"] == ["ssh (pid 91)"]
    assert snapshot(node) == before and ["daemon-reload"] not in systemd.calls


def test_a_node_without_cap_sys_resource_is_left_as_it_is(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node / "proc" / "self" / "status").write_text(f"CapEff:\t{WITHOUT_CAP}\n")
    before = snapshot(node)
    systemd = Systemd({"ssh": 91})
    result = run_main(node, systemd, capsys)
    assert result == {**result, "changed": False, "protected": False, "changed_paths": [], "adjusted": []}
    assert result["reason"] == "no CAP_SYS_RESOURCE, as in a container"
    assert [warning["event"]["msg"] for warning in result["warnings"]] == [
        "cannot lower OOM scores here (no CAP_SYS_RESOURCE, as in a container); ssh, docker, containerd are left as "
        "they are"]
    assert snapshot(node) == before and systemd.calls == []


def test_a_changed_score_rewrites_the_drop_ins_and_scores_again(node: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    systemd = Systemd({"ssh": 91, "docker": 85})
    run_main(node, systemd, capsys)
    result = run_main(node, systemd, capsys, score=-1000)
    assert len(result["changed_paths"]) == 3 and result["adjusted"] == ["ssh (pid 91)", "docker (pid 85)"]
    assert "OOMScoreAdjust=-1000\n" in Path(result["changed_paths"][0]).read_text()
    assert score_of(node, 85) == "-1000"


@pytest.mark.parametrize(("more", "message"), [
    ({"services": ["ssh.service"]}, "not a service name: 'ssh.service'"),
    ({"services": ["../etc"]}, "not a service name: '../etc'"),
    ({"score": -1001}, "score -1001 is outside -1000..1000"),
])
def test_bad_options_are_refused_before_anything_is_read(node: Path, capsys: pytest.CaptureFixture[str],
                                                         more: dict[str, Any], message: str) -> None:
    before = snapshot(node)
    systemd = Systemd({"ssh": 91})
    result = run_main(node, systemd, capsys, **more)
    assert result["failed"] is True and message in result["msg"]
    assert snapshot(node) == before and systemd.calls == []


def test_a_failing_systemctl_fails_naming_it(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        return 1, "", "Failed to connect to bus: No such file or directory\n"

    (node / "systemd" / "ssh.service.d").mkdir()
    (node / "systemd" / "ssh.service.d" / "sparkserve-oom.conf").write_text(DROP_IN)
    with patch_module_args({"services": ["ssh"], "systemd_dir": str(node / "systemd"),
                            "proc_root": str(node / "proc")}), pytest.raises(SystemExit):
        op.main(runner=broken)
    result = json.loads(capsys.readouterr().out)
    assert result["msg"] == ("systemctl show --property=MainPID --value ssh.service exited 1: "
                             "Failed to connect to bus: No such file or directory")
