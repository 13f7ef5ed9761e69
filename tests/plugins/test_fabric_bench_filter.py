"""The fabric bench's filters: which twins share a link (a switch of 2 and 4 nodes, a ring of 3), the table, the
metrics."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.filter.fabric_bench import (
    fabric_bench_metrics,
    fabric_bench_pairs,
    fabric_bench_table,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.textfile import MetricFamily, exposition_text
from tests.roles import exposition

TWINS = ["enp1s0f1np1", "enP2p1s0f1np1"]
DEVICES = ["rocep1s0f1", "roceP2p1s0f1"]
SUBNETS = ["10.77.1.0/24", "10.77.2.0/24"]


def switch(count: int) -> dict[str, dict[str, Any]]:
    """Nodes on a switch: every node has a twin on each of the two shared subnets."""
    return {f"spark-{n}": {"sparkserve_fabric_interfaces": TWINS, "sparkserve_rdma_devices": DEVICES,
                           "sparkserve_fabric_subnets": SUBNETS,
                           "sparkserve_fabric_ips": [f"10.77.1.{10 + n}", f"10.77.2.{10 + n}"]}
            for n in range(1, count + 1)}


def ring(count: int) -> dict[str, dict[str, Any]]:
    """A ring: node k has two twins on the link to k+1 (port 0) and two on the link to k-1 (port 1); each twin of a
    link is a /30 of its own, the lower address on the node whose port 0 it is."""
    def link(k: int, twin: int) -> ipaddress.IPv4Network:  # the link from node k to node k+1
        return ipaddress.ip_network(f"10.20.{k}.{4 * twin}/30")

    hosts = {}
    for k in range(count):
        before = (k - 1) % count
        nets = [link(k, 0), link(k, 1), link(before, 0), link(before, 1)]
        hosts[f"spark-{k + 1}"] = {
            "sparkserve_fabric_interfaces": ["enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"],
            "sparkserve_rdma_devices": ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"],
            "sparkserve_fabric_subnets": [str(net) for net in nets],
            "sparkserve_fabric_ips": [str(nets[0][1]), str(nets[1][1]), str(nets[2][2]), str(nets[3][2])],
        }
    return hosts


def links(pairs: list[dict[str, str]]) -> list[tuple[str, ...]]:
    return [(p["server"], p["server_device"], p["server_address"], p["client"], p["client_device"], p["subnet"])
            for p in pairs]


def test_two_nodes_on_a_switch_are_linked_twin_by_twin() -> None:
    hostvars = switch(2)
    pairs = fabric_bench_pairs(list(hostvars), hostvars)
    assert links(pairs) == [
        ("spark-1", "rocep1s0f1", "10.77.1.11", "spark-2", "rocep1s0f1", "10.77.1.0/24"),
        ("spark-1", "roceP2p1s0f1", "10.77.2.11", "spark-2", "roceP2p1s0f1", "10.77.2.0/24"),
    ]
    assert pairs[0]["server_host"] == "spark-1" and pairs[0]["client_host"] == "spark-2"
    assert pairs[0]["client_address"] == "10.77.1.12"


def test_four_nodes_on_a_switch_link_every_pair_of_nodes_on_both_twins() -> None:
    hostvars = switch(4)
    pairs = fabric_bench_pairs(list(hostvars), hostvars)
    assert len(pairs) == 6 * 2
    assert {(p["server"], p["client"]) for p in pairs} == {
        (f"spark-{a}", f"spark-{b}") for a in range(1, 5) for b in range(a + 1, 5)}
    assert all(p["server_device"] == p["client_device"] for p in pairs)  # twin i meets twin i on a switch
    assert all(ipaddress.ip_address(p["client_address"]) in ipaddress.ip_network(p["subnet"]) for p in pairs)


def test_the_play_order_decides_the_server() -> None:
    hostvars = switch(2)
    pairs = fabric_bench_pairs(["spark-2", "spark-1"], hostvars)
    assert {p["server"] for p in pairs} == {"spark-2"} and {p["client"] for p in pairs} == {"spark-1"}


def test_a_ring_of_three_links_each_neighbour_over_the_two_twins_of_their_link_only() -> None:
    hostvars = ring(3)
    pairs = fabric_bench_pairs(list(hostvars), hostvars)
    assert links(pairs) == [
        # spark-1's port 0 (link 1-2) meets spark-2's port 1; spark-1's port 1 (link 3-1) meets spark-3's port 0
        ("spark-1", "rocep1s0f0", "10.20.0.1", "spark-2", "rocep1s0f1", "10.20.0.0/30"),
        ("spark-1", "roceP2p1s0f0", "10.20.0.5", "spark-2", "roceP2p1s0f1", "10.20.0.4/30"),
        ("spark-1", "rocep1s0f1", "10.20.2.2", "spark-3", "rocep1s0f0", "10.20.2.0/30"),
        ("spark-1", "roceP2p1s0f1", "10.20.2.6", "spark-3", "roceP2p1s0f0", "10.20.2.4/30"),
        ("spark-2", "rocep1s0f0", "10.20.1.1", "spark-3", "rocep1s0f1", "10.20.1.0/30"),
        ("spark-2", "roceP2p1s0f0", "10.20.1.5", "spark-3", "roceP2p1s0f1", "10.20.1.4/30"),
    ]
    # every device serves or writes over exactly its own link: two pairs each, one per neighbour's twin
    for host in hostvars:
        used = [p["server_device"] for p in pairs if p["server"] == host]
        used += [p["client_device"] for p in pairs if p["client"] == host]
        assert sorted(used) == sorted(hostvars[host]["sparkserve_rdma_devices"])


def test_the_example_rings_inventory_links_each_pair_of_neighbours_over_their_link() -> None:
    """The filter on what the inventory plugin computes for inventory/example/three-sparks-ring.sparks.yml."""
    root = Path(__file__).resolve().parents[2]
    command = Path(sys.executable).parent / "ansible-inventory"
    done = subprocess.run([str(command if command.exists() else "ansible-inventory"), "-i",
                           "inventory/example/three-sparks-ring.sparks.yml", "--list"], cwd=root, text=True,
                          capture_output=True, timeout=120, check=False,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(root / "ansible.cfg")))
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    hosts, hostvars = listed["nodes"]["hosts"], listed["_meta"]["hostvars"]
    pairs = fabric_bench_pairs(hosts, hostvars)
    nodes = [hostvars[host]["sparkserve_node"] for host in hosts]
    assert len(nodes) == 3 and {(p["server"], p["client"]) for p in pairs} == {
        (nodes[0], nodes[1]), (nodes[0], nodes[2]), (nodes[1], nodes[2])}
    for host, node in zip(hosts, nodes, strict=True):  # each of a node's four twins is on exactly one link
        used = [p["server_device"] for p in pairs if p["server"] == node]
        used += [p["client_device"] for p in pairs if p["client"] == node]
        assert sorted(used) == sorted(hostvars[host]["sparkserve_rdma_devices"]) and len(used) == 4
    assert all(len({p["subnet"] for p in pairs if {p["server"], p["client"]} == {a, b}}) == 2
               for a, b in [(nodes[0], nodes[1]), (nodes[1], nodes[2])])  # two twins, two subnets, per link


def test_hosts_without_fabric_and_second_ranks_of_a_node_have_no_links_of_their_own() -> None:
    hostvars: dict[str, dict[str, Any]] = switch(2)
    hostvars["lone"] = {"sparkserve_fabric_ips": None}
    hostvars["other@spark-1"] = {**hostvars["spark-1"], "sparkserve_node": "spark-1"}
    pairs = fabric_bench_pairs(["spark-1", "other@spark-1", "lone", "spark-2"], hostvars)
    assert len(pairs) == 2 and {p["server"] for p in pairs} == {"spark-1"}
    assert fabric_bench_pairs(["spark-1"], hostvars) == []


def test_a_host_whose_twin_lists_disagree_is_refused_by_name() -> None:
    hostvars = switch(2)
    hostvars["spark-2"] = {**hostvars["spark-2"], "sparkserve_rdma_devices": ["rocep1s0f1"]}
    with pytest.raises(AnsibleFilterError, match="spark-2 needs one entry per twin"):
        fabric_bench_pairs(list(hostvars), hostvars)
    hostvars["spark-2"] = {**switch(2)["spark-2"], "sparkserve_fabric_ips": ["10.77.1.12", "not-an-address"]}
    with pytest.raises(AnsibleFilterError, match="spark-2's twin enP2p1s0f1np1"):
        fabric_bench_pairs(list(hostvars), hostvars)


RESULTS = [
    {**fabric_bench_pairs(["spark-1", "spark-2"], switch(2))[0], "bandwidth_gbps": 92.57, "floor_gbps": 80.0,
     "ran": True, "problem": None},
    {**fabric_bench_pairs(["spark-1", "spark-2"], switch(2))[1], "bandwidth_gbps": 13.23, "floor_gbps": 80.0,
     "ran": True, "problem": "spark-2:roceP2p1s0f1 -> spark-1:roceP2p1s0f1: 13.23 Gb/s, under the floor"},
]


def test_the_table_lines_up_every_link_with_its_figure_floor_and_verdict() -> None:
    failed_outright = {**RESULTS[1], "bandwidth_gbps": None}
    unrun = {**RESULTS[0], "ran": False, "bandwidth_gbps": None}
    lines = fabric_bench_table([*RESULTS, failed_outright, unrun])
    assert lines[0].startswith("link (writer -> written)")
    assert lines[1].split() == ["spark-2:rocep1s0f1", "->", "spark-1:rocep1s0f1", "92.57", "80", "ok"]
    assert lines[2].split()[-3:] == ["13.23", "80", "FAIL"]
    assert lines[3].split()[-3:] == ["-", "80", "FAIL"]
    assert lines[4].endswith("not run (check mode)")
    # the figures are right-aligned under their heading
    assert lines[0].index("Gb/s") + 4 == lines[1].index("92.57") + 5 == lines[2].index("13.23") + 5


def test_the_metrics_carry_each_measured_link_and_every_floor() -> None:
    families = fabric_bench_metrics([*RESULTS, {**RESULTS[1], "bandwidth_gbps": None}], 1796000000.5)
    text = exposition_text([MetricFamily(f["name"], f["type"], f["help"],
                                         [(s["labels"], s["value"]) for s in f["samples"]]) for f in families])
    parsed = exposition.parse(text)
    labels = {"node": "spark-2", "device": "rocep1s0f1", "peer": "spark-1", "peer_device": "rocep1s0f1"}
    assert parsed["sparkserve_fabric_link_bandwidth_gbps"].samples == [
        (labels, 92.57), ({**labels, "device": "roceP2p1s0f1", "peer_device": "roceP2p1s0f1"}, 13.23)]
    assert len(parsed["sparkserve_fabric_link_bandwidth_floor_gbps"].samples) == 3
    assert parsed["sparkserve_fabric_link_bench_timestamp_seconds"].samples == [({}, 1796000000.0)]
