"""The fabric_env filter and the fabric.env file the fabric role writes with it, for both GID index modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import jinja2
import pytest

from ansible_collections.sparkserve.deploy.plugins.filter.fabric_env import fabric_env

TEMPLATE = Path(__file__).resolve().parents[2] / "roles/fabric/templates/etc/sparkserve/fabric.env.j2"
NODE = {"sparkserve_fabric_interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"],
        "sparkserve_rdma_devices": ["rocep1s0f1", "roceP2p1s0f1"], "sparkserve_fabric_ip": "10.77.1.11"}
COMMON = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1", "TP_SOCKET_IFNAME": "enp1s0f1np1",
          "UCX_NET_DEVICES": "enp1s0f1np1", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "NCCL_IB_DISABLE": "0",
          "VLLM_HOST_IP": "10.77.1.11"}


def test_fixed_writes_the_one_index() -> None:
    assert fabric_env(NODE, "VLLM_HOST_IP", 3) == COMMON | {"NCCL_IB_GID_INDEX": "3"}
    assert fabric_env(NODE, "VLLM_HOST_IP", 3, "fixed") == COMMON | {"NCCL_IB_GID_INDEX": "3"}
    assert fabric_env(NODE, "VLLM_HOST_IP") == COMMON  # render.yml: the index is read on the node


def test_per_device_leaves_the_index_to_nccl() -> None:
    env = fabric_env(NODE, "VLLM_HOST_IP", None, "per_device")
    assert env == COMMON | {"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET"}
    assert "NCCL_IB_GID_INDEX" not in env


def test_contradictory_or_unknown_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="gid_index 3 with gid_index_mode per_device"):
        fabric_env(NODE, "VLLM_HOST_IP", 3, "per_device")
    with pytest.raises(ValueError, match="gid_index_mode 'dynamic'; use fixed or per_device"):
        fabric_env(NODE, "VLLM_HOST_IP", 3, "dynamic")


def combine(*dicts: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for each in dicts:
        merged.update(each)
    return merged


def render(mode: str, gid_index: int | None, extra: Mapping[str, str] | None = None) -> list[str]:
    """The fabric.env the role writes: its template with the role's variables and roce_facts' answer."""
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["sparkserve.deploy.fabric_env"] = fabric_env
    env.filters["combine"] = combine
    text = env.from_string(TEMPLATE.read_text(encoding="utf-8")).render(
        ansible_managed="managed", inventory_hostname="spark-1", hostvars={"spark-1": NODE},
        fabric_host_ip_variable="VLLM_HOST_IP", fabric_sysfs_root="/sys/class/infiniband",
        fabric_gid_index_mode=mode, fabric_env_extra=dict(extra or {}),
        __fabric_roce_read={"gid_index": gid_index},
    )
    return text.splitlines()


def test_the_file_with_fixed_names_the_index() -> None:
    lines = render("fixed", 4)
    assert "NCCL_IB_GID_INDEX=4" in lines
    assert not any(line.startswith(("NCCL_IB_ROCE_VERSION_NUM=", "NCCL_IB_ADDR_FAMILY=")) for line in lines)


def test_the_file_with_per_device_leaves_the_index_unset() -> None:
    lines = render("per_device", None, {"NCCL_DEBUG": "INFO"})
    settings = [line for line in lines if not line.startswith("#")]
    assert settings == sorted(f"{k}={v}" for k, v in (COMMON | {"NCCL_IB_ROCE_VERSION_NUM": "2",
                                                                "NCCL_IB_ADDR_FAMILY": "AF_INET",
                                                                "NCCL_DEBUG": "INFO"}).items())
    assert any("fabric.gid_index: per_device" in line for line in lines if line.startswith("#"))
