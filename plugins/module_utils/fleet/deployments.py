"""The deployments a cluster file lists: each a recipe, where it runs, its priority and its desired state.

``deployments:`` in a ``.sparks.yml`` is a list; ``recipe:`` is the shorthand for one deployment of that
recipe on every node, the head first. ``read_deployments`` checks the list's shape and returns what each
entry asks; placing them by memory is ``placement.place``'s, their ports ``ports.assign_ports``'s.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KEYS = ("name", "recipe", "nodes", "count", "priority", "state", "api_port", "master_port")
STATES = ("present", "absent")
# Each deployment's hosts are the group GROUP_PREFIX + its name (group_name).
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_PREFIX = "inventory: "
GROUP_PREFIX = "deployment_"
RECIPE_MISSING = ("recipe is missing; name the recipe the cluster serves (recipe: glm53-fp4local-mtp-tp2), or list "
                  "the deployments (deployments: [{recipe: ..., nodes: [spark-a]}]).")


@dataclass(frozen=True)
class Deployment:
    """One deployment as the cluster file asks it (``nodes`` None: placed automatically on ``count`` nodes)."""

    name: str
    recipe: str
    nodes: tuple[str, ...] | None
    count: int | None
    priority: int
    state: str
    api_port: int | None
    master_port: int | None


def group_name(deployment: str) -> str:
    """The inventory group of a deployment's hosts: ``deployment_`` and the name, with - and . as _."""
    return GROUP_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", deployment)


def host_name(deployment: str, node: str, single: bool) -> str:
    """The inventory name of one rank: the node's own name when the inventory has one deployment, else
    DEPLOYMENT@NODE (a node serving two deployments is two hosts of the inventory, one per rank)."""
    return node if single else f"{deployment}@{node}"


def _port(value: Any, where: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        problems.append(f"{_PREFIX}{where} is {value!r}; write a port number from 1 to 65535, or leave it out.")
        return None
    return value


def read_deployments(raw: Any, shorthand: str | None, node_names: Sequence[str],
                     head: str | None) -> tuple[list[Deployment], list[str]]:
    """The deployments of a cluster file and the problems of their shape, one sentence each.

    ``raw`` is the ``deployments`` value (None when absent), ``shorthand`` the ``recipe`` value, ``node_names``
    the nodes in file order and ``head`` the node marked ``head: true`` (the shorthand's rank 0).
    """
    problems: list[str] = []
    if raw is not None and shorthand is not None:
        problems.append(f"{_PREFIX}both recipe and deployments are set; recipe is the shorthand for one "
                        "deployment: keep deployments (with that recipe as one of them) or recipe alone.")
        return [], problems
    if raw is None:
        if shorthand is None:
            problems.append(_PREFIX + RECIPE_MISSING)
            return [], problems
        if not isinstance(shorthand, str) or not shorthand:
            problems.append(f"{_PREFIX}recipe is {shorthand!r}; name a recipe of recipes/ (recipe: lab-tp2).")
            return [], problems
        ordered = ([head] if head else []) + [name for name in node_names if name != head]
        return [Deployment(name=shorthand, recipe=shorthand, nodes=tuple(ordered), count=None, priority=0,
                           state="present", api_port=None, master_port=None)], problems
    if not isinstance(raw, list) or not raw:
        problems.append(f"{_PREFIX}deployments is {raw!r}; list the deployments, each with a recipe "
                        "(deployments: [{recipe: lab-tp2}]).")
        return [], problems
    found: list[Deployment] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(raw):
        where = f"deployments[{index}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{_PREFIX}{where} is {entry!r}; write it as a mapping with recipe (and name, nodes "
                            "or count, priority, state).")
            continue
        for key in entry:
            if key not in KEYS:
                near = difflib.get_close_matches(str(key), KEYS, n=1, cutoff=0.7)
                fix = f"did you mean {near[0]!r}? " if near else ""
                problems.append(f"{_PREFIX}{where} has unknown key {key!r}; {fix}the keys are {', '.join(KEYS)}.")
        recipe = entry.get("recipe")
        if not isinstance(recipe, str) or not recipe:
            problems.append(f"{_PREFIX}{where} has no recipe; name a recipe of recipes/ (recipe: lab-tp2).")
            continue
        name = entry.get("name", recipe)
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append(f"{_PREFIX}{where}: name is {name!r}; use lower-case letters, digits, '.', '_' and "
                            "'-', starting with a letter or digit (it names containers, units and folders).")
            continue
        where = f"deployment {name}"
        if name in seen:
            problems.append(f"{_PREFIX}{where} is listed twice (deployments[{seen[name]}] and [{index}]); give "
                            "one of them its own name (name: ...) to run the same recipe twice.")
            continue
        seen[name] = index
        nodes_in = entry.get("nodes")
        count = entry.get("count")
        nodes: tuple[str, ...] | None = None
        if nodes_in is not None:
            if isinstance(nodes_in, str):
                nodes_in = [nodes_in]
            if not isinstance(nodes_in, list) or not nodes_in or not all(isinstance(n, str) for n in nodes_in):
                problems.append(f"{_PREFIX}{where}: nodes is {nodes_in!r}; list node names of the cluster file "
                                "(nodes: [spark-a]), the first is the deployment's head.")
            else:
                unknown = [n for n in nodes_in if n not in node_names]
                twice = sorted({n for n in nodes_in if nodes_in.count(n) > 1})
                if unknown:
                    problems.append(f"{_PREFIX}{where}: nodes names {', '.join(unknown)}, not a node of this "
                                    f"file; the nodes are {', '.join(node_names)}.")
                elif twice:
                    problems.append(f"{_PREFIX}{where}: nodes names {', '.join(twice)} twice; a deployment runs "
                                    "one rank per node.")
                else:
                    nodes = tuple(nodes_in)
            if count is not None and nodes is not None and count != len(nodes):
                problems.append(f"{_PREFIX}{where}: count is {count!r} but nodes lists {len(nodes)}; give one "
                                "of them.")
        elif count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            problems.append(f"{_PREFIX}{where}: count is {count!r}; write how many nodes it runs on (count: 2), "
                            "or list them (nodes: [...]).")
            count = None
        priority = entry.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            problems.append(f"{_PREFIX}{where}: priority is {priority!r}; write a whole number (the memory guard "
                            "acts on the lowest first).")
            priority = 0
        state = entry.get("state", "present")
        if state not in STATES:
            problems.append(f"{_PREFIX}{where}: state is {state!r}; write present or absent.")
            state = "present"
        found.append(Deployment(name=name, recipe=recipe, nodes=nodes, count=count, priority=priority, state=state,
                                api_port=_port(entry.get("api_port"), f"{where}: api_port", problems),
                                master_port=_port(entry.get("master_port"), f"{where}: master_port", problems)))
    groups: dict[str, str] = {}
    for deployment in found:
        group = group_name(deployment.name)
        if group in groups:
            problems.append(f"{_PREFIX}deployments {groups[group]} and {deployment.name} make the same inventory "
                            f"group {group}; rename one of them.")
        groups[group] = deployment.name
    return found, problems
