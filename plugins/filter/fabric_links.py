"""The fabric's links, as the nodes' host variables describe them: what a node pings, its routes, the table."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible_collections.sparkserve.deploy.plugins.module_utils.fabric_links import (
    from_hostvars,
    link_table,
    peer_addresses,
    peer_routes,
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


def fabric_link_table(names: Sequence[str], hostvars: Mapping[str, Any]) -> list[str]:
    """Every link with its ends, one line each."""
    return link_table(from_hostvars(names, hostvars))


class FilterModule:
    """sparkserve fabric link filters."""

    def filters(self) -> dict[str, Any]:
        return {"fabric_peer_addresses": fabric_peer_addresses, "fabric_routes": fabric_routes,
                "fabric_link_table": fabric_link_table}
