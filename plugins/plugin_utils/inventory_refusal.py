"""An inventory sparkserve cannot use, refused once every inventory source is read.

Ansible tries each enabled inventory plugin on a source the first one fails
on, shows every failure as a warning and ends with "Completely failed to parse
inventory source": a cluster file's own message would be one warning among
the yaml and ini plugins' and not the last line. So where the guard runs (the
vars plugin ``sparkserve.deploy.inventory_guard`` is enabled and
``any_unparsed_is_failed`` is set, as ansible.cfg has them), the spark_cluster
plugin leaves its report in the inventory, as a variable of the group
``all``, and the guard raises it after the last source: the report is then the
one error shown. Elsewhere the plugin fails the source as usual.

The guard also refuses an inventory meant for sparkserve that has no Spark
(``no_spark``): every sparkserve play runs on the ``sparks`` group, and
without one the run would skip every play and succeed having done nothing.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ansible import constants

GUARD = "sparkserve.deploy.inventory_guard"
# A variable of the group all, set only on the way to the guard's error.
REFUSED = "__sparkserve_inventory_refused"
SPARKS = "sparks"
# The hosts of the deployments the inventory marks state: absent (site.yml stops them).
ABSENT = "absent"
EXAMPLES = ("put every Spark in the sparks group (all.children.sparks.hosts), the head also in its child group "
            "head and the others in workers, as inventory/example/hosts.yml does; or describe the cluster in a "
            "cluster file named NAME.sparks.yml (inventory/example/two-sparks.sparks.yml)")
_SHOWN = 6


def guard_speaks() -> bool:
    """Whether the guard will raise what the inventory plugin leaves to it."""
    config = constants.config
    enabled = config.get_config_value("VARIABLE_PLUGINS_ENABLED") or []
    return bool(config.get_config_value("INVENTORY_ANY_UNPARSED_IS_FAILED")) and GUARD in enabled


def leave(inventory: Any, report: str) -> None:
    """Leave a cluster file's report for the guard (see the module docstring)."""
    earlier = list(inventory.groups["all"].vars.get(REFUSED, []))
    inventory.set_variable("all", REFUSED, [*earlier, report])


def left(group_vars: Mapping[str, Any]) -> list[str]:
    """The reports left in the group all's variables."""
    return [str(report) for report in group_vars.get(REFUSED, [])]


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def no_spark(sources: Iterable[str], has_sparks: bool, placement: Mapping[str, Iterable[str]]) -> str:
    """The message for an inventory meant for sparkserve with no Spark in it.

    ``has_sparks``: the inventory has a sparks group (an empty one);
    ``placement``: each host of the inventory, with the groups it is in
    (other than all and ungrouped).
    """
    where = f"inventory {', '.join(sources) or '(none given)'}"
    hosts = sorted(placement)
    if hosts and all(ABSENT in placement[host] for host in hosts):
        return (f"{where}: every deployment it names is marked state: absent, so there is nothing here to serve "
                f"or ask. site.yml (sparkserve up) stops them; mark one present to serve it again.")
    what = "the sparks group has no hosts" if has_sparks else "there is no sparks group"
    groups = sorted({group for host in hosts for group in placement[host]} - {SPARKS})
    if not hosts:
        found = "; the inventory has no host at all"
    elif groups:
        found = f"; its hosts ({_names(hosts)}) are in {', '.join(groups)}, not in sparks"
    else:
        found = f"; its hosts ({_names(hosts)}) sit directly under all"
    close = difflib.get_close_matches(SPARKS, [group.lower() for group in groups], n=1, cutoff=0.6)
    typo = next((group for group in groups if close and group.lower() == close[0]), None)
    hint = f" (is the group {typo} meant to be sparks?)" if typo else ""
    return (f"{where}: {what}, so sparkserve has no Spark to run on and every play would be skipped{found}{hint}. "
            f"Fix: {EXAMPLES}.")
