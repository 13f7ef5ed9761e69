#!/usr/bin/python
"""Check a node's links to its peers in one pass: full-MTU pings and ssh."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: peer_links
short_description: Check this node's twins, then ping every peer at full MTU with don't-fragment set and ssh to it
version_added: "0.1.0"
description:
  - First checks this node's own twins (O(links)) with C(ip -j addr show) - each interface exists, holds its
    fabric address and has the fabric MTU - and fails naming every twin that does not, before any probe.
  - Runs every probe at once (one thread each), so the time does not grow with the number of peers.
  - A ping sends one packet of O(mtu) bytes with the don't-fragment bit set; ssh runs C(true) in batch mode.
  - Changes nothing; runs the same in check mode. Fails naming every peer that did not answer.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  links:
    description: This node's twins, each C(interface) with the fabric C(address) it must hold.
    type: list
    elements: dict
    default: []
    suboptions:
      interface:
        description: The interface name.
        type: str
        required: true
      address:
        description: The fabric address it must hold.
        type: str
        required: true
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
    links:
      - {interface: enp1s0f1np1, address: 10.77.1.11}
      - {interface: enP2p1s0f1np1, address: 10.77.2.11}
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

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from ansible.module_utils.basic import AnsibleModule

Runner = Callable[[Sequence[str], int], int]
HEADERS = 28  # IPv4 (20) and ICMP (8)


def run(argv: Sequence[str], timeout_s: int) -> int:
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout_s + 2, check=False).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 1


def link_problems(links: Sequence[Mapping[str, str]], found: Sequence[Mapping[str, Any]], mtu: int) -> list[str]:
    """What is wrong with this node's twins, given the JSON of ``ip -j addr show``."""
    by_name = {str(link.get("ifname")): link for link in found}
    problems = []
    for want in links:
        name, address = want["interface"], want["address"]
        link = by_name.get(name)
        if link is None:
            problems.append(f"{name} does not exist; check sparkserve_fabric_interfaces against `ip link`")
            continue
        held = [str(a.get("local")) for a in link.get("addr_info") or []]
        if address not in held:
            problems.append(f"{name} lacks its fabric address {address} (it has {', '.join(held) or 'none'}); "
                            "apply the fabric configuration")
        elif link.get("mtu") != mtu:
            problems.append(f"{name} has MTU {link.get('mtu')}, the fabric needs {mtu} on every node; "
                            "set it the same everywhere")
    return problems


def read_links() -> list[dict[str, Any]]:
    """This node's interfaces and addresses (``ip -j addr show``)."""
    done = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True)
    return list(json.loads(done.stdout))


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
            "links": {"type": "list", "elements": "dict", "default": [], "options": {
                "interface": {"type": "str", "required": True},
                "address": {"type": "str", "required": True},
            }},
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
    if params["links"]:
        try:
            found = read_links()
        except (OSError, ValueError, subprocess.CalledProcessError) as err:
            module.fail_json(msg=f"cannot read this node's interfaces with ip -j addr show: {err}")
        link_errors = link_problems(params["links"], found, params["mtu"])
        if link_errors:
            module.fail_json(msg="; ".join(link_errors), link_problems=link_errors, unanswered_pings=[],
                             unanswered_ssh=[])
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
