"""Tests for the fabric's links (module_utils/fabric_links.py, filter/fabric_links.py) and the ring topology of
the cluster file and of a plain YAML inventory: link computation, routes, peers, the link table, refusals."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.sparkserve.deploy.plugins.filter.fabric_links import (
    fabric_link_table,
    fabric_peer_addresses,
    fabric_routes,
    fabric_slow_twins,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster import validate_cluster
from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster_hostvars import cluster_from_hostvars
from ansible_collections.sparkserve.deploy.plugins.module_utils.fabric_links import (
    SPARK_PORTS,
    NodeFabric,
    cabling_problems,
    carve_subnets,
    rate_gbps,
    ring_layout,
    ring_problems,
)
from tests.plugins.test_spark_cluster_inventory import EXAMPLES, PLUGIN, inventory_of, problems, write

NAMES = ["spark-a", "spark-b", "spark-c"]
ORDER = [("spark-a", "spark-b"), ("spark-b", "spark-c"), ("spark-c", "spark-a")]


def ring(cabling: list[tuple[str, str]] = ORDER) -> dict[str, NodeFabric]:
    ports = [list(port) for port in SPARK_PORTS]
    return ring_layout(NAMES, ports, cabling, carve_subnets("10.77.0.0/24", 3, 2, 30))


def as_hostvars(nodes: dict[str, NodeFabric]) -> dict[str, dict[str, Any]]:
    return {name: {"sparkserve_fabric_interfaces": node.interfaces, "sparkserve_rdma_devices": node.rdma_devices,
                   "sparkserve_fabric_subnets": node.subnets, "sparkserve_fabric_ips": node.addresses}
            for name, node in nodes.items()}


SWITCH = {name: {"sparkserve_fabric_interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"],
                 "sparkserve_rdma_devices": ["rocep1s0f1", "roceP2p1s0f1"],
                 "sparkserve_fabric_subnets": ["10.77.1.0/24", "10.77.2.0/24"],
                 "sparkserve_fabric_ips": [f"10.77.1.{index + 1}", f"10.77.2.{index + 1}"]}
          for index, name in enumerate(NAMES)}


# --- computing a ring ----------------------------------------------------------------


def test_ring_links_follow_the_node_order_port_0_to_port_1() -> None:
    nodes = ring()
    a, b, c = (nodes[name] for name in NAMES)
    # A node lists its port 0 twins (to the next node), then its port 1 twins (from the one before).
    assert a.interfaces == ["enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"]
    assert a.rdma_devices == ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"]
    assert a.subnets == ["10.77.0.0/30", "10.77.0.4/30", "10.77.0.16/30", "10.77.0.20/30"]
    assert a.addresses == ["10.77.0.1", "10.77.0.5", "10.77.0.18", "10.77.0.22"]
    assert b.subnets == ["10.77.0.8/30", "10.77.0.12/30", "10.77.0.0/30", "10.77.0.4/30"]
    assert b.addresses == ["10.77.0.9", "10.77.0.13", "10.77.0.2", "10.77.0.6"]
    assert c.addresses == ["10.77.0.17", "10.77.0.21", "10.77.0.10", "10.77.0.14"]
    assert ring_problems(list(nodes.values())) == []


def test_given_cabling_decides_which_ports_meet() -> None:
    nodes = ring([("spark-a", "spark-c"), ("spark-c", "spark-b"), ("spark-b", "spark-a")])
    assert nodes["spark-c"].subnets[2:] == ["10.77.0.0/30", "10.77.0.4/30"]  # its port 1 meets spark-a's port 0
    assert nodes["spark-c"].addresses[2:] == ["10.77.0.2", "10.77.0.6"]
    assert ring_problems(list(nodes.values())) == []


def test_a_31_link_uses_both_addresses() -> None:
    nodes = ring_layout(NAMES, [list(port) for port in SPARK_PORTS], ORDER, carve_subnets("10.77.0.0/28", 3, 2, 31))
    assert nodes["spark-a"].addresses[:2] == ["10.77.0.0", "10.77.0.2"]
    assert nodes["spark-b"].addresses[2:] == ["10.77.0.1", "10.77.0.3"]


def test_a_range_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match=r"10.77.0.0/28 holds fewer than the 6 /30 subnets"):
        carve_subnets("10.77.0.0/28", 3, 2, 30)
    with pytest.raises(ValueError, match=r"link_prefix /24 does not fit"):
        carve_subnets("10.77.0.0/24", 3, 2, 24)


# --- what each node reaches and routes ----------------------------------------------------


def test_ring_routes_reach_each_peers_own_address_over_the_shared_link() -> None:
    hostvars = as_hostvars(ring())
    # spark-c shares 10.77.0.16/30 (its port 0, spark-a's port 1) with spark-a, whose own address is on the
    # a-b link: routed through spark-a's end of the c-a link, out of spark-c's port 0 twin.
    assert fabric_routes(NAMES, hostvars, "spark-c") == [
        {"to": "10.77.0.1/32", "via": "10.77.0.18", "interface": "enp1s0f0np0", "peer": "spark-a"}]
    # spark-b is on spark-a's own subnet (its port 1): no route there; spark-c's own is on the c-a link.
    assert fabric_routes(NAMES, hostvars, "spark-b") == [
        {"to": "10.77.0.17/32", "via": "10.77.0.10", "interface": "enp1s0f0np0", "peer": "spark-c"}]
    assert fabric_routes(NAMES, hostvars, "spark-a") == [
        {"to": "10.77.0.9/32", "via": "10.77.0.2", "interface": "enp1s0f0np0", "peer": "spark-b"}]


def test_ring_peers_are_the_other_end_of_each_link_then_each_own_address() -> None:
    hostvars = as_hostvars(ring())
    assert fabric_peer_addresses(NAMES, hostvars, "spark-a") == [
        "10.77.0.2", "10.77.0.6", "10.77.0.17", "10.77.0.21", "10.77.0.9"]


def test_a_switch_needs_no_route_and_pings_every_peer_twin() -> None:
    assert fabric_routes(NAMES, SWITCH, "spark-a") == []
    assert fabric_peer_addresses(NAMES, SWITCH, "spark-b") == ["10.77.1.1", "10.77.2.1", "10.77.1.3", "10.77.2.3"]


def test_deployment_hosts_are_read_as_their_node() -> None:
    hostvars = {f"glm@{name}": dict(variables, sparkserve_node=name) for name, variables in SWITCH.items()}
    hosts = list(hostvars)
    assert fabric_peer_addresses(hosts, hostvars, "glm@spark-a") == ["10.77.1.2", "10.77.2.2", "10.77.1.3",
                                                                     "10.77.2.3"]


def test_the_link_table_names_both_ends_of_each_ring_link() -> None:
    table = fabric_link_table(NAMES, as_hostvars(ring()))
    assert len(table) == 6
    assert table[0] == ("10.77.0.0/30: spark-a enp1s0f0np0 (rocep1s0f0) 10.77.0.1 <-> "
                        "spark-b enp1s0f1np1 (rocep1s0f1) 10.77.0.2")
    assert fabric_link_table(NAMES, SWITCH)[1] == (
        "10.77.2.0/24: spark-a enP2p1s0f1np1 (roceP2p1s0f1) 10.77.2.1 <-> spark-b enP2p1s0f1np1 (roceP2p1s0f1) "
        "10.77.2.2 <-> spark-c enP2p1s0f1np1 (roceP2p1s0f1) 10.77.2.3")


# --- what is not a ring -------------------------------------------------------------------


def test_a_ring_of_two_or_four_is_refused() -> None:
    two = ring_problems(list(ring().values())[:2])
    assert two == ["inventory: a ring of two Sparks is two Sparks cabled back to back; write fabric.topology: "
                   "direct and give the twins of the port you cabled (fabric.twins)."]
    four = list(ring().values()) + [NodeFabric("spark-d", ["x"], ["y"], ["10.9.0.0/30"], ["10.9.0.1"])]
    assert ring_problems(four)[0].startswith("inventory: a ring of 4 Sparks leaves pairs of them without a link")


def test_a_link_to_itself_a_lone_subnet_and_overlaps_are_refused() -> None:
    nodes = copy.deepcopy(ring())
    nodes["spark-a"].subnets[1], nodes["spark-a"].addresses[1] = "10.77.0.0/30", "10.77.0.3"
    found = ring_problems(list(nodes.values()))
    assert ("inventory: spark-a: enp1s0f0np0 and enP2p1s0f0np0 are both on 10.77.0.0/30, a link to itself; each "
            "link joins two Sparks, give each end's half its own subnet.") in found
    assert any("spark-b: enP2p1s0f1np1 is on 10.77.0.4/30, which no other Spark is on" in item for item in found)
    nodes = copy.deepcopy(ring())
    nodes["spark-c"].subnets[0] = nodes["spark-a"].subnets[2] = "10.77.0.16/29"  # the c-a link's first half
    assert any("link subnet 10.77.0.16/29 (spark-a - spark-c) overlaps 10.77.0.20/30 (spark-a - spark-c)" in item
               for item in ring_problems(list(nodes.values())))


def test_cabling_to_itself_or_twice_is_refused() -> None:
    assert cabling_problems(NAMES, [("spark-a", "spark-a"), ("spark-b", "spark-c"), ("spark-c", "spark-b")]) == [
        "inventory: fabric.links[0] cables spark-a to itself; a link joins port 0 of one Spark to port 1 of the next."]
    twice = cabling_problems(NAMES, [("spark-a", "spark-b"), ("spark-a", "spark-c"), ("spark-c", "spark-a")])
    assert "inventory: fabric.links uses spark-a's port 0 (from) 2 times; in a ring each Spark's port 0 and port 1 " \
           "are each cabled once." in twice
    assert cabling_problems(NAMES, [("spark-a", "spark-x")] + ORDER[1:])[0].startswith(
        "inventory: fabric.links[0] names 'spark-x', not a node of the file")


# --- the cluster file and the plain YAML inventory ----------------------------------------------


def nodes_hostvars(inventory: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    hosts = inventory["nodes"]["hosts"] if "nodes" in inventory else inventory["sparks"]["hosts"]
    return hosts, inventory["_meta"]["hostvars"]


def test_the_ring_example_loads_and_meets_the_contract(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, EXAMPLES / "three-sparks-ring.sparks.yml")
    hosts, hostvars = nodes_hostvars(inventory)
    assert [hostvars[host]["sparkserve_node"] for host in hosts] == NAMES
    a = hostvars[hosts[0]]
    assert a["sparkserve_fabric_topology"] == "ring"
    assert a["sparkserve_fabric_ips"] == ["10.77.0.1", "10.77.0.5", "10.77.0.18", "10.77.0.22"]
    assert a["sparkserve_fabric_ip"] == "10.77.0.1"
    # Each deployment is checked on its own nodes, as the context play does (one node each here).
    for deployment in ("deployment_gemma", "deployment_gemma_b", "deployment_gemma_c"):
        own = inventory[deployment]["hosts"]
        cluster = cluster_from_hostvars(own, hostvars, own[:1])
        assert cluster.topology == "ring" and validate_cluster(cluster) == []
    # Two of the ring's three, as a deployment over two of them is checked.
    pair = hosts[1:]
    two = {host: dict(hostvars[host], sparkserve_world_size=2, sparkserve_rank=index,
                      sparkserve_head_fabric_ip=hostvars[pair[0]]["sparkserve_fabric_ip"])
           for index, host in enumerate(pair)}
    assert validate_cluster(cluster_from_hostvars(pair, two, pair[:1])) == []


def test_a_plain_yaml_ring_is_checked_per_node() -> None:
    hostvars = {name: dict(variables, sparkserve_rank=index, sparkserve_world_size=3, sparkserve_fabric_mtu=9000,
                           sparkserve_fabric_ip=variables["sparkserve_fabric_ips"][0],
                           sparkserve_head_fabric_ip="10.77.0.1", sparkserve_fabric_topology="ring")
                for index, (name, variables) in enumerate(as_hostvars(ring()).items())}
    assert validate_cluster(cluster_from_hostvars(NAMES, hostvars, ["spark-a"])) == []
    # Part of a ring (one deployment's two nodes): every pair of them must be linked.
    assert validate_cluster(cluster_from_hostvars(NAMES[:2], dict(hostvars, **{
        "spark-b": dict(hostvars["spark-b"], sparkserve_world_size=2),
        "spark-a": dict(hostvars["spark-a"], sparkserve_world_size=2)}), ["spark-a"])) == []
    broken = copy.deepcopy(hostvars)
    broken["spark-c"]["sparkserve_fabric_subnets"][0] = "10.77.0.24/30"  # spark-c's port 0 end left the c-a link
    broken["spark-c"]["sparkserve_fabric_ips"][0] = broken["spark-c"]["sparkserve_fabric_ip"] = "10.77.0.25"
    assert "inventory: spark-c: enp1s0f0np0 is on 10.77.0.24/30, which no other Spark is on; a ring link's two " \
           "ends share their subnet." in validate_cluster(cluster_from_hostvars(NAMES, broken, ["spark-a"]))
    hostvars["spark-b"]["sparkserve_fabric_subnets"] = hostvars["spark-b"]["sparkserve_fabric_subnets"][:3]
    with pytest.raises(ValueError, match="spark-b: its twin lists differ in length"):
        cluster_from_hostvars(NAMES, hostvars, ["spark-a"])


def ring_file(tmp_path: Path, fabric: str, count: int = 3) -> Path:
    nodes = "".join(f"  - {{name: spark-{chr(97 + index)}, address: 192.168.1.{21 + index}}}\n"
                    for index in range(count))
    return write(tmp_path, f"plugin: {PLUGIN}\nrecipe: lab-tp2\nmanagement_subnet: 192.168.1.0/24\n"
                           f"fabric:\n  topology: ring\n{fabric}nodes:\n{nodes}")


@pytest.mark.parametrize(("fabric", "count", "expected"), [
    ("  link_range: 10.77.0.0/24\n", 2, "inventory: a ring of two Sparks is two Sparks cabled back to back"),
    ("  link_range: 10.77.0.0/24\n", 4, "inventory: a ring of 4 Sparks leaves pairs of them without a link"),
    ("  mtu: 9000\n", 3, "inventory: the ring has no fabric.link_range to carve its link subnets from"),
    ("  link_range: 10.77.0.0/29\n", 3, "inventory: fabric.link_range 10.77.0.0/29 holds fewer than the 6 /30"),
    ("  link_range: 10.77.0.0/24\n  links:\n    - {from: spark-a, to: spark-a}\n    - {from: spark-b, to: spark-c}\n"
     "    - {from: spark-c, to: spark-b}\n", 3, "inventory: fabric.links[0] cables spark-a to itself"),
    ("  link_range: 10.77.0.0/24\n  twins: []\n", 3, "inventory: fabric.twins is for a switch"),
    ("  link_range: 10.77.0.0/24\n  links:\n    - {from: spark-a, to: spark-b, subnets: [10.77.0.0/30]}\n"
     "    - {from: spark-b, to: spark-c}\n    - {from: spark-c, to: spark-a}\n", 3,
     "inventory: fabric.links[0].subnets is ['10.77.0.0/30']; give one subnet per twin (2)."),
])
def test_bad_rings_are_refused_before_anything_runs(tmp_path: Path, fabric: str, count: int, expected: str) -> None:
    found = problems(tmp_path, ring_file(tmp_path, fabric, count))
    assert any(expected.removeprefix("inventory: ") in line for line in found), found


def test_ring_keys_without_a_ring_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, f"plugin: {PLUGIN}\nrecipe: lab-tp2\nfabric:\n  link_range: 10.77.0.0/24\n  twins:\n"
                           "    - {interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 10.77.1.0/24}\n"
                           "nodes:\n  - {name: a, address: 192.168.1.21}\n  - {name: b, address: 192.168.1.22}\n")
    assert any("fabric.link_range describes a ring; write fabric.topology: ring, or remove it." in line
               for line in problems(tmp_path, path))


def test_given_link_subnets_are_used(tmp_path: Path) -> None:
    path = ring_file(tmp_path, "  links:\n    - {from: spark-a, to: spark-b, subnets: [10.1.0.0/30, 10.1.0.4/30]}\n"
                               "    - {from: spark-b, to: spark-c, subnets: [10.1.0.8/30, 10.1.0.12/30]}\n"
                               "    - {from: spark-c, to: spark-a, subnets: [10.1.0.16/30, 10.1.0.20/30]}\n")
    hosts, hostvars = nodes_hostvars(inventory_of(tmp_path, path))
    assert hostvars[hosts[1]]["sparkserve_fabric_ips"] == ["10.1.0.9", "10.1.0.13", "10.1.0.2", "10.1.0.6"]


# --- link speeds ---------------------------------------------------------------------------


def roce(rates: dict[str, str]) -> dict[str, Any]:
    return {"roce": {"devices": [{"name": device, "rate": rate} for device, rate in rates.items()]}}


def test_a_twin_slower_than_the_fabric_is_named_on_its_node_only() -> None:
    hostvars = copy.deepcopy(SWITCH)
    full = {"rocep1s0f1": "200 Gb/sec (4X HDR)", "roceP2p1s0f1": "200 Gb/sec (4X HDR)"}
    for name in NAMES:
        hostvars[name]["__fabric_roce"] = roce(full)
    assert [fabric_slow_twins(NAMES, hostvars, name) for name in NAMES] == [[], [], []]
    hostvars["spark-b"]["__fabric_roce"] = roce(dict(full, rocep1s0f1="100 Gb/sec (2X HDR)"))
    assert fabric_slow_twins(NAMES, hostvars, "spark-a") == []
    assert fabric_slow_twins(NAMES, hostvars, "spark-b") == [
        "spark-b: rocep1s0f1 (enp1s0f1np1) links at 100 Gb/sec (2X HDR), under the 200 Gb/sec of spark-a "
        "roceP2p1s0f1, spark-a rocep1s0f1 and others: its cable or transceiver negotiated a lower speed, so NCCL "
        "gets less over this twin while every ping passes; reseat or replace the cable (an approved QSFP cable "
        "brings both twins up at full speed)"]


def test_unknown_rates_and_nodes_without_facts_are_left_out() -> None:
    hostvars = copy.deepcopy(SWITCH)
    hostvars["spark-a"]["__fabric_roce"] = roce({"rocep1s0f1": "", "roceP2p1s0f1": "200 Gb/sec (4X HDR)"})
    assert [fabric_slow_twins(NAMES, hostvars, name) for name in NAMES] == [[], [], []]
    assert rate_gbps("25 Gb/sec (1X EDR)") == 25.0 and rate_gbps(None) is None and rate_gbps("unknown") is None


def test_the_rates_come_from_the_fabric_configuration_where_roce_facts_did_not_run() -> None:
    # A run that changed nothing read the devices with fabric_network; roce_facts was skipped (its registered
    # result has no roce), and one that ran is read first.
    hostvars = copy.deepcopy(SWITCH)
    full = {"rocep1s0f1": "200 Gb/sec (4X HDR)", "roceP2p1s0f1": "200 Gb/sec (4X HDR)"}
    for name in NAMES:
        hostvars[name]["__fabric_roce"] = {"skipped": True, "changed": False}
        hostvars[name]["__fabric_network_result"] = dict(roce(full), changed=False)
    hostvars["spark-c"]["__fabric_network_result"] = roce(dict(full, roceP2p1s0f1="100 Gb/sec (2X HDR)"))
    assert fabric_slow_twins(NAMES, hostvars, "spark-a") == []
    [slow] = fabric_slow_twins(NAMES, hostvars, "spark-c")
    assert slow.startswith("spark-c: roceP2p1s0f1 (enP2p1s0f1np1) links at 100")
    hostvars["spark-c"]["__fabric_roce"] = roce(full)
    assert fabric_slow_twins(NAMES, hostvars, "spark-c") == []
