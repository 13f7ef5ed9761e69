"""Tests for the roce_facts module: kernel-shaped RDMA trees, the lab's own tree, and the module's answers."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import roce_facts as rf
from tests.scripts import load_script

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

LAB_HW = Path(__file__).resolve().parents[2] / "lab/node/rootfs/usr/local/sbin/sparkserve-lab-hw"

V1 = "IB/RoCE v1"
V2 = "RoCE v2"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
LINK_LOCAL = "fe80:0000:0000:0000:4ebb:47ff:fe1a:2b3c"
TWINS = ["rocep1s0f1", "roceP2p1s0f1"]
IFNAMES = {"rocep1s0f1": "enp1s0f1np1", "roceP2p1s0f1": "enP2p1s0f1np1"}
ADDRESSES = ["10.77.1.11", "10.77.2.11"]


def mapped(address: str) -> str:
    packed = bytes(10) + b"\xff\xff" + ipaddress.IPv4Address(address).packed
    return ":".join(packed[i : i + 2].hex() for i in range(0, 16, 2))


def write_device(
    root: Path,
    name: str,
    ifname: str,
    address: str,
    gid_index: int = 3,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    v2: bool = True,
    net_dir: bool = True,
    size: int = 8,
    empty_type: str = "missing",
) -> None:
    """One device in the kernel's layout: fe80 pair at 0/1, fillers, then the IPv4-mapped v1/v2 pair with
    the v2 entry at ``gid_index`` (or a lone v1 entry there when ``v2`` is false); empty slots after it read
    as the zero GID with their type file missing, or a directory (reads fail, like the kernel's EINVAL)."""
    dev = root / name
    port = dev / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    if net_dir:
        (dev / "device" / "net" / ifname).mkdir(parents=True)
    (port / "state").write_text(state + "\n", encoding="ascii")
    (port / "phys_state").write_text(phys_state + "\n", encoding="ascii")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n", encoding="ascii")
    (port / "link_layer").write_text("Ethernet\n", encoding="ascii")
    table: list[tuple[str, str]] = [(LINK_LOCAL, V1), (LINK_LOCAL, V2)]
    for slot in range(2, gid_index - 1):
        table.append((f"2001:0db8:0000:{slot:04x}:4ebb:47ff:fe1a:2b3c", V1 if slot % 2 == 0 else V2))
    table.append((mapped(address), V1))
    if v2:
        table.append((mapped(address), V2))
    for index in range(size):
        gid, kind = table[index] if index < len(table) else (ZERO_GID, "")
        (port / "gids" / str(index)).write_text(gid + "\n", encoding="ascii")
        if kind:
            (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n", encoding="ascii")
            (port / "gid_attrs" / "ndevs" / str(index)).write_text(ifname + "\n", encoding="ascii")
        elif empty_type == "unreadable":
            (port / "gid_attrs" / "types" / str(index)).mkdir()


def write_netdev(net: Path, ifname: str, mtu: int = 9000, operstate: str = "up") -> None:
    (net / ifname).mkdir(parents=True)
    (net / ifname / "mtu").write_text(f"{mtu}\n", encoding="ascii")
    (net / ifname / "operstate").write_text(operstate + "\n", encoding="ascii")


def spark(tmp_path: Path, indexes: tuple[int, int] = (3, 3), **first: Any) -> dict[str, Any]:
    """A Spark with both twins; ``first`` overrides write_device for rocep1s0f1. Returns the params."""
    root, net = tmp_path / "infiniband", tmp_path / "net"
    for position, (name, address) in enumerate(zip(TWINS, ADDRESSES, strict=True)):
        overrides = first if position == 0 else {}
        write_device(root, name, IFNAMES[name], address, indexes[position], **overrides)
        write_netdev(net, IFNAMES[name])
    return params_for(root, net)


def params_for(root: Path, net: Path, **extra: Any) -> dict[str, Any]:
    params = {"sysfs_root": str(root), "net_root": str(net), "devices": list(TWINS), "addresses": list(ADDRESSES),
              "fail_on_problems": True}
    params.update(extra)
    return params


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        rf.main()
    return json.loads(capsys.readouterr().out)


def load_lab_hw() -> ModuleType:
    return load_script("lab/node/rootfs/usr/local/sbin/sparkserve-lab-hw", "lab_hw_for_roce_facts")


# ---------------------------------------------------------------- reading


def test_a_healthy_node_at_index_3(tmp_path: Path) -> None:
    roce = rf.gather(spark(tmp_path))
    assert roce["problems"] == []
    assert roce["gid_index"] == 3
    first = roce["devices"][0]
    assert first["name"] == "rocep1s0f1" and first["present"] is True
    assert first["netdevs"] == ["enp1s0f1np1"]
    assert first["address"] == "10.77.1.11"
    assert (first["state"], first["phys_state"]) == ("ACTIVE", "LinkUp")
    assert first["rate"] == "200 Gb/sec (4X HDR)" and first["link_layer"] == "Ethernet"
    assert first["gids"] == [
        {"index": 0, "gid": LINK_LOCAL, "type": V1, "ndev": "enp1s0f1np1"},
        {"index": 1, "gid": LINK_LOCAL, "type": V2, "ndev": "enp1s0f1np1"},
        {"index": 2, "gid": mapped("10.77.1.11"), "type": V1, "ndev": "enp1s0f1np1"},
        {"index": 3, "gid": mapped("10.77.1.11"), "type": V2, "ndev": "enp1s0f1np1"},
    ]
    assert [d["gid_index"] for d in roce["devices"]] == [3, 3]
    assert roce["netdevs"] == {
        "enp1s0f1np1": {"mtu": 9000, "operstate": "up", "ipv4": ["10.77.1.11"]},
        "enP2p1s0f1np1": {"mtu": 9000, "operstate": "up", "ipv4": ["10.77.2.11"]},
    }


def test_another_node_at_index_4_after_a_filler(tmp_path: Path) -> None:
    roce = rf.gather(spark(tmp_path, (4, 4)))
    assert roce["problems"] == []
    assert roce["gid_index"] == 4
    first = roce["devices"][0]
    assert [(g["index"], g["type"]) for g in first["gids"]] == [(0, V1), (1, V2), (2, V1), (3, V1), (4, V2)]
    assert first["gids"][2]["gid"].startswith("2001:0db8:")
    assert first["gids"][4]["gid"] == mapped("10.77.1.11")


def test_twins_that_agree_give_their_one_index(tmp_path: Path) -> None:
    roce = rf.gather(spark(tmp_path, (5, 5)))
    assert roce["problems"] == []
    assert roce["gid_index"] == 5
    assert roce["gid_indexes"] == {"rocep1s0f1": 5, "roceP2p1s0f1": 5}


def test_twins_that_disagree_are_refused_naming_both(tmp_path: Path) -> None:
    roce = rf.gather(spark(tmp_path, (3, 5)))
    assert roce["problems"] == [
        "GID index differs between the twins: rocep1s0f1 has 3 (10.77.1.11), roceP2p1s0f1 has 5 (10.77.2.11); "
        "NCCL takes one index per process. Make them agree (same netplan order on both twins) or set "
        "fabric.gid_index: per_device in the recipe to let NCCL choose per device"
    ]
    assert roce["gid_indexes"] == {"rocep1s0f1": 3, "roceP2p1s0f1": 5}
    assert [d["gid_index"] for d in roce["devices"]] == [3, 5]


def test_per_device_lets_the_twins_disagree_and_gives_no_one_index(tmp_path: Path) -> None:
    roce = rf.gather(spark(tmp_path, (3, 5)) | {"gid_index_mode": "per_device"})
    assert roce["problems"] == []
    assert roce["gid_index"] is None
    assert roce["gid_indexes"] == {"rocep1s0f1": 3, "roceP2p1s0f1": 5}


def test_per_device_with_twins_that_agree_still_gives_no_one_index(tmp_path: Path) -> None:
    roce = rf.gather(spark(tmp_path) | {"gid_index_mode": "per_device"})
    assert roce["problems"] == [] and roce["gid_index"] is None
    assert roce["gid_indexes"] == {"rocep1s0f1": 3, "roceP2p1s0f1": 3}


def test_per_device_still_needs_a_roce_v2_gid_on_each_twin(tmp_path: Path) -> None:
    root, net = tmp_path / "infiniband", tmp_path / "net"
    write_device(root, "rocep1s0f1", "enp1s0f1np1", "10.77.1.11", 3)
    write_device(root, "roceP2p1s0f1", "enP2p1s0f1np1", "10.77.2.11", 5, v2=False)
    roce = rf.gather(params_for(root, net, gid_index_mode="per_device"))
    assert roce["problems"] == [
        "roceP2p1s0f1 has no RoCE v2 GID for 10.77.2.11; check the address is on enP2p1s0f1np1 (ip addr)"
    ]
    assert roce["gid_indexes"] == {"rocep1s0f1": 3, "roceP2p1s0f1": None}


def test_a_twin_without_an_index_is_no_disagreement(tmp_path: Path) -> None:
    root, net = tmp_path / "infiniband", tmp_path / "net"
    write_device(root, "rocep1s0f1", "enp1s0f1np1", "10.77.1.11", 3)
    write_device(root, "roceP2p1s0f1", "enP2p1s0f1np1", "10.77.2.11", 5, v2=False)
    problems = rf.gather(params_for(root, net))["problems"]
    assert len(problems) == 1 and not any(p.startswith("GID index differs") for p in problems)


def test_empty_slots_with_unreadable_types_are_skipped(tmp_path: Path) -> None:
    root, net = tmp_path / "infiniband", tmp_path / "net"
    write_device(root, "rocep1s0f1", "enp1s0f1np1", "10.77.1.11", 4, size=16, empty_type="unreadable")
    write_device(root, "roceP2p1s0f1", "enP2p1s0f1np1", "10.77.2.11", 3, size=16, empty_type="missing")
    roce = rf.gather(params_for(root, net, gid_index_mode="per_device"))
    assert roce["problems"] == []
    assert [len(d["gids"]) for d in roce["devices"]] == [5, 4]
    assert [d["gid_index"] for d in roce["devices"]] == [4, 3]
    assert all(g["gid"] != ZERO_GID for d in roce["devices"] for g in d["gids"])
    # no net sysfs entries for the interfaces: reported as unknown, not an error
    assert roce["netdevs"]["enp1s0f1np1"] == {"mtu": None, "operstate": None, "ipv4": ["10.77.1.11"]}


def test_netdev_from_the_gid_table_when_device_net_is_absent(tmp_path: Path) -> None:
    params = spark(tmp_path, net_dir=False)
    roce = rf.gather(params)
    assert roce["devices"][0]["netdevs"] == ["enp1s0f1np1"]
    assert roce["gid_index"] == 3


def test_without_addresses_the_one_v2_ipv4_gid_is_used(tmp_path: Path) -> None:
    params = spark(tmp_path, (4, 3)) | {"gid_index_mode": "per_device"}
    params["addresses"] = []
    roce = rf.gather(params)
    assert roce["problems"] == []
    assert [(d["address"], d["gid_index"]) for d in roce["devices"]] == [("10.77.1.11", 4), ("10.77.2.11", 3)]


def test_without_devices_every_device_found_is_reported(tmp_path: Path) -> None:
    params = spark(tmp_path, (3, 4)) | {"gid_index_mode": "per_device"}
    params["devices"] = []
    roce = rf.gather(params)
    assert roce["problems"] == []
    assert sorted((d["name"], d["gid_index"]) for d in roce["devices"]) == [("roceP2p1s0f1", 4), ("rocep1s0f1", 3)]
    assert roce["gid_indexes"] == {"roceP2p1s0f1": 4, "rocep1s0f1": 3}


def test_without_devices_found_devices_that_disagree_are_refused(tmp_path: Path) -> None:
    params = spark(tmp_path, (3, 4))
    params["devices"] = []
    (problem,) = rf.gather(params)["problems"]
    assert problem.startswith("GID index differs between the twins: roceP2p1s0f1 has 4 (10.77.2.11), "
                              "rocep1s0f1 has 3 (10.77.1.11); NCCL takes one index per process.")


# ---------------------------------------------------------------- problems


def test_a_device_with_only_roce_v1_has_no_gid_index(tmp_path: Path) -> None:
    root, net = tmp_path / "infiniband", tmp_path / "net"
    write_device(root, "rocep1s0f1", "enp1s0f1np1", "10.77.1.11", 3)
    write_device(root, "roceP2p1s0f1", "enP2p1s0f1np1", "10.77.2.11", 3, v2=False)
    roce = rf.gather(params_for(root, net))
    assert roce["problems"] == [
        "roceP2p1s0f1 has no RoCE v2 GID for 10.77.2.11; check the address is on enP2p1s0f1np1 (ip addr)"
    ]
    assert [d["gid_index"] for d in roce["devices"]] == [3, None]
    assert roce["gid_index"] == 3


def test_addresses_in_the_wrong_order_say_where_they_are(tmp_path: Path) -> None:
    params = spark(tmp_path)
    params["addresses"] = list(reversed(ADDRESSES))
    problems = rf.gather(params)["problems"]
    assert problems[0] == (
        "rocep1s0f1 has no RoCE v2 GID for 10.77.2.11; check the address is on enp1s0f1np1 (ip addr); "
        "it is on roceP2p1s0f1, so devices and addresses may be in different orders"
    )
    assert len(problems) == 2


def test_a_port_down_is_named(tmp_path: Path) -> None:
    roce = rf.gather(spark(tmp_path, state="1: DOWN", phys_state="3: Disabled"))
    assert roce["problems"] == ["rocep1s0f1 port 1 is DOWN; bring the link up (cable, switch port) before launching"]
    assert (roce["devices"][0]["state"], roce["devices"][0]["phys_state"]) == ("DOWN", "Disabled")
    assert roce["gid_index"] == 3  # the GID table is still read


def test_a_missing_device_lists_what_exists(tmp_path: Path) -> None:
    root, net = tmp_path / "infiniband", tmp_path / "net"
    write_device(root, "roceP2p1s0f1", "enP2p1s0f1np1", "10.77.2.11", 4)
    write_device(root, "rocep1s0f0", "enp1s0f0np0", "10.77.9.11", 3)
    roce = rf.gather(params_for(root, net))
    (problem,) = roce["problems"]
    assert problem.startswith(f"rocep1s0f1 is missing: no such RDMA device under {root} "
                              "(found: roceP2p1s0f1, rocep1s0f0);")
    assert roce["devices"][0] == {
        "name": "rocep1s0f1", "present": False, "netdevs": [], "address": "10.77.1.11", "state": None,
        "phys_state": None, "rate": None, "link_layer": None, "gids": [], "gid_index": None,
    }
    assert roce["devices"][1]["gid_index"] == 4
    assert roce["gid_index"] is None  # the first device is the one NCCL_IB_GID_INDEX follows


def test_no_tree_at_all(tmp_path: Path) -> None:
    roce = rf.gather(params_for(tmp_path / "nothing", tmp_path / "net", devices=[], addresses=[]))
    assert roce["devices"] == [] and roce["gid_index"] is None
    assert roce["problems"][0].startswith(f"no RDMA devices under {tmp_path / 'nothing'};")


def test_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one address per device"):
        rf.gather(params_for(tmp_path, tmp_path, addresses=["10.77.1.11"]))
    with pytest.raises(ValueError, match=r"'10.77.1.11/24' is not an IPv4 address"):
        rf.gather(params_for(tmp_path, tmp_path, addresses=["10.77.1.11/24", "10.77.2.11"]))


# ---------------------------------------------------------------- the lab's tree


def test_reads_the_gid_index_the_lab_wrote(tmp_path: Path) -> None:
    hw = load_lab_hw()
    root, net = tmp_path / "run/sys/class/infiniband", tmp_path / "net"
    config = hw.parse_config({
        "hostname": "spark-2",
        "rdma_root": str(root),
        "interfaces": [
            {"name": "enP7s7", "subnet": "172.30.77.0/24"},
            {"name": "enp1s0f1np1", "subnet": "10.77.1.0/24", "rdma": {"device": "rocep1s0f1", "gid_index": 3}},
            {"name": "enP2p1s0f1np1", "subnet": "10.77.2.0/24", "rdma": {"device": "roceP2p1s0f1", "gid_index": 4}},
        ],
    })
    write_netdev(net, "enp1s0f1np1")
    (net / "enp1s0f1np1" / "address").write_text("4c:bb:47:1a:2b:3c\n", encoding="ascii")
    addresses = {"enp1s0f1np1": ipaddress.IPv4Address("10.77.1.12"),
                 "enP2p1s0f1np1": ipaddress.IPv4Address("10.77.2.12")}
    assert hw.write_rdma_tree(config.rdma_root, config.interfaces, addresses, config.hostname, net) == TWINS

    roce = rf.gather(params_for(root, net, addresses=["10.77.1.12", "10.77.2.12"], gid_index_mode="per_device"))
    assert roce["problems"] == []
    assert [d["gid_index"] for d in roce["devices"]] == [3, 4]
    assert roce["gid_indexes"] == {"rocep1s0f1": 3, "roceP2p1s0f1": 4} and roce["gid_index"] is None
    assert [d["netdevs"] for d in roce["devices"]] == [["enp1s0f1np1"], ["enP2p1s0f1np1"]]
    assert roce["devices"][0]["gids"][0]["gid"] == LINK_LOCAL
    assert all(d["state"] == "ACTIVE" and d["link_layer"] == "Ethernet" for d in roce["devices"])
    assert roce["netdevs"]["enp1s0f1np1"] == {"mtu": 9000, "operstate": "up", "ipv4": ["10.77.1.12"]}
    assert roce["netdevs"]["enP2p1s0f1np1"]["mtu"] is None


# ---------------------------------------------------------------- the module


def test_main_returns_facts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(spark(tmp_path, (4, 4)), capsys)
    assert not result.get("failed") and result["changed"] is False
    assert result["roce"]["gid_index"] == 4
    assert result["ansible_facts"] == {"sparkserve_roce": result["roce"]}


def test_main_fails_on_problems_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = spark(tmp_path, state="1: DOWN", v2=False)
    del params["fail_on_problems"]
    result = run_main(params, capsys)
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == (
        "rocep1s0f1 port 1 is DOWN; bring the link up (cable, switch port) before launching; "
        "rocep1s0f1 has no RoCE v2 GID for 10.77.1.11; check the address is on enp1s0f1np1 (ip addr)"
    )
    assert len(result["roce"]["problems"]) == 2


def test_main_returns_problems_when_told_not_to_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = spark(tmp_path, state="1: DOWN")
    params["fail_on_problems"] = False
    result = run_main(params, capsys)
    assert not result.get("failed")
    assert result["roce"]["problems"] == [
        "rocep1s0f1 port 1 is DOWN; bring the link up (cable, switch port) before launching"
    ]
    assert result["ansible_facts"]["sparkserve_roce"]["gid_index"] == 3


def test_main_in_check_mode_answers_the_same_and_changes_nothing(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    params = spark(tmp_path, (4, 4))
    before = sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*"))
    plain = run_main(params, capsys)
    checked = run_main({**params, "_ansible_check_mode": True}, capsys)
    assert checked["changed"] is False and not checked.get("failed") and "skipped" not in checked
    assert checked["roce"] == plain["roce"] and checked["roce"]["gid_index"] == 4
    assert sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*")) == before


def test_main_refuses_twins_that_disagree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(spark(tmp_path, (3, 5)), capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("GID index differs between the twins: rocep1s0f1 has 3 (10.77.1.11), "
                                    "roceP2p1s0f1 has 5 (10.77.2.11);")
    assert result["roce"]["gid_indexes"] == {"rocep1s0f1": 3, "roceP2p1s0f1": 5}


def test_main_per_device_returns_no_one_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(spark(tmp_path, (3, 5)) | {"gid_index_mode": "per_device"}, capsys)
    assert not result.get("failed")
    assert result["roce"]["gid_index"] is None
    assert result["roce"]["gid_indexes"] == {"rocep1s0f1": 3, "roceP2p1s0f1": 5}


def test_main_refuses_an_unknown_gid_index_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(spark(tmp_path) | {"gid_index_mode": "dynamic"}, capsys)
    assert result["failed"] is True and "gid_index_mode" in result["msg"]


def test_main_refuses_a_bad_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(spark(tmp_path) | {"addresses": ["10.77.1.11", "not-an-address"]}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("roce_facts: addresses: 'not-an-address' is not an IPv4 address")


def test_documentation_matches_the_argument_spec() -> None:
    options = yaml.safe_load(rf.DOCUMENTATION)["options"]
    assert set(options) == set(rf.ARGUMENT_SPEC)
    for name, spec in rf.ARGUMENT_SPEC.items():
        assert options[name]["type"] == spec["type"], name
        assert options[name].get("default") == spec.get("default"), name
        assert options[name].get("choices") == spec.get("choices"), name
    yaml.safe_load(rf.EXAMPLES)
    yaml.safe_load(rf.RETURN)
