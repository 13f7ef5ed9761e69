"""Where in a cluster file (*.sparks.yml) each of its problems is: the line a report names beside each message.

``field_lines`` reads the file's YAML nodes (PyYAML, on the controller) into
the line of each field, as ``fabric.mtu``, ``fabric.twins[1]``, ``nodes[0]``,
``nodes[0].adress``, and of each node by its name. ``locate`` finds, for one
problem's message (module_utils/cluster.py and the inventory plugin write
them), the line of the field it is about: the node it names, else the twin,
else the fabric or top-level field; None when it names none (a missing key).
"""

from __future__ import annotations

import re
from typing import Dict, Optional

import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.load import key_lines

NODE_BY_NAME = "node:"


def field_lines(text: str) -> Dict[str, int]:
    """Line (1-based) of every field of the cluster file TEXT, and ``node:NAME`` of each named node."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    lines: Dict[str, int] = {}
    key_lines(root, "", lines, [])
    nodes = root.value if isinstance(root, yaml.MappingNode) else []
    for key, value in nodes:
        if key.value == "nodes" and isinstance(value, yaml.SequenceNode):
            for entry in value.value:
                name = next((v.value for k, v in entry.value if k.value == "name" and isinstance(v, yaml.ScalarNode)),
                            None) if isinstance(entry, yaml.MappingNode) else None
                if name is not None:
                    lines.setdefault(NODE_BY_NAME + str(name), entry.start_mark.line + 1)
    return lines


_INDEXED = re.compile(r"\b((?:nodes|fabric\.twins)\[\d+\])(?: has unknown key '([^']+)')?")
_TWIN = re.compile(r"\btwins? (\d+)\b")
_UNKNOWN = re.compile(r"^(the top level|fabric|vars) has unknown key '([^']+)'")
_NAMED = re.compile(r"^(?:node name )?'?([^':\s]+)'?[: ]")
_TOPICS = (("fabric MTU", "fabric.mtu"), ("RDMA sysfs root", "fabric.rdma_sysfs_root"),
           ("management subnet", "management_subnet"), ("the fabric has no twins", "fabric"),
           ("the cluster has no nodes", "nodes"), ("vars", "vars"))


def locate(message: str, lines: Dict[str, int]) -> Optional[int]:
    """The line of the field MESSAGE (one problem, without its prefix) is about, or None."""
    indexed = _INDEXED.search(message)
    if indexed:
        key = f"{indexed.group(1)}.{indexed.group(2)}" if indexed.group(2) else indexed.group(1)
        return lines.get(key) or lines.get(indexed.group(1))
    unknown = _UNKNOWN.match(message)
    if unknown:
        where = {"the top level": "", "fabric": "fabric.", "vars": "vars."}[unknown.group(1)]
        return lines.get(where + unknown.group(2))
    quoted = re.match(r"^node name '([^']+)'", message)
    if quoted and NODE_BY_NAME + quoted.group(1) in lines:
        return lines[NODE_BY_NAME + quoted.group(1)]
    named = _NAMED.match(message)
    if named and NODE_BY_NAME + named.group(1) in lines:
        return lines[NODE_BY_NAME + named.group(1)]
    used_by = re.search(r"\bused by ([^\s,;]+)", message) or re.search(r"\(([^\s,;()]+)[,)]", message)
    if used_by and NODE_BY_NAME + used_by.group(1) in lines:
        return lines[NODE_BY_NAME + used_by.group(1)]
    twin = _TWIN.search(message)
    if twin:
        found = lines.get(f"fabric.twins[{int(twin.group(1)) - 1}]")
        if found:
            return found
    for topic, key in _TOPICS:
        if message.startswith(topic) and key in lines:
            return lines[key]
    return None
