"""The normalized model of a Spark cluster and the rules its topology must obey.

One model for every way a cluster is described: the inventory plugin
(``sparkserve.deploy.spark_cluster``) builds it from a ``.sparks.yml`` file,
``cluster_from_hostvars`` (cluster_hostvars.py) builds it from the host
variables of a plain YAML inventory, and ``validate_cluster`` holds the rules
both must pass. Standard
library only (``ipaddress``), so the same code runs on the controller and on
the nodes.

Host variables of the contract (``cluster_hostvars`` in cluster_hostvars.py writes them, a plain
YAML inventory carries them): ``ansible_host``, ``sparkserve_rank``,
``sparkserve_world_size``, ``sparkserve_fabric_ip``, ``sparkserve_fabric_ips``,
``sparkserve_head_fabric_ip``, ``sparkserve_fabric_mtu``,
``sparkserve_fabric_interfaces``, ``sparkserve_rdma_devices``,
``sparkserve_fabric_subnets``, ``sparkserve_fabric_topology``,
``sparkserve_rdma_sysfs_root`` and, when known,
``sparkserve_management_subnet``. In a ring the interface, device and subnet
lists are each node's own (``fabric_links``); otherwise they are the
cluster's. Groups: ``sparks`` (all), ``head``
(one host), ``workers`` (the rest).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Union

from ansible_collections.sparkserve.deploy.plugins.module_utils.fabric_links import (
    RING_NODES,
    TOPOLOGIES,
    TOPOLOGY_DIRECT,
    TOPOLOGY_RING,
    TOPOLOGY_SWITCH,
    NodeFabric,
    ring_problems,
    ring_size_problem,
)

IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

DEFAULT_RDMA_SYSFS_ROOT = "/sys/class/infiniband"
MTU_MIN = 1280
MTU_MAX = 9216

GROUP_ALL = "sparks"
GROUP_HEAD = "head"
GROUP_WORKERS = "workers"

# The host variables a cluster description carries (see the module docstring).
CONTRACT_VARS = (
    "ansible_host",
    "sparkserve_rank",
    "sparkserve_world_size",
    "sparkserve_fabric_ip",
    "sparkserve_fabric_ips",
    "sparkserve_head_fabric_ip",
    "sparkserve_fabric_mtu",
    "sparkserve_fabric_interfaces",
    "sparkserve_rdma_devices",
    "sparkserve_fabric_subnets",
    "sparkserve_fabric_topology",
    "sparkserve_rdma_sysfs_root",
    "sparkserve_management_subnet",
)


PREFIX = "inventory: "
# A node's inventory name: one word that ssh config, shells and container names all take as it is.
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOST_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_WHERE_FABRIC_IPS = "fabric_ips in a .sparks.yml, sparkserve_fabric_ips in a YAML inventory"
_WHERE_HEAD = "head: true on one node of a .sparks.yml, one host in the head group of a YAML inventory"


@dataclass
class Twin:
    """One of the two PCIe halves of a Spark's QSFP port, on its own subnet."""

    interface: str
    rdma_device: str
    subnet: str


@dataclass
class Node:
    """One Spark: its management address, rank and one fabric address per twin."""

    name: str
    address: str
    rank: int
    fabric_ips: list[str]
    head: bool
    # The node's own interfaces, in a ring (each node's links differ); None: the cluster's twins.
    twins: list[Twin] | None = None


@dataclass
class Cluster:
    """Every Spark of one deployment and the fabric that joins them."""

    nodes: list[Node]
    twins: list[Twin]
    mtu: int
    management_subnet: str | None
    rdma_sysfs_root: str
    # False for Sparks with no fabric between them (every deployment on one node): no twin is checked.
    fabric: bool = True
    # How the Sparks are cabled: switch (every twin's subnet joins every node), direct (two Sparks back to
    # back, the same shape) or ring (three Sparks, each link its own subnets; the nodes carry their twins).
    topology: str = TOPOLOGY_SWITCH


# --- validation ---------------------------------------------------------------


def validate_cluster(cluster: Cluster) -> list[str]:
    """Every problem of the cluster, one message each (empty when it is sound).

    Each message names the field, the bad value and the fix.
    """
    problems: list[str] = []
    if cluster.fabric:
        _check_mtu(cluster.mtu, problems)
        _check_sysfs_root(cluster.rdma_sysfs_root, problems)
    management = _check_management_subnet(cluster.management_subnet, problems)
    ring = cluster.fabric and cluster.topology == TOPOLOGY_RING
    subnets = _check_twins(cluster.twins, management, problems) if cluster.fabric and not ring else []
    _check_nodes(cluster, subnets, management, problems)
    if cluster.fabric:
        _check_topology(cluster, problems)
    return problems


def _check_topology(cluster: Cluster, problems: list[str]) -> None:
    """The cabling the topology names fits the nodes: two for direct, a ring of three whose links pair up."""
    count = len(cluster.nodes)
    if cluster.topology not in TOPOLOGIES:
        problems.append(f"{PREFIX}fabric topology {cluster.topology!r} is not one sparkserve knows; write "
                        f"{', '.join(TOPOLOGIES[:-1])} or {TOPOLOGIES[-1]} (sparkserve_fabric_topology, "
                        "fabric.topology in a .sparks.yml).")
    elif cluster.topology == TOPOLOGY_DIRECT and count != 2:
        problems.append(f"{PREFIX}fabric topology direct cables two Sparks back to back, the cluster has "
                        f"{counted(count, 'node')}; write topology: ring for three, switch for more.")
    elif cluster.topology == TOPOLOGY_RING:
        # Fewer nodes than a ring: one deployment's part of it (the cluster file checked the whole ring).
        size = ring_size_problem(count) if count > RING_NODES else None
        if size is not None:
            problems.append(size)
        elif not problems:  # the links are read from sound addresses only
            problems += ring_problems(part=count < RING_NODES, nodes=[NodeFabric(
                name=node.name, interfaces=[twin.interface for twin in node.twins or []],
                rdma_devices=[twin.rdma_device for twin in node.twins or []],
                subnets=[twin.subnet for twin in node.twins or []], addresses=list(node.fabric_ips))
                for node in cluster.nodes])


def counted(number: int, noun: str) -> str:
    """'1 node', '2 nodes'."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _twin_label(index: int, twin: Twin) -> str:
    if isinstance(twin.interface, str) and twin.interface:
        return f"twin {index + 1} ({twin.interface})"
    return f"twin {index + 1}"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_address(value: Any) -> IPAddress | None:
    if not isinstance(value, str):
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def _looks_numeric(value: str) -> bool:
    """True for what can only be meant as an IP address (digits and dots, or a colon)."""
    return ":" in value or bool(re.fullmatch(r"[0-9.]+", value))


def _is_host_name(value: str) -> bool:
    labels = value.rstrip(".").split(".")
    return len(value) <= 253 and all(_HOST_LABEL.match(label) for label in labels)


def _check_mtu(mtu: Any, problems: list[str]) -> None:
    fix = (f"set sparkserve_fabric_mtu (fabric.mtu in a .sparks.yml) to a whole number in {MTU_MIN}..{MTU_MAX}: "
           "9000, the Spark community default, or 1500")
    if not is_int(mtu):
        problems.append(f"{PREFIX}fabric MTU {mtu!r} is not a whole number; {fix}.")
    elif not MTU_MIN <= mtu <= MTU_MAX:
        problems.append(f"{PREFIX}fabric MTU {mtu} is outside {MTU_MIN}..{MTU_MAX}; {fix}.")


def _check_sysfs_root(root: Any, problems: list[str]) -> None:
    if not isinstance(root, str) or not root.startswith("/"):
        problems.append(
            f"{PREFIX}RDMA sysfs root {root!r} is not an absolute path; set sparkserve_rdma_sysfs_root "
            f"(fabric.rdma_sysfs_root in a .sparks.yml) to {DEFAULT_RDMA_SYSFS_ROOT}, as on a real Spark."
        )


def _parse_network(value: Any, field: str, example: str, problems: list[str]) -> IPNetwork | None:
    """The network value names, or None after recording why it is not one.

    ``field`` names the value where ``{value}`` stands, for example
    ``"subnet {value} of twin 1 (enp1s0f1np1)"``.
    """
    where = PREFIX + field.format(value=repr(value))
    if not isinstance(value, str) or not value:
        problems.append(f"{where} is not a CIDR; write it as network/prefix, for example {example}.")
        return None
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError:
        pass
    try:
        loose = ipaddress.ip_network(value, strict=False)
    except ValueError:
        problems.append(f"{where} is not a valid CIDR; write it as network/prefix, for example {example}.")
        return None
    problems.append(f"{PREFIX}{field.format(value=value)} has host bits set; write the network itself, {loose}.")
    return None


def _check_management_subnet(subnet: str | None, problems: list[str]) -> IPNetwork | None:
    if subnet is None:
        return None
    return _parse_network(subnet, "management subnet {value} (sparkserve_management_subnet, management_subnet in a "
                          ".sparks.yml)", "192.168.1.0/24", problems)


def _check_twins(twins: list[Twin], management: IPNetwork | None, problems: list[str]) -> list[IPNetwork | None]:
    """Check the twins; return each twin's network (None where its subnet is bad)."""
    if not twins:
        problems.append(
            f"{PREFIX}the fabric has no twins; list each twin with its interface, RDMA device and subnet "
            "(a Spark's are enp1s0f1np1/rocep1s0f1 and enP2p1s0f1np1/roceP2p1s0f1, each on its own subnet)."
        )
    subnets: list[IPNetwork | None] = []
    for index, twin in enumerate(twins):
        label = _twin_label(index, twin)
        for value, what, fix in (
            (twin.interface, "interface", "the twin's Ethernet interface (enp1s0f1np1 or enP2p1s0f1np1 on a Spark)"),
            (twin.rdma_device, "RDMA device", "the twin's RoCE device (rocep1s0f1 or roceP2p1s0f1 on a Spark)"),
        ):
            if value is None or (isinstance(value, str) and not value.strip()):
                problems.append(f"{PREFIX}{label} has an empty {what} name; set it to {fix}.")
            elif not isinstance(value, str):
                problems.append(f"{PREFIX}{label} has {what} {value!r}, not a name; set it to {fix}.")
        field = "subnet {value} of " + label.replace("{", "{{").replace("}", "}}")
        subnets.append(_parse_network(twin.subnet, field, f"192.168.{100 + index}.0/24", problems))
    for attr, what in (("interface", "interface"), ("rdma_device", "RDMA device")):
        seen: dict[str, int] = {}
        for index, twin in enumerate(twins):
            value = getattr(twin, attr)
            if not isinstance(value, str) or not value.strip():
                continue
            if value in seen:
                problems.append(f"{PREFIX}twins {seen[value] + 1} and {index + 1} both use {what} {value}; "
                                f"give each twin its own {what}.")
            else:
                seen[value] = index
    for i, first in enumerate(subnets):
        for j in range(i + 1, len(subnets)):
            second = subnets[j]
            if first is not None and second is not None and first.overlaps(second):
                problems.append(
                    f"{PREFIX}subnet {first} of {_twin_label(i, twins[i])} overlaps subnet {second} of "
                    f"{_twin_label(j, twins[j])}; put each twin on its own subnet."
                )
        if first is not None and management is not None and first.overlaps(management):
            problems.append(
                f"{PREFIX}subnet {first} of {_twin_label(i, twins[i])} overlaps the management subnet {management}; "
                "give the fabric subnets apart from the management network."
            )
    return subnets


def _check_nodes(cluster: Cluster, subnets: list[IPNetwork | None], management: IPNetwork | None,
                 problems: list[str]) -> None:
    nodes = cluster.nodes
    if not nodes:
        problems.append(f"{PREFIX}the cluster has no nodes; list at least one Spark "
                        "(nodes in a .sparks.yml, hosts of the sparks group in a YAML inventory).")
        return
    _check_names(nodes, problems)
    _check_ranks(nodes, problems)
    _check_heads(nodes, problems)
    _check_management_addresses(nodes, management, problems)
    if cluster.fabric:
        _check_fabric_addresses(cluster, subnets, management, problems)


def _check_names(nodes: list[Node], problems: list[str]) -> None:
    counts: dict[str, int] = {}
    for index, node in enumerate(nodes):
        if not isinstance(node.name, str) or not node.name.strip():
            problems.append(f"{PREFIX}node {index + 1} has no name; give every Spark its inventory name.")
            continue
        _check_name_characters(node.name, problems)
        counts[node.name] = counts.get(node.name, 0) + 1
    for name, count in counts.items():
        if count > 1:
            problems.append(f"{PREFIX}node name {name} appears {count} times; give each Spark its own name.")


def _check_name_characters(name: str, problems: list[str]) -> None:
    """A node's name is a pattern of the peers' ssh config (Host NAME ADDRESS...): one word of plain characters."""
    if _NODE_NAME.match(name):
        return
    words = name.split()
    if len(words) > 1:
        why = f"has a space, so the nodes' ssh config would read it as {len(words)} names ({', '.join(words)})"
    elif any(char.isspace() for char in name):
        why = "has a space at its start or end, which the nodes' ssh config would drop"
    else:
        odd = sorted({char for char in name if not (char.isascii() and (char.isalnum() or char in "._-"))})
        why = (f"has {', '.join(repr(char) for char in odd)}, which the nodes' ssh config would not read as "
               "a plain name" if odd else f"starts with {name[0]!r}")
    fixed = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._") or "spark-a"
    problems.append(f"{PREFIX}node name {name!r} (name in a .sparks.yml, the host's name in a YAML inventory) {why}; "
                    "rename the node with letters, digits, '.', '-' and '_' only, starting with a letter or digit, "
                    f"for example {fixed}.")


def _numbering(count: int) -> str:
    """How to number ``count`` nodes."""
    return "give the node rank 0" if count == 1 else f"number the nodes 0..{count - 1} with the head at 0"


def _check_ranks(nodes: list[Node], problems: list[str]) -> None:
    holders: dict[int, list[str]] = {}
    for node in nodes:
        if not is_int(node.rank):
            problems.append(f"{PREFIX}{node.name}: rank (sparkserve_rank) {node.rank!r} is not a whole number; "
                            f"{_numbering(len(nodes))}.")
            continue
        holders.setdefault(node.rank, []).append(node.name)
    for rank, names in sorted(holders.items()):
        if len(names) > 1:
            problems.append(f"{PREFIX}rank {rank} is held by {' and '.join(names)}; give each node its own rank, "
                            f"0..{len(nodes) - 1}.")
    ranks = sorted(holders)
    if all(is_int(node.rank) for node in nodes) and ranks != list(range(len(nodes))):
        shown = ", ".join(str(node.rank) for node in sorted(nodes, key=lambda n: n.rank))
        if len(nodes) == 1:
            problems.append(f"{PREFIX}rank (sparkserve_rank) is {shown} but 1 node needs rank 0; "
                            f"{_numbering(1)}.")
        else:
            problems.append(f"{PREFIX}ranks (sparkserve_rank) are {shown} but {counted(len(nodes), 'node')} need "
                            f"exactly 0..{len(nodes) - 1}; {_numbering(len(nodes))}.")


def _check_heads(nodes: list[Node], problems: list[str]) -> None:
    heads = [node for node in nodes if node.head]
    if not heads:
        problems.append(f"{PREFIX}no node is the head; mark exactly one ({_WHERE_HEAD}) and give it rank 0.")
    elif len(heads) > 1:
        problems.append(f"{PREFIX}{len(heads)} nodes are marked head ({', '.join(n.name for n in heads)}); "
                        f"mark exactly one ({_WHERE_HEAD}).")
    if len(heads) == 1 and is_int(heads[0].rank) and heads[0].rank != 0:
        head = heads[0]
        problems.append(f"{PREFIX}{head.name}: the head has rank {head.rank}; the head must be rank 0, "
                        "give it rank 0 and the workers 1 and up.")


def _check_management_addresses(nodes: list[Node], management: IPNetwork | None, problems: list[str]) -> None:
    holders: dict[str, list[str]] = {}
    for node in nodes:
        address = node.address
        where = f"{PREFIX}{node.name}: management address (ansible_host, address in a .sparks.yml)"
        if not isinstance(address, str) or not address.strip():
            problems.append(f"{where} is empty; set it to the address Ansible reaches the node on (enP7s7).")
            continue
        parsed = _parse_address(address)
        if parsed is None:
            if _looks_numeric(address) or not _is_host_name(address):
                problems.append(f"{where} {address!r} is not a valid IP address or host name; "
                                "write it like 192.168.1.21.")
                continue
        elif management is not None and parsed not in management:
            problems.append(f"{where} {address} is outside the management subnet {management}; "
                            "fix the address or the management subnet.")
        key = str(parsed) if parsed is not None else address.lower()
        holders.setdefault(key, []).append(node.name)
    for address, names in holders.items():
        if len(names) > 1:
            problems.append(f"{PREFIX}management address {address} is used by {' and '.join(names)}; "
                            "give each Spark its own management address.")


def _check_fabric_addresses(cluster: Cluster, subnets: list[IPNetwork | None], management: IPNetwork | None,
                            problems: list[str]) -> None:
    holders: dict[IPAddress, list[str]] = {}
    for node in cluster.nodes:
        twins, node_subnets = cluster.twins, subnets
        if node.twins is not None:  # a ring node's own twins, checked as the cluster's are
            twins = node.twins
            found: list[str] = []
            node_subnets = _check_twins(twins, management, found)
            problems += [problem.replace(PREFIX, f"{PREFIX}{node.name}: ", 1) for problem in found]
        ips = node.fabric_ips
        if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
            problems.append(f"{PREFIX}{node.name}: fabric addresses {ips!r} are not a list of addresses; "
                            f"give one per twin, in twin order ({_WHERE_FABRIC_IPS}).")
            continue
        if len(ips) != len(twins):
            problems.append(
                f"{PREFIX}{node.name}: has {len(ips)} fabric address{'es' if len(ips) != 1 else ''} "
                f"({', '.join(ips) or 'none'}) for {len(twins)} twin{'s' if len(twins) != 1 else ''}; "
                f"give exactly one per twin, in twin order ({_WHERE_FABRIC_IPS})."
            )
        management_ip = _parse_address(node.address)
        # A node with too few or too many addresses was reported above; check the ones that pair with a twin.
        for index, (twin, subnet, ip) in enumerate(zip(twins, node_subnets, ips, strict=False)):
            label = _twin_label(index, twin)
            if ip == "":
                if subnet is not None:  # a twin whose subnet is bad is reported once, for the subnet
                    problems.append(f"{PREFIX}{node.name}: {label} has no fabric address; "
                                    f"give it one in {subnet} ({_WHERE_FABRIC_IPS}).")
                continue
            parsed = _parse_address(ip)
            if parsed is None:
                example = f" in {subnet}" if subnet is not None else ""
                problems.append(f"{PREFIX}{node.name}: fabric address {ip!r} of {label} is not a valid IP address; "
                                f"give it an address{example}.")
                continue
            if subnet is not None and parsed not in subnet:
                problems.append(f"{PREFIX}{node.name}: fabric address {ip} of {label} is outside its subnet "
                                f"{subnet}; give it an address in that subnet.")
            if management is not None and parsed in management:
                problems.append(f"{PREFIX}{node.name}: fabric address {ip} of {label} is inside the management "
                                f"subnet {management}; the fabric must not share the management network, "
                                "give it an address in its twin's subnet.")
            if management_ip is not None and parsed == management_ip:
                problems.append(f"{PREFIX}{node.name}: management address (ansible_host) {node.address} is also "
                                f"the fabric address of {label}; set ansible_host to the node's management "
                                "address (enP7s7), not a fabric one.")
            holders.setdefault(parsed, []).append(f"{node.name} ({label})")
    for address, users in holders.items():
        if len(users) > 1:
            problems.append(f"{PREFIX}fabric address {address} is used by {' and '.join(users)}; "
                            "give every node and twin its own fabric address.")
