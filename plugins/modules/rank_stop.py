#!/usr/bin/python
"""Stop and remove a deployment's containers on this node, then wait until its rank's ports are free."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rank_stop
short_description: Stop and remove a deployment's containers on this node, then wait until its rank's ports are free
version_added: "0.6.0"
description:
  - Finds every container of this node, running or not, that carries the label O(label), stops them
    gracefully (C(docker stop) with O(stop_grace_s), that is SIGTERM, then SIGKILL once the grace is over) and
    removes them, then waits until no socket of this node's network namespace listens on any port of O(ports) (read
    from C(/proc/net/tcp) and C(tcp6), on any address), so that the next rank can bind them. One call does it
    all, where a launch took a round trip for each container and each port.
  - A node with none of the deployment's containers and its ports free is left as it is (C(changed) false).
  - Fails naming what docker could not remove, or the ports still listening after O(port_timeout_s) seconds
    (another program holds them).
  - Runs on the node's python3 with nothing but its standard library, and the C(docker) command.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    description: Lists the containers it would remove and the ports that listen; stops nothing.
options:
  label:
    description: The label that marks the deployment's containers, as C(KEY=VALUE).
    type: str
    required: true
  stop_grace_s:
    description: Seconds each container has to end after its SIGTERM before docker kills it.
    type: int
    default: 10
  ports:
    description: The rank's ports, which must be free before this module returns.
    type: list
    elements: int
    default: []
  port_timeout_s:
    description: How long to wait for the ports to be free.
    type: int
    default: 120
  docker:
    description: The docker command.
    type: str
    default: docker
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Stop lab-tp2's rank on this node and free its ports
  sparkserve.deploy.rank_stop:
    label: sparkserve.deployment=lab-tp2
    stop_grace_s: 30
    ports: [8000, 29500]
"""

RETURN = r"""
removed:
  description: The containers removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: ["lab-tp2-rank0"]
listening:
  description: The ports of O(ports) that still listened when the module gave up, or listen (check mode).
  returned: always
  type: list
  elements: int
  sample: []
"""

import time
from typing import Any, Callable, Dict, List, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.docker import NO_SUCH_CONTAINER
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.ports import listening
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import (
    Runner,
    one_line,
    run_command,
)

LIST_TIMEOUT_S = 60  # docker ps and docker rm on a busy daemon
POLL_S = 0.2  # between two readings of the ports


class StopError(Exception):
    """The module fails with this message, naming the containers it removed before it failed."""

    def __init__(self, message: str, removed: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.removed = list(removed)


def containers(docker: str, label: str, runner: Runner) -> List[str]:
    """The names of this node's containers, running or not, that carry label."""
    rc, out, err = runner([docker, "ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}"],
                          LIST_TIMEOUT_S)
    if rc != 0:
        raise StopError(f"cannot list the containers labelled {label}: {one_line(err or out, 300)}")
    return [name for name in out.split() if name]


def remove(docker: str, names: Sequence[str], grace_s: int, runner: Runner) -> None:
    """Stop names gracefully (docker's SIGTERM, then SIGKILL after grace_s), then remove them; a container
    already gone is not an error."""
    runner([docker, "stop", "--time", str(grace_s), *names], grace_s + LIST_TIMEOUT_S)
    rc, out, err = runner([docker, "rm", "--force", *names], LIST_TIMEOUT_S)
    failed = [line for line in err.splitlines() if line.strip() and not NO_SUCH_CONTAINER.search(line)]
    if rc != 0 and failed:
        raise StopError(f"docker could not remove {', '.join(names)}: {one_line(' '.join(failed) or out, 300)}")


def wait_free(ports: Sequence[int], timeout_s: float, is_listening: Callable[[int], bool] = listening,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> List[int]:
    """Wait until none of ports listens; the ones still listening when timeout_s ran out (empty: all free)."""
    deadline = clock() + timeout_s
    while True:
        busy = [port for port in ports if is_listening(port)]
        if not busy or clock() >= deadline:
            return busy
        sleep(POLL_S)


def stop(params: Dict[str, Any], check_mode: bool, runner: Runner = run_command,
         is_listening: Callable[[int], bool] = listening) -> Dict[str, Any]:
    """Stop the labelled containers and wait for the ports; the module's result (StopError: it fails)."""
    names = containers(params["docker"], params["label"], runner)
    if check_mode:
        return {"changed": bool(names), "removed": names,
                "listening": [port for port in params["ports"] if is_listening(port)]}
    if names:
        remove(params["docker"], names, params["stop_grace_s"], runner)
    busy = wait_free(params["ports"], params["port_timeout_s"], is_listening)
    if busy:
        raise StopError(f"port {', '.join(map(str, busy))} still listens {params['port_timeout_s']} s after "
                        f"the deployment's containers were removed ({', '.join(names) or 'there were none'}); "
                        "another program holds it: stop it, or give the deployment other ports", names)
    return {"changed": bool(names), "removed": names, "listening": []}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "label": {"type": "str", "required": True},
            "stop_grace_s": {"type": "int", "default": 10},
            "ports": {"type": "list", "elements": "int", "default": []},
            "port_timeout_s": {"type": "int", "default": 120},
            "docker": {"type": "str", "default": "docker"},
        },
        supports_check_mode=True,
    )
    try:
        result = stop(module.params, module.check_mode)
    except StopError as err:
        module.fail_json(msg=str(err), changed=bool(err.removed), removed=err.removed, listening=[])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
