"""Tests for the host_preflight module: each check, and what counts as this deployment's own."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

import pytest

from ansible_collections.sparkserve.deploy.plugins.modules import host_preflight as hp

GIB = 1024**3


class FakeNode:
    """Answers the commands the module runs, like a node would."""

    def __init__(self) -> None:
        self.containers: list[str] = []
        self.apps = ""
        self.driver = "580.95.05\n"
        self.smi_rc = 0
        self.listening = ""

    def __call__(self, argv: Sequence[str]) -> tuple[int, str, str]:
        if argv[0] == "docker":
            return 0, "\n".join(self.containers), ""
        if argv[0] == "nvidia-smi":
            if self.smi_rc:
                return (self.smi_rc,
                        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", "")
            if argv[1].startswith("--query-compute-apps"):
                return 0, self.apps, ""
            return 0, self.driver, ""
        if argv[0] == "ss":
            return 0, self.listening, ""
        raise AssertionError(f"unexpected command {argv}")


@pytest.fixture()
def node(tmp_path: Path) -> tuple[FakeNode, dict, Path]:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {128 * 1024 * 1024} kB\nMemAvailable: {110 * 1024 * 1024} kB\n", encoding="utf-8")
    params = {
        "deployment": "lab-tp2",
        "min_available_bytes": 100 * GIB,
        "driver_prefixes": ["580."],
        "ports": [8000, 29501],
        "disk_path": str(tmp_path / "models" / "not-yet"),
        "min_free_disk_bytes": 0,
        "meminfo_path": str(meminfo),
        "nvidia_smi": "nvidia-smi",
    }
    proc = tmp_path / "proc"
    proc.mkdir()
    return FakeNode(), params, proc


def test_a_healthy_node_passes(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    result = hp.check(params, fake, str(proc))
    assert result["problems"] == []
    assert result["mem_available_bytes"] == 110 * GIB
    assert result["driver_version"] == "580.95.05"
    assert result["free_disk_bytes"] > 0
    assert result["oom_killers"] == []


def test_an_oom_killer_that_picks_its_victim_is_warned_not_refused(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    for pid, name in (("900", "sshd"), ("812", "earlyoom"), ("77", "dockerd")):
        (proc / pid).mkdir()
        (proc / pid / "comm").write_text(f"{name}\n", encoding="utf-8")
    (proc / "sys").mkdir()  # not a process
    (proc / "1234").mkdir()  # a process gone before its name was read
    result = hp.check(params, fake, str(proc))
    assert result["problems"] == []
    assert result["oom_killers"] == [{"pid": "812", "name": "earlyoom"}]
    warning = hp.oom_killer_warning(result["oom_killers"][0], "spark-2")
    assert warning.startswith("earlyoom runs on spark-2 (pid 812): under memory pressure it kills")
    assert warning.endswith("Stop it and keep it off: systemctl disable --now earlyoom")


def test_the_paths_asked_about_are_reported_when_there(node: tuple[FakeNode, dict, Path], tmp_path: Path) -> None:
    fake, params, proc = node
    unit = tmp_path / "sparkserve-gateway.service"
    unit.write_text("[Unit]\n", encoding="utf-8")
    link = tmp_path / "dangling.service"
    link.symlink_to(tmp_path / "nowhere")
    params["report_paths"] = [str(tmp_path / "absent.service"), str(link), str(unit)]
    result = hp.check(params, fake, str(proc))
    assert result["present_paths"] == [str(link), str(unit)]
    assert result["problems"] == []
    assert hp.check({**params, "report_paths": []}, fake, str(proc))["present_paths"] == []


def test_memory_below_the_floor_is_named(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    params["min_available_bytes"] = 120 * GIB
    (problem,) = hp.check(params, fake, str(proc))["problems"]
    assert "MemAvailable is 110.0 GiB, below the recipe's floor of 120.0 GiB (memory.min_available_gib)" in problem


def test_memory_floor_waits_while_the_deployment_serves(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    params["min_available_bytes"] = 120 * GIB
    fake.containers = ["c0ffee" * 10]
    assert hp.check(params, fake, str(proc))["problems"] == []


def test_a_foreign_gpu_process_is_refused(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    fake.apps = "4242, python3, 81920 MiB\n"
    (problem,) = hp.check(params, fake, str(proc))["problems"]
    assert "a GPU compute process is already running: pid 4242 (python3, 81920 MiB)" in problem


def test_the_deployments_own_gpu_process_is_not(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    cid = "ab12" * 16
    fake.containers = [cid]
    fake.apps = "4242, python3, 81920 MiB\n"
    (proc / "4242").mkdir()
    (proc / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n", encoding="utf-8")
    assert hp.check(params, fake, str(proc))["problems"] == []


def test_a_driver_outside_the_allowed_set_is_refused(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    fake.driver = "590.44.01\n"
    (problem,) = hp.check(params, fake, str(proc))["problems"]
    assert "NVIDIA driver 590.44.01 is not in the recipe's allowed set ['580.'] (host.driver_versions)" in problem


def test_a_broken_driver_is_reported_once(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    fake.smi_rc = 9
    (problem,) = hp.check(params, fake, str(proc))["problems"]
    assert problem.startswith("nvidia-smi failed: NVIDIA-SMI has failed")


def test_too_little_disk_is_refused(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    params["min_free_disk_bytes"] = 1 << 60
    (problem,) = hp.check(params, fake, str(proc))["problems"]
    assert "GiB free, the weights need" in problem and "(host.min_free_disk_gib)" in problem
    assert str(Path(params["meminfo_path"]).parent) in problem


def test_a_busy_port_names_its_process(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    fake.listening = (
        'LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:(("nginx",pid=777,fd=6))\n'
        'LISTEN 0 4096 127.0.0.1:9999 0.0.0.0:* users:(("other",pid=1,fd=3))\n'
    )
    result = hp.check(params, fake, str(proc))
    assert result["problems"] == [
        "port 8000 is held by nginx (pid 777); stop it or choose another port in the recipe (launch.*_port)."]
    assert result["port_holders"] == {"8000": {"process": "nginx", "pid": "777"}}


def test_a_port_held_by_the_deployment_itself_is_fine(node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    cid = "cd34" * 16
    fake.containers = [cid]
    fake.listening = 'LISTEN 0 4096 [::]:29501 [::]:* users:(("python3",pid=88,fd=6))\n'
    (proc / "88").mkdir()
    (proc / "88" / "cgroup").write_text(f"12:memory:/docker/{cid}\n", encoding="utf-8")
    assert hp.check(params, fake, str(proc))["problems"] == []


def test_meminfo_without_memavailable_is_an_error() -> None:
    with pytest.raises(ValueError, match="MemAvailable"):
        hp.mem_available("MemTotal: 1 kB\n")


def test_the_four_probes_run_side_by_side(node: tuple[FakeNode, dict, Path]) -> None:
    # Each probe waits until all four have started: one after another, the first would wait alone and break it.
    fake, params, proc = node
    all_started = threading.Barrier(4, timeout=60)
    asked: list[str] = []

    def side_by_side(argv: Sequence[str]) -> tuple[int, str, str]:
        all_started.wait()
        asked.append(" ".join(argv[:2]))
        return fake(argv)

    result = hp.check(params, side_by_side, str(proc))
    assert result["problems"] == [] and result["driver_version"] == "580.95.05"
    assert len(asked) == 4


def test_a_failed_nvidia_smi_is_named_once_though_the_driver_was_asked_beside_it(
        node: tuple[FakeNode, dict, Path]) -> None:
    fake, params, proc = node
    fake.smi_rc = 9
    (problem,) = hp.check(params, fake, str(proc))["problems"]
    assert problem.startswith("nvidia-smi failed: NVIDIA-SMI has failed")
