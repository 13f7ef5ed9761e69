#!/usr/bin/python
"""Validate the cluster an inventory describes, whatever its format."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cluster_check
short_description: Validate the Spark cluster of an inventory (ranks, head, fabric addresses, MTU)
version_added: "0.1.0"
description:
  - Builds the cluster from the hosts' variables (as the spark_cluster inventory plugin writes them, or
    as a plain YAML inventory carries them) and applies the same topology rules to both.
  - Fails with one message per problem, each naming the host, the variable, the bad value and the fix.
  - Changes nothing. Runs on the controller, in the playbook's own process (its action plugin), once per play.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  hosts:
    description: Inventory names of the cluster's nodes (the C(sparks) group).
    type: list
    elements: str
    required: true
  head:
    description: Inventory names in the C(head) group.
    type: list
    elements: str
    required: true
  hostvars:
    description: The nodes' variables, by name (the C(sparkserve_*) variables and C(ansible_host)).
    type: dict
    required: true
  sources:
    description: The inventory's sources (C(ansible_inventory_sources)); every message names them.
    type: list
    elements: str
    default: []
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Validate the inventory's cluster
  sparkserve.deploy.cluster_check:
    hosts: "{{ sparkserve_deployment_hosts }}"
    head: "{{ groups['head'] | default([]) | intersect(sparkserve_deployment_hosts) }}"
    hostvars: "{{ dict(sparkserve_deployment_hosts | zip(sparkserve_deployment_hosts | map('extract', hostvars))) }}"
    sources: "{{ ansible_inventory_sources }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
cluster:
  description: The validated cluster, nodes in rank order.
  returned: success
  type: dict
  contains:
    nodes:
      description: Name, management address, rank, fabric addresses and head flag of each node.
      type: list
      elements: dict
    mtu:
      description: Fabric MTU.
      type: int
"""

from dataclasses import asdict
from typing import Any

from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster import validate_cluster
from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster_hostvars import cluster_from_hostvars
from ansible_collections.sparkserve.deploy.plugins.module_utils.controller_module import run_module

ARGUMENT_SPEC: dict[str, Any] = {
    "hosts": {"type": "list", "elements": "str", "required": True},
    "head": {"type": "list", "elements": "str", "required": True},
    "hostvars": {"type": "dict", "required": True},
    "sources": {"type": "list", "elements": "str", "default": []},
}
PREFIX = "inventory: "


def run(params: dict[str, Any]) -> dict[str, Any]:
    """The module's result for these arguments (``failed`` and ``msg`` when the cluster is refused).

    The action plugin of the same name calls it on the controller, in process.
    """
    sources = params.get("sources") or []
    try:
        cluster = cluster_from_hostvars(params["hosts"], params["hostvars"], params["head"])
    except ValueError as err:
        return {"failed": True, "msg": "\n".join(_named(str(err).splitlines(), sources)), "changed": False}
    problems = _named(validate_cluster(cluster), sources)
    if problems:
        return {"failed": True, "msg": "\n".join(problems), "problems": problems, "changed": False}
    result = asdict(cluster)
    result["nodes"] = sorted(result["nodes"], key=lambda node: node["rank"])
    return {"changed": False, "cluster": result}


def _named(problems: list[str], sources: list[str]) -> list[str]:
    """Each message with the inventory it is about: "inventory FILE: ..." instead of "inventory: ..."."""
    if not sources:
        return problems
    where = f"inventory {', '.join(sources)}: "
    return [where + problem[len(PREFIX):] if problem.startswith(PREFIX) else problem for problem in problems]


def main() -> None:
    run_module(ARGUMENT_SPEC, run)


if __name__ == "__main__":
    main()
