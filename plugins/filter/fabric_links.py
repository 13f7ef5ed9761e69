"""The fabric's links, as the nodes' host variables describe them: what a node pings, its routes, the table."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible_collections.sparkserve.deploy.plugins.module_utils.fabric_links import (
    SPARK_PORTS,
    carve_subnets,
    from_hostvars,
    link_table,
    peer_addresses,
    peer_routes,
    ring_layout,
    slower_twins,
)

DOCUMENTATION = r"""
name: fabric_peer_addresses
short_description: The fabric addresses a node must reach, its routes, and the link table
version_added: "0.6.0"
description:
  - C(fabric_peer_addresses) - every peer address on a subnet the node shares with it (each twin of each link),
    then each peer's own address (C(sparkserve_fabric_ip)); C(peer_links) pings them.
  - C(fabric_routes) - in a ring, a route to each peer's own address that is on none of the node's subnets,
    through the peer's address on the first link they share (C(to), C(via), C(interface), C(peer)); none with a
    switch or two Sparks back to back, where every node shares every subnet.
  - "C(fabric_link_table) - one line per link, its subnet and each end's node, interface, RDMA device and address
    (C(10.77.0.0/30: spark-a enp1s0f0np0 (rocep1s0f0\\) 10.77.0.1 <-> spark-b ...))."
  - C(fabric_ring_layout) - a ring's twins per node as the cluster file computes them from the node order and
    a link range (a Spark's ports, link k from port 0 of node k to port 1 of node k+1); the lab builds its
    networks from it. Its input is the node names, its arguments the range and the prefix length.
  - C(fabric_slow_twins) - the twins of O(node) whose RDMA port links at a lower speed than the fastest twin
    of the fabric, one sentence each, from every node's RoCE facts as the fabric role registered them this run
    (the M(sparkserve.deploy.roce_facts) result C(__fabric_roce), else the
    RV(sparkserve.deploy.fabric_network#module:roce) of C(__fabric_network_result); nodes with neither are left
    out).
positional: hostvars, node
options:
  _input:
    description: The inventory names of the fabric's nodes.
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars).
    type: dict
    required: true
  node:
    description: The node the addresses or routes are for (not used by C(fabric_link_table)).
    type: str
"""

EXAMPLES = r"""
peers: "{{ groups['sparks'] | sparkserve.deploy.fabric_peer_addresses(hostvars, inventory_hostname) }}"
routes: "{{ groups['sparks'] | sparkserve.deploy.fabric_routes(hostvars, inventory_hostname) }}"
table: "{{ groups['sparks'] | sparkserve.deploy.fabric_link_table(hostvars) }}"
"""

RETURN = r"""
_value:
  description: Addresses or the table's lines (lists of strings), or routes (a list of dicts).
  type: list
"""


def _node_name(hostvars: Mapping[str, Any], node: str) -> str:
    variables = hostvars.get(node) or {}
    return str(variables.get("sparkserve_node") or node)


def fabric_peer_addresses(names: Sequence[str], hostvars: Mapping[str, Any], node: str) -> list[str]:
    """What ``node`` must reach over the fabric."""
    return peer_addresses(from_hostvars(names, hostvars), _node_name(hostvars, node))


def fabric_routes(names: Sequence[str], hostvars: Mapping[str, Any], node: str) -> list[dict[str, str]]:
    """The routes ``node`` needs to every peer's own address."""
    return peer_routes(from_hostvars(names, hostvars), _node_name(hostvars, node))


def fabric_ring_layout(names: Sequence[str], link_range: str, prefix: int) -> dict[str, list[dict[str, str]]]:
    """Each node of a ring in node order: its twins, each with interface, RDMA device, subnet and address."""
    names = list(names)
    cabling = [(name, names[(index + 1) % len(names)]) for index, name in enumerate(names)]
    ports = [list(port) for port in SPARK_PORTS]
    layout = ring_layout(names, ports, cabling, carve_subnets(link_range, len(names), len(ports[0]), int(prefix)))
    return {name: [{"interface": interface, "rdma_device": device, "subnet": subnet, "address": address}
                   for interface, device, subnet, address in zip(node.interfaces, node.rdma_devices, node.subnets,
                                                                 node.addresses, strict=True)]
            for name, node in layout.items()}


def registered_roce(variables: Mapping[str, Any]) -> Mapping[str, Any]:
    """A node's RoCE facts of this run: its own read (roce_facts), else the one its fabric configuration made."""
    for name in ("__fabric_roce", "__fabric_network_result"):
        facts = (variables.get(name) or {}).get("roce")
        if facts:
            return facts
    return {}


def fabric_slow_twins(names: Sequence[str], hostvars: Mapping[str, Any], node: str) -> list[str]:
    """The twins of ``node`` slower than the fabric's fastest, from each node's registered RoCE facts."""
    rates: dict[str, dict[str, Any]] = {}
    for host in names:
        facts = registered_roce(hostvars.get(host) or {})
        devices = {device.get("name"): device.get("rate") for device in facts.get("devices") or []}
        if devices:
            rates[_node_name(hostvars, host)] = devices
    return slower_twins(from_hostvars(names, hostvars), rates, _node_name(hostvars, node))


def fabric_link_table(names: Sequence[str], hostvars: Mapping[str, Any]) -> list[str]:
    """Every link with its ends, one line each."""
    return link_table(from_hostvars(names, hostvars))


class FilterModule:
    """sparkserve fabric link filters."""

    def filters(self) -> dict[str, Any]:
        return {"fabric_peer_addresses": fabric_peer_addresses, "fabric_routes": fabric_routes,
                "fabric_link_table": fabric_link_table, "fabric_ring_layout": fabric_ring_layout,
                "fabric_slow_twins": fabric_slow_twins}
