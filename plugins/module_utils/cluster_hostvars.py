"""The cluster model (cluster.py) and a plain YAML inventory's host variables, both ways.

``cluster_hostvars`` and ``cluster_groups`` write the contract's host variables
and groups for a cluster (the ``spark_cluster`` inventory plugin gives them to
Ansible); ``cluster_from_hostvars`` builds the cluster back from a plain YAML
inventory's host variables, which ``validate_cluster`` then checks. Standard
library only, as cluster.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster import (
    DEFAULT_RDMA_SYSFS_ROOT,
    GROUP_ALL,
    GROUP_HEAD,
    GROUP_WORKERS,
    PREFIX,
    Cluster,
    Node,
    Twin,
    counted,
    is_int,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.fabric_links import TOPOLOGY_RING, TOPOLOGY_SWITCH

# The same value on every host: these describe the cluster, not one node.
_CLUSTER_WIDE = (
    "sparkserve_fabric_mtu",
    "sparkserve_fabric_interfaces",
    "sparkserve_rdma_devices",
    "sparkserve_fabric_subnets",
    "sparkserve_rdma_sysfs_root",
    "sparkserve_management_subnet",
    "sparkserve_world_size",
    "sparkserve_head_fabric_ip",
    "sparkserve_fabric_topology",
)
# In a ring each node has its own interfaces on its own links.
_PER_NODE_IN_RING = ("sparkserve_fabric_interfaces", "sparkserve_rdma_devices", "sparkserve_fabric_subnets")
_FABRIC_VARS = ("sparkserve_fabric_mtu", "sparkserve_fabric_interfaces", "sparkserve_rdma_devices",
                "sparkserve_fabric_subnets", "sparkserve_fabric_ips", "sparkserve_fabric_ip")


def cluster_groups(cluster: Cluster) -> dict[str, list[str]]:
    """The inventory groups: ``sparks`` (all, by rank), ``head`` and ``workers`` (by rank)."""
    ordered = sorted(cluster.nodes, key=lambda node: (node.rank if is_int(node.rank) else len(cluster.nodes)))
    return {
        GROUP_ALL: [node.name for node in ordered],
        GROUP_HEAD: [node.name for node in ordered if node.head],
        GROUP_WORKERS: [node.name for node in ordered if not node.head],
    }


def cluster_hostvars(cluster: Cluster) -> dict[str, dict]:
    """The contract's host variables of every node, by node name."""
    heads = [node for node in cluster.nodes if node.head]
    head_fabric_ip = heads[0].fabric_ips[0] if len(heads) == 1 and heads[0].fabric_ips else None
    shared: dict[str, Any] = {
        "sparkserve_world_size": len(cluster.nodes),
        "sparkserve_head_fabric_ip": head_fabric_ip,
        "sparkserve_fabric_mtu": cluster.mtu,
        "sparkserve_fabric_interfaces": [twin.interface for twin in cluster.twins],
        "sparkserve_rdma_devices": [twin.rdma_device for twin in cluster.twins],
        "sparkserve_fabric_subnets": [twin.subnet for twin in cluster.twins],
        "sparkserve_rdma_sysfs_root": cluster.rdma_sysfs_root,
        "sparkserve_fabric_topology": cluster.topology,
    }
    if not cluster.fabric:  # no fabric: none of its variables, so the fabric stage has nothing to do
        shared = {"sparkserve_world_size": len(cluster.nodes), "sparkserve_head_fabric_ip": None}
    if cluster.management_subnet is not None:
        shared["sparkserve_management_subnet"] = cluster.management_subnet
    result: dict[str, dict] = {}
    for node in cluster.nodes:
        hostvars: dict[str, Any] = {
            "ansible_host": node.address,
            "sparkserve_rank": node.rank,
        }
        if cluster.fabric:
            hostvars["sparkserve_fabric_ip"] = node.fabric_ips[0] if node.fabric_ips else None
            hostvars["sparkserve_fabric_ips"] = list(node.fabric_ips)
        for key, value in shared.items():
            hostvars[key] = list(value) if isinstance(value, list) else value
        if cluster.fabric and node.twins is not None:
            hostvars["sparkserve_fabric_interfaces"] = [twin.interface for twin in node.twins]
            hostvars["sparkserve_rdma_devices"] = [twin.rdma_device for twin in node.twins]
            hostvars["sparkserve_fabric_subnets"] = [twin.subnet for twin in node.twins]
        result[node.name] = hostvars
    return result


def _as_int(value: Any) -> int | None:
    if is_int(value):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]+\s*", value):
        return int(value)
    return None


def _as_str_list(value: Any) -> list[str] | None:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return None
    if not all(isinstance(item, str) for item in value):
        return None
    return [str(item) for item in value]


def cluster_from_hostvars(names: list[str], hostvars: dict, head_names: list[str]) -> Cluster:
    """Build the cluster from a plain YAML inventory's host variables.

    ``names`` are the hosts of the ``sparks`` group, ``head_names`` those of the
    ``head`` group. Raises ValueError naming every host and variable that is
    missing, malformed, or disagrees with the rest of the cluster. The topology
    rules themselves are ``validate_cluster``'s. A host without ``ansible_host``
    is reached by its name, as Ansible does; ``sparkserve_rdma_sysfs_root``
    defaults to /sys/class/infiniband and ``sparkserve_management_subnet`` is
    optional.
    """
    problems: list[str] = []
    unknown_heads = [name for name in head_names if name not in names]
    if unknown_heads:
        problems.append(f"{PREFIX}the head group names {', '.join(unknown_heads)}, not in the sparks group; "
                        "put the head in the sparks group too.")

    present: list[tuple[str, Mapping]] = []
    for name in names:
        variables = hostvars.get(name) if isinstance(hostvars, Mapping) else None
        if not isinstance(variables, Mapping):
            problems.append(f"{PREFIX}{name}: has no host variables; define the host in the inventory.")
            continue
        present.append((name, variables))

    def missing(name: str, var: str, what: str) -> None:
        problems.append(f"{PREFIX}{name}: {var} is missing; set it to {what}.")

    def malformed(name: str, var: str, value: Any, what: str) -> None:
        problems.append(f"{PREFIX}{name}: {var} is {value!r}; set it to {what}.")

    # Sparks with no fabric (a deployment on one node): no host names a fabric variable.
    fabric = len(names) > 1 or any(var in variables for _, variables in present for var in _FABRIC_VARS)
    required_wide = {
        "sparkserve_fabric_mtu": "the fabric MTU, a whole number (9000)",
        "sparkserve_fabric_interfaces": "the list of the twins' interfaces ([enp1s0f1np1, enP2p1s0f1np1])",
        "sparkserve_rdma_devices": "the list of the twins' RDMA devices ([rocep1s0f1, roceP2p1s0f1])",
        "sparkserve_fabric_subnets": "the list of the twins' subnets ([192.168.100.0/24, 192.168.101.0/24])",
        "sparkserve_world_size": f"the number of nodes ({len(names)})",
        "sparkserve_head_fabric_ip": "the head's twin 1 fabric address",
    }
    wide: dict[str, Any] = {}
    wide_from: dict[str, str] = {}
    if not fabric:
        for var in _FABRIC_VARS + ("sparkserve_head_fabric_ip",):
            required_wide.pop(var, None)
    # In a ring each node lists its own twins, so those lists are read per node below.
    ring = fabric and any(variables.get("sparkserve_fabric_topology") == TOPOLOGY_RING for _, variables in present)
    for name, variables in present:
        for var in _CLUSTER_WIDE:
            if ring and var in _PER_NODE_IN_RING:
                continue
            if var not in variables:
                if var in required_wide:
                    missing(name, var, required_wide[var])
                continue
            value = variables[var]
            if var not in wide:
                wide[var], wide_from[var] = value, name
            elif value != wide[var]:
                problems.append(f"{PREFIX}{name}: {var} is {value!r} but {wide_from[var]} has {wide[var]!r}; "
                                "it describes the cluster, give every host the same value.")

    mtu: Any = wide.get("sparkserve_fabric_mtu")
    if "sparkserve_fabric_mtu" in wide:
        parsed_mtu = _as_int(mtu)
        if parsed_mtu is None:
            malformed(wide_from["sparkserve_fabric_mtu"], "sparkserve_fabric_mtu", mtu, "a whole number (9000)")
        else:
            mtu = parsed_mtu

    lists: dict[str, list[str]] = {}
    for var in ("sparkserve_fabric_interfaces", "sparkserve_rdma_devices", "sparkserve_fabric_subnets"):
        if var in wide:
            value = _as_str_list(wide[var])
            if value is None:
                malformed(wide_from[var], var, wide[var], required_wide[var])
            else:
                lists[var] = value
    if len(lists) == 3 and len({len(value) for value in lists.values()}) != 1:
        problems.append(
            f"{PREFIX}the twin lists differ in length: "
            f"{counted(len(lists['sparkserve_fabric_interfaces']), 'interface')}, "
            f"{counted(len(lists['sparkserve_rdma_devices']), 'RDMA device')}, "
            f"{counted(len(lists['sparkserve_fabric_subnets']), 'subnet')}; "
            "give sparkserve_fabric_interfaces, sparkserve_rdma_devices and sparkserve_fabric_subnets "
            "one entry per twin."
        )

    sysfs_root = wide.get("sparkserve_rdma_sysfs_root", DEFAULT_RDMA_SYSFS_ROOT)
    management_subnet = wide.get("sparkserve_management_subnet")
    if management_subnet is not None:
        management_subnet = str(management_subnet)

    nodes: list[Node] = []
    for name, variables in present:
        rank: Any = None
        if "sparkserve_rank" not in variables:
            missing(name, "sparkserve_rank", "the node's rank, 0 for the head")
        else:
            rank = _as_int(variables["sparkserve_rank"])
            if rank is None:
                malformed(name, "sparkserve_rank", variables["sparkserve_rank"], "the node's rank, a whole number")
        fabric_ips: list[str] = []
        if not fabric:
            pass
        elif "sparkserve_fabric_ips" not in variables:
            missing(name, "sparkserve_fabric_ips", "the node's fabric addresses, one per twin")
        else:
            value = _as_str_list(variables["sparkserve_fabric_ips"])
            if value is None:
                malformed(name, "sparkserve_fabric_ips", variables["sparkserve_fabric_ips"],
                          "a list of the node's fabric addresses, one per twin")
            else:
                fabric_ips = value
        if not fabric:
            pass
        elif "sparkserve_fabric_ip" not in variables:
            missing(name, "sparkserve_fabric_ip",
                    "the node's twin 1 fabric address (the first of sparkserve_fabric_ips)")
        elif fabric_ips and variables["sparkserve_fabric_ip"] != fabric_ips[0]:
            malformed(name, "sparkserve_fabric_ip", variables["sparkserve_fabric_ip"],
                      f"{fabric_ips[0]}, the first of sparkserve_fabric_ips")
        address = variables.get("ansible_host", name)
        own_twins = _node_twins(name, variables, required_wide, problems) if ring else None
        # A deployment's rank on a node (DEPLOYMENT@NODE, with several deployments) is checked as its node.
        nodes.append(Node(name=str(variables.get("sparkserve_node") or name), address=str(address), rank=rank,
                          fabric_ips=fabric_ips, head=name in head_names, twins=own_twins))

    world_size = wide.get("sparkserve_world_size")
    if world_size is not None and _as_int(world_size) != len(names):
        malformed(wide_from["sparkserve_world_size"], "sparkserve_world_size", world_size,
                  f"{len(names)}, the number of hosts in the sparks group")
    heads = [node for node in nodes if node.head]
    head_ip = wide.get("sparkserve_head_fabric_ip")
    if head_ip is not None and len(heads) == 1 and heads[0].fabric_ips and head_ip != heads[0].fabric_ips[0]:
        malformed(wide_from["sparkserve_head_fabric_ip"], "sparkserve_head_fabric_ip", head_ip,
                  f"{heads[0].fabric_ips[0]}, the twin 1 fabric address of the head {heads[0].name}")

    if problems:
        raise ValueError("\n".join(problems))
    if not fabric:
        return Cluster(nodes=nodes, twins=[], mtu=mtu, management_subnet=management_subnet,
                       rdma_sysfs_root=str(sysfs_root), fabric=False)
    topology = str(wide.get("sparkserve_fabric_topology", TOPOLOGY_SWITCH))
    if ring:
        return Cluster(nodes=nodes, twins=[], mtu=mtu, management_subnet=management_subnet,
                       rdma_sysfs_root=str(sysfs_root), topology=topology)
    twins = [Twin(interface=interface, rdma_device=device, subnet=subnet) for interface, device, subnet in zip(
        lists["sparkserve_fabric_interfaces"], lists["sparkserve_rdma_devices"], lists["sparkserve_fabric_subnets"],
        strict=True)]
    return Cluster(nodes=nodes, twins=twins, mtu=mtu, management_subnet=management_subnet,
                   rdma_sysfs_root=str(sysfs_root), topology=topology)


def _node_twins(name: str, variables: Mapping, required: Mapping[str, str], problems: list[str]) -> list[Twin]:
    """A ring node's own twins from its interface, device and subnet lists (each reported when missing,
    malformed or of another length)."""
    lists: dict[str, list[str]] = {}
    for var in _PER_NODE_IN_RING:
        if var not in variables:
            problems.append(f"{PREFIX}{name}: {var} is missing; set it to {required[var]}, this node's own in a ring.")
            continue
        value = _as_str_list(variables[var])
        if value is None:
            problems.append(f"{PREFIX}{name}: {var} is {variables[var]!r}; set it to {required[var]}.")
        else:
            lists[var] = value
    if len(lists) != len(_PER_NODE_IN_RING):
        return []
    if len({len(value) for value in lists.values()}) != 1:
        problems.append(f"{PREFIX}{name}: its twin lists differ in length; give sparkserve_fabric_interfaces, "
                        "sparkserve_rdma_devices and sparkserve_fabric_subnets one entry per twin.")
        return []
    return [Twin(interface=interface, rdma_device=device, subnet=subnet) for interface, device, subnet in zip(
        *(lists[var] for var in _PER_NODE_IN_RING), strict=True)]
