"""A cluster file's fabric section (and the keys of any of its mappings), read into the cluster model.

The ``spark_cluster`` inventory plugin reads the rest of the file; these read
``fabric``: the twins of a switch or of two Sparks back to back
(``read_twins``), each node's addresses on them (``fabric_ips``), and a ring's
ports, cabling and link subnets, from which each node gets its own twins and
addresses (``lay_out_ring``). Each problem is added to the caller's list, as
the plugin reports them: all at once, each with its line.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster import PREFIX, Node, Twin
from ansible_collections.sparkserve.deploy.plugins.module_utils.fabric_links import (
    DEFAULT_LINK_PREFIX,
    SPARK_PORTS,
    cabling_problems,
    carve_subnets,
    ring_layout,
    ring_size_problem,
)

try:
    import netaddr
except ImportError:  # the inventory plugin reports it, where it matters
    netaddr = None

FABRIC_KEYS = ("mtu", "rdma_sysfs_root", "topology", "twins", "ports", "link_range", "link_prefix", "links")
RING_KEYS = ("ports", "link_range", "link_prefix", "links")
TWIN_KEYS = ("interface", "rdma_device", "subnet")
PORT_TWIN_KEYS = ("interface", "rdma_device")
LINK_KEYS = ("from", "to", "subnets")


def unknown_keys(data: Mapping, allowed: tuple[str, ...], where: str) -> list[str]:
    problems = []
    for key in data:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.7)
            fix = f"did you mean {near[0]!r}? " if near else ""
            problems.append(f"{PREFIX}{where} has unknown key {key!r}; {fix}the keys are {', '.join(allowed)}.")
    return problems


def read_twins(fabric: Mapping, problems: list[str]) -> list[Twin] | None:
    """The twins of the fabric, or None where their shape is broken (each reported)."""
    problems += unknown_keys(fabric, FABRIC_KEYS, "fabric")
    entries = fabric.get("twins")
    if entries is None:
        return []  # validate_cluster reports a fabric without twins
    if not isinstance(entries, list):
        problems.append(f"{PREFIX}fabric.twins is {entries!r}; list each twin with interface, rdma_device and subnet.")
        return None
    twins: list[Twin] | None = []
    for index, entry in enumerate(entries):
        where = f"fabric.twins[{index}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{PREFIX}{where} is {entry!r}; "
                            "write it as {interface: ..., rdma_device: ..., subnet: ...}.")
            twins = None
            continue
        problems += unknown_keys(entry, TWIN_KEYS, where)
        values = [entry.get(key, "") for key in TWIN_KEYS]  # validate_cluster reports empty and malformed ones
        if twins is not None:
            twins.append(Twin(interface=values[0], rdma_device=values[1], subnet=values[2]))
    return twins


def lay_out_ring(fabric: Mapping, nodes: list[Node], problems: list[str]) -> bool:
    """Give each node of a ring its twins and addresses from the ports, the cabling and the link subnets;
    False (with the problems) where the ring cannot be laid out."""
    before = len(problems)
    names = [node.name for node in nodes]
    size = ring_size_problem(len(names))
    if size is not None:
        problems.append(size)
        return False
    ports = _ports(fabric.get("ports"), problems)
    links = fabric.get("links")
    if links is None:
        entries: list[Mapping] = [{"from": name, "to": names[(index + 1) % len(names)]}
                                  for index, name in enumerate(names)]
    elif not isinstance(links, list) or not all(isinstance(entry, Mapping) for entry in links):
        problems.append(f"{PREFIX}fabric.links is {links!r}; list each link as {{from: NODE, to: NODE}}, port 0 of "
                        "from cabled to port 1 of to.")
        return False
    else:
        entries = links
        for index, entry in enumerate(entries):
            problems += unknown_keys(entry, LINK_KEYS, f"fabric.links[{index}]")
        if len(entries) != len(names):
            problems.append(f"{PREFIX}fabric.links lists {len(entries)} links for a ring of {len(names)}; list one "
                            "per cable, each Spark's port 0 to the next one's port 1.")
    if len(problems) > before or ports is None:
        return False
    cabling = [(str(entry.get("from")), str(entry.get("to"))) for entry in entries]
    problems += cabling_problems(names, cabling)
    subnets = _link_subnets(fabric, entries, len(ports[0]), problems)
    if len(problems) > before or subnets is None:
        return False
    layout = ring_layout(names, ports, cabling, subnets)
    for node in nodes:
        own = layout[node.name]
        node.twins = [Twin(interface=interface, rdma_device=device, subnet=subnet) for interface, device, subnet
                      in zip(own.interfaces, own.rdma_devices, own.subnets, strict=True)]
        node.fabric_ips = list(own.addresses)
    return True


def _ports(value: Any, problems: list[str]) -> list[list[tuple[str, str]]] | None:
    """A ring's two ports, each a list of (interface, RDMA device); a Spark's own when not given."""
    if value is None:
        return [list(port) for port in SPARK_PORTS]
    fix = ("list the two ports, each a list of its twins "
           "([[{interface: enp1s0f0np0, rdma_device: rocep1s0f0}, ...], [...]])")
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(port, list) and port for port in value):
        problems.append(f"{PREFIX}fabric.ports is {value!r}; {fix}.")
        return None
    if len(value[0]) != len(value[1]):
        problems.append(f"{PREFIX}fabric.ports lists {len(value[0])} twins on port 0 and {len(value[1])} on port 1; "
                        "a cable joins twin to twin, give both ports the same number.")
        return None
    ports: list[list[tuple[str, str]]] = []
    for port_index, port in enumerate(value):
        ports.append([])
        for twin_index, twin in enumerate(port):
            where = f"fabric.ports[{port_index}][{twin_index}]"
            if not isinstance(twin, Mapping):
                problems.append(f"{PREFIX}{where} is {twin!r}; write it as {{interface: ..., rdma_device: ...}}.")
                return None
            problems += unknown_keys(twin, PORT_TWIN_KEYS, where)
            ports[-1].append((twin.get("interface", ""), twin.get("rdma_device", "")))
    return ports


def _link_subnets(fabric: Mapping, entries: list[Mapping], twins: int, problems: list[str]) -> list[list[str]] | None:
    """Each link's subnets, one per twin: given in fabric.links, else carved from fabric.link_range."""
    given = [entry.get("subnets") for entry in entries]
    found: list[str] = []
    for index, value in enumerate(given):
        if value is not None and (not isinstance(value, list) or len(value) != twins):
            found.append(f"{PREFIX}fabric.links[{index}].subnets is {value!r}; give one subnet per twin ({twins}).")
    carved: list[list[str]] = []
    link_range = fabric.get("link_range")
    if any(value is None for value in given):
        prefix = fabric.get("link_prefix", DEFAULT_LINK_PREFIX)
        if link_range is None:
            found.append(f"{PREFIX}the ring has no fabric.link_range to carve its link subnets from; give one "
                         "(link_range: 10.77.0.0/24), or subnets on every entry of fabric.links.")
        else:
            try:
                carved = carve_subnets(str(link_range), len(entries), twins, int(prefix))
            except (TypeError, ValueError) as error:
                message = str(error)
                found.append(message if message.startswith(PREFIX) else
                             f"{PREFIX}fabric.link_range {link_range!r} with link_prefix {prefix!r}: {message}; give "
                             "a network such as 10.77.0.0/24 and a prefix length such as 30.")
    problems += found
    if found:
        return None
    return [[str(item) for item in value] if value is not None else carved[index] for index, value in enumerate(given)]


def fabric_ips(entry: Mapping, index: int, name: str, twins: list[Twin], problems: list[str]) -> list[str]:
    """The node's explicit fabric addresses, or its host number in every twin's subnet."""
    if "fabric_ips" in entry:
        explicit = entry["fabric_ips"]  # validate_cluster reports a malformed one
        return list(explicit) if isinstance(explicit, list) else explicit
    host_number = index + 1
    addresses = []
    for twin_index, twin in enumerate(twins):
        try:
            network = netaddr.IPNetwork(twin.subnet)
        except (netaddr.AddrFormatError, ValueError, TypeError):
            addresses.append("")  # the bad subnet is validate_cluster's to report
            continue
        if network.ip != network.network:
            addresses.append("")  # host bits set: reported by validate_cluster
            continue
        last = network.size - 1 if network.version == 6 or network.prefixlen >= 31 else network.size - 2
        if host_number > last:
            problems.append(f"{PREFIX}{name}: subnet {network} of twin {twin_index + 1} ({twin.interface}) has no "
                            f"host number {host_number} (the node's place in the file); use a larger subnet or "
                            "give the node explicit fabric_ips.")
            addresses.append("")
            continue
        addresses.append(str(network[host_number]))
    return addresses
