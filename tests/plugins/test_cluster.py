"""Tests for module_utils/cluster.py: the cluster model, its rules and the host-variable contract."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster import (
    DEFAULT_RDMA_SYSFS_ROOT,
    Cluster,
    Node,
    Twin,
    validate_cluster,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster_hostvars import (
    cluster_from_hostvars,
    cluster_groups,
    cluster_hostvars,
)
from ansible_collections.sparkserve.deploy.plugins.modules.cluster_check import run

REPO = Path(__file__).resolve().parents[2]
CLUSTER_PY = REPO / "plugins/module_utils/cluster.py"
I1, I2 = "enp1s0f1np1", "enP2p1s0f1np1"
R1, R2 = "rocep1s0f1", "roceP2p1s0f1"
S1, S2 = "192.168.100.0/24", "192.168.101.0/24"
MGMT = "192.168.1.0/24"


def make_cluster(count: int = 2, management_subnet: str | None = MGMT) -> Cluster:
    """A sound cluster of `count` Sparks: spark-a is the head, fabric .1, .2, ... on both twins."""
    nodes = [
        Node(name=f"spark-{chr(ord('a') + i)}", address=f"192.168.1.{21 + i}", rank=i,
             fabric_ips=[f"192.168.100.{i + 1}", f"192.168.101.{i + 1}"], head=i == 0)
        for i in range(count)
    ]
    twins = [Twin(interface=I1, rdma_device=R1, subnet=S1), Twin(interface=I2, rdma_device=R2, subnet=S2)]
    return Cluster(nodes=nodes, twins=twins, mtu=9000, management_subnet=management_subnet,
                   rdma_sysfs_root=DEFAULT_RDMA_SYSFS_ROOT)


def problems_of(cluster: Cluster) -> list[str]:
    return validate_cluster(cluster)


# --- sound clusters ---------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_sound_cluster_has_no_problem(count: int) -> None:
    assert problems_of(make_cluster(count)) == []


def test_management_subnet_is_optional() -> None:
    assert problems_of(make_cluster(2, management_subnet=None)) == []


def test_head_need_not_be_listed_first() -> None:
    cluster = make_cluster(3)
    a, b, _ = cluster.nodes
    a.head, a.rank, b.head, b.rank = False, 1, True, 0
    assert problems_of(cluster) == []


def test_management_address_may_be_a_host_name() -> None:
    cluster = make_cluster(2, management_subnet=None)
    cluster.nodes[0].address = "spark-a.lan"
    assert problems_of(cluster) == []


@pytest.mark.parametrize("mtu", [1280, 1500, 9000, 9216])
def test_mtu_bounds_are_inclusive(mtu: int) -> None:
    cluster = make_cluster()
    cluster.mtu = mtu
    assert problems_of(cluster) == []


# --- every rule has its message -------------------------------------------------------


def test_no_nodes() -> None:
    cluster = make_cluster()
    cluster.nodes = []
    assert problems_of(cluster) == [
        "inventory: the cluster has no nodes; list at least one Spark "
        "(nodes in a .sparks.yml, hosts of the sparks group in a YAML inventory)."
    ]


def test_duplicate_node_names() -> None:
    cluster = make_cluster(3)
    cluster.nodes[2].name = "spark-a"
    assert "inventory: node name spark-a appears 2 times; give each Spark its own name." in problems_of(cluster)


def test_empty_node_name() -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].name = ""
    assert "inventory: node 2 has no name; give every Spark its inventory name." in problems_of(cluster)


def test_duplicate_ranks() -> None:
    cluster = make_cluster(3)
    cluster.nodes[2].rank = 1
    problems = problems_of(cluster)
    assert "inventory: rank 1 is held by spark-b and spark-c; give each node its own rank, 0..2." in problems


def test_ranks_must_be_exactly_zero_to_n_minus_one() -> None:
    cluster = make_cluster(3)
    cluster.nodes[2].rank = 3
    assert problems_of(cluster) == [
        "inventory: ranks (sparkserve_rank) are 0, 1, 3 but 3 nodes need exactly 0..2; "
        "number the nodes 0..2 with the head at 0."
    ]


def test_rank_must_be_a_whole_number() -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].rank = "one"  # type: ignore[assignment]
    assert problems_of(cluster) == [
        "inventory: spark-b: rank (sparkserve_rank) 'one' is not a whole number; "
        "number the nodes 0..1 with the head at 0."
    ]


def test_one_node_is_one_node_not_one_nodes() -> None:
    cluster = make_cluster(1)
    cluster.nodes[0].rank = 3
    assert problems_of(cluster) == [
        "inventory: rank (sparkserve_rank) is 3 but 1 node needs rank 0; give the node rank 0.",
        "inventory: spark-a: the head has rank 3; the head must be rank 0, give it rank 0 and the workers 1 and up.",
    ]
    cluster.nodes[0].rank = "three"  # type: ignore[assignment]
    assert problems_of(cluster) == [
        "inventory: spark-a: rank (sparkserve_rank) 'three' is not a whole number; give the node rank 0."
    ]
    assert not any("1 nodes" in problem for problem in problems_of(cluster))


@pytest.mark.parametrize(("name", "why", "fixed"), [
    ("spark b", "has a space, so the nodes' ssh config would read it as 2 names (spark, b)", "spark-b"),
    ("spark-b ", "has a space at its start or end, which the nodes' ssh config would drop", "spark-b"),
    ("spark*b", "has '*', which the nodes' ssh config would not read as a plain name", "spark-b"),
    ("-spark-b", "starts with '-'", "spark-b"),
])
def test_a_node_name_must_be_one_plain_word(name: str, why: str, fixed: str) -> None:
    """The name is a pattern of every peer's ssh config (Host NAME ADDRESS...): a space makes it two."""
    cluster = make_cluster(2)
    cluster.nodes[1].name = name
    assert problems_of(cluster) == [
        f"inventory: node name {name!r} (name in a .sparks.yml, the host's name in a YAML inventory) {why}; "
        "rename the node with letters, digits, '.', '-' and '_' only, starting with a letter or digit, "
        f"for example {fixed}."
    ]


@pytest.mark.parametrize("name", ["spark-2", "node1", "spark_b", "spark-b.lan", "192.168.1.22", "Spark-B"])
def test_plain_node_names_pass(name: str) -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].name = name
    assert problems_of(cluster) == []


def test_cluster_check_names_the_inventory_file() -> None:
    """For a plain YAML inventory the recipe role's cluster_check gives every message the inventory's file."""
    names, hostvars, heads = example_hostvars()
    hostvars["spark b"] = hostvars.pop("spark-b")
    result = run({"hosts": ["spark-a", "spark b"], "head": heads, "hostvars": hostvars,
                  "sources": ["/srv/inventory/hosts.yml"]})
    assert result["failed"] is True
    assert result["msg"] == (
        "inventory /srv/inventory/hosts.yml: node name 'spark b' (name in a .sparks.yml, the host's name in a YAML "
        "inventory) has a space, so the nodes' ssh config would read it as 2 names (spark, b); rename the node with "
        "letters, digits, '.', '-' and '_' only, starting with a letter or digit, for example spark-b."
    )
    del hostvars["spark b"]["sparkserve_rank"]
    result = run({"hosts": ["spark-a", "spark b"], "head": heads, "hostvars": hostvars,
                  "sources": ["/srv/inventory/hosts.yml"]})
    assert result["msg"].startswith("inventory /srv/inventory/hosts.yml: spark b: sparkserve_rank is missing; ")


def test_two_heads() -> None:
    cluster = make_cluster(3)
    cluster.nodes[2].head = True
    assert problems_of(cluster) == [
        "inventory: 2 nodes are marked head (spark-a, spark-c); mark exactly one "
        "(head: true on one node of a .sparks.yml, one host in the head group of a YAML inventory)."
    ]


def test_no_head() -> None:
    cluster = make_cluster(2)
    cluster.nodes[0].head = False
    assert problems_of(cluster) == [
        "inventory: no node is the head; mark exactly one "
        "(head: true on one node of a .sparks.yml, one host in the head group of a YAML inventory) and give it rank 0."
    ]


def test_head_must_be_rank_zero() -> None:
    cluster = make_cluster(2)
    cluster.nodes[0].head, cluster.nodes[1].head = False, True
    assert problems_of(cluster) == [
        "inventory: spark-b: the head has rank 1; the head must be rank 0, give it rank 0 and the workers 1 and up."
    ]


def test_one_fabric_address_per_twin() -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].fabric_ips = ["192.168.100.2"]
    assert problems_of(cluster) == [
        "inventory: spark-b: has 1 fabric address (192.168.100.2) for 2 twins; give exactly one per twin, "
        "in twin order (fabric_ips in a .sparks.yml, sparkserve_fabric_ips in a YAML inventory)."
    ]


def test_too_many_fabric_addresses() -> None:
    cluster = make_cluster(2)
    cluster.nodes[0].fabric_ips.append("192.168.102.1")
    assert problems_of(cluster) == [
        "inventory: spark-a: has 3 fabric addresses (192.168.100.1, 192.168.101.1, 192.168.102.1) for 2 twins; "
        "give exactly one per twin, in twin order "
        "(fabric_ips in a .sparks.yml, sparkserve_fabric_ips in a YAML inventory)."
    ]


def test_fabric_address_outside_its_subnet() -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].fabric_ips[0] = "10.0.0.5"
    assert problems_of(cluster) == [
        "inventory: spark-b: fabric address 10.0.0.5 of twin 1 (enp1s0f1np1) is outside its subnet "
        "192.168.100.0/24; give it an address in that subnet."
    ]


def test_fabric_address_in_the_other_twins_subnet() -> None:
    cluster = make_cluster(2)
    cluster.nodes[0].fabric_ips = ["192.168.101.1", "192.168.100.1"]  # twins swapped
    assert problems_of(cluster) == [
        "inventory: spark-a: fabric address 192.168.101.1 of twin 1 (enp1s0f1np1) is outside its subnet "
        "192.168.100.0/24; give it an address in that subnet.",
        "inventory: spark-a: fabric address 192.168.100.1 of twin 2 (enP2p1s0f1np1) is outside its subnet "
        "192.168.101.0/24; give it an address in that subnet.",
    ]


def test_fabric_address_duplicated_across_nodes() -> None:
    cluster = make_cluster(3)
    cluster.nodes[2].fabric_ips[1] = "192.168.101.2"
    assert problems_of(cluster) == [
        "inventory: fabric address 192.168.101.2 is used by spark-b (twin 2 (enP2p1s0f1np1)) and "
        "spark-c (twin 2 (enP2p1s0f1np1)); give every node and twin its own fabric address."
    ]


def test_fabric_address_inside_the_management_subnet() -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].fabric_ips[1] = "192.168.1.30"
    problems = problems_of(cluster)
    assert (
        "inventory: spark-b: fabric address 192.168.1.30 of twin 2 (enP2p1s0f1np1) is inside the management subnet "
        "192.168.1.0/24; the fabric must not share the management network, give it an address in its twin's subnet."
    ) in problems
    assert len(problems) == 2  # and it is outside its own subnet


def test_twin_subnets_overlap() -> None:
    cluster = make_cluster(2)
    cluster.twins[1].subnet = "192.168.100.128/25"
    cluster.nodes[0].fabric_ips[1] = "192.168.100.201"
    cluster.nodes[1].fabric_ips[1] = "192.168.100.202"
    assert problems_of(cluster) == [
        "inventory: subnet 192.168.100.0/24 of twin 1 (enp1s0f1np1) overlaps subnet 192.168.100.128/25 of "
        "twin 2 (enP2p1s0f1np1); put each twin on its own subnet."
    ]


def test_twin_subnet_overlaps_the_management_subnet() -> None:
    cluster = make_cluster(2, management_subnet="192.168.0.0/16")  # holds the fabric's 192.168.100.0/24 too
    problems = problems_of(cluster)
    assert (
        "inventory: subnet 192.168.100.0/24 of twin 1 (enp1s0f1np1) overlaps the management subnet 192.168.0.0/16; "
        "give the fabric subnets apart from the management network."
    ) in problems
    assert (
        "inventory: subnet 192.168.101.0/24 of twin 2 (enP2p1s0f1np1) overlaps the management subnet 192.168.0.0/16; "
        "give the fabric subnets apart from the management network."
    ) in problems


def test_management_address_equal_to_a_fabric_address() -> None:
    cluster = make_cluster(2, management_subnet=None)
    cluster.nodes[1].address = "192.168.100.2"
    assert problems_of(cluster) == [
        "inventory: spark-b: management address (ansible_host) 192.168.100.2 is also the fabric address of "
        "twin 1 (enp1s0f1np1); set ansible_host to the node's management address (enP7s7), not a fabric one."
    ]


@pytest.mark.parametrize("mtu", [0, 1279, 9217, 65520])
def test_mtu_outside_the_range(mtu: int) -> None:
    cluster = make_cluster()
    cluster.mtu = mtu
    assert problems_of(cluster) == [
        f"inventory: fabric MTU {mtu} is outside 1280..9216; set sparkserve_fabric_mtu (fabric.mtu in a .sparks.yml) "
        "to a whole number in 1280..9216: 9000, the Spark community default, or 1500."
    ]


@pytest.mark.parametrize("mtu", ["9000", True, 9000.0, None])
def test_mtu_must_be_a_whole_number(mtu: Any) -> None:
    cluster = make_cluster()
    cluster.mtu = mtu
    assert problems_of(cluster) == [
        f"inventory: fabric MTU {mtu!r} is not a whole number; set sparkserve_fabric_mtu (fabric.mtu in a .sparks.yml) "
        "to a whole number in 1280..9216: 9000, the Spark community default, or 1500."
    ]


@pytest.mark.parametrize("bad", ["192.168.100.300", "192.168.100", "spark-b", "192.168.100.2/24"])
def test_fabric_address_syntax(bad: str) -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].fabric_ips[0] = bad
    assert problems_of(cluster) == [
        f"inventory: spark-b: fabric address {bad!r} of twin 1 (enp1s0f1np1) is not a valid IP address; "
        "give it an address in 192.168.100.0/24."
    ]


def test_empty_fabric_address() -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].fabric_ips[1] = ""
    assert problems_of(cluster) == [
        "inventory: spark-b: twin 2 (enP2p1s0f1np1) has no fabric address; give it one in 192.168.101.0/24 "
        "(fabric_ips in a .sparks.yml, sparkserve_fabric_ips in a YAML inventory)."
    ]


@pytest.mark.parametrize("bad", ["192.168.100.0/33", "192.168.100.0/", "fabric", "192.168.300.0/24", ""])
def test_twin_subnet_syntax(bad: str) -> None:
    cluster = make_cluster(2)
    cluster.twins[0].subnet = bad
    problems = problems_of(cluster)
    assert problems == [
        f"inventory: subnet {bad!r} of twin 1 (enp1s0f1np1) is not "
        f"{'a CIDR' if not bad else 'a valid CIDR'}; write it as network/prefix, for example 192.168.100.0/24."
    ]  # and no noise about the addresses of a twin whose subnet is unknown


def test_twin_subnet_with_host_bits() -> None:
    cluster = make_cluster(2)
    cluster.twins[1].subnet = "192.168.101.5/24"
    assert problems_of(cluster) == [
        "inventory: subnet 192.168.101.5/24 of twin 2 (enP2p1s0f1np1) has host bits set; "
        "write the network itself, 192.168.101.0/24."
    ]


def test_management_subnet_syntax() -> None:
    cluster = make_cluster(2, management_subnet="192.168.1.0/24x")
    assert problems_of(cluster) == [
        "inventory: management subnet '192.168.1.0/24x' (sparkserve_management_subnet, management_subnet in a "
        ".sparks.yml) is not a valid CIDR; write it as network/prefix, for example 192.168.1.0/24."
    ]


@pytest.mark.parametrize("bad", ["192.168.1.300", "192.168.1.21:22", "spark a", "-spark"])
def test_management_address_syntax(bad: str) -> None:
    cluster = make_cluster(2)
    cluster.nodes[0].address = bad
    assert problems_of(cluster) == [
        f"inventory: spark-a: management address (ansible_host, address in a .sparks.yml) {bad!r} is not a valid "
        "IP address or host name; write it like 192.168.1.21."
    ]


def test_empty_management_address() -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].address = ""
    assert problems_of(cluster) == [
        "inventory: spark-b: management address (ansible_host, address in a .sparks.yml) is empty; "
        "set it to the address Ansible reaches the node on (enP7s7)."
    ]


def test_management_address_outside_the_management_subnet() -> None:
    cluster = make_cluster(2)
    cluster.nodes[1].address = "10.1.1.22"
    assert problems_of(cluster) == [
        "inventory: spark-b: management address (ansible_host, address in a .sparks.yml) 10.1.1.22 is outside the "
        "management subnet 192.168.1.0/24; fix the address or the management subnet."
    ]


def test_duplicate_management_address() -> None:
    cluster = make_cluster(3)
    cluster.nodes[2].address = "192.168.1.22"
    assert problems_of(cluster) == [
        "inventory: management address 192.168.1.22 is used by spark-b and spark-c; "
        "give each Spark its own management address."
    ]


def test_twin_with_empty_interface_name() -> None:
    cluster = make_cluster(2)
    cluster.twins[1].interface = ""
    assert problems_of(cluster) == [
        "inventory: twin 2 has an empty interface name; set it to the twin's Ethernet interface "
        "(enp1s0f1np1 or enP2p1s0f1np1 on a Spark)."
    ]


def test_twin_with_empty_rdma_device() -> None:
    cluster = make_cluster(2)
    cluster.twins[0].rdma_device = " "
    assert problems_of(cluster) == [
        "inventory: twin 1 (enp1s0f1np1) has an empty RDMA device name; set it to the twin's RoCE device "
        "(rocep1s0f1 or roceP2p1s0f1 on a Spark)."
    ]


def test_twins_sharing_an_interface_or_device() -> None:
    cluster = make_cluster(2)
    cluster.twins[1].interface = I1
    cluster.twins[1].rdma_device = R1
    assert problems_of(cluster) == [
        "inventory: twins 1 and 2 both use interface enp1s0f1np1; give each twin its own interface.",
        "inventory: twins 1 and 2 both use RDMA device rocep1s0f1; give each twin its own RDMA device.",
    ]


def test_no_twins() -> None:
    cluster = make_cluster(2)
    cluster.twins = []
    for node in cluster.nodes:
        node.fabric_ips = []
    assert problems_of(cluster) == [
        "inventory: the fabric has no twins; list each twin with its interface, RDMA device and subnet "
        "(a Spark's are enp1s0f1np1/rocep1s0f1 and enP2p1s0f1np1/roceP2p1s0f1, each on its own subnet)."
    ]


def test_rdma_sysfs_root_must_be_absolute() -> None:
    cluster = make_cluster(2)
    cluster.rdma_sysfs_root = "sys/class/infiniband"
    assert problems_of(cluster) == [
        "inventory: RDMA sysfs root 'sys/class/infiniband' is not an absolute path; set sparkserve_rdma_sysfs_root "
        "(fabric.rdma_sysfs_root in a .sparks.yml) to /sys/class/infiniband, as on a real Spark."
    ]


def test_every_problem_is_reported_at_once() -> None:
    cluster = make_cluster(3)
    cluster.mtu = 100
    cluster.nodes[1].fabric_ips[0] = "10.0.0.5"
    cluster.nodes[2].rank = 7
    cluster.twins[1].interface = ""
    problems = problems_of(cluster)
    assert len(problems) == 4
    assert all(problem.startswith("inventory: ") and problem.endswith(".") for problem in problems)


# --- host variables ---------------------------------------------------------------------


def test_cluster_hostvars_carry_the_contract() -> None:
    hostvars = cluster_hostvars(make_cluster(2))
    assert hostvars["spark-b"] == {
        "ansible_host": "192.168.1.22",
        "sparkserve_rank": 1,
        "sparkserve_world_size": 2,
        "sparkserve_fabric_ip": "192.168.100.2",
        "sparkserve_fabric_ips": ["192.168.100.2", "192.168.101.2"],
        "sparkserve_head_fabric_ip": "192.168.100.1",
        "sparkserve_fabric_mtu": 9000,
        "sparkserve_fabric_interfaces": [I1, I2],
        "sparkserve_rdma_devices": [R1, R2],
        "sparkserve_fabric_subnets": [S1, S2],
        "sparkserve_rdma_sysfs_root": "/sys/class/infiniband",
        "sparkserve_fabric_topology": "switch",
        "sparkserve_management_subnet": MGMT,
    }
    assert "sparkserve_management_subnet" not in cluster_hostvars(make_cluster(2, None))["spark-a"]


def test_cluster_hostvars_do_not_share_lists() -> None:
    hostvars = cluster_hostvars(make_cluster(2))
    hostvars["spark-a"]["sparkserve_fabric_interfaces"].append("eth9")
    assert hostvars["spark-b"]["sparkserve_fabric_interfaces"] == [I1, I2]


def test_cluster_groups_by_rank() -> None:
    cluster = make_cluster(3)
    a, _, c = cluster.nodes
    a.head, a.rank, c.head, c.rank = False, 2, True, 0
    assert cluster_groups(cluster) == {
        "sparks": ["spark-c", "spark-b", "spark-a"],
        "head": ["spark-c"],
        "workers": ["spark-b", "spark-a"],
    }


@pytest.mark.parametrize("count", [1, 2, 4, 8])
@pytest.mark.parametrize("management_subnet", [MGMT, None])
def test_round_trip(count: int, management_subnet: str | None) -> None:
    cluster = make_cluster(count, management_subnet)
    names = [node.name for node in cluster.nodes]
    heads = [node.name for node in cluster.nodes if node.head]
    assert cluster_from_hostvars(names, cluster_hostvars(cluster), heads) == cluster


def test_round_trip_head_not_first_and_custom_sysfs_root() -> None:
    cluster = make_cluster(3)
    a, b, _ = cluster.nodes
    a.head, a.rank, b.head, b.rank = False, 1, True, 0
    cluster.rdma_sysfs_root = "/run/sparkserve-lab/sys/class/infiniband"
    back = cluster_from_hostvars(["spark-a", "spark-b", "spark-c"], cluster_hostvars(cluster), ["spark-b"])
    assert back == cluster
    assert validate_cluster(back) == []


def flat_hostvars(inventory: dict) -> tuple[list[str], dict[str, dict], list[str]]:
    """The host variables of a plain YAML inventory of the shape of inventory/example/hosts.yml."""
    sparks = inventory["sparks"]
    names = list(sparks["hosts"])
    hostvars = {name: {**sparks.get("vars", {}), **(sparks["hosts"][name] or {})} for name in names}
    return names, hostvars, list(sparks["children"]["head"]["hosts"])


def test_from_the_example_yaml_inventory() -> None:
    inventory = yaml.safe_load((REPO / "inventory/example/hosts.yml").read_text(encoding="utf-8"))
    cluster = cluster_from_hostvars(*flat_hostvars(inventory))
    assert validate_cluster(cluster) == []
    assert cluster == make_cluster(2)


def example_hostvars() -> tuple[list[str], dict[str, dict], list[str]]:
    cluster = make_cluster(2)
    return ["spark-a", "spark-b"], cluster_hostvars(cluster), ["spark-a"]


REQUIRED = [
    "sparkserve_rank",
    "sparkserve_world_size",
    "sparkserve_fabric_ip",
    "sparkserve_fabric_ips",
    "sparkserve_head_fabric_ip",
    "sparkserve_fabric_mtu",
    "sparkserve_fabric_interfaces",
    "sparkserve_rdma_devices",
    "sparkserve_fabric_subnets",
]


@pytest.mark.parametrize("var", REQUIRED)
def test_missing_variable_names_host_and_variable(var: str) -> None:
    names, hostvars, heads = example_hostvars()
    del hostvars["spark-b"][var]
    with pytest.raises(ValueError, match=rf"^inventory: spark-b: {var} is missing; set it to "):
        cluster_from_hostvars(names, hostvars, heads)


def test_optional_variables_take_their_defaults() -> None:
    names, hostvars, heads = example_hostvars()
    for variables in hostvars.values():
        del variables["sparkserve_rdma_sysfs_root"]
        del variables["sparkserve_management_subnet"]
        del variables["ansible_host"]
    cluster = cluster_from_hostvars(names, hostvars, heads)
    assert cluster.rdma_sysfs_root == DEFAULT_RDMA_SYSFS_ROOT
    assert cluster.management_subnet is None
    assert [node.address for node in cluster.nodes] == ["spark-a", "spark-b"]  # Ansible's own default


def test_every_missing_variable_is_listed() -> None:
    names, hostvars, heads = example_hostvars()
    del hostvars["spark-a"]["sparkserve_rank"]
    del hostvars["spark-b"]["sparkserve_fabric_ips"]
    with pytest.raises(ValueError) as caught:
        cluster_from_hostvars(names, hostvars, heads)
    assert str(caught.value).splitlines() == [
        "inventory: spark-a: sparkserve_rank is missing; set it to the node's rank, 0 for the head.",
        "inventory: spark-b: sparkserve_fabric_ips is missing; set it to the node's fabric addresses, one per twin.",
    ]


def test_host_without_variables() -> None:
    names, hostvars, heads = example_hostvars()
    with pytest.raises(ValueError, match=r"inventory: spark-c: has no host variables; define the host"):
        cluster_from_hostvars(names + ["spark-c"], hostvars, heads)


def test_cluster_wide_variable_must_agree() -> None:
    names, hostvars, heads = example_hostvars()
    hostvars["spark-b"]["sparkserve_fabric_mtu"] = 1500
    with pytest.raises(ValueError) as caught:
        cluster_from_hostvars(names, hostvars, heads)
    assert str(caught.value) == (
        "inventory: spark-b: sparkserve_fabric_mtu is 1500 but spark-a has 9000; "
        "it describes the cluster, give every host the same value."
    )


def test_world_size_must_match() -> None:
    names, hostvars, heads = example_hostvars()
    for variables in hostvars.values():
        variables["sparkserve_world_size"] = 3
    with pytest.raises(ValueError) as caught:
        cluster_from_hostvars(names, hostvars, heads)
    assert str(caught.value) == (
        "inventory: spark-a: sparkserve_world_size is 3; set it to 2, the number of hosts in the sparks group."
    )


def test_fabric_ip_must_be_the_first_fabric_ip() -> None:
    names, hostvars, heads = example_hostvars()
    hostvars["spark-b"]["sparkserve_fabric_ip"] = "192.168.101.2"
    with pytest.raises(ValueError) as caught:
        cluster_from_hostvars(names, hostvars, heads)
    assert str(caught.value) == (
        "inventory: spark-b: sparkserve_fabric_ip is '192.168.101.2'; "
        "set it to 192.168.100.2, the first of sparkserve_fabric_ips."
    )


def test_head_fabric_ip_must_be_the_heads() -> None:
    names, hostvars, heads = example_hostvars()
    for variables in hostvars.values():
        variables["sparkserve_head_fabric_ip"] = "192.168.100.2"
    with pytest.raises(ValueError) as caught:
        cluster_from_hostvars(names, hostvars, heads)
    assert str(caught.value) == (
        "inventory: spark-a: sparkserve_head_fabric_ip is '192.168.100.2'; "
        "set it to 192.168.100.1, the twin 1 fabric address of the head spark-a."
    )


def test_twin_lists_must_have_the_same_length() -> None:
    names, hostvars, heads = example_hostvars()
    for variables in hostvars.values():
        variables["sparkserve_rdma_devices"] = [R1]
    with pytest.raises(ValueError,
                       match=r"inventory: the twin lists differ in length: 2 interfaces, 1 RDMA device, 2 subnets; "):
        cluster_from_hostvars(names, hostvars, heads)


@pytest.mark.parametrize(("var", "value"), [
    ("sparkserve_rank", "first"),
    ("sparkserve_fabric_ips", "192.168.100.2"),
])
def test_malformed_node_variable(var: str, value: Any) -> None:
    names, hostvars, heads = example_hostvars()
    hostvars["spark-b"][var] = value
    with pytest.raises(ValueError, match=rf"^inventory: spark-b: {var} is {value!r}; set it to "):
        cluster_from_hostvars(names, hostvars, heads)


def test_rank_as_a_string_of_digits_is_read_as_a_number() -> None:
    names, hostvars, heads = example_hostvars()
    hostvars["spark-b"]["sparkserve_rank"] = "1"
    assert cluster_from_hostvars(names, hostvars, heads).nodes[1].rank == 1


def test_head_group_outside_sparks() -> None:
    names, hostvars, heads = example_hostvars()
    with pytest.raises(ValueError, match=r"inventory: the head group names spark-z, not in the sparks group"):
        cluster_from_hostvars(names, hostvars, ["spark-z"])


def test_head_group_problems_are_the_validators() -> None:
    names, hostvars, _ = example_hostvars()
    cluster = cluster_from_hostvars(names, hostvars, ["spark-a", "spark-b"])
    assert [node.head for node in cluster.nodes] == [True, True]
    assert validate_cluster(cluster)[0].startswith("inventory: 2 nodes are marked head (spark-a, spark-b)")


def test_module_uses_only_the_standard_library() -> None:
    """It runs on the nodes too, where only Python's own library can be assumed: the standard library and
    the fabric's links (module_utils/fabric_links.py), which is held to the same."""
    for path in (CLUSTER_PY, CLUSTER_PY.parent / "fabric_links.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        own = {name for name in imported if name.startswith("ansible_collections.")}
        assert own <= {"ansible_collections.sparkserve.deploy.plugins.module_utils.fabric_links"}
        assert {name.split(".")[0] for name in imported - own} <= {
            "__future__", "ipaddress", "re", "collections", "dataclasses", "typing"}
