"""The node a host of the inventory runs on: itself, or the node of a deployment's rank."""

from __future__ import annotations

from typing import Any, Mapping

DOCUMENTATION = r"""
name: node_name
short_description: The name of the node an inventory host is on
version_added: "0.4.0"
description:
  - With several deployments, each rank is its own inventory host (C(DEPLOYMENT@NODE)) and C(sparkserve_node) names
    its node; ssh between the nodes (peer ssh, the readiness wait, the link checks) knows nodes, not ranks.
  - A host without C(sparkserve_node) (a plain YAML inventory of one deployment) is its own node.
options:
  _input:
    description: The inventory host.
    type: str
    required: true
  hostvars:
    description: The magic variable C(hostvars).
    type: dict
    required: true
"""

EXAMPLES = r"""
ssh_hosts: "{{ peers | map('sparkserve.deploy.node_name', hostvars) | list }}"
"""

RETURN = r"""
_value:
  description: The node's name.
  type: str
"""


def node_name(host: str, hostvars: Mapping[str, Any]) -> str:
    """HOST's node: its sparkserve_node, else HOST."""
    variables = hostvars.get(host) if hasattr(hostvars, "get") else None
    node = variables.get("sparkserve_node") if variables is not None else None
    return str(node) if node else host


class FilterModule:
    """sparkserve.deploy.node_name."""

    def filters(self) -> dict[str, Any]:
        return {"node_name": node_name}
