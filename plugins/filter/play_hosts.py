"""What the pipeline's plays read to choose their hosts: the gateway's node and the nodes it leaves, the
inventory's nodes (all of them, or those that serve), whether any rank must start, whether the inventory
monitors."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.sparkserve.deploy.plugins.filter.node_name import node_name

DOCUMENTATION = r"""
name: gateway_hosts
short_description: The hosts a play of the gateway runs on
version_added: "0.6.0"
description:
  - The context play's recipe role notes on every Spark the node the gateway runs on (C(recipe_gateway_node),
    empty when the inventory runs no gateway). A play of the gateway (its render check in the preflight, its
    install in the deploy pipeline) runs on that node alone, named once, as the inventory names the node, that
    is its host in the C(nodes) group where several deployments share the inventory (each rank a host named
    DEPLOYMENT@NODE, one host of each node in C(nodes)), else the Spark of that name.
  - Empty when no Spark noted one (no gateway, or the context play has not run), or the inventory holds no host
    of that node.
options:
  _input:
    description: The magic variable C(groups).
    type: dict
    required: true
  hostvars:
    description: The magic variable C(hostvars).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: The gateway in front of the deployments
  hosts: "{{ [] if hostvars is not defined else groups | sparkserve.deploy.gateway_hosts(hostvars) }}"
"""

RETURN = r"""
_value:
  description: The inventory host of the gateway's node, or nothing.
  type: list
  elements: str
"""


def relaunching(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any]) -> bool:
    """Whether a Spark's engine noted that its deployment's ranks must (re)start (engine_relaunch, the engine's
    prepare); a Spark that has not noted it counts as one that must (the launch play then runs and decides)."""
    return any(boolean(hostvars[host].get("engine_relaunch", True), strict=False) if host in hostvars else True
               for host in groups.get("sparks", []))


def monitoring(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any]) -> bool:
    """Whether a Spark's inventory asks for monitoring (sparkserve_monitoring): the monitoring plays run then."""
    return any(boolean(hostvars[host].get("sparkserve_monitoring", False), strict=False)
               for host in groups.get("sparks", []) if host in hostvars)


def _gateway_nodes(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any]) -> list[str]:
    """The node each Spark noted as the gateway's (recipe_gateway_node, empty with the gateway off), once each, in
    the order of the sparks group."""
    noted = (str(hostvars[host].get("recipe_gateway_node") or "")
             for host in groups.get("sparks", []) if host in hostvars)
    return [node for node in dict.fromkeys(noted) if node]


def gateway_hosts(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any]) -> list[str]:
    """The host of each node a Spark noted as the gateway's (recipe_gateway_node), once each, in the order of the
    sparks group: the node's host in the nodes group (a fleet's inventory), else the Spark named as the node."""
    host_of_node: dict[str, str] = {}
    for host in groups.get("nodes") or groups.get("sparks", []):
        host_of_node.setdefault(node_name(host, hostvars), host)
    return list(dict.fromkeys(host_of_node[node] for node in _gateway_nodes(groups, hostvars) if node in host_of_node))


def gateway_leaving_hosts(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any]) -> list[str]:
    """The host of each node that still has the gateway's units, as its preflight found them
    (preflight_node.present_paths), and is not the gateway's node (recipe_gateway_node, empty with the gateway
    off): the inventory moved the gateway or turned it off, and the gateway play takes it off there. In the order
    of the nodes group (else the sparks group); none when no preflight ran (a run under other tags)."""
    gateway_nodes = set(_gateway_nodes(groups, hostvars))
    found: list[str] = []
    for host in groups.get("nodes") or groups.get("sparks", []):
        report = (hostvars[host].get("preflight_node") if host in hostvars else None) or {}
        if report.get("present_paths") and node_name(host, hostvars) not in gateway_nodes:
            found.append(host)
    return found


def _host_of_node(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any]) -> dict[str, str]:
    """Each node the inventory reaches and its first host: in the nodes group (else the sparks group), then in the
    absent group (a node where every deployment is marked absent)."""
    host_of_node: dict[str, str] = {}
    for host in [*(groups.get("nodes") or groups.get("sparks", [])), *groups.get("absent", [])]:
        host_of_node.setdefault(node_name(host, hostvars), host)
    return host_of_node


def inventory_nodes(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any]) -> list[str]:
    """The names of the nodes the inventory reaches (as sparkserve_node names them), each once: those of the nodes
    group (else the sparks group), then those where every deployment is marked absent (the absent group)."""
    return list(_host_of_node(groups, hostvars))


def serving_nodes(groups: Mapping[str, Sequence[str]], hostvars: Mapping[str, Any]) -> list[str]:
    """The names of the nodes where a deployment is present (those of the nodes group, else the sparks group), each
    once: a gateway or an exporter runs only there, never on a node where every deployment is marked absent."""
    return list(dict.fromkeys(node_name(host, hostvars) for host in groups.get("nodes") or groups.get("sparks", [])))


class FilterModule:
    """sparkserve.deploy.gateway_hosts, gateway_leaving_hosts, inventory_nodes, serving_nodes, relaunching and
    monitoring (the doc above names the first)."""

    def filters(self) -> dict[str, Any]:
        return {"gateway_hosts": gateway_hosts, "gateway_leaving_hosts": gateway_leaving_hosts,
                "inventory_nodes": inventory_nodes, "serving_nodes": serving_nodes, "relaunching": relaunching,
                "monitoring": monitoring}
