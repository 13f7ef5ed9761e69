#!/usr/bin/python
"""Wait, for a bounded time, until a node's MemAvailable is back above the recipe's floor."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: memory_gate
short_description: Wait, for a bounded time, until a node's memory is back before its rank starts
version_added: "0.1.0"
description:
  - Runs on each node after the deployment's old ranks are stopped and before any new rank starts. Reads
    C(MemAvailable) from O(meminfo_path) every O(interval_s) seconds until it is at least
    O(min_available_bytes), for at most O(wait_s) seconds.
  - On a DGX Spark the CPU and the GPU share the memory; a rank that stopped normally gives its memory
    back within seconds. Memory that is still missing after O(wait_s) seconds is held by something the
    stop did not reach (a leaked GPU context, a wedged driver), and loading a new rank on top of it can run
    the node out of memory and freeze it. The module then fails with the node, the figure, the floor and
    the time waited, and asks for a reboot of that node.
  - Changes nothing (RV(changed) is always false).
  - In check mode it reads once and never waits; memory below the floor is a warning there, not a failure,
    so C(--check) against a node that is serving (its rank holds the memory) passes. A meminfo that cannot
    be read fails in check mode too.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  min_available_bytes:
    description: The floor; MemAvailable must reach it (the recipe's C(memory.min_available_gib) in bytes).
    type: int
    required: true
  wait_s:
    description: How long to wait for memory to come back, in seconds; C(0) reads once.
    type: int
    default: 120
  interval_s:
    description: Seconds between two reads.
    type: float
    default: 1
  meminfo_path:
    description: The meminfo file to read (the lab gives a file instead of C(/proc/meminfo)).
    type: path
    default: /proc/meminfo
  node:
    description: The node's name in messages; by default the host name.
    type: str
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Wait until memory is back before the new rank starts
  sparkserve.deploy.memory_gate:
    min_available_bytes: "{{ (recipe_config.memory.min_available_gib * 1073741824) | int }}"
    wait_s: 120
    node: "{{ inventory_hostname }}"
"""

RETURN = r"""
mem_available_bytes:
  description: MemAvailable at the last read, in bytes.
  returned: success, and failure once meminfo was read
  type: int
  sample: 118111600640
min_available_bytes:
  description: The floor it was compared with.
  returned: success, and failure once meminfo was read
  type: int
waited_s:
  description: Seconds from the first read to the last, to one decimal; 0 when memory was there at once.
  returned: success, and failure once meminfo was read
  type: float
  sample: 3.0
reads:
  description: How many times meminfo was read.
  returned: success, and failure once meminfo was read
  type: int
passed:
  description: Whether MemAvailable reached the floor; false only in check mode (a warning) or on failure.
  returned: success, and failure once meminfo was read
  type: bool
"""

import math
import socket
import time
from typing import Any, Callable, Dict

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.meminfo import read_mem_available

GIB = 1024**3
Clock = Callable[[], float]
Sleep = Callable[[float], None]


class GateError(Exception):
    """A problem that ends the gate at once (bad options, meminfo unreadable); the message says it all."""


def gib(value: int) -> str:
    """Bytes in GiB with one decimal, rounded down, so a figure just under the floor never prints as the floor."""
    return f"{math.floor(value / GIB * 10) / 10:.1f} GiB"


def below_floor_message(node: str, available: int, floor: int, waited_s: float) -> str:
    return (
        f"{node}: MemAvailable {gib(available)} after {waited_s:.0f} s, below the recipe's {gib(floor)} "
        f"(memory.min_available_gib); memory did not come back after the ranks stopped: reboot {node}, "
        "then run again"
    )


def check_mode_message(node: str, available: int, floor: int, wait_s: int) -> str:
    return (
        f"{node}: MemAvailable {gib(available)}, below the recipe's {gib(floor)} (memory.min_available_gib); "
        f"check mode reads once and does not wait: a real run waits up to {wait_s} s for memory to come back "
        f"once the ranks are stopped, then fails"
    )


def read_available(node: str, path: str) -> int:
    try:
        return read_mem_available(path)
    except OSError as err:
        raise GateError(f"{node}: cannot read {path}: {err.strerror or err}") from err
    except ValueError as err:
        raise GateError(f"{node}: {path}: {err}; the gate needs the kernel's MemAvailable") from err


def check_options(params: Dict[str, Any]) -> None:
    if params["min_available_bytes"] < 0:
        raise GateError(f"min_available_bytes is {params['min_available_bytes']}; give 0 or more bytes")
    if params["wait_s"] < 0:
        raise GateError(f"wait_s is {params['wait_s']}; give 0 or more seconds")
    if not params["interval_s"] > 0:
        raise GateError(f"interval_s is {params['interval_s']}; give a number of seconds above 0")


def wait_for_memory(params: Dict[str, Any], check_mode: bool = False,
                    clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> Dict[str, Any]:
    """Read MemAvailable until it reaches the floor or wait_s has passed (one read in check mode).

    Returns the result: passed, mem_available_bytes, min_available_bytes, waited_s, reads, and msg when
    the floor was not reached. Raises GateError for bad options or an unreadable meminfo.
    """
    check_options(params)
    node = params["node"] or socket.gethostname()
    floor = params["min_available_bytes"]
    wait_s = params["wait_s"]
    started = clock()
    reads = 0
    while True:
        available = read_available(node, params["meminfo_path"])
        reads += 1
        waited_s = clock() - started
        result: Dict[str, Any] = {
            "passed": available >= floor,
            "mem_available_bytes": available,
            "min_available_bytes": floor,
            "waited_s": round(waited_s, 1),
            "reads": reads,
        }
        if available >= floor:
            return result
        if check_mode:
            result["msg"] = check_mode_message(node, available, floor, wait_s)
            return result
        if waited_s >= wait_s:
            result["msg"] = below_floor_message(node, available, floor, waited_s)
            return result
        sleep(min(params["interval_s"], wait_s - waited_s))


def main(clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> None:
    module = AnsibleModule(
        argument_spec={
            "min_available_bytes": {"type": "int", "required": True},
            "wait_s": {"type": "int", "default": 120},
            "interval_s": {"type": "float", "default": 1.0},
            "meminfo_path": {"type": "path", "default": "/proc/meminfo"},
            "node": {"type": "str"},
        },
        supports_check_mode=True,
    )
    try:
        result = wait_for_memory(module.params, module.check_mode, clock, sleep)
    except GateError as err:
        module.fail_json(msg=str(err), changed=False)
    if result["passed"]:
        module.exit_json(changed=False, **result)
    if module.check_mode:
        module.warn(result.pop("msg"))
        module.exit_json(changed=False, **result)
    module.fail_json(changed=False, **result)


if __name__ == "__main__":
    main()
