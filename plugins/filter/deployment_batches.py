"""A play's batches, one per deployment, for the ``serial`` of the plays that act on one deployment at a time."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.deployments import GROUP_PREFIX

DOCUMENTATION = r"""
name: deployment_batches
short_description: The batch sizes that make each batch of a play one deployment's hosts
version_added: "0.4.0"
description:
  - A play over C(sparks) whose tasks run once per deployment (C(run_once), a lock, a launch in rank order) sets
    C(serial) to this list, so that each batch is exactly one deployment's hosts and C(run_once) runs once for
    each deployment.
  - The play's hosts (C(ansible_play_hosts_all), which follows C(--limit)) are taken in order; each run of
    consecutive hosts of the same C(deployment_*) group is one batch. A host in no such group (a plain YAML
    inventory of one deployment) joins the run it follows.
  - The spark_cluster inventory plugin adds each deployment's hosts together, so a deployment is one run.
options:
  _input:
    description: The inventory's groups and their hosts (the magic variable C(groups)).
    type: dict
    required: true
  hosts:
    description: The play's hosts, in order (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  apart:
    description:
      - Whether the deployments go one batch each. With C(false) every host is one batch, for a play whose
        per-deployment work has nothing to do this run (the launch play when no rank has to start).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Act on one deployment at a time
  hosts: sparks
  serial: "{{ groups | sparkserve.deploy.deployment_batches(ansible_play_hosts_all) }}"
  tasks: []

- name: Act on every deployment at once when no host has a rank to start
  hosts: sparks
  serial: >-
    {{ groups | sparkserve.deploy.deployment_batches(ansible_play_hosts_all,
       apart=ansible_play_hosts_all | map('extract', hostvars | default({}))
             | map(attribute='engine_relaunch', default=true) | select | list | length > 0) }}
  tasks: []
"""

RETURN = r"""
_value:
  description: The batch sizes, in order; one batch of every host when there is at most one deployment or not apart.
  type: list
  elements: int
"""


def deployment_batches(groups: Mapping[str, Sequence[str]], hosts: Sequence[str], apart: bool = True) -> list[int]:
    """The sizes of the runs of consecutive HOSTS that belong to the same deployment group (one run if not APART)."""
    if not apart:
        return [max(len(hosts), 1)]
    deployment_of: dict[str, str] = {}
    for group, members in groups.items():
        if group.startswith(GROUP_PREFIX):
            for host in members:
                deployment_of.setdefault(host, group)
    sizes: list[int] = []
    previous: str | None = None
    for host in hosts:
        current = deployment_of.get(host, previous)
        if sizes and current == previous:
            sizes[-1] += 1
        else:
            sizes.append(1)
        previous = current
    return sizes or [1]


class FilterModule:
    """sparkserve.deploy.deployment_batches."""

    def filters(self) -> dict[str, Any]:
        return {"deployment_batches": deployment_batches}
