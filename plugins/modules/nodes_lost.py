"""Fail a step of the launch naming the nodes that stopped answering, with the failure's structure."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nodes_lost
short_description: Fails naming the nodes that stopped answering, each with its rank, as data and as a sentence
version_added: "0.3.0"
author:
  - sparkserve
description:
  - The launch's steps that reach every node fail with it when a node does not answer. The result carries the
    failure's structure (RV(kind) C(node_lost) and RV(lost), each node with its rank and error), which the
    launch's rescue reads to leave those nodes alone, and one sentence per node, the same wherever it is raised.
  - The rank of each node is read from the inventory (C(sparkserve_rank)); an action on the controller, it never
    contacts a host.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  nodes:
    description: The inventory names of the nodes that stopped answering.
    type: list
    elements: str
    required: true
  errors:
    description: What each node's step said (the same order as O(nodes)); C(unreachable) when missing.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Fail naming a node that stopped answering
  sparkserve.deploy.nodes_lost:
    nodes: "{{ __silent | map(attribute='item') | list }}"
    errors: "{{ __silent | map(attribute='msg', default='unreachable') | list }}"
  when: __silent | length > 0
"""

RETURN = r"""
kind:
  description: C(node_lost).
  type: str
  returned: always
lost:
  description: Each node that stopped answering, C(node), C(rank) and C(error).
  type: list
  elements: dict
  returned: always
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence

ARGUMENT_SPEC = {
    "nodes": {"type": "list", "elements": "str", "required": True},
    "errors": {"type": "list", "elements": "str", "default": []},
}
KIND = "node_lost"


def lost_nodes(nodes: Sequence[str], errors: Sequence[str], ranks: Mapping[str, Optional[int]]) -> List[Dict[str, Any]]:
    """Each node once, in the order given, with its rank and what its step said."""
    found: List[Dict[str, Any]] = []
    for index, node in enumerate(nodes):
        if any(entry["node"] == node for entry in found):
            continue
        error = (errors[index] if index < len(errors) else "") or "unreachable"
        found.append({"node": node, "rank": ranks.get(node), "error": " ".join(str(error).split())})
    return found


def failure(lost: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The failed result: the sentence, the kind and the nodes."""
    msg = "; ".join(f"{entry['node']} (rank {entry['rank']}) stopped answering during the launch: {entry['error']}"
                    for entry in lost)
    return {"failed": True, "changed": False, "kind": KIND, "lost": list(lost), "msg": msg}


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result = failure(lost_nodes(module.params["nodes"], module.params["errors"], {}))
    result.pop("failed")
    module.fail_json(**result)


if __name__ == "__main__":
    main()
