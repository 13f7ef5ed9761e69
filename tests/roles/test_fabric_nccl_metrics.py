"""The fabric role's record of the NCCL probe for Prometheus, from the probe's real output on two H200s.

The lab has no GPU, so the probe never runs there: this runs the role's own task file
(roles/fabric/tasks/nccl_metrics.yml) in a play on this machine, with the head's probe result set to the
output the probe printed on the device (tests/fixtures/nccl), and reads the file it writes back with promtool.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nccl"
PLAY = """
- name: Record a probe the head ran
  hosts: node
  gather_facts: false
  tasks:
    - name: The head's probe result, as the probe task registers it
      ansible.builtin.set_fact:
        __fabric_probe: {container: {Output: "{{ lookup('ansible.builtin.file', probe_log) }}"}}

    - name: Record it
      ansible.builtin.include_tasks: TASKS
"""


def run_play(tmp_path: Path, probe_log: Path) -> subprocess.CompletedProcess[str]:
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    (tmp_path / "inventory.yml").write_text(json.dumps({"all": {"children": {"sparks": {"hosts": {"node": {
        "ansible_connection": "local", "ansible_python_interpreter": python, "__fabric_head": "node",
        "fabric_metrics_dir": str(tmp_path / "metrics"), "fabric_deployment": "glm53",
        "probe_log": str(probe_log)}}}}}}), encoding="utf-8")
    (tmp_path / "play.yml").write_text(
        PLAY.replace("TASKS", str(ROOT / "roles" / "fabric" / "tasks" / "nccl_metrics.yml")), encoding="utf-8")
    playbook = Path(sys.executable).parent / "ansible-playbook"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory")
    return subprocess.run([str(playbook if playbook.exists() else "ansible-playbook"), "-i",
                           str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("log", "busbw", "transport"), [
    ("h200x2-c-p2p.log", "311.918", "P2P"),
    ("h200x2-a-net-only.log", "3.064", "NET/Socket"),
])
def test_the_head_records_the_bus_bandwidth_and_transport(tmp_path: Path, log: str, busbw: str,
                                                           transport: str) -> None:
    done = run_play(tmp_path, FIXTURES / log)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"node\s*:\s*ok=\d+\s+changed=0\s", done.stdout), done.stdout  # a measurement, not a change
    text = (tmp_path / "metrics" / "nccl-glm53.prom").read_text(encoding="utf-8")
    labels = '{deployment="glm53",transport="%s"}' % transport
    assert f"sparkserve_nccl_busbw_gbps{labels} {busbw}\n" in text
    assert f"sparkserve_nccl_transport_info{labels} 1\n" in text
    assert re.search(r'^sparkserve_nccl_probe_timestamp_seconds\{deployment="glm53"\} \d{10}$', text, re.M)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run tools/setup-controller.sh (it installs Debian's prometheus)"
    checked = subprocess.run([promtool, "check", "metrics"], input=text, text=True, capture_output=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_probe_that_measured_nothing_records_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("NCCL WARN the probe never started\n", encoding="utf-8")
    done = run_play(tmp_path, empty)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "metrics").exists()
