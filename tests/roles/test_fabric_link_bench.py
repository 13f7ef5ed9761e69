"""The fabric role's link bench (entry point bench), run in a play on this machine over the lab's ib_write_bw.

Two inventory hosts on this machine (local connection) stand for two nodes whose two twins share two subnets
(127.0.0.0/24 and 127.0.2.0/24); their RDMA trees are written by the lab's hardware tool, and the lab's stand-in
for ib_write_bw is first on PATH, so every pair really moves bytes over TCP. The role's tasks run as
`--tags fabric-bench` runs them: the pairs one at a time, the table, the record for Prometheus, the gate.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.roles import exposition
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
STAND_IN_DIR = ROOT / "lab/node/rootfs/usr/local/bin"
hw = load_script("lab/node/rootfs/usr/local/sbin/sparkserve-lab-hw", "lab_hw_for_link_bench")
PLAY = """
- name: The link bench, as deploy.yml's play runs it
  hosts: sparks
  gather_facts: false
  any_errors_fatal: true
  module_defaults:
    sparkserve.deploy.link_bench: {state_dir: "STATE"}
  tasks:
    - name: Measure every linked pair of twins
      ansible.builtin.include_role:
        name: fabric
        tasks_from: bench
"""
DEVICES = ["rocep1s0f1", "roceP2p1s0f1"]
SUBNETS = ["127.0.0.0/24", "127.0.2.0/24"]


def tree(tmp_path: Path, node: str, number: int, second_port: str) -> dict[str, Any]:
    """A node's config and RDMA tree: its two twins at 127.0.0.N and 127.0.2.N, the second's port as given."""
    raw = {"hostname": node, "rdma_root": str(tmp_path / node), "interfaces": [
        {"name": f"tw{number}a", "subnet": SUBNETS[0], "address": f"127.0.0.{number}", "rdma": {"device": DEVICES[0]}},
        {"name": f"tw{number}b", "subnet": SUBNETS[1], "address": f"127.0.2.{number}",
         "rdma": {"device": DEVICES[1], "port_state": second_port}}]}
    config = hw.parse_config(raw)
    hw.write_rdma_tree(config.rdma_root, config.interfaces, {i.name: i.address for i in config.interfaces}, node,
                       tmp_path / "net")
    return raw


def run_bench(tmp_path: Path, floor: float, second_port: str = "ACTIVE",
              *options: str) -> subprocess.CompletedProcess[str]:
    config = tree(tmp_path, "spark-1", 1, second_port)
    tree(tmp_path, "spark-2", 2, second_port)
    (tmp_path / "node.json").write_text(json.dumps(config), encoding="utf-8")  # what the stand-in reads
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def host(number: int) -> dict[str, Any]:
        return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                "sparkserve_fabric_interfaces": [f"tw{number}a", f"tw{number}b"], "sparkserve_rdma_devices": DEVICES,
                "sparkserve_fabric_subnets": SUBNETS,
                "sparkserve_fabric_ips": [f"127.0.0.{number}", f"127.0.2.{number}"],
                "sparkserve_fabric_ip": f"127.0.0.{number}",
                "sparkserve_rdma_sysfs_root": str(tmp_path / f"spark-{number}")}

    inventory = {"all": {"vars": {
        "fabric_bench_packages": [], "fabric_bench_port": port, "fabric_bench_duration_s": 1, "fabric_bench_wait_s": 10,
        "fabric_bench_floor_gbps": floor, "sparkserve_metrics_dir": str(tmp_path / "metrics")},
        "children": {"sparks": {"hosts": {"spark-1": host(1), "spark-2": host(2)}}}}}
    (tmp_path / "inventory.yml").write_text(json.dumps(inventory), encoding="utf-8")
    (tmp_path / "play.yml").write_text(PLAY.replace("STATE", str(tmp_path / "state")), encoding="utf-8")
    playbook = Path(sys.executable).parent / "ansible-playbook"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory",
               SPARKSERVE_LAB_NODE_CONFIG=str(tmp_path / "node.json"),
               PATH=f"{STAND_IN_DIR}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([str(playbook if playbook.exists() else "ansible-playbook"), "-i",
                           str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), *options],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def table(stdout: str) -> list[list[str]]:
    """The rows of the printed table, each split on blanks."""
    return [line.strip().strip("-").strip().split() for line in stdout.splitlines() if " -> spark-1:" in line
            and line.strip().startswith("- spark-")]


def test_every_link_is_measured_recorded_and_passes_its_floor(tmp_path: Path) -> None:
    done = run_bench(tmp_path, 0.01)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table(done.stdout)
    assert [row[:3] for row in rows] == [["spark-2:rocep1s0f1", "->", "spark-1:rocep1s0f1"],
                                        ["spark-2:roceP2p1s0f1", "->", "spark-1:roceP2p1s0f1"]]
    assert all(float(row[3]) > 0.05 and row[4:] == ["0.01", "ok"] for row in rows), rows
    assert "link bench: every one of the 2 links reaches 0.01 Gb/s" in done.stdout
    assert re.search(r"spark-1\s*:\s*ok=\d+\s+changed=0\s", done.stdout), done.stdout  # a measurement, no change
    text = (tmp_path / "metrics" / "link-bench.prom").read_text(encoding="utf-8")
    families = exposition.parse(text)
    bandwidth = families["sparkserve_fabric_link_bandwidth_gbps"]
    assert bandwidth.value(node="spark-2", device="rocep1s0f1", peer="spark-1", peer_device="rocep1s0f1") \
        == float(rows[0][3])
    assert families["sparkserve_fabric_link_bandwidth_floor_gbps"].samples[1][1] == 0.01
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run tools/setup-controller.sh (it installs Debian's prometheus)"
    checked = subprocess.run([promtool, "check", "metrics"], input=text, text=True, capture_output=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert not list((tmp_path / "state").glob("*.pid"))  # no server left behind


def test_the_run_goes_through_every_link_and_fails_at_the_end_naming_each(tmp_path: Path) -> None:
    done = run_bench(tmp_path, 1000, "DOWN")
    assert done.returncode != 0
    rows = table(done.stdout)
    assert rows[0][-2:] == ["1000", "FAIL"] and float(rows[0][3]) > 0  # measured, under the floor
    assert rows[1][-3:] == ["-", "1000", "FAIL"]  # no figure: the server's port is down
    failed = done.stdout + done.stderr
    assert "link bench: 2 of 2 links fail: spark-2:rocep1s0f1 -> spark-1:rocep1s0f1: " in failed
    assert "Gb/s, under the floor of 1000 Gb/s; likely" in failed
    assert ("; spark-2:roceP2p1s0f1 -> spark-1:roceP2p1s0f1: the ib_write_bw server on spark-1:roceP2p1s0f1 did not "
            "listen on port ") in failed
    assert "the device's port 1 is Down, not ACTIVE: its twin is down" in failed
    # the figure that was measured is recorded all the same
    families = exposition.parse((tmp_path / "metrics" / "link-bench.prom").read_text(encoding="utf-8"))
    assert len(families["sparkserve_fabric_link_bandwidth_gbps"].samples) == 1
    assert not list((tmp_path / "state").glob("*.pid"))


def test_check_mode_lists_the_links_and_runs_nothing(tmp_path: Path) -> None:
    done = run_bench(tmp_path, 80, "ACTIVE", "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table(done.stdout)
    assert len(rows) == 2 and all(row[3:] == ["-", "80", "not", "run", "(check", "mode)"] for row in rows), rows
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "state").exists()
