"""The fabric role's network files for a ring node: netplan's routes and networkd's [Route] sections put each
peer's own address behind the twin on the link they share; a switch node's files carry no route."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import yaml

from ansible_collections.sparkserve.deploy.plugins.filter.fabric_links import fabric_ring_layout, fabric_routes

TEMPLATES = Path(__file__).resolve().parents[2] / "roles/fabric/templates/etc"
NAMES = ["spark-a", "spark-b", "spark-c"]


def render(name: str, **variables: Any) -> str:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), trim_blocks=True,
                                     undefined=jinja2.StrictUndefined)
    environment.filters["to_json"] = json.dumps
    environment.filters["zip"] = lambda *lists: zip(*lists, strict=False)  # as Ansible's zip filter
    return environment.get_template(name).render(ansible_managed="managed", **variables)


def ring_node(name: str) -> dict[str, Any]:
    layout = fabric_ring_layout(NAMES, "10.77.0.0/24", 30)
    hostvars = {node: {"sparkserve_fabric_interfaces": [twin["interface"] for twin in twins],
                       "sparkserve_rdma_devices": [twin["rdma_device"] for twin in twins],
                       "sparkserve_fabric_subnets": [twin["subnet"] for twin in twins],
                       "sparkserve_fabric_ips": [twin["address"] for twin in twins]} for node, twins in layout.items()}
    twins = layout[name]
    return {"fabric_interfaces": [twin["interface"] for twin in twins], "fabric_mtu": 9000,
            "fabric_netplan_options": {},
            "__fabric_cidrs": [f"{twin['address']}/30" for twin in twins],
            "__fabric_routes": fabric_routes(NAMES, hostvars, name)}


def test_a_ring_nodes_netplan_routes_the_peer_through_the_shared_link() -> None:
    network = yaml.safe_load(render("netplan/60-sparkserve-fabric.yaml.j2", **ring_node("spark-c")))
    ethernets = network["network"]["ethernets"]
    assert list(ethernets) == ["enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"]
    assert ethernets["enp1s0f0np0"]["addresses"] == ["10.77.0.17/30"]
    assert ethernets["enp1s0f0np0"]["routes"] == [{"to": "10.77.0.1/32", "via": "10.77.0.18"}]
    assert [name for name, twin in ethernets.items() if "routes" in twin] == ["enp1s0f0np0"]


def test_a_ring_nodes_networkd_file_has_the_route_section() -> None:
    variables = ring_node("spark-c")
    text = render("systemd/network/60-sparkserve-fabric.network.j2", twin_interface="enp1s0f0np0",
                  twin_cidr="10.77.0.17/30", **variables)
    assert "[Route]\nDestination=10.77.0.1/32\nGateway=10.77.0.18\n" in text
    other = render("systemd/network/60-sparkserve-fabric.network.j2", twin_interface="enp1s0f1np1",
                   twin_cidr="10.77.0.10/30", **variables)
    assert "[Route]" not in other


def test_a_switch_nodes_files_carry_no_route() -> None:
    variables = {"fabric_interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"], "fabric_mtu": 9000,
                 "fabric_netplan_options": {}, "__fabric_cidrs": ["10.77.1.1/24", "10.77.2.1/24"],
                 "__fabric_routes": []}
    network = yaml.safe_load(render("netplan/60-sparkserve-fabric.yaml.j2", **variables))
    assert all("routes" not in twin for twin in network["network"]["ethernets"].values())
    assert "[Route]" not in render("systemd/network/60-sparkserve-fabric.network.j2", twin_interface="enp1s0f1np1",
                                   twin_cidr="10.77.1.1/24", **variables)
