"""sparkserve.deploy.nodes_lost on the controller: each node's rank is read from the inventory."""

from __future__ import annotations

from typing import Any, Dict

from ansible.plugins.action import ActionBase

from ansible_collections.sparkserve.deploy.plugins.modules.nodes_lost import ARGUMENT_SPEC, failure, lost_nodes


class ActionModule(ActionBase):
    """Fails with the nodes that stopped answering, their ranks, and one sentence for each."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: Dict[str, Any] | None = None) -> Dict[str, Any]:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        hostvars = (task_vars or {}).get("hostvars", {})
        ranks = {}
        for node in args["nodes"]:
            rank = hostvars[node].get("sparkserve_rank") if node in hostvars else None
            ranks[node] = int(rank) if rank is not None else None
        result.update(failure(lost_nodes(args["nodes"], args["errors"], ranks)))
        return result
