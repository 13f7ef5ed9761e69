"""The fabric environment every rank of an engine gets (NCCL, Gloo, UCX, host IP)."""

from __future__ import annotations

import re
from typing import Any, Mapping

DOCUMENTATION = r"""
name: fabric_env
short_description: The fabric environment of one node's rank
version_added: "0.1.0"
description:
  - From a node's inventory variables, the environment that makes every collective and socket of
    the engine use the fabric, on both twins of the Spark's port.
  - C(NCCL_IB_GID_INDEX) is detected on the node at each launch (it moves after reboots); pass the
    detected value as O(gid_index), or leave it out to have the key omitted.
  - With O(gid_index_mode=per_device), for twins whose RoCE v2 GID indexes differ, C(NCCL_IB_GID_INDEX) is
    left unset and C(NCCL_IB_ROCE_VERSION_NUM=2) and C(NCCL_IB_ADDR_FAMILY=AF_INET) are set instead, so that
    NCCL (2.21 and later) picks each device's RoCE v2 IPv4 GID itself.
positional: host_ip_variable, gid_index, gid_index_mode
options:
  _input:
    description: The node's host variables (C(hostvars[node])).
    type: dict
    required: true
  host_ip_variable:
    description:
      - The variable that tells the engine the node's own fabric address (C(VLLM_HOST_IP), C(SGLANG_HOST_IP));
        the engine's adapter names it and the render carries it (C(recipe_engine.host_ip_variable)).
    type: str
    required: true
  gid_index:
    description: The RoCE v2 IPv4 GID index detected on the node; none with O(gid_index_mode=per_device).
    type: int
  gid_index_mode:
    description:
      - V(fixed) writes O(gid_index) as C(NCCL_IB_GID_INDEX), the index every twin agrees on.
      - V(per_device) leaves C(NCCL_IB_GID_INDEX) unset and sets C(NCCL_IB_ROCE_VERSION_NUM=2) and
        C(NCCL_IB_ADDR_FAMILY=AF_INET) (the recipe's C(fabric.gid_index)).
    type: str
    choices: [fixed, per_device]
    default: fixed
"""

EXAMPLES = r"""
fabric_env: "{{ hostvars[inventory_hostname] | sparkserve.deploy.fabric_env(recipe_engine.host_ip_variable) }}"
# On the node, with the index roce_facts read and the recipe's fabric.gid_index:
node_env: "{{ hostvars[inventory_hostname] | sparkserve.deploy.fabric_env('VLLM_HOST_IP', __fabric_roce.roce.gid_index,
  recipe_config.fabric.gid_index) }}"
"""

RETURN = r"""
_value:
  description: Environment variable names and values.
  type: dict
"""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GID_INDEX_FIXED = "fixed"
GID_INDEX_PER_DEVICE = "per_device"
# NCCL 2.21 and later select each device's GID when NCCL_IB_GID_INDEX is unset (-1): the GID of this RoCE
# version and address family.
PER_DEVICE_GID_ENV = {"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET"}


def fabric_env(
    node: Mapping[str, Any],
    host_ip_variable: str,
    gid_index: int | None = None,
    gid_index_mode: str = GID_INDEX_FIXED,
) -> dict[str, str]:
    """The environment that pins a rank's traffic to the fabric."""
    if not isinstance(host_ip_variable, str) or not _ENV_NAME.match(host_ip_variable):
        raise ValueError(f"fabric_env: host_ip_variable {host_ip_variable!r} is not an environment variable name")
    if gid_index_mode not in (GID_INDEX_FIXED, GID_INDEX_PER_DEVICE):
        raise ValueError(f"fabric_env: gid_index_mode {gid_index_mode!r}; use {GID_INDEX_FIXED} or "
                         f"{GID_INDEX_PER_DEVICE}")
    if gid_index_mode == GID_INDEX_PER_DEVICE and gid_index is not None:
        raise ValueError(f"fabric_env: gid_index {gid_index!r} with gid_index_mode {GID_INDEX_PER_DEVICE}, "
                         "which leaves NCCL_IB_GID_INDEX unset; give no gid_index")
    interfaces = list(node.get("sparkserve_fabric_interfaces") or [])
    devices = list(node.get("sparkserve_rdma_devices") or [])
    address = node.get("sparkserve_fabric_ip")
    if not interfaces or not devices or not address:
        raise ValueError(
            "fabric_env: the node needs sparkserve_fabric_interfaces, sparkserve_rdma_devices and "
            "sparkserve_fabric_ip in the inventory"
        )
    first = interfaces[0]
    env = {
        "NCCL_SOCKET_IFNAME": first,
        "GLOO_SOCKET_IFNAME": first,
        "TP_SOCKET_IFNAME": first,
        "UCX_NET_DEVICES": first,
        "NCCL_IB_HCA": ",".join(devices),
        "NCCL_IB_DISABLE": "0",
        host_ip_variable: str(address),
    }
    if gid_index_mode == GID_INDEX_PER_DEVICE:
        env.update(PER_DEVICE_GID_ENV)
    elif gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(int(gid_index))
    return env


class FilterModule:
    """sparkserve fabric filters."""

    def filters(self) -> dict[str, Any]:
        return {"fabric_env": fabric_env}
