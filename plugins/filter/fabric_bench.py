"""The links of the fabric bench: which twins are cabled to which, the table of their figures, their metrics."""

from __future__ import annotations

import ipaddress
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: fabric_bench_pairs
short_description: Every linked pair of twins between the nodes, for the link bench
version_added: "0.6.0"
description:
  - From the hosts' variables (C(sparkserve_fabric_interfaces), C(sparkserve_rdma_devices),
    C(sparkserve_fabric_subnets), C(sparkserve_fabric_ips), one entry per twin and in the same order on each
    host), every pair of twins that share a link. For nodes A before B in the order given, and each twin I of A,
    the twin J of B whose address lies in A's subnet I is linked to it; A runs the server, B the client.
  - Each host's lists are its own, so a ring (where a node's twins sit on the links to its two neighbours and
    a pair of nodes shares only the subnets of the link between them) is read as a switch is (where every node
    has a twin on each shared subnet).
  - A host without C(sparkserve_fabric_ips) (no fabric) has no link; a node with several inventory hosts (one per
    deployment, C(sparkserve_node)) counts once.
  - The same file has C(fabric_bench_table) (the lines of the run's table of figures) and C(fabric_bench_metrics)
    (the families of the C(sparkserve_fabric_link_*) series, for M(sparkserve.deploy.node_files) through
    C(sparkserve.deploy.prometheus_textfile)).
options:
  _input:
    description: The hosts, in play order (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  hostvars:
    description: The magic variable C(hostvars).
    type: dict
    required: true
"""

EXAMPLES = r"""
pairs: "{{ ansible_play_hosts_all | sparkserve.deploy.fabric_bench_pairs(hostvars) }}"
table: "{{ results | sparkserve.deploy.fabric_bench_table }}"
families: "{{ results | sparkserve.deploy.fabric_bench_metrics(now().timestamp()) }}"
"""

RETURN = r"""
_value:
  description:
    - One entry per linked pair of twins, C(server) (the node), C(server_host) (its inventory host),
      C(server_device), C(server_address), C(client), C(client_host), C(client_device), C(client_address) and
      C(subnet) (the server's subnet of the link).
  type: list
  elements: dict
"""

TWIN_VARS = ("sparkserve_fabric_interfaces", "sparkserve_rdma_devices", "sparkserve_fabric_subnets",
             "sparkserve_fabric_ips")
BANDWIDTH_METRIC = "sparkserve_fabric_link_bandwidth_gbps"
FLOOR_METRIC = "sparkserve_fabric_link_bandwidth_floor_gbps"
TIMESTAMP_METRIC = "sparkserve_fabric_link_bench_timestamp_seconds"


def _twins(host: str, variables: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """A host's twins, each with its device, address and subnet (a network)."""
    lists = [variables.get(name) for name in TWIN_VARS]
    shapes = {len(value) if isinstance(value, list) else None for value in lists}
    if None in shapes or len(shapes) != 1:
        said = ", ".join(f"{name}: {variables.get(name)!r}" for name in TWIN_VARS)
        raise AnsibleFilterError(f"fabric_bench_pairs: {host} needs one entry per twin in each of {said}")
    twins = []
    for interface, device, subnet, address in zip(*lists, strict=True):
        try:
            network = ipaddress.ip_network(str(subnet), strict=False)
            ip = ipaddress.ip_address(str(address))
        except ValueError as err:
            raise AnsibleFilterError(f"fabric_bench_pairs: {host}'s twin {interface}: {err}") from None
        twins.append({"interface": str(interface), "device": str(device), "network": network, "address": ip})
    return twins


def fabric_bench_pairs(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> List[Dict[str, str]]:
    """Every linked pair of twins, the earlier node of the order the server (see DOCUMENTATION)."""
    nodes: List[Dict[str, Any]] = []
    seen = set()
    for host in hosts:
        variables = hostvars.get(host) if hasattr(hostvars, "get") else None
        if variables is None or variables.get("sparkserve_fabric_ips") is None:
            continue
        node = str(variables.get("sparkserve_node") or host)
        if node in seen:
            continue
        seen.add(node)
        nodes.append({"node": node, "host": host, "twins": _twins(host, variables)})
    pairs = []
    for first, a in enumerate(nodes):
        for b in nodes[first + 1:]:
            for twin in a["twins"]:
                for other in b["twins"]:
                    if other["address"] in twin["network"] and other["address"] != twin["address"]:
                        pairs.append({
                            "server": a["node"], "server_host": a["host"], "server_device": twin["device"],
                            "server_address": str(twin["address"]), "client": b["node"], "client_host": b["host"],
                            "client_device": other["device"], "client_address": str(other["address"]),
                            "subnet": str(twin["network"]),
                        })
    return pairs


def _link(result: Mapping[str, Any]) -> str:
    return f"{result['client']}:{result['client_device']} -> {result['server']}:{result['server_device']}"


def _labels(result: Mapping[str, Any]) -> Dict[str, str]:
    """A link's labels: the writing side (the client) is the node, the side written to the peer."""
    return {"node": str(result["client"]), "device": str(result["client_device"]), "peer": str(result["server"]),
            "peer_device": str(result["server_device"])}


def _verdict(result: Mapping[str, Any]) -> str:
    if result.get("problem"):
        return "FAIL"
    return "ok" if result.get("ran", True) else "not run (check mode)"


def fabric_bench_table(results: Sequence[Mapping[str, Any]]) -> List[str]:
    """The lines of the table of a bench's links: each link, its average Gb/s, the floor and the verdict.

    A result is a pair (fabric_bench_pairs) with bandwidth_gbps (None when the run gave no figure), floor_gbps,
    problem (None when the link passed) and ran (false in check mode)."""
    rows = [(_link(r), "-" if r.get("bandwidth_gbps") is None else f"{float(r['bandwidth_gbps']):.2f}",
             f"{float(r['floor_gbps']):g}", _verdict(r)) for r in results]
    header = ("link (writer -> written)", "Gb/s", "floor", "")
    width = max([len(header[0])] + [len(row[0]) for row in rows])
    return [f"{row[0]:<{width}}  {row[1]:>8}  {row[2]:>6}  {row[3]}".rstrip() for row in [header, *rows]]


def fabric_bench_metrics(results: Sequence[Mapping[str, Any]], timestamp: Optional[float] = None
                         ) -> List[Dict[str, Any]]:
    """The metric families of a bench: each measured link's average bandwidth, every link's floor, and when."""
    families: List[Dict[str, Any]] = [
        {"name": BANDWIDTH_METRIC, "type": "gauge",
         "help": "The average RDMA write bandwidth of a fabric link (ib_write_bw, node's device to peer's), Gb/s.",
         "samples": [{"labels": _labels(r), "value": float(r["bandwidth_gbps"])} for r in results
                     if r.get("bandwidth_gbps") is not None]},
        {"name": FLOOR_METRIC, "type": "gauge",
         "help": "The bandwidth below which the fabric bench fails a link, Gb/s.",
         "samples": [{"labels": _labels(r), "value": float(r["floor_gbps"])} for r in results]},
    ]
    if timestamp is not None:
        families.append({"name": TIMESTAMP_METRIC, "type": "gauge",
                         "help": "When the fabric bench last ran (unix time).",
                         "samples": [{"labels": {}, "value": int(float(timestamp))}]})
    return families


class FilterModule:
    """sparkserve.deploy.fabric_bench_pairs, fabric_bench_table and fabric_bench_metrics."""

    def filters(self) -> Dict[str, Any]:
        return {"fabric_bench_pairs": fabric_bench_pairs, "fabric_bench_table": fabric_bench_table,
                "fabric_bench_metrics": fabric_bench_metrics}
