"""Why an inventory with no Spark cannot be used, for the context play's check."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible_collections.sparkserve.deploy.plugins.plugin_utils.inventory_refusal import ABSENT, SPARKS, no_spark

DOCUMENTATION = r"""
name: no_spark
short_description: Why an inventory with no host in the sparks group cannot be used
version_added: "0.3.0"
description:
  - The same sentence the C(sparkserve.deploy.inventory_guard) vars plugin raises, for an inventory the guard never
    sees (one given as a host list, C(-i a,b,)), saying what the inventory holds, where its hosts are, and the fix.
  - Empty when the sparks group has a host, or the absent group (deployments marked state absent, which site.yml
    stops).
options:
  _input:
    description: The inventory's sources (C(ansible_inventory_sources)).
    type: list
    elements: str
    required: true
  groups:
    description: The inventory's groups and their hosts (the magic variable C(groups)).
    type: dict
    required: true
"""

EXAMPLES = r"""
msg: "{{ ansible_inventory_sources | sparkserve.deploy.no_spark(groups) }}"
"""

RETURN = r"""
_value:
  description: The refusal, one sentence; empty when the inventory has a Spark.
  type: str
"""


def no_spark_message(sources: Sequence[str], groups: Mapping[str, Sequence[str]]) -> str:
    """The refusal for an inventory whose sparks group is missing or empty; '' when it has a Spark."""
    if groups.get(SPARKS) or groups.get(ABSENT):
        return ""  # with only absent deployments, the guard has let site.yml through to stop them
    placement: dict[str, list[str]] = {}
    for group, hosts in groups.items():
        for host in hosts:
            names = placement.setdefault(host, [])
            if group not in ("all", "ungrouped"):
                names.append(group)
    return no_spark(sources, SPARKS in groups, placement)


class FilterModule:
    """sparkserve.deploy.no_spark."""

    def filters(self) -> dict[str, Any]:
        return {"no_spark": no_spark_message}
