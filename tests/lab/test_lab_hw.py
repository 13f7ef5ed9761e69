"""Tests for lab/node/rootfs/usr/local/sbin/sparkserve-lab-hw and its unit."""

from __future__ import annotations

import configparser
import ipaddress
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.scripts import load_script

ROOTFS = Path(__file__).resolve().parents[2] / "lab/node/rootfs"
SCRIPT = ROOTFS / "usr/local/sbin/sparkserve-lab-hw"
UNIT = ROOTFS / "etc/systemd/system/sparkserve-lab-hw.service"
WANTS = ROOTFS / "etc/systemd/system/multi-user.target.wants/sparkserve-lab-hw.service"

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
MAPPED_10_77_1_11 = "0000:0000:0000:0000:0000:ffff:0a4d:010b"
MAC = bytes.fromhex("4cbb471a2b3c")


def load_module() -> ModuleType:
    return load_script("lab/node/rootfs/usr/local/sbin/sparkserve-lab-hw", "lab_hw")


hw = load_module()


# ---------------------------------------------------------------- fake ip


class FakeIp:
    """A tiny stateful stand-in for iproute2, enough for the rename logic."""

    def __init__(self, links: dict[str, list[str]], routes: list[dict[str, Any]]) -> None:
        self.links: dict[str, dict[str, Any]] = {name: {"addrs": addrs, "up": True} for name, addrs in links.items()}
        self.routes = routes
        self.calls: list[list[str]] = []

    @property
    def mutations(self) -> list[list[str]]:
        return [c for c in self.calls if "-j" not in c]

    def __call__(self, argv: Sequence[str]) -> str:
        argv = list(argv)
        self.calls.append(argv)
        assert argv[0] == "ip"
        match argv[1:]:
            case ["-j", "-4", "addr", "show"]:
                return json.dumps([
                    {"ifname": name, "addr_info": [
                        {"family": "inet", "local": a.split("/")[0], "prefixlen": int(a.split("/")[1])}
                        for a in link["addrs"]
                    ]} if link["addrs"] else {}  # iproute2 prints {} for a link -4 filters out
                    for name, link in self.links.items()
                ])
            case ["-4", "addr", "del", address, "dev", dev]:
                if address not in self.links[dev]["addrs"]:
                    raise hw.HwError("RTNETLINK answers: Cannot assign requested address")
                self.links[dev]["addrs"].remove(address)
                return ""
            case ["-j", "link", "show"]:
                return json.dumps([{"ifname": name} for name in self.links])
            case ["-j", "route", "show", "default"]:
                return json.dumps(self.routes)
            case ["link", "set", "dev", dev, "down"]:
                self.links[dev]["up"] = False
                self.routes = [r for r in self.routes if r.get("dev") != dev]  # as the kernel does
                return ""
            case ["link", "set", "dev", dev, "up"]:
                self.links[dev]["up"] = True
                return ""
            case ["link", "set", "dev", dev, "name", new]:
                if self.links[dev]["up"]:
                    raise hw.HwError("RTNETLINK answers: Device or resource busy")
                if new in self.links:
                    raise hw.HwError("RTNETLINK answers: File exists")
                self.links[new] = self.links.pop(dev)
                return ""
            case ["route", "replace", "default", *rest]:
                opts = dict(zip(rest[::2], rest[1::2], strict=True))
                route: dict[str, Any] = {"dst": "default", "dev": opts["dev"]}
                if "via" in opts:
                    route["gateway"] = opts["via"]
                if "metric" in opts:
                    route["metric"] = int(opts["metric"])
                self.routes = [r for r in self.routes if r.get("dev") != opts["dev"]] + [route]
                return ""
        raise AssertionError(f"unexpected command {argv}")


def spec(name: str, subnet: str, device: str | None = None, gid_index: int = 3,
         port_state: str = "ACTIVE", address: str | None = None, flush: bool = False) -> Any:
    rdma = hw.RdmaSpec(device, gid_index, port_state) if device else None
    return hw.InterfaceSpec(name, ipaddress.IPv4Network(subnet), rdma,
                            ipaddress.IPv4Address(address) if address else None, flush)


SPARK_SPECS = [
    spec("enP7s7", "172.30.77.0/24"),
    spec("enp1s0f1np1", "10.77.1.0/24", "rocep1s0f1"),
    spec("enP2p1s0f1np1", "10.77.2.0/24", "roceP2p1s0f1"),
]
DEFAULT_ROUTE = {"dst": "default", "gateway": "172.30.77.1", "dev": "eth0", "metric": 100,
                 "flags": [], "protocol": "static"}


# ---------------------------------------------------------------- renaming


def test_rename_only_the_mismatched_interface_and_restore_default_route() -> None:
    ip = FakeIp(
        {"lo": ["127.0.0.1/8"], "eth0": ["172.30.77.11/24"], "enp1s0f1np1": ["10.77.1.11/24"],
         "enP2p1s0f1np1": ["10.77.2.11/24"]},
        [dict(DEFAULT_ROUTE)],
    )
    done = hw.rename_interfaces(SPARK_SPECS, ip)
    assert done == [("eth0", "enP7s7")]
    assert ip.mutations == [
        ["ip", "link", "set", "dev", "eth0", "down"],
        ["ip", "link", "set", "dev", "eth0", "name", "enP7s7"],
        ["ip", "link", "set", "dev", "enP7s7", "up"],
        ["ip", "route", "replace", "default", "via", "172.30.77.1", "dev", "enP7s7", "metric", "100"],
    ]
    assert sorted(ip.links) == ["enP2p1s0f1np1", "enP7s7", "enp1s0f1np1", "lo"]
    assert ip.routes == [{"dst": "default", "dev": "enP7s7", "gateway": "172.30.77.1", "metric": 100}]


def test_rename_is_idempotent() -> None:
    ip = FakeIp({"host0": ["172.30.77.11/24"], "eth1": ["10.77.1.11/24"], "eth2": ["10.77.2.11/24"]},
                [dict(DEFAULT_ROUTE, dev="host0")])
    assert hw.rename_interfaces(SPARK_SPECS, ip) == [
        ("host0", "enP7s7"), ("eth1", "enp1s0f1np1"), ("eth2", "enP2p1s0f1np1"),
    ]
    assert ip.links["enp1s0f1np1"]["up"] and ip.links["enP2p1s0f1np1"]["up"]
    ip.calls.clear()
    assert hw.rename_interfaces(SPARK_SPECS, ip) == []
    assert ip.mutations == []
    assert ip.routes[0]["dev"] == "enP7s7"


def test_route_through_an_untouched_interface_is_not_readded() -> None:
    ip = FakeIp({"enP7s7": ["172.30.77.11/24"], "eth1": ["10.77.1.11/24"], "enP2p1s0f1np1": ["10.77.2.11/24"]},
                [dict(DEFAULT_ROUTE, dev="enP7s7")])
    assert hw.rename_interfaces(SPARK_SPECS, ip) == [("eth1", "enp1s0f1np1")]
    assert not any(c[1] == "route" for c in ip.mutations)


def test_missing_subnet_and_name_clash_fail_before_touching_links() -> None:
    ip = FakeIp({"eth0": ["172.30.77.11/24"], "eth1": ["10.77.1.11/24"]}, [])
    with pytest.raises(hw.HwError, match=r"no interface holds an IPv4 address in 10\.77\.2\.0/24"):
        hw.rename_interfaces(SPARK_SPECS, ip)
    assert ip.mutations == []
    clash = FakeIp({"eth0": ["172.30.77.11/24"], "enP7s7": []}, [])
    with pytest.raises(hw.HwError, match="enP7s7 already exists"):
        hw.rename_interfaces(SPARK_SPECS[:1], clash)
    assert clash.mutations == []
    twice = FakeIp({"eth0": ["10.77.1.11/24", "10.77.2.11/24"]}, [])
    with pytest.raises(hw.HwError, match="two configured interfaces"):
        hw.rename_interfaces(SPARK_SPECS[1:], twice)


def test_wait_for_subnets_polls_until_addresses_appear() -> None:
    ip = FakeIp({"eth0": []}, [])
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            ip.links["eth0"]["addrs"] = ["10.77.1.11/24"]

    found = hw.wait_for_subnets(ip, [SPARK_SPECS[1]], 60, sleep)
    assert len(sleeps) == 2
    assert found["eth0"] == [ipaddress.IPv4Interface("10.77.1.11/24")]
    ip.links["eth0"]["addrs"] = []
    hw.wait_for_subnets(ip, [SPARK_SPECS[1]], 0, sleep)
    assert len(sleeps) == 2  # no time left: one look, no sleep


def test_wait_for_subnets_counts_a_named_interface_without_address_as_found() -> None:
    ip = FakeIp({"enP7s7": ["172.30.77.11/24"], "enp1s0f1np1": [], "enP2p1s0f1np1": []}, [])

    def sleep(seconds: float) -> None:
        raise AssertionError("waited although every interface is there")

    found = hw.wait_for_subnets(ip, SPARK_SPECS, 60, sleep)
    assert found == {"enP7s7": [ipaddress.IPv4Interface("172.30.77.11/24")]}
    # links are read only when a subnet has no holder
    every_holder = FakeIp({"enP7s7": ["172.30.77.11/24"]}, [])
    hw.wait_for_subnets(every_holder, SPARK_SPECS[:1], 60, sleep)
    assert every_holder.calls == [["ip", "-j", "-4", "addr", "show"]]


# ---------------------------------------------------------------- flush


FLUSH_SPECS = [
    spec("enP7s7", "172.30.77.0/24"),
    spec("enp1s0f1np1", "10.77.1.0/24", "rocep1s0f1", address="10.77.1.11", flush=True),
    spec("enP2p1s0f1np1", "10.77.2.0/24", "roceP2p1s0f1", 4, address="10.77.2.11", flush=True),
]


def test_flush_removes_only_the_in_subnet_addresses_of_flush_entries() -> None:
    ip = FakeIp({"enP7s7": ["172.30.77.11/24"],
                 "enp1s0f1np1": ["10.77.1.11/24", "192.0.2.5/24", "10.77.1.99/24"],
                 "enP2p1s0f1np1": ["10.77.2.11/24"]}, [])
    renamed = {"enP7s7", "enp1s0f1np1", "enP2p1s0f1np1"}
    flushed = hw.flush_addresses(FLUSH_SPECS, hw.ipv4_addresses(ip), renamed, ip)
    assert flushed == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert ip.mutations == [
        ["ip", "-4", "addr", "del", "10.77.1.11/24", "dev", "enp1s0f1np1"],
        ["ip", "-4", "addr", "del", "10.77.1.99/24", "dev", "enp1s0f1np1"],
        ["ip", "-4", "addr", "del", "10.77.2.11/24", "dev", "enP2p1s0f1np1"],
    ]
    assert ip.links["enP7s7"]["addrs"] == ["172.30.77.11/24"]  # not a flush entry
    assert ip.links["enp1s0f1np1"]["addrs"] == ["192.0.2.5/24"]  # outside its subnet
    assert ip.links["enp1s0f1np1"]["up"]  # the link stays up
    ip.calls.clear()
    assert hw.flush_addresses(FLUSH_SPECS, hw.ipv4_addresses(ip), renamed, ip) == []
    assert ip.mutations == []


def test_flush_leaves_an_interface_that_was_already_named() -> None:
    # Named before this run: its address is the one the fabric role gave it.
    ip = FakeIp({"enP7s7": ["172.30.77.11/24"], "enp1s0f1np1": ["10.77.1.11/24"],
                 "enP2p1s0f1np1": ["10.77.2.11/24"]}, [])
    assert hw.flush_addresses(FLUSH_SPECS, hw.ipv4_addresses(ip), {"enP2p1s0f1np1"}, ip) == ["enP2p1s0f1np1"]
    assert ip.mutations == [["ip", "-4", "addr", "del", "10.77.2.11/24", "dev", "enP2p1s0f1np1"]]
    assert ip.links["enp1s0f1np1"]["addrs"] == ["10.77.1.11/24"]


def test_rename_after_flush_finds_named_interfaces_without_addresses() -> None:
    ip = FakeIp({"enP7s7": ["172.30.77.11/24"], "enp1s0f1np1": [], "enP2p1s0f1np1": []}, [])
    assert hw.rename_interfaces(FLUSH_SPECS, ip) == []
    assert ip.mutations == []
    # the fabric role gave one its address back: still nothing to do
    ip.links["enp1s0f1np1"]["addrs"] = ["10.77.1.11/24"]
    assert hw.rename_interfaces(FLUSH_SPECS, ip) == []
    assert ip.mutations == []


def test_gid_uses_the_configured_address_when_flushed() -> None:
    config = hw.parse_config({"interfaces": [
        {"name": "enp1s0f1np1", "subnet": "10.77.1.0/24", "address": "10.77.1.11", "flush": True,
         "rdma": {"device": "rocep1s0f1"}},
        {"name": "enP2p1s0f1np1", "subnet": "10.77.2.0/24", "address": "10.77.2.11",
         "rdma": {"device": "roceP2p1s0f1"}}]})
    live = {"enP2p1s0f1np1": [ipaddress.IPv4Interface("10.77.2.42/24")]}
    assert hw.rdma_addresses(config, live) == {
        "enp1s0f1np1": ipaddress.IPv4Address("10.77.1.11"),  # flushed: the configured one
        "enP2p1s0f1np1": ipaddress.IPv4Address("10.77.2.42"),  # live beats configured
    }
    bare = hw.parse_config({"interfaces": [
        {"name": "enp1s0f1np1", "subnet": "10.77.1.0/24", "rdma": {"device": "rocep1s0f1"}}]})
    with pytest.raises(hw.HwError, match=r"no IPv4 address in 10\.77\.1\.0/24 and none is configured"):
        hw.rdma_addresses(bare, {})


def test_address_outside_the_subnet_is_an_error() -> None:
    with pytest.raises(hw.HwError, match=r"address 10\.77\.2\.11 is not inside its subnet 10\.77\.1\.0/24"):
        hw.parse_config({"interfaces": [{"name": "e", "subnet": "10.77.1.0/24", "address": "10.77.2.11"}]})
    with pytest.raises(hw.HwError, match="bad address"):
        hw.parse_config({"interfaces": [{"name": "e", "subnet": "10.77.1.0/24", "address": "10.77.1.300"}]})
    with pytest.raises(hw.HwError, match="flush must be true or false"):
        hw.parse_config({"interfaces": [{"name": "e", "subnet": "10.77.1.0/24", "flush": "yes"}]})
    config = hw.parse_config({"interfaces": [
        {"name": "e", "subnet": "10.77.1.0/24", "address": "10.77.1.11", "flush": True}]})
    assert config.interfaces[0].address == ipaddress.IPv4Address("10.77.1.11")
    assert config.interfaces[0].flush


# ---------------------------------------------------------------- device nodes


class FakeDev:
    """Records mknod calls, leaves a regular file as a stand-in, and stats it as the device made."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, int]] = []
        self.made: dict[Path, tuple[int, int, int]] = {}

    def mknod(self, path: Path, mode: int, major: int, minor: int) -> None:
        assert not path.exists(), f"{path} not removed before mknod"
        self.calls.append((path.name, mode, major, minor))
        path.write_text("")
        self.made[path] = (mode, major, minor)

    def stat(self, path: Path) -> os.stat_result:
        if path not in self.made:
            return os.lstat(path)
        mode, major, minor = self.made[path]
        return os.stat_result((stat.S_IFCHR | mode, 0, 0, 1, 0, 0, 0, 0, 0, 0),
                              {"st_rdev": os.makedev(major, minor)})


def test_dev_nodes_are_made_with_the_mlx5_numbers(tmp_path: Path) -> None:
    dev = FakeDev()
    root = tmp_path / "dev/infiniband"
    made = hw.write_dev_nodes(root, SPARK_SPECS, dev.mknod, dev.stat)
    assert made == [root / "uverbs0", root / "uverbs1", root / "rdma_cm"]
    assert dev.calls == [("uverbs0", 0o666, 231, 192), ("uverbs1", 0o666, 231, 193), ("rdma_cm", 0o666, 10, 58)]
    dev.calls.clear()
    assert hw.write_dev_nodes(root, SPARK_SPECS, dev.mknod, dev.stat) == []
    assert dev.calls == []


def test_wrong_dev_nodes_are_replaced_and_others_left_alone(tmp_path: Path) -> None:
    dev = FakeDev()
    root = tmp_path / "infiniband"
    root.mkdir()
    (root / "uverbs0").write_text("a regular file\n")
    (root / "uverbs1").write_text("")
    dev.made[root / "uverbs1"] = (0o666, 231, 199)  # a character device with the wrong minor
    (root / "rdma_cm").mkdir()
    (root / "umad0").write_text("not ours\n")
    hw.write_dev_nodes(root, SPARK_SPECS, dev.mknod, dev.stat)
    assert dev.calls == [("uverbs0", 0o666, 231, 192), ("uverbs1", 0o666, 231, 193), ("rdma_cm", 0o666, 10, 58)]
    assert sorted(p.name for p in root.iterdir()) == ["rdma_cm", "umad0", "uverbs0", "uverbs1"]
    assert read(root / "umad0") == "not ours\n"


def test_default_mknod_makes_a_root_owned_character_device(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(hw.os, "mknod", lambda path, mode, device: calls.append(("mknod", (path, mode, device))))
    monkeypatch.setattr(hw.os, "chown", lambda path, uid, gid: calls.append(("chown", (path, uid, gid))))
    monkeypatch.setattr(hw.os, "chmod", lambda path, mode: calls.append(("chmod", (path, mode))))
    node = Path("/dev/infiniband/uverbs1")
    hw.mknod_char(node, 0o666, 231, 193)
    assert calls == [("mknod", (node, stat.S_IFCHR | 0o666, os.makedev(231, 193))),
                     ("chown", (node, 0, 0)), ("chmod", (node, 0o666))]  # chmod: the umask aside


# ---------------------------------------------------------------- drop_caches


class Recorder:
    """A Runner that records the commands and returns no output."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        return ""


def test_drop_caches_made_writable_with_a_bind_mount(tmp_path: Path) -> None:
    path = tmp_path / "drop_caches"
    run = Recorder()
    assert hw.make_drop_caches_writable(run, path, lambda p, mode: False)
    assert run.calls == [["mount", "--bind", str(path), str(path)], ["mount", "-o", "remount,bind,rw", str(path)]]


def test_writable_drop_caches_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "drop_caches"
    path.write_text("")
    run = Recorder()
    checked: list[tuple[Path, int]] = []

    def access(p: Path, mode: int) -> bool:
        checked.append((p, mode))
        return os.access(p, mode)

    assert not hw.make_drop_caches_writable(run, path, access)
    assert run.calls == []
    assert checked == [(path, os.W_OK)]


# ---------------------------------------------------------------- GID table


def test_ipv4_mapped_gid_encoding() -> None:
    assert hw.ipv4_mapped_gid(ipaddress.IPv4Address("10.77.1.11")) == MAPPED_10_77_1_11
    assert hw.ipv4_mapped_gid(ipaddress.IPv4Address("192.168.200.1")).endswith(":ffff:c0a8:c801")


def test_link_local_gid_and_node_guid_come_from_the_mac() -> None:
    table = hw.gid_table("enp1s0f1np1", ipaddress.IPv4Address("10.77.1.11"), 3, MAC)
    assert table[0].gid == "fe80:0000:0000:0000:4ebb:47ff:fe1a:2b3c"
    assert hw.node_guid(MAC) == "4cbb:4703:001a:2b3c"


def test_gid_index_3_layout() -> None:
    table = hw.gid_table("enp1s0f1np1", ipaddress.IPv4Address("10.77.1.11"), 3, MAC)
    assert len(table) == 16
    assert [e.type for e in table[:4]] == ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"]
    assert table[0].gid == table[1].gid and table[0].gid.startswith("fe80:")
    assert table[2].gid == table[3].gid == MAPPED_10_77_1_11
    assert {e.ndev for e in table[:4]} == {"enp1s0f1np1"}
    assert table[4:] == [None] * 12


def test_gid_index_4_puts_roce_v2_ipv4_at_4() -> None:
    table = hw.gid_table("enP2p1s0f1np1", ipaddress.IPv4Address("10.77.2.11"), 4, MAC)
    assert (table[4].gid, table[4].type) == ("0000:0000:0000:0000:0000:ffff:0a4d:020b", "RoCE v2")
    assert (table[3].gid, table[3].type) == (table[4].gid, "IB/RoCE v1")
    assert table[2].gid.startswith("2001:0db8:") and table[2].type == "IB/RoCE v1"
    assert table[5:] == [None] * 11
    v2_ipv4 = [i for i, e in enumerate(table) if e and e.type == "RoCE v2" and ":ffff:" in e.gid]
    assert v2_ipv4 == [4]


def test_larger_gid_indexes_fill_with_ipv6_pairs() -> None:
    v1, v2 = "IB/RoCE v1", "RoCE v2"
    five = hw.gid_table("eth", ipaddress.IPv4Address("10.0.0.1"), 5, MAC)
    assert [e.type for e in five[:6]] == [v1, v2, v1, v2, v1, v2]
    assert five[2].gid == five[3].gid and five[2].gid.startswith("2001:0db8:")
    assert five[4].gid == five[5].gid == "0000:0000:0000:0000:0000:ffff:0a00:0001"
    six = hw.gid_table("eth", ipaddress.IPv4Address("10.0.0.1"), 6, MAC)
    assert [e.type for e in six[:7]] == [v1, v2, v1, v2, v1, v1, v2]
    assert six[2].gid == six[3].gid != six[4].gid
    assert six[6].gid.endswith("ffff:0a00:0001") and six[7] is None


@pytest.mark.parametrize("index", [-1, 0, 1, 2, 16, 99])
def test_impossible_gid_index_is_rejected(index: int) -> None:
    with pytest.raises(hw.HwError, match=f"gid_index {index} is impossible"):
        hw.gid_table("eth", ipaddress.IPv4Address("10.0.0.1"), index, MAC)


# ---------------------------------------------------------------- RDMA tree


def read(path: Path) -> str:
    return path.read_text(encoding="ascii")


@pytest.fixture
def net_root(tmp_path: Path) -> Path:
    root = tmp_path / "net"
    (root / "enp1s0f1np1").mkdir(parents=True)
    (root / "enp1s0f1np1" / "address").write_text("4c:bb:47:1a:2b:3c\n")
    return root


ADDRESSES = {
    "enp1s0f1np1": ipaddress.IPv4Address("10.77.1.11"),
    "enP2p1s0f1np1": ipaddress.IPv4Address("10.77.2.11"),
}


def test_rdma_tree_layout(tmp_path: Path, net_root: Path) -> None:
    root = tmp_path / "sys/class/infiniband"
    specs = [SPARK_SPECS[0], SPARK_SPECS[1], spec("enP2p1s0f1np1", "10.77.2.0/24", "roceP2p1s0f1", 4)]
    assert hw.write_rdma_tree(root, specs, ADDRESSES, "spark-1", net_root) == ["rocep1s0f1", "roceP2p1s0f1"]
    assert sorted(p.name for p in root.iterdir()) == ["roceP2p1s0f1", "rocep1s0f1"]
    dev = root / "rocep1s0f1"
    port = dev / "ports/1"
    assert dev.is_dir() and not dev.is_symlink()  # so rdma_root can be bind-mounted alone
    assert read(port / "state") == "4: ACTIVE\n"
    assert read(port / "phys_state") == "5: LinkUp\n"
    assert read(port / "link_layer") == "Ethernet\n"
    assert read(port / "rate") == "200 Gb/sec (4X HDR)\n"
    assert read(dev / "node_guid") == "4cbb:4703:001a:2b3c\n"
    assert (dev / "device/net/enp1s0f1np1").is_dir()
    assert read(port / "gids/0") == "fe80:0000:0000:0000:4ebb:47ff:fe1a:2b3c\n"
    assert read(port / "gids/3") == MAPPED_10_77_1_11 + "\n"
    assert read(port / "gid_attrs/types/2") == "IB/RoCE v1\n"
    assert read(port / "gid_attrs/types/3") == "RoCE v2\n"
    assert read(port / "gid_attrs/ndevs/3") == "enp1s0f1np1\n"
    assert sorted(int(p.name) for p in (port / "gids").iterdir()) == list(range(16))
    assert read(port / "gids/15") == ZERO_GID + "\n"
    assert not (port / "gid_attrs/types/4").exists()
    twin = root / "roceP2p1s0f1/ports/1"
    assert read(twin / "gids/4") == "0000:0000:0000:0000:0000:ffff:0a4d:020b\n"
    assert read(twin / "gid_attrs/types/4") == "RoCE v2\n"
    assert read(twin / "gid_attrs/ndevs/4") == "enP2p1s0f1np1\n"
    # no address file for the twin: a stable made-up locally administered MAC
    guid = read(root / "roceP2p1s0f1/node_guid")
    assert int(guid[:2], 16) & 0x02
    assert oct(os.stat(port / "gids/3").st_mode & 0o777) == "0o444"


def test_rewrite_updates_gid_index_and_port_state(tmp_path: Path, net_root: Path) -> None:
    root = tmp_path / "ib"
    hw.write_rdma_tree(root, [SPARK_SPECS[1]], ADDRESSES, "spark-1", net_root)
    (root / "README").write_text("not ours\n")
    moved = spec("enp1s0f1np1", "10.77.1.0/24", "rocep1s0f1", gid_index=4, port_state="DOWN")
    hw.write_rdma_tree(root, [moved], ADDRESSES, "spark-1", net_root)
    port = root / "rocep1s0f1/ports/1"
    assert read(port / "state") == "1: DOWN\n"
    assert read(port / "phys_state") == "3: Disabled\n"
    assert read(port / "gids/4") == MAPPED_10_77_1_11 + "\n"
    assert read(port / "gid_attrs/types/4") == "RoCE v2\n"
    assert read(port / "gid_attrs/types/3") == "IB/RoCE v1\n"
    assert sorted(p.name for p in root.iterdir()) == ["README", "rocep1s0f1"]  # no temp left over
    hw.write_rdma_tree(root, [SPARK_SPECS[1]], ADDRESSES, "spark-1", net_root)
    assert read(port / "state") == "4: ACTIVE\n"
    assert not (port / "gid_attrs/types/4").exists()
    hw.write_rdma_tree(root, [], ADDRESSES, "spark-1", net_root)
    assert [p.name for p in root.iterdir()] == ["README"]  # stale device gone, foreign file kept


def test_exchange_swaps_two_directories(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a/x").write_text("a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b/x").write_text("b")
    assert hw.exchange(tmp_path / "a", tmp_path / "b")
    assert (read(tmp_path / "a/x"), read(tmp_path / "b/x")) == ("b", "a")


def test_rewrite_without_rename_exchange_falls_back(
    tmp_path: Path, net_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hw, "exchange", lambda a, b: False)
    root = tmp_path / "ib"
    hw.write_rdma_tree(root, [SPARK_SPECS[1]], ADDRESSES, "spark-1", net_root)
    down = spec("enp1s0f1np1", "10.77.1.0/24", "rocep1s0f1", 3, "DOWN")
    hw.write_rdma_tree(root, [down], ADDRESSES, "spark-1", net_root)
    assert read(root / "rocep1s0f1/ports/1/state") == "1: DOWN\n"
    assert [p.name for p in root.iterdir()] == ["rocep1s0f1"]


def test_rewrite_never_shows_a_half_tree(tmp_path: Path, net_root: Path) -> None:
    root = tmp_path / "ib"
    up, down = SPARK_SPECS[1], spec("enp1s0f1np1", "10.77.1.0/24", "rocep1s0f1", 4, "DOWN")
    hw.write_rdma_tree(root, [up], ADDRESSES, "spark-1", net_root)
    seen: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(read(root / "rocep1s0f1/ports/1/state"))
            except OSError as err:
                seen.append(f"error: {err}")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for turn in range(40):
            hw.write_rdma_tree(root, [down if turn % 2 == 0 else up], ADDRESSES, "spark-1", net_root)
    finally:
        stop.set()
        thread.join()
    assert seen
    assert set(seen) <= {"4: ACTIVE\n", "1: DOWN\n"}


def test_rdma_interface_without_address_is_an_error(tmp_path: Path, net_root: Path) -> None:
    with pytest.raises(hw.HwError, match="no IPv4 address known for enp1s0f1np1"):
        hw.write_rdma_tree(tmp_path / "ib", [SPARK_SPECS[1]], {}, "spark-1", net_root)


# ---------------------------------------------------------------- config, apply, CLI


def node_json(tmp_path: Path, **rdma: Any) -> dict[str, Any]:
    return {
        "hostname": "spark-1",
        "rdma_root": str(tmp_path / "ib"),
        "interfaces": [
            {"name": "enP7s7", "subnet": "172.30.77.0/24"},
            {"name": "enp1s0f1np1", "subnet": "10.77.1.0/24",
             "rdma": {"device": "rocep1s0f1", "gid_index": 3, "port_state": "ACTIVE",
                      "rate": "100 Gb/sec (2X HDR)", **rdma}},
        ],
        "gpu": {},
    }


def test_parse_config_defaults_and_errors(tmp_path: Path) -> None:
    config = hw.parse_config({"interfaces": [
        {"name": "eth9", "subnet": "10.9.0.0/16", "rdma": {"device": "roce9"}}]})
    assert config.rdma_root == Path("/run/sparkserve-lab/sys/class/infiniband")
    assert config.interfaces[0].rdma == hw.RdmaSpec("roce9", 3, "ACTIVE", "200 Gb/sec (4X HDR)")
    with pytest.raises(hw.HwError, match="bad subnet"):
        hw.parse_config({"interfaces": [{"name": "x", "subnet": "10.1.1.1/33"}]})
    with pytest.raises(hw.HwError, match="port_state"):
        hw.parse_config(node_json(tmp_path, port_state="SLEEPY"))
    with pytest.raises(hw.HwError, match="duplicate interface name"):
        hw.parse_config({"interfaces": [{"name": "a", "subnet": "10.0.0.0/8"}] * 2})


def test_apply_flushes_makes_devices_and_drop_caches_then_a_rerun_changes_nothing(
    tmp_path: Path, net_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = node_json(tmp_path)
    raw["interfaces"][1].update(address="10.77.1.11", flush=True)
    raw.update(rdma_dev_root=str(tmp_path / "dev/infiniband"), writable_drop_caches=True)
    config = hw.parse_config(raw)
    ip = FakeIp({"host0": ["172.30.77.11/24"], "eth1": ["10.77.1.11/24"]}, [dict(DEFAULT_ROUTE, dev="host0")])
    mounts: list[list[str]] = []
    writable = {"now": False}

    def run(argv: Sequence[str]) -> str:
        if argv[0] == "mount":
            mounts.append(list(argv))
            writable["now"] = True
            return ""
        return ip(argv)

    dev = FakeDev()
    drop_caches = tmp_path / "drop_caches"
    options = {"mknod": dev.mknod, "read_stat": dev.stat, "drop_caches": drop_caches,
               "access": lambda p, mode: writable["now"]}
    hw.apply(config, run, net_root, **options)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "renamed host0 -> enP7s7",
        "renamed eth1 -> enp1s0f1np1",
        f"wrote {tmp_path / 'ib/rocep1s0f1'}",
        "flushed enp1s0f1np1 (the fabric role gives it its address)",
        f"created {tmp_path / 'dev/infiniband/uverbs0'}",
        f"created {tmp_path / 'dev/infiniband/rdma_cm'}",
        f"made {drop_caches} writable",
    ]
    assert ip.links["enp1s0f1np1"] == {"addrs": [], "up": True}
    assert ip.links["enP7s7"]["addrs"] == ["172.30.77.11/24"]
    assert len(mounts) == 2
    gid = tmp_path / "ib/rocep1s0f1/ports/1/gids/3"
    assert read(gid) == MAPPED_10_77_1_11 + "\n"

    ip.calls.clear()
    hw.apply(config, run, net_root, **options)
    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path / 'ib/rocep1s0f1'}"]
    assert ip.mutations == []
    # The fabric role gave the twin its address: a re-run keeps it.
    ip.links["enp1s0f1np1"]["addrs"] = ["10.77.1.11/24"]
    hw.apply(config, run, net_root, **options)
    assert ip.mutations == [] and ip.links["enp1s0f1np1"]["addrs"] == ["10.77.1.11/24"]
    assert len(mounts) == 2 and len(dev.calls) == 2
    assert read(gid) == MAPPED_10_77_1_11 + "\n"  # from the configured address now


def test_apply_renames_then_writes_gids_from_live_addresses(tmp_path: Path, net_root: Path) -> None:
    config = hw.parse_config(node_json(tmp_path, gid_index=4))
    ip = FakeIp({"host0": ["172.30.77.11/24"], "eth1": ["10.77.1.11/24", "192.0.2.5/24"]},
                [dict(DEFAULT_ROUTE, dev="host0")])
    hw.apply(config, ip, net_root)
    assert sorted(ip.links) == ["enP7s7", "enp1s0f1np1"]
    assert ip.routes[0]["dev"] == "enP7s7"
    port = tmp_path / "ib/rocep1s0f1/ports/1"
    assert read(port / "gids/4") == MAPPED_10_77_1_11 + "\n"
    assert read(port / "rate") == "100 Gb/sec (2X HDR)\n"
    assert read(port / "gid_attrs/ndevs/4") == "enp1s0f1np1\n"


FAKE_IP = """#!{python}
import json, sys
if sys.argv[1:] == ["-j", "-4", "addr", "show"]:
    print(json.dumps([{{"ifname": "enp1s0f1np1", "addr_info": [
        {{"family": "inet", "local": "10.77.1.11", "prefixlen": 24}}]}},
        {{"ifname": "enP7s7", "addr_info": [
        {{"family": "inet", "local": "172.30.77.11", "prefixlen": 24}}]}}]))
else:
    sys.exit("fake ip: unexpected " + " ".join(sys.argv[1:]))
"""


def run_cli(tmp_path: Path, config: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "ip").write_text(FAKE_IP.format(python=sys.executable))
    (bindir / "ip").chmod(0o755)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SPARKSERVE_LAB_NODE_CONFIG": str(path)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_cli_writes_the_tree_with_the_config_from_the_environment(tmp_path: Path, net_root: Path) -> None:
    done = run_cli(tmp_path, node_json(tmp_path), "--skip-rename", "--wait-s", "0", "--net-root", str(net_root))
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout
    assert read(tmp_path / "ib/rocep1s0f1/ports/1/gids/3") == MAPPED_10_77_1_11 + "\n"
    assert read(tmp_path / "ib/rocep1s0f1/node_guid") == "4cbb:4703:001a:2b3c\n"


def test_cli_reports_errors_without_traceback(tmp_path: Path) -> None:
    bad_index = run_cli(tmp_path, node_json(tmp_path, gid_index=2), "--skip-rename", "--wait-s", "0")
    assert bad_index.returncode == 1
    assert "sparkserve-lab-hw: error: gid_index 2 is impossible" in bad_index.stderr
    assert "Traceback" not in bad_index.stderr
    missing = run_cli(tmp_path, {}, "--config", str(tmp_path / "absent.json"))
    assert missing.returncode == 1
    assert "cannot read node config" in missing.stderr
    # without --skip-rename the fake ip refuses "ip -j link show": the failure is reported
    refused = run_cli(tmp_path, node_json(tmp_path), "--wait-s", "0")
    assert refused.returncode == 1
    assert "ip -j link show failed" in refused.stderr


# ---------------------------------------------------------------- unit


def test_unit_file_and_enablement_symlink() -> None:
    unit = configparser.ConfigParser(strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT, encoding="utf-8")
    assert unit["Service"]["Type"] == "oneshot"
    assert unit["Service"]["RemainAfterExit"] == "yes"
    assert unit["Service"]["ExecStart"] == "/usr/local/sbin/sparkserve-lab-hw"
    lines = UNIT.read_text(encoding="utf-8").splitlines()
    before = {u for line in lines if line.startswith("Before=") for u in line.removeprefix("Before=").split()}
    wants = {u for line in lines if line.startswith("Wants=") for u in line.removeprefix("Wants=").split()}
    # before sshd and dockerd, and before systemd-networkd, which must find the twins named and flushed
    assert before >= {"ssh.service", "docker.service", "systemd-networkd.service", "network-pre.target"}
    assert "network-pre.target" in wants
    assert unit["Unit"]["ConditionPathExists"] == "/etc/sparkserve-lab/node.json"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert WANTS.is_symlink()
    assert os.readlink(WANTS) == "/etc/systemd/system/sparkserve-lab-hw.service"
    assert SCRIPT.read_text(encoding="utf-8").startswith("#!/usr/bin/python3\n")
    assert os.access(SCRIPT, os.X_OK)
