"""The relay plan of a weights fan-out: which node each node fetches from."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ansible_collections.sparkserve.deploy.plugins.module_utils.weights import plan_relay

DOCUMENTATION = r"""
name: weights_relay
short_description: Which node each node fetches the weights from
version_added: "0.1.0"
description:
  - With O(fanout=1), a chain (seeder, then each node in order, each fed by the one before); every node
    sends the model once, so with a relay pipelined file by file the whole fan-out takes about one transfer.
  - With a larger O(fanout), a tree of that many children per node, in node order.
  - The seeder's upstream is null.
positional: seeder, fanout
options:
  _input:
    description: Every node's name, in order.
    type: list
    elements: str
    required: true
  seeder:
    description: The node that downloaded the weights.
    type: str
    required: true
  fanout:
    description: Children per node (1 is a chain).
    type: int
    default: 1
"""

EXAMPLES = r"""
upstream: "{{ (groups['sparks'] | sparkserve.deploy.weights_relay('spark-1'))[inventory_hostname] }}"
"""

RETURN = r"""
_value:
  description: Node name to the name of the node it fetches from (null for the seeder).
  type: dict
"""


def weights_relay(nodes: Sequence[str], seeder: str, fanout: int = 1) -> dict[str, Optional[str]]:
    return plan_relay(list(nodes), seeder, int(fanout))


class FilterModule:
    """sparkserve weights filters."""

    def filters(self) -> dict[str, Any]:
        return {"weights_relay": weights_relay}
