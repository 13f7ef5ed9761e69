"""The links of a Spark fabric: which interfaces of which nodes share a subnet.

Every topology comes down to the same host variables on each node: its fabric
interfaces, RDMA devices, subnets and addresses, in order. A link is a subnet
and the interfaces of every node on it: with a switch (or two Sparks back to
back) each twin's subnet joins every node; in a ring of three Sparks each node
cables its port 0 to the next node's port 1, each half of that cable (one twin
per end) is its own small subnet, and a node has an address per half.

From those variables this module reads the links, the addresses a node must
reach directly (``peer_addresses``), and the routes that make every node's
first address (its ``sparkserve_fabric_ip``, which the engines, ssh and the
weights use) reachable from nodes that do not share its subnet
(``peer_routes``). ``ring_layout`` computes a ring's variables from the node
order and the two ports; ``ring_problems`` states what makes a ring unusable.
Standard library only, so the same code runs on the controller and the nodes.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOPOLOGY_SWITCH = "switch"
TOPOLOGY_DIRECT = "direct"
TOPOLOGY_RING = "ring"
TOPOLOGIES = (TOPOLOGY_SWITCH, TOPOLOGY_DIRECT, TOPOLOGY_RING)
# Each Spark has two QSFP ports, one to each neighbour of a ring: every pair of three is cabled. Four or
# more leave pairs without a link (NCCL connects every pair of ranks), so they need a switch.
RING_NODES = 3
# A ring link's half: a /30 holds its two ends.
DEFAULT_LINK_PREFIX = 30
# A Spark's two QSFP ports (port 0 nearest the Ethernet jack), each two twins (interface, RoCE device), one
# per PCIe x4 half of the ConnectX-7.
SPARK_PORTS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("enp1s0f0np0", "rocep1s0f0"), ("enP2p1s0f0np0", "roceP2p1s0f0")),
    (("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")),
)
_PREFIX = "inventory: "


@dataclass(frozen=True)
class Endpoint:
    """One node's interface on a link."""

    node: str
    interface: str
    rdma_device: str
    address: str


@dataclass(frozen=True)
class Link:
    """A subnet and every node interface on it."""

    subnet: str
    ends: tuple[Endpoint, ...]

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(end.node for end in self.ends))


@dataclass
class NodeFabric:
    """One node's fabric interfaces, in order: the first address is the node's own (sparkserve_fabric_ip)."""

    name: str
    interfaces: list[str] = field(default_factory=list)
    rdma_devices: list[str] = field(default_factory=list)
    subnets: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)

    @property
    def primary(self) -> str | None:
        return self.addresses[0] if self.addresses else None


def _network(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return None


def _address(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None


def from_hostvars(names: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> list[NodeFabric]:
    """Each node's fabric from its host variables (nodes without fabric variables are left out)."""
    nodes = []
    for name in names:
        variables = hostvars.get(name) or {}
        addresses = variables.get("sparkserve_fabric_ips")
        if not addresses:
            continue
        nodes.append(NodeFabric(
            name=str(variables.get("sparkserve_node") or name),
            interfaces=[str(item) for item in variables.get("sparkserve_fabric_interfaces") or []],
            rdma_devices=[str(item) for item in variables.get("sparkserve_rdma_devices") or []],
            subnets=[str(item) for item in variables.get("sparkserve_fabric_subnets") or []],
            addresses=[str(item) for item in addresses],
        ))
    return list({node.name: node for node in nodes}.values())


def fabric_links(nodes: Sequence[NodeFabric]) -> list[Link]:
    """The links: every subnet with the interfaces on it, in the order the nodes first name them."""
    ends: dict[str, list[Endpoint]] = {}
    for node in nodes:
        for interface, device, subnet, address in zip(node.interfaces, node.rdma_devices, node.subnets,
                                                      node.addresses, strict=False):
            network = _network(subnet)
            key = str(network) if network is not None else str(subnet)
            ends.setdefault(key, []).append(Endpoint(node.name, interface, device, address))
    return [Link(subnet=subnet, ends=tuple(found)) for subnet, found in ends.items()]


def _find(nodes: Sequence[NodeFabric], name: str) -> NodeFabric:
    for node in nodes:
        if node.name == name:
            return node
    raise ValueError(f"fabric: no node {name!r} among {', '.join(node.name for node in nodes)}")


def _shared(me: NodeFabric, peer: NodeFabric) -> list[tuple[str, str]]:
    """(my interface, the peer's address) for each of my subnets the peer has an address in."""
    found = []
    for interface, subnet in zip(me.interfaces, me.subnets, strict=False):
        network = _network(subnet)
        for address in peer.addresses:
            parsed = _address(address)
            if network is not None and parsed is not None and parsed in network:
                found.append((interface, address))
    return found


def peer_addresses(nodes: Sequence[NodeFabric], name: str) -> list[str]:
    """What ``name`` must reach: every peer address on a subnet it shares, then each peer's own address."""
    me = _find(nodes, name)
    found: list[str] = []
    for peer in nodes:
        if peer.name != name:
            found += [address for _, address in _shared(me, peer)]
    found += [peer.primary for peer in nodes if peer.name != name and peer.primary]
    return list(dict.fromkeys(found))


def peer_routes(nodes: Sequence[NodeFabric], name: str) -> list[dict[str, str]]:
    """Routes from ``name`` to each peer's own address that is on none of its subnets: through the peer's
    address on the first link they share, out of this node's interface on it."""
    me = _find(nodes, name)
    routes = []
    for peer in nodes:
        if peer.name == name or not peer.primary:
            continue
        shared = _shared(me, peer)
        if not shared or peer.primary in [address for _, address in shared]:
            continue
        interface, via = shared[0]
        parsed = _address(peer.primary)
        host = f"{peer.primary}/{parsed.max_prefixlen if parsed is not None else 32}"
        routes.append({"to": host, "via": via, "interface": interface, "peer": peer.name})
    return routes


def link_table(nodes: Sequence[NodeFabric]) -> list[str]:
    """One line per link: its subnet and each end's node, interface, RDMA device and address."""
    return [f"{link.subnet}: " + " <-> ".join(f"{end.node} {end.interface} ({end.rdma_device}) {end.address}"
                                              for end in link.ends)
            for link in fabric_links(nodes)]


# --- link speeds ------------------------------------------------------------------

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


def rate_gbps(text: Any) -> float | None:
    """The speed of an RDMA port's rate file (``200 Gb/sec (4X HDR)``), or None."""
    found = _RATE.match(str(text)) if text is not None else None
    return float(found.group(1)) if found else None


def slower_twins(nodes: Sequence[NodeFabric], rates: Mapping[str, Mapping[str, Any]], name: str) -> list[str]:
    """The twins of ``name`` whose port links at a lower speed than the fastest twin of the fabric (each
    node's ``rates`` by RDMA device, as its sysfs rate file reads): a cable or transceiver that negotiated
    down halves what NCCL gets over that twin while every check of addresses and pings passes."""
    speeds = {(node.name, device): rate_gbps(rates.get(node.name, {}).get(device))
              for node in nodes for device in node.rdma_devices}
    known = {key: value for key, value in speeds.items() if value is not None}
    if not known:
        return []
    fastest = max(known.values())
    at_fastest = sorted(f"{node} {device}" for (node, device), value in known.items() if value == fastest)
    me = _find(nodes, name)
    problems = []
    for interface, device in zip(me.interfaces, me.rdma_devices, strict=False):
        value = known.get((name, device))
        if value is not None and value < fastest:
            problems.append(
                f"{name}: {device} ({interface}) links at {rates[name][device]}, under the {fastest:g} Gb/sec of "
                f"{', '.join(at_fastest[:2])}{' and others' if len(at_fastest) > 2 else ''}: its cable or "
                "transceiver negotiated a lower speed, so NCCL gets less over this twin while every ping passes; "
                "reseat or replace the cable (an approved QSFP cable brings both twins up at full speed)")
    return problems


# --- rings ------------------------------------------------------------------------


def ring_size_problem(count: int) -> str | None:
    """Why ``count`` Sparks cannot form a ring, or None."""
    if count == RING_NODES:
        return None
    if count == 2:
        return (f"{_PREFIX}a ring of two Sparks is two Sparks cabled back to back; write fabric.topology: direct "
                "and give the twins of the port you cabled (fabric.twins).")
    if count < 2:
        return f"{_PREFIX}a ring needs three Sparks, the file has {count}; a single Spark needs no fabric."
    return (f"{_PREFIX}a ring of {count} Sparks leaves pairs of them without a link (each Spark has two ports, "
            "one to each neighbour) while NCCL connects every pair of ranks; join four or more Sparks through a "
            "switch (fabric.topology: switch).")


def cabling_problems(names: Sequence[str], cabling: Sequence[tuple[str, str]]) -> list[str]:
    """What is wrong with a ring's cabling, each (port 0 of FROM, port 1 of TO) once."""
    problems = []
    known = set(names)
    for index, (start, end) in enumerate(cabling):
        where = f"{_PREFIX}fabric.links[{index}]"
        for value in (start, end):
            if value not in known:
                problems.append(f"{where} names {value!r}, not a node of the file; use a node's name "
                                f"({', '.join(names)}).")
        if start == end:
            problems.append(f"{where} cables {start} to itself; a link joins port 0 of one Spark to port 1 of "
                            "the next.")
    if problems:
        return problems
    for role, ends in (("port 0 (from)", [start for start, _ in cabling]),
                       ("port 1 (to)", [end for _, end in cabling])):
        for name in names:
            if ends.count(name) != 1:
                problems.append(f"{_PREFIX}fabric.links uses {name}'s {role} {ends.count(name)} times; in a ring "
                                "each Spark's port 0 and port 1 are each cabled once.")
    if not problems:
        following = dict(cabling)
        seen, current = [names[0]], following[names[0]]
        while current != names[0]:
            seen.append(current)
            current = following[current]
        if len(seen) != len(names):
            problems.append(f"{_PREFIX}fabric.links make more than one loop ({' -> '.join(seen)} is one); a ring "
                            "is one loop through every Spark.")
    return problems


def carve_subnets(link_range: str, links: int, halves: int, prefix: int) -> list[list[str]]:
    """``halves`` subnets of length ``prefix`` per link, in order from the start of ``link_range``."""
    network = ipaddress.ip_network(link_range, strict=True)
    if prefix <= network.prefixlen or prefix > network.max_prefixlen - 1:
        raise ValueError(f"{_PREFIX}fabric.link_prefix /{prefix} does not fit in fabric.link_range {network}; give "
                         f"a prefix longer than /{network.prefixlen} and at most /{network.max_prefixlen - 1}.")
    needed = links * halves
    pieces = network.subnets(new_prefix=prefix)
    subnets = []
    for _ in range(needed):
        piece = next(pieces, None)
        if piece is None:
            raise ValueError(f"{_PREFIX}fabric.link_range {network} holds fewer than the {needed} /{prefix} "
                             f"subnets the ring needs ({links} links of {halves} twins); give a larger range.")
        subnets.append(str(piece))
    return [subnets[index * halves:(index + 1) * halves] for index in range(links)]


def _link_ends(subnet: str) -> tuple[str, str]:
    """The addresses of a link half's two ends: its first two host addresses (both of a /31)."""
    network = _network(subnet)
    if network is None or network.num_addresses < 2:
        return "", ""
    if network.num_addresses == 2:
        return str(network[0]), str(network[1])
    return str(network[1]), str(network[2])


def ring_layout(names: Sequence[str], ports: Sequence[Sequence[tuple[str, str]]],
                cabling: Sequence[tuple[str, str]], subnets: Sequence[Sequence[str]]) -> dict[str, NodeFabric]:
    """Each node's fabric in a ring: link k cables port 0 of ``cabling[k][0]`` to port 1 of
    ``cabling[k][1]``, twin by twin, each twin's half on ``subnets[k][twin]`` with the first host address at
    port 0's end and the second at port 1's. A node lists its port 0 twins, then its port 1 twins; an address
    that cannot be computed (a bad subnet) is left empty for the checks to report."""
    nodes = {name: NodeFabric(name=name) for name in names}
    ends: dict[str, list[tuple[int, str, str, str, str]]] = {name: [] for name in names}
    for (start, end), halves in zip(cabling, subnets, strict=True):
        for twin, subnet in enumerate(halves):
            first, second = _link_ends(subnet)
            for port, name, address in ((0, start, first), (1, end, second)):
                if twin < len(ports[port]):
                    interface, device = ports[port][twin]
                    ends[name].append((port, interface, device, str(subnet), address))
    for name, found in ends.items():
        node = nodes[name]
        for _, interface, device, subnet, address in sorted(found, key=lambda item: item[0]):
            node.interfaces.append(interface)
            node.rdma_devices.append(device)
            node.subnets.append(subnet)
            node.addresses.append(address)
    return nodes


def ring_problems(nodes: Sequence[NodeFabric], part: bool = False) -> list[str]:
    """What makes these nodes' fabric not a ring: its size, a subnet on one node only or on one node twice
    (a link to itself), a subnet shared by more than two, overlapping link subnets, a node not linked to
    every other. With ``part``, the nodes are some of a ring's (one deployment's): neither the size nor a
    subnet whose other end is on a node left out is a problem, but every pair of them must be linked."""
    size = ring_size_problem(len(nodes))
    if size is not None and not (part and len(nodes) < RING_NODES):
        return [size]
    problems = []
    links = fabric_links(nodes)
    for link in links:
        names = [end.node for end in link.ends]
        twice = sorted({name for name in names if names.count(name) > 1})
        for name in twice:
            interfaces = [end.interface for end in link.ends if end.node == name]
            problems.append(f"{_PREFIX}{name}: {' and '.join(interfaces)} are both on {link.subnet}, a link to "
                            "itself; each link joins two Sparks, give each end's half its own subnet.")
        if twice:
            continue
        if len(names) == 1 and not part:
            end = link.ends[0]
            problems.append(f"{_PREFIX}{end.node}: {end.interface} is on {link.subnet}, which no other Spark is on; "
                            "a ring link's two ends share their subnet.")
        elif len(names) > 2:
            problems.append(f"{_PREFIX}{link.subnet} is shared by {', '.join(names)}; in a ring each link joins "
                            "two Sparks.")
    for index, first in enumerate(links):
        for second in links[index + 1:]:
            a, b = _network(first.subnet), _network(second.subnet)
            if a is not None and b is not None and a.overlaps(b):
                problems.append(f"{_PREFIX}link subnet {a} ({' - '.join(first.nodes)}) overlaps {b} "
                                f"({' - '.join(second.nodes)}); give each link its own subnets.")
    if problems:
        return problems
    for node in nodes:
        peers = sorted({name for link in links if node.name in link.nodes for name in link.nodes} - {node.name})
        missing = [other.name for other in nodes if other.name != node.name and other.name not in peers]
        if missing:
            problems.append(f"{_PREFIX}{node.name} has no link to {' or '.join(missing)}; in a ring of three each "
                            "Spark's port 0 is cabled to the next one's port 1, so every pair is linked.")
    return problems
