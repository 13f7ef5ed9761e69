"""Vars plugin: refuse an inventory sparkserve cannot use, once it is read and before any play."""

from __future__ import annotations

DOCUMENTATION = r"""
name: inventory_guard
short_description: Refuses an inventory sparkserve cannot use, before any play starts
version_added: "0.1.0"
author:
  - sparkserve
description:
  - Adds no variables. Ansible runs the vars plugins of the C(inventory) stage once every inventory source is read,
    before any play starts and whatever the playbook; this one stops the run there, with one error that is the last
    thing on the screen, in two cases.
  - A cluster file the C(sparkserve.deploy.spark_cluster) inventory plugin refused. Where this guard is enabled and
    C(any_unparsed_is_failed) is set, the plugin leaves its report to the guard instead of failing the source, so
    that the report is not one warning among the other inventory plugins' followed by
    "Completely failed to parse inventory source".
  - An inventory meant for sparkserve (it has a C(sparks) group, sets a C(sparkserve_*) variable, or is given to one
    of sparkserve's own playbooks, site.yml and playbooks/*.yml but the lab's) with no host in the C(sparks) group.
    Every sparkserve play runs on that group, so such a run would skip every play and succeed having done nothing.
    The message names the inventory, where its hosts are, and the fix. An inventory whose every deployment is marked
    C(state=absent) (its hosts in the C(absent) group) is let through to site.yml, which stops them, and refused for
    the other playbooks, saying so.
  - Any other inventory (the lab playbook's, a scenario's own) is left alone.
  - Enabled in ansible.cfg
    (C(vars_plugins_enabled = ansible.builtin.host_group_vars, sparkserve.deploy.inventory_guard)).
options:
  stage:
    description: When the guard runs; only once the inventory is read.
    type: str
    choices: [inventory]
    default: inventory
"""

import os
from typing import Any

from ansible import context
from ansible.errors import AnsibleError
from ansible.inventory.group import Group
from ansible.plugins.vars import BaseVarsPlugin

from ansible_collections.sparkserve.deploy.plugins.plugin_utils.inventory_refusal import (
    ABSENT,
    SPARKS,
    left,
    no_spark,
)

_PREFIX = "sparkserve_"
# The checkout this plugin belongs to (plugins/vars/inventory_guard.py, through the collection's link).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
# sparkserve's playbooks that run on the controller alone.
_CONTROLLER_PLAYBOOKS = ("lab.yml", "lab-destroy.yml")
# The one that stops the deployments marked absent, which is all there is to do when every deployment is.
_STOPPING_PLAYBOOK = "site.yml"


class VarsModule(BaseVarsPlugin):
    """Raises, for the group all, what makes the inventory unusable; gives no variables."""

    def get_vars(self, loader: Any, path: str, entities: Any) -> dict:
        for entity in entities if isinstance(entities, list) else [entities]:
            if isinstance(entity, Group) and entity.name == "all":
                _refuse(entity, path)
        return {}


def _refuse(everything: Group, path: str) -> None:
    reports = left(everything.vars)
    if reports:
        raise AnsibleError("\n".join(reports))
    groups = [everything, *everything.get_descendants()]
    sparks = next((group for group in groups if group.name == SPARKS), None)
    if sparks is not None and sparks.get_hosts():
        return
    absent = next((group for group in groups if group.name == ABSENT), None)
    if absent is not None and absent.get_hosts() and _runs_playbook(_STOPPING_PLAYBOOK):
        return  # site.yml stops every deployment: each is marked absent
    hosts = everything.get_hosts()
    meant = sparks is not None or _runs_sparkserve_playbook() or any(
        name.startswith(_PREFIX) for holder in [*groups, *hosts] for name in holder.vars)
    if not meant:
        return
    sources = [str(source) for source in context.CLIARGS.get("inventory") or [path]]
    placement = {host.name: [group.name for group in host.get_groups() if group.name not in ("all", "ungrouped")]
                 for host in hosts}
    raise AnsibleError(no_spark(sources, sparks is not None, placement))


def _runs_playbook(path: str) -> bool:
    """Whether ansible-playbook was given this playbook (its path from the checkout's root)."""
    return any(os.path.realpath(str(given)) == os.path.join(_ROOT, path) for given in context.CLIARGS.get("args") or ())


def _runs_sparkserve_playbook() -> bool:
    """Whether ansible-playbook was given one of sparkserve's playbooks that run on the sparks group."""
    if any(context.CLIARGS.get(mode) for mode in ("syntax", "listtasks", "listtags", "listhosts")):
        return False  # it only reads the playbook
    playbooks = os.path.join(_ROOT, "playbooks")
    for given in context.CLIARGS.get("args") or ():
        path = os.path.realpath(str(given))
        folder, name = os.path.split(path)
        if path == os.path.join(_ROOT, "site.yml") or (folder == playbooks and name not in _CONTROLLER_PLAYBOOKS):
            return True
    return False
