#!/usr/bin/python3
"""Check a node's links to its peers in one pass: full-MTU pings and ssh."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: peer_links
short_description: Ping every peer address at full MTU with don't-fragment set, and reach every peer over ssh
version_added: "0.1.0"
description:
  - Runs every probe at once (one thread each), so the time does not grow with the number of peers.
  - A ping sends one packet of O(mtu) bytes with the don't-fragment bit set; ssh runs C(true) in batch mode.
  - Changes nothing; runs the same in check mode. Fails naming every peer that did not answer.
options:
  addresses:
    description: Peer fabric addresses to ping.
    type: list
    elements: str
    default: []
  mtu:
    description: The fabric MTU; the ping payload is this minus the 28 bytes of IPv4 and ICMP headers.
    type: int
    required: true
  ssh_hosts:
    description: Peers to reach over ssh (names the ssh client resolves, as ~/.ssh/config sets them).
    type: list
    elements: str
    default: []
  timeout_s:
    description: Seconds each probe may take.
    type: int
    default: 5
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Check the links to every peer
  sparkserve.deploy.peer_links:
    addresses: [10.77.1.12, 10.77.2.12]
    mtu: 9000
    ssh_hosts: [spark-2]
"""

RETURN = r"""
unanswered_pings:
  description: Addresses that did not answer a full-MTU ping with don't-fragment set.
  returned: always
  type: list
  elements: str
unanswered_ssh:
  description: Peers that did not answer over ssh.
  returned: always
  type: list
  elements: str
"""

import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from ansible.module_utils.basic import AnsibleModule

Runner = Callable[[Sequence[str], int], int]
HEADERS = 28  # IPv4 (20) and ICMP (8)


def run(argv: Sequence[str], timeout_s: int) -> int:
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout_s + 2, check=False).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 1


def ping_argv(address: str, mtu: int, timeout_s: int) -> list[str]:
    return ["ping", "-c", "1", "-W", str(timeout_s), "-M", "do", "-s", str(mtu - HEADERS), address]


def ssh_argv(host: str, timeout_s: int) -> list[str]:
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout_s}", host, "true"]


def check(addresses: Sequence[str], mtu: int, ssh_hosts: Sequence[str], timeout_s: int,
          runner: Runner = run) -> dict[str, list[str]]:
    """Run every probe at once; return who did not answer, in the order given."""
    probes = [("ping", a, ping_argv(a, mtu, timeout_s)) for a in addresses]
    probes += [("ssh", h, ssh_argv(h, timeout_s)) for h in ssh_hosts]
    with ThreadPoolExecutor(max_workers=max(1, len(probes))) as pool:
        codes = list(pool.map(lambda probe: runner(probe[2], timeout_s), probes))
    failed = [(kind, target) for (kind, target, _), rc in zip(probes, codes, strict=True) if rc != 0]
    return {
        "unanswered_pings": [target for kind, target in failed if kind == "ping"],
        "unanswered_ssh": [target for kind, target in failed if kind == "ssh"],
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "addresses": {"type": "list", "elements": "str", "default": []},
            "mtu": {"type": "int", "required": True},
            "ssh_hosts": {"type": "list", "elements": "str", "default": []},
            "timeout_s": {"type": "int", "default": 5},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not 1280 <= params["mtu"] <= 9216:
        module.fail_json(msg=f"mtu {params['mtu']} is outside 1280..9216")
    result = check(params["addresses"], params["mtu"], params["ssh_hosts"], params["timeout_s"], run)
    problems = []
    if result["unanswered_pings"]:
        problems.append(
            f"no answer at MTU {params['mtu']} with don't-fragment set from {', '.join(result['unanswered_pings'])}; "
            "a link or a peer has a smaller MTU, or the twin's subnet does not reach it"
        )
    if result["unanswered_ssh"]:
        problems.append(f"no ssh to {', '.join(result['unanswered_ssh'])}; run site.yml --tags access")
    if problems:
        module.fail_json(msg="; ".join(problems), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
