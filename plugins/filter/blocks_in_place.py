"""Whether the blocks of lines a task would write are on the node already, from what the node read of them."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import block_in_place

DOCUMENTATION = r"""
name: blocks_in_place
short_description: Whether the blocks of lines a node_files call would write are on the node already
version_added: "0.6.0"
description:
  - True when every block of the input, as M(sparkserve.deploy.node_files) takes it in its
    O(sparkserve.deploy.node_files#module:blocks), is already in its file on the node with the mode it asks,
    so that the call would change nothing and need not be made; false when one differs, or its file is
    missing, unreadable or not read.
  - O(read) is what M(sparkserve.deploy.peer_key) returned for those files and markers
    (RV(sparkserve.deploy.peer_key#module:blocks)); the comparison is the node library's own, the one
    M(sparkserve.deploy.node_files) writes by, so the answer is exact.
options:
  _input:
    description: The blocks a node_files call would write (path, marker, content, and mode when it asks one).
    type: list
    elements: dict
    required: true
  read:
    description: What the node read of the same files and markers.
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
when: not (access_blocks | sparkserve.deploy.blocks_in_place(node_key.blocks))
"""

RETURN = r"""
_value:
  description: Whether every block is in place.
  type: bool
"""


def blocks_in_place(wanted: Sequence[Mapping[str, Any]], read: Sequence[Mapping[str, Any]]) -> bool:
    found = {(str(item.get("path")), str(item.get("marker"))): item for item in read}
    for block in wanted:
        state = found.get((str(block["path"]), str(block["marker"])))
        if state is None or not state.get("readable"):
            return False
        mode = block.get("mode")
        if mode and int(str(mode), 8) != int(str(state["mode"]), 8):
            return False
        if not block_in_place(state, str(block["marker"]), str(block["content"])):
            return False
    return True


class FilterModule:
    """Whether a node_files call's blocks are in place."""

    def filters(self) -> dict[str, Any]:
        return {"blocks_in_place": blocks_in_place}
