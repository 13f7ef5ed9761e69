#!/usr/bin/python
"""Read, in every rank's log, which network NCCL chose between the nodes, and say what is wrong with it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rank_transport
short_description: Read which network NCCL uses in every rank's log (NET/IB over every twin, or TCP sockets)
version_added: "0.6.0"
description:
  - Reads each rank container's log (C(docker logs), on this node or on its peer over the ssh the access stage set
    up) for NCCL's own lines, which the launch asks for (C(NCCL_DEBUG=INFO), C(NCCL_DEBUG_SUBSYS=INIT,NET)).
    They give the network NCCL loaded, the devices it uses, the transport of every channel, and a failed RDMA memory
    registration (C(ibv_reg_mr)).
  - Each rank's RV(ranks) entry says its transport, the HCAs NCCL named, NCCL's own line and, when the rank does
    not use RDMA over every one of O(hcas), the problem with its likely cause and the fix. Sockets cost about half
    the decode speed while every health check stays green.
  - Reads only; RV(problems) lists each rank's problem, and the caller decides (the launch fails on them when the
    recipe's C(fabric.require_rdma) holds).
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  containers:
    description: The deployment's rank containers, each C(name), C(rank), C(host) (the peer as this node's ssh
      knows it; empty for this node) and C(node) (the node's name in messages; C(host), or this node's).
    type: list
    elements: dict
    required: true
  deployment:
    description: The deployment, the label of RV(metric)'s samples.
    type: str
    required: true
  hcas:
    description: The HCAs every rank should use (the twins' RoCE devices, as the node's C(NCCL_IB_HCA) names them).
    type: list
    elements: str
    default: []
  this_node:
    description: This node's name in messages.
    type: str
    default: ""
notes:
  - Standard library only; runs with the node's python3.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Read which network NCCL chose on every rank
  sparkserve.deploy.rank_transport:
    containers: [{name: lab-tp2-rank0, rank: 0, host: ""}, {name: lab-tp2-rank1, rank: 1, host: spark-2}]
    deployment: lab-tp2
    hcas: [rocep1s0f1, roceP2p1s0f1]
    this_node: spark-1
"""

RETURN = r"""
ranks:
  description: Each rank, C(rank), C(node), C(transport) (C(NET/IB), C(NET/Socket), or null when NCCL said none),
    C(hcas), C(line) (NCCL's own line) and C(problem) (null when it uses RDMA over every HCA).
  returned: always
  type: list
  elements: dict
metric:
  description: The family C(sparkserve_rank_transport_info) (C(name), C(help), C(samples)), one sample a rank, as the
    prometheus_textfile filter takes it; the supervisor writes the same after a heal.
  returned: always
  type: dict
problems:
  description: One sentence per rank with a problem, starting C(rank N on NODE).
  returned: always
  type: list
  elements: str
"""

from typing import Any, Dict, List, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import nccl_log
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import (
    remote_argv,
    run_command,
)

ARGUMENT_SPEC: Dict[str, Any] = {
    "containers": {"type": "list", "elements": "dict", "required": True},
    "deployment": {"type": "str", "required": True},
    "hcas": {"type": "list", "elements": "str", "default": []},
    "this_node": {"type": "str", "default": ""},
}
SSH_ARGV = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
LOG_TIMEOUT_S = 60


def read_rank(container: Dict[str, Any], hcas: Sequence[str], this_node: str, runner: Any = run_command
              ) -> Dict[str, Any]:
    """One rank's network, as NCCL wrote it in the rank's log."""
    host = str(container.get("host") or "")
    node = str(container.get("node") or host or this_node or "this node")
    rc, out, err = runner(remote_argv(SSH_ARGV, host, ["docker", "logs", str(container["name"])]), LOG_TIMEOUT_S)
    return {"rank": int(container["rank"]), "node": node, "container": container["name"],
            **nccl_log.rank_report(rc, out, err, hcas)}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    ranks: List[Dict[str, Any]] = [read_rank(c, p["hcas"], p["this_node"], run_command) for c in p["containers"]]
    problems = [f"rank {r['rank']} on {r['node']}: {r['problem']}" for r in ranks if r["problem"]]
    metric = {"name": nccl_log.TRANSPORT_METRIC, "help": nccl_log.TRANSPORT_HELP,
              "samples": [{"labels": labels, "value": value}
                          for labels, value in nccl_log.transport_samples(p["deployment"], ranks)]}
    module.exit_json(changed=False, ranks=ranks, problems=problems, metric=metric)


if __name__ == "__main__":
    main()
