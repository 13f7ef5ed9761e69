"""A node that stopped answering during the launch: one structured failure, worded in one place."""

from __future__ import annotations

import re
from pathlib import Path

from ansible_collections.sparkserve.deploy.plugins.modules.nodes_lost import KIND, failure, lost_nodes

ROOT = Path(__file__).resolve().parents[2]


def test_each_node_once_with_its_rank_and_what_its_step_said() -> None:
    lost = lost_nodes(["spark-2", "spark-3", "spark-2"], ["ssh: connect to host\n  timed out", ""],
                      {"spark-2": 1, "spark-3": 2})
    assert lost == [{"node": "spark-2", "rank": 1, "error": "ssh: connect to host timed out"},
                    {"node": "spark-3", "rank": 2, "error": "unreachable"}]
    result = failure(lost)
    assert result["failed"] and result["kind"] == KIND == "node_lost" and result["lost"] == lost
    assert result["msg"] == ("spark-2 (rank 1) stopped answering during the launch: ssh: connect to host timed out; "
                             "spark-3 (rank 2) stopped answering during the launch: unreachable")


def test_the_launch_reads_the_lost_nodes_from_the_failure_not_from_its_sentence() -> None:
    tasks = ROOT / "roles/engine/tasks"
    launch = (tasks / "launch.yml").read_text(encoding="utf-8")
    assert "ansible_failed_result.lost | default([]) | map(attribute='node')" in launch
    assert "regex_findall" not in launch
    # Every step that fails on a silent node raises the structured failure; none words the sentence itself.
    writers = sorted(p.name for p in tasks.glob("*.yml") if "sparkserve.deploy.nodes_lost:" in p.read_text("utf-8"))
    assert writers == ["answered.yml", "await_ranks.yml", "dispatch_rank.yml", "stop_node.yml", "wait.yml"]
    worded = [p.name for p in tasks.glob("*.yml") if re.search(r"\) stopped answering", p.read_text("utf-8"))]
    assert worded == []
