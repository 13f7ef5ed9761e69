"""A node's RoCE devices as sysfs shows them: port state, GID table, and the RoCE v2 GID index of each fabric
address (the roce_facts module's reading, which fabric_network also does when it changed nothing)."""

from __future__ import annotations

import ipaddress
import os
from typing import Any, Sequence

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "sysfs_root": {"type": "path", "default": "/sys/class/infiniband"},
    "net_root": {"type": "path", "default": "/sys/class/net"},
    "devices": {"type": "list", "elements": "str", "default": []},
    "addresses": {"type": "list", "elements": "str", "default": []},
    "gid_index_mode": {"type": "str", "choices": ["fixed", "per_device"], "default": "fixed"},
    "fail_on_problems": {"type": "bool", "default": True},
}
ROCE_V2 = "roce v2"
GID_INDEX_FIXED = "fixed"
GID_INDEX_PER_DEVICE = "per_device"


def read_text(path: str) -> str | None:
    """The stripped content of a sysfs file, or None where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def state_name(text: str | None) -> str | None:
    """``4: ACTIVE`` -> ``ACTIVE``; ``5: LinkUp`` -> ``LinkUp``."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip() or None


def mapped_ipv4(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID, else None."""
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped is not None else None


def is_v2(entry: dict[str, Any]) -> bool:
    return str(entry["type"]).strip().lower() == ROCE_V2


def numbered(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(name) for name in names if name.isdigit())


def read_gids(port: str) -> list[dict[str, Any]]:
    """The GID entries that exist: a non-zero GID whose type can be read."""
    entries = []
    for index in numbered(os.path.join(port, "gids")):
        gid = read_text(os.path.join(port, "gids", str(index)))
        gid_type = read_text(os.path.join(port, "gid_attrs", "types", str(index)))
        if not gid or gid_type is None:
            continue
        try:
            if ipaddress.IPv6Address(gid) == ipaddress.IPv6Address(0):
                continue
        except ValueError:
            pass
        ndev = read_text(os.path.join(port, "gid_attrs", "ndevs", str(index)))
        entries.append({"index": index, "gid": gid, "type": gid_type, "ndev": ndev or None})
    return entries


def read_device(root: str, name: str) -> dict[str, Any]:
    """One RDMA device as the facts report it (port 1 only; address and gid_index set later)."""
    path = os.path.join(root, name)
    port = os.path.join(path, "ports", "1")
    gids = read_gids(port)
    try:
        netdevs = sorted(os.listdir(os.path.join(path, "device", "net")))
    except OSError:
        netdevs = []
    for entry in gids:
        if entry["ndev"] and entry["ndev"] not in netdevs:
            netdevs.append(entry["ndev"])
    return {
        "name": name,
        "present": True,
        "netdevs": netdevs,
        "address": None,
        "state": state_name(read_text(os.path.join(port, "state"))),
        "phys_state": state_name(read_text(os.path.join(port, "phys_state"))),
        "rate": read_text(os.path.join(port, "rate")),
        "link_layer": read_text(os.path.join(port, "link_layer")),
        "gids": gids,
        "gid_index": None,
    }


def absent_device(name: str, address: str | None) -> dict[str, Any]:
    return {"name": name, "present": False, "netdevs": [], "address": address, "state": None,
            "phys_state": None, "rate": None, "link_layer": None, "gids": [], "gid_index": None}


def read_netdev(net_root: str, name: str, gids: Sequence[dict[str, Any]]) -> dict[str, Any]:
    mtu_text = read_text(os.path.join(net_root, name, "mtu"))
    ipv4: list[str] = []
    for entry in gids:
        address = mapped_ipv4(entry["gid"]) if entry["ndev"] == name else None
        if address and address not in ipv4:
            ipv4.append(address)
    return {
        "mtu": int(mtu_text) if mtu_text and mtu_text.isdigit() else None,
        "operstate": read_text(os.path.join(net_root, name, "operstate")),
        "ipv4": ipv4,
    }


def v2_index(device: dict[str, Any], address: str) -> int | None:
    """The lowest index of a RoCE v2 GID carrying ``address`` on the device."""
    for entry in device["gids"]:
        if is_v2(entry) and mapped_ipv4(entry["gid"]) == address:
            return int(entry["index"])
    return None


def pick_address(device: dict[str, Any], addresses: Sequence[str]) -> tuple[str | None, str | None]:
    """The address of a device not paired with one: the first of ``addresses`` it carries as RoCE v2,
    or, with no addresses given, the one IPv4 address of its RoCE v2 GIDs (a problem when it has several)."""
    if addresses:
        return next((a for a in addresses if v2_index(device, a) is not None), None), None
    carried = sorted({a for a in (mapped_ipv4(e["gid"]) for e in device["gids"] if is_v2(e)) if a},
                     key=ipaddress.IPv4Address)
    if len(carried) > 1:
        return None, (
            f"{device['name']} has RoCE v2 GIDs for several addresses ({', '.join(carried)}); "
            "give this node's fabric address in addresses to choose one"
        )
    return (carried[0] if carried else None), None


def parse_addresses(values: Sequence[str]) -> list[str]:
    addresses = []
    for value in values:
        try:
            addresses.append(str(ipaddress.IPv4Address(str(value).strip())))
        except ValueError as err:
            raise ValueError(f"addresses: {value!r} is not an IPv4 address ({err}); give the fabric address, "
                             "without a prefix length") from err
    return addresses


def interface_of(device: dict[str, Any]) -> str:
    return device["netdevs"][0] if device["netdevs"] else "its interface"


def gid_index_disagreement(devices: Sequence[dict[str, Any]]) -> str | None:
    """The problem of devices whose RoCE v2 GID indexes differ (NCCL takes one per process), else None."""
    known = [d for d in devices if d["gid_index"] is not None]
    if len({d["gid_index"] for d in known}) < 2:
        return None
    each = ", ".join(f"{d['name']} has {d['gid_index']} ({d['address']})" for d in known)
    return (
        f"GID index differs between the twins: {each}; NCCL takes one index per process. "
        "Make them agree (same netplan order on both twins) or set fabric.gid_index: per_device in the recipe "
        "to let NCCL choose per device"
    )


def gather(params: dict[str, Any]) -> dict[str, Any]:
    """Read the trees; return the ``roce`` facts with their problems."""
    root, net_root = params["sysfs_root"], params["net_root"]
    gid_index_mode = params.get("gid_index_mode") or GID_INDEX_FIXED
    if gid_index_mode not in (GID_INDEX_FIXED, GID_INDEX_PER_DEVICE):
        raise ValueError(f"gid_index_mode is {gid_index_mode!r}; use {GID_INDEX_FIXED} or {GID_INDEX_PER_DEVICE}")
    expected: list[str] = list(params["devices"] or [])
    addresses = parse_addresses(params["addresses"] or [])
    if expected and addresses and len(addresses) != len(expected):
        raise ValueError(
            f"devices has {len(expected)} entries and addresses {len(addresses)}; give one address per device, "
            "in the same order"
        )
    try:
        found = sorted(n for n in os.listdir(root) if not n.startswith("."))
    except OSError:
        found = []
    problems: list[str] = []
    devices: list[dict[str, Any]] = []

    if not expected and not found:
        problems.append(
            f"no RDMA devices under {root}; load the NIC's RDMA driver (mlx5_ib) or point sysfs_root at the right tree"
        )
    for position, name in enumerate(expected or found):
        wanted = addresses[position] if expected and addresses else None
        if name not in found:
            problems.append(
                f"{name} is missing: no such RDMA device under {root} (found: {', '.join(found) or 'none'}); "
                "fix the device name in the inventory or load the RDMA driver (mlx5_ib)"
            )
            devices.append(absent_device(name, wanted))
            continue
        device = read_device(root, name)
        devices.append(device)
        if device["state"] != "ACTIVE":
            problems.append(
                f"{name} port 1 is {device['state'] or 'unreadable'}; "
                "bring the link up (cable, switch port) before launching"
            )
        if wanted is None:
            wanted, problem = pick_address(device, addresses)
            if problem:
                problems.append(problem)
            if wanted is None:
                continue
        device["address"] = wanted
        device["gid_index"] = v2_index(device, wanted)

    for device in devices:
        address = device["address"]
        if not device["present"] or address is None or device["gid_index"] is not None:
            continue
        message = (
            f"{device['name']} has no RoCE v2 GID for {address}; "
            f"check the address is on {interface_of(device)} (ip addr)"
        )
        elsewhere = [d["name"] for d in devices
                     if d is not device and d["present"] and v2_index(d, address) is not None]
        if elsewhere:
            message += f"; it is on {', '.join(elsewhere)}, so devices and addresses may be in different orders"
        problems.append(message)
    if not expected and addresses:
        for address in addresses:
            if not any(d["address"] == address for d in devices):
                problems.append(
                    f"no RDMA device has a RoCE v2 GID for {address}; "
                    "check the address is on a fabric interface (ip addr)"
                )
    if gid_index_mode == GID_INDEX_FIXED:
        disagreement = gid_index_disagreement(devices)
        if disagreement:
            problems.append(disagreement)

    netdevs: dict[str, dict[str, Any]] = {}
    for device in devices:
        for name in device["netdevs"]:
            netdevs.setdefault(name, read_netdev(net_root, name, device["gids"]))
    return {
        "devices": devices,
        "netdevs": netdevs,
        "gid_index": devices[0]["gid_index"] if devices and gid_index_mode == GID_INDEX_FIXED else None,
        "gid_indexes": {d["name"]: d["gid_index"] for d in devices},
        "problems": problems,
    }
