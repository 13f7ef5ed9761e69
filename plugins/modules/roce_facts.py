#!/usr/bin/python
"""Read a Spark's RoCE devices from sysfs: port state, GID table, and the RoCE v2 GID index of each fabric address."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: roce_facts
short_description: Read the RoCE devices of a node and the RoCE v2 GID index of its fabric addresses
version_added: "0.1.0"
description:
  - Reads the RDMA sysfs tree (C(<sysfs_root>/<dev>/ports/1/state), C(phys_state), C(rate), C(link_layer),
    C(gids/N), C(gid_attrs/types/N), C(gid_attrs/ndevs/N), C(device/net/*)) and, for each network interface
    behind a device, C(<net_root>/<ifname>/mtu) and C(operstate).
  - Maps each fabric address to the index of the RoCE v2 GID that carries it, by decoding the IPv4-mapped
    GIDs (C(0000:0000:0000:0000:0000:ffff:XXXX:XXXX)). That index moves between nodes and across reboots,
    so read it at each launch and give it to C(NCCL_IB_GID_INDEX).
  - NCCL takes one C(NCCL_IB_GID_INDEX) per process, for every device. When the devices' RoCE v2 indexes
    differ, the second twin would run on a wrong GID, so with O(gid_index_mode=fixed) that is a problem;
    with O(gid_index_mode=per_device) it is not, and RV(roce.gid_index) is V(null) (NCCL 2.21 and later
    pick each device's RoCE v2 IPv4 GID themselves when C(NCCL_IB_GID_INDEX) is unset).
  - GID slots whose type cannot be read are skipped; the kernel fails that read with EINVAL for an empty slot.
  - An interface's IPv4 addresses are read from the GID table (the kernel adds a GID pair for each address
    of the interface), so an interface without an RDMA device behind it lists none.
  - Changes nothing; runs the same in check mode.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  sysfs_root:
    description:
      - The RDMA sysfs tree. The lab nodes write theirs to C(/run/sparkserve-lab/sys/class/infiniband).
    type: path
    default: /sys/class/infiniband
  net_root:
    description: The network sysfs tree, read for each interface's MTU and operstate.
    type: path
    default: /sys/class/net
  devices:
    description:
      - RDMA devices this node must have, in order, for example C([rocep1s0f1, roceP2p1s0f1]).
      - Empty reports every device found, in name order, and makes finding none a problem.
    type: list
    elements: str
    default: []
  addresses:
    description:
      - This node's fabric IPv4 addresses, one per entry of O(devices), in the same order.
      - Empty lets each device report the one IPv4 address of its RoCE v2 GIDs, when it has exactly one.
    type: list
    elements: str
    default: []
  gid_index_mode:
    description:
      - V(fixed) gives one GID index for every device, in RV(roce.gid_index) (for C(NCCL_IB_GID_INDEX)),
        and makes devices whose RoCE v2 indexes differ a problem.
      - V(per_device) lets NCCL choose the GID of each device itself; indexes that differ are no problem
        and RV(roce.gid_index) is V(null).
    type: str
    choices: [fixed, per_device]
    default: fixed
  fail_on_problems:
    description: Fail with every problem joined into the message; V(false) returns them in RV(roce.problems).
    type: bool
    default: true
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Read the RoCE v2 GID index of the fabric addresses
  sparkserve.deploy.roce_facts:
    devices: [rocep1s0f1, roceP2p1s0f1]
    addresses: ["10.77.1.11", "10.77.2.11"]
  register: __fabric_roce
  check_mode: false
  changed_when: false

- name: Only report, in the lab's tree
  sparkserve.deploy.roce_facts:
    sysfs_root: /run/sparkserve-lab/sys/class/infiniband
    devices: [rocep1s0f1]
    addresses: ["{{ sparkserve_fabric_ip }}"]
    fail_on_problems: false

- name: Twins whose GID indexes may differ; NCCL chooses each device's GID
  sparkserve.deploy.roce_facts:
    devices: [rocep1s0f1, roceP2p1s0f1]
    addresses: ["10.77.1.11", "10.77.2.11"]
    gid_index_mode: per_device
"""

RETURN = r"""
roce:
  description: What was read; the same value is set as the fact C(sparkserve_roce).
  returned: always
  type: dict
  contains:
    devices:
      description:
        - One entry per device of O(devices) in that order (missing ones with C(present=false)), or every
          device found when O(devices) is empty.
        - Each has C(name), C(present), C(netdevs) (interface names, from C(device/net) and the GID table),
          C(address) (the fabric address looked for, or the one found), C(state) and C(phys_state)
          (C(ACTIVE), C(LinkUp); V(null) where unreadable), C(rate), C(link_layer), C(gids) (the GID entries
          that exist, each C(index), C(gid), C(type), C(ndev)) and C(gid_index) (the RoCE v2 GID carrying
          the address, or V(null)).
      type: list
      elements: dict
    netdevs:
      description: For each interface behind a device, C(mtu) and C(operstate) (V(null) where unreadable) and C(ipv4).
      type: dict
    gid_index:
      description:
        - The RoCE v2 GID index every device has, the value for C(NCCL_IB_GID_INDEX); with the devices
          disagreeing, the first device's.
        - V(null) when the first device's is unknown, and always with O(gid_index_mode=per_device).
      type: int
    gid_indexes:
      description: Each device's RoCE v2 GID index, by device name (V(null) where unknown).
      type: dict
    problems:
      description: Each problem found, naming the device, what is wrong and the fix.
      type: list
      elements: str
  sample:
    devices:
      - name: rocep1s0f1
        present: true
        netdevs: [enp1s0f1np1]
        address: 10.77.1.11
        state: ACTIVE
        phys_state: LinkUp
        rate: 200 Gb/sec (4X HDR)
        link_layer: Ethernet
        gids:
          - {index: 3, gid: "0000:0000:0000:0000:0000:ffff:0a4d:010b", type: RoCE v2, ndev: enp1s0f1np1}
        gid_index: 3
    netdevs:
      enp1s0f1np1: {mtu: 9000, operstate: up, ipv4: [10.77.1.11]}
    gid_index: 3
    gid_indexes: {rocep1s0f1: 3}
    problems: []
ansible_facts:
  description: The fact C(sparkserve_roce), the same value as RV(roce).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.roce import ARGUMENT_SPEC, gather


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        roce = gather(module.params)
    except ValueError as err:
        module.fail_json(msg=f"roce_facts: {err}")
    facts = {"sparkserve_roce": roce}
    if roce["problems"] and module.params["fail_on_problems"]:
        module.fail_json(msg="; ".join(roce["problems"]), changed=False, roce=roce)
    module.exit_json(changed=False, roce=roce, ansible_facts=facts)


if __name__ == "__main__":
    main()
