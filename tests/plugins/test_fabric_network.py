"""Tests for the fabric_network module: install, apply to the twins only, wait, and undo what failed.

The node is a temporary folder (the module's root) and a double that answers the commands: ``ip`` prints the
addresses it holds, ``networkctl reconfigure`` gives the twins their addresses (or never, per test),
``netplan generate --root-dir`` is checked against the files it is given, ``systemctl`` keeps systemd-networkd's
state. The clock moves only when the module sleeps.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Sequence

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import fabric_network as fn
from ansible_collections.sparkserve.deploy.plugins.modules import roce_facts as rf
from tests.plugins.test_roce_facts import spark
from tests.tree import snapshot

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

NETPLAN_FILE = "/etc/netplan/60-sparkserve-fabric.yaml"
NETWORKD_A = "/etc/systemd/network/60-sparkserve-enp1s0f0np0.network"
NETWORKD_B = "/etc/systemd/network/60-sparkserve-enp1s0f1np1.network"
CLOUD_INIT = "/etc/netplan/50-cloud-init.yaml"
MGMT = "/etc/systemd/network/10-mgmt.network"
OWNED = ["/etc/netplan/60-sparkserve-*.yaml", "/etc/systemd/network/60-sparkserve-*.network"]
TWINS = [{"name": "enp1s0f0np0", "address": "10.77.1.11/24"}, {"name": "enp1s0f1np1", "address": "10.77.2.11/24"}]
WANTED = {"enp1s0f0np0": "10.77.1.11/24", "enp1s0f1np1": "10.77.2.11/24"}
IP = ["ip", "-j", "-4", "addr", "show"]
NETWORKD_UNIT = "systemd-networkd.service"
# What the module reads of systemd-networkd before the addresses, every run.
SERVICE_READS = [["systemctl", "is-enabled", NETWORKD_UNIT],
                 ["systemctl", "show", "--property=ActiveState", "--value", NETWORKD_UNIT]]
READS = [*SERVICE_READS, IP]

NETPLAN = """network:
  version: 2
  ethernets:
    enp1s0f0np0:
      dhcp4: false
      mtu: 9000
      addresses: [10.77.1.11/24]
    enp1s0f1np1:
      dhcp4: false
      mtu: 9000
      addresses: [10.77.2.11/24]
"""
NETPLAN_OLD = NETPLAN.replace("mtu: 9000", "mtu: 1500")
CLOUD_INIT_TEXT = "network:\n  version: 2\n  ethernets:\n    enP7s7:\n      dhcp4: true\n"
MGMT_TEXT = "[Match]\nName=enP7s7\n\n[Network]\nDHCP=yes\n"


def networkd(name: str, address: str) -> str:
    return f"[Match]\nName={name}\n\n[Link]\nMTUBytes=9000\n\n[Network]\nAddress={address}\nLinkLocalAddressing=no\n"


class FakeNode:
    """Answers the module's commands as a node would, and records them."""

    def __init__(self, comes_up: bool = True, live: dict[str, list[str]] | None = None) -> None:
        self.comes_up = comes_up
        self.live: dict[str, list[str]] = {"lo": ["127.0.0.1/8"], "enP7s7": ["192.168.1.20/24"], **(live or {})}
        self.commands: list[list[str]] = []
        self.staged: dict[str, str] = {}  # what netplan generate --root-dir was given: relative path -> content
        self.generate_check: tuple[int, str] = (0, "")
        self.failing: dict[tuple[str, ...], tuple[int, str]] = {}
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.networkd = {"enabled": True, "active": True}

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def ip_json(self) -> str:
        links: list[dict[str, Any]] = []
        for index, (name, cidrs) in enumerate(self.live.items()):
            if not cidrs:
                links.append({})  # what ip -4 prints for an interface without an IPv4 address
                continue
            info = [{"family": "inet", "local": c.split("/")[0], "prefixlen": int(c.split("/")[1])} for c in cidrs]
            links.append({"ifindex": index + 1, "ifname": name, "addr_info": info})
        return json.dumps(links)

    def __call__(self, argv: Sequence[str]) -> tuple[int, str, str]:
        argv = list(argv)
        self.commands.append(argv)
        if argv == IP:
            return 0, self.ip_json(), ""
        if tuple(argv) in self.failing:
            rc, err = self.failing[tuple(argv)]
            return rc, "", err
        if argv == SERVICE_READS[0]:
            return (0, "enabled\n", "") if self.networkd["enabled"] else (1, "disabled\n", "")
        if argv == SERVICE_READS[1]:
            return 0, "active\n" if self.networkd["active"] else "inactive\n", ""
        if argv in (["systemctl", "enable", NETWORKD_UNIT], ["systemctl", "start", NETWORKD_UNIT]):
            self.networkd["enabled" if argv[1] == "enable" else "active"] = True
            return 0, "", ""
        if argv[:3] == ["netplan", "generate", "--root-dir"]:
            staging = Path(argv[3])
            self.staged = {str(p.relative_to(staging)): p.read_text(encoding="utf-8")
                           for p in sorted(staging.rglob("*")) if p.is_file()}
            rc, err = self.generate_check
            return rc, "", err.replace("STAGING", argv[3])
        if argv == ["netplan", "generate"] or argv == ["networkctl", "reload"]:
            return 0, "", ""
        if argv[:2] == ["networkctl", "reconfigure"]:
            if self.comes_up:
                for name in argv[2:]:
                    self.live[name] = [WANTED[name]]
            return 0, "", ""
        raise AssertionError(f"unexpected command {argv}")

    def acting(self) -> list[list[str]]:
        """The commands run but the reads, with the scratch folder of netplan generate --root-dir named SCRATCH."""
        return [c[:3] + ["SCRATCH"] if c[:3] == ["netplan", "generate", "--root-dir"] else c
                for c in self.commands if c not in READS]


APPLY_NETPLAN = [["netplan", "generate"], ["networkctl", "reload"],
                 ["networkctl", "reconfigure", "enp1s0f0np0", "enp1s0f1np1"]]
APPLY_NETWORKD = APPLY_NETPLAN[1:]
CHECK = [["netplan", "generate", "--root-dir", "SCRATCH"]]


def put(root: Path, path: str, text: str, mode: int = 0o644) -> None:
    full = root / path.lstrip("/")
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text, encoding="utf-8")
    full.chmod(mode)


def node_root(tmp_path: Path) -> Path:
    """A node with its own network files: cloud-init's netplan file and a networkd file for the management link."""
    root = tmp_path / "node"
    put(root, CLOUD_INIT, CLOUD_INIT_TEXT, 0o600)
    put(root, MGMT, MGMT_TEXT)
    return root


def mode_of(root: Path, path: str) -> int:
    return stat.S_IMODE(os.lstat(root / path.lstrip("/")).st_mode)


def args(root: Path, backend: str = "netplan", files: dict[str, str] | None = None, **more: Any) -> dict[str, Any]:
    return {"backend": backend, "files": {NETPLAN_FILE: NETPLAN} if files is None else files, "owned": OWNED,
            "interfaces": TWINS, "root": str(root), **more}


def networkd_files() -> dict[str, str]:
    return {NETWORKD_A: networkd("enp1s0f0np0", "10.77.1.11/24"), NETWORKD_B: networkd("enp1s0f1np1", "10.77.2.11/24")}


def run_main(module_args: dict[str, Any], node: FakeNode, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(module_args), pytest.raises(SystemExit):
        fn.main(runner=node, clock=node.clock, sleep=node.sleep)
    return json.loads(capsys.readouterr().out)


def test_first_apply_writes_the_file_and_applies_it_to_the_twins_only(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    node = FakeNode()
    result = run_main(args(root), node, capsys)
    assert result["changed"] is True and result["applied"] is True, result
    assert result["files_written"] == [NETPLAN_FILE] and result["files_removed"] == []
    assert result["addresses"] == {"enp1s0f0np0": ["10.77.1.11/24"], "enp1s0f1np1": ["10.77.2.11/24"]}
    assert (root / NETPLAN_FILE.lstrip("/")).read_text(encoding="utf-8") == NETPLAN
    assert mode_of(root, NETPLAN_FILE) == 0o600
    assert node.acting() == CHECK + APPLY_NETPLAN  # never netplan apply, never the management link
    # The check saw the node's own netplan file beside the new one, and nothing was left behind.
    assert node.staged == {CLOUD_INIT.lstrip("/"): CLOUD_INIT_TEXT, NETPLAN_FILE.lstrip("/"): NETPLAN}
    assert not Path(next(c for c in node.commands if c[:3] == CHECK[0][:3])[3]).exists()
    assert not [p for p in (root / "etc" / "netplan").iterdir() if p.name.startswith(".")]  # no temporary file
    assert node.sleeps == []  # the addresses were there at the first read


def test_a_second_run_changes_nothing_and_runs_only_ip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    node = FakeNode()
    run_main(args(root), node, capsys)
    before = snapshot(root)
    node.commands.clear()
    again = run_main(dict(args(root), _ansible_diff=True), node, capsys)
    assert again["changed"] is False and again["applied"] is False
    assert again["files_written"] == [] and again["files_removed"] == [] and "diff" not in again
    assert node.commands == READS
    assert snapshot(root) == before


def test_a_wrong_mode_alone_is_a_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    put(root, NETPLAN_FILE, NETPLAN, 0o644)
    node = FakeNode(live=dict((k, [v]) for k, v in WANTED.items()))
    result = run_main(args(root), node, capsys)
    assert result["files_written"] == [NETPLAN_FILE] and mode_of(root, NETPLAN_FILE) == 0o600


def test_check_mode_touches_nothing_and_runs_nothing_but_ip(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    put(root, NETWORKD_A, "old\n")
    before = snapshot(root)
    node = FakeNode()
    result = run_main(dict(args(root), _ansible_check_mode=True, _ansible_diff=True), node, capsys)
    assert result["changed"] is True and result["applied"] is False
    assert result["files_written"] == [NETPLAN_FILE] and result["files_removed"] == [NETWORKD_A]
    assert [d["after_header"] for d in result["diff"]] == [f"{NETPLAN_FILE} (mode 0600)", f"{NETWORKD_A} (removed)"]
    assert node.commands == READS
    assert snapshot(root) == before


def test_check_mode_reports_a_missing_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    put(root, NETPLAN_FILE, NETPLAN, 0o600)
    node = FakeNode(live={"enp1s0f0np0": ["10.77.1.11/24"]})
    result = run_main(dict(args(root), _ansible_check_mode=True), node, capsys)
    assert result["changed"] is True and result["applied"] is False and result["files_written"] == []
    assert result["addresses"] == {"enp1s0f0np0": ["10.77.1.11/24"], "enp1s0f1np1": []}
    assert node.commands == READS


def test_the_diff_shows_each_written_and_removed_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    put(root, NETPLAN_FILE, NETPLAN_OLD, 0o644)
    put(root, NETWORKD_B, "stale\n")
    result = run_main(dict(args(root), _ansible_diff=True), FakeNode(), capsys)
    written, removed = result["diff"]
    assert written == {"before_header": f"{NETPLAN_FILE} (mode 0644)", "after_header": f"{NETPLAN_FILE} (mode 0600)",
                       "before": NETPLAN_OLD, "after": NETPLAN}
    assert removed == {"before_header": f"{NETWORKD_B} (mode 0644)", "after_header": f"{NETWORKD_B} (removed)",
                       "before": "stale\n", "after": ""}
    new = run_main(dict(args(tmp_path / "fresh"), _ansible_diff=True), FakeNode(), capsys)
    assert new["diff"] == [{"before_header": f"{NETPLAN_FILE} (absent)", "after_header": f"{NETPLAN_FILE} (mode 0600)",
                            "before": "", "after": NETPLAN}]


def test_a_switch_to_networkd_removes_sparkserve_netplan_file_and_nothing_else(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    run_main(args(root), FakeNode(), capsys)
    put(root, "/etc/netplan/60-sparkserve-fabric.yaml.bak", "kept\n")  # matches no pattern of owned
    others = [CLOUD_INIT.lstrip("/"), MGMT.lstrip("/"), "etc/netplan/60-sparkserve-fabric.yaml.bak"]
    before = snapshot(root)
    node = FakeNode(live=dict((k, [v]) for k, v in WANTED.items()))
    result = run_main(args(root, "networkd", networkd_files()), node, capsys)
    assert result["files_written"] == [NETWORKD_A, NETWORKD_B] and result["files_removed"] == [NETPLAN_FILE]
    assert not (root / NETPLAN_FILE.lstrip("/")).exists()
    assert mode_of(root, NETWORKD_A) == 0o644 and mode_of(root, NETWORKD_B) == 0o644
    after = snapshot(root)
    assert {p: after[p] for p in others} == {p: before[p] for p in others}  # not even rewritten
    # No generator check for networkd; netplan generate runs so that what it made of the removed file goes too.
    assert node.acting() == [["netplan", "generate"], *APPLY_NETWORKD]


def test_a_switch_back_to_netplan_removes_the_networkd_files(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    run_main(args(root, "networkd", networkd_files()), FakeNode(), capsys)
    mgmt = snapshot(root)[MGMT.lstrip("/")]
    cloud = snapshot(root)[CLOUD_INIT.lstrip("/")]
    node = FakeNode(live=dict((k, [v]) for k, v in WANTED.items()))
    result = run_main(args(root), node, capsys)
    assert result["files_written"] == [NETPLAN_FILE] and result["files_removed"] == [NETWORKD_A, NETWORKD_B]
    assert sorted(p.name for p in (root / "etc" / "systemd" / "network").iterdir()) == ["10-mgmt.network"]
    assert snapshot(root)[MGMT.lstrip("/")] == mgmt and snapshot(root)[CLOUD_INIT.lstrip("/")] == cloud
    assert node.acting() == CHECK + APPLY_NETPLAN


def test_networkd_runs_no_netplan_at_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    node = FakeNode()
    result = run_main(args(root, "networkd", networkd_files()), node, capsys)
    assert result["changed"] is True and (root / NETWORKD_A.lstrip("/")).read_text(encoding="utf-8").startswith(
        "[Match]\nName=enp1s0f0np0\n")
    assert node.acting() == APPLY_NETWORKD


def test_a_configuration_netplan_refuses_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    put(root, NETPLAN_FILE, NETPLAN_OLD, 0o600)
    put(root, NETWORKD_A, "stale\n")
    before = snapshot(root)
    node = FakeNode(live=dict((k, [v]) for k, v in WANTED.items()))
    node.generate_check = (1, f"STAGING{NETPLAN_FILE}:7:13: Error in network definition: invalid boolean value "
                              "'flase'\n      dhcp4: flase\n            ^\n")
    bad = NETPLAN.replace("dhcp4: false", "dhcp4: flase")
    result = run_main(args(root, files={NETPLAN_FILE: bad}), node, capsys)
    assert result["failed"] is True and result["changed"] is False
    msg = result["msg"]
    assert msg.startswith("netplan generate refused the fabric configuration; nothing was changed: ")
    assert f"{NETPLAN_FILE}:7:13: Error in network definition: invalid boolean value 'flase'" in msg
    assert "dhcp4: flase\n            ^" in msg and NETPLAN_FILE in msg and "sparkserve-netplan-" not in msg
    assert node.staged[NETPLAN_FILE.lstrip("/")] == bad and CLOUD_INIT.lstrip("/") in node.staged
    assert snapshot(root) == before
    assert node.acting() == CHECK


def test_addresses_that_never_come_up_restore_the_previous_files(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    old_bytes = b"# by hand, \xc3\xa9t\xc3\xa9\nnetwork: {version: 2}\n"
    (root / "etc" / "netplan" / "60-sparkserve-fabric.yaml").write_bytes(old_bytes)
    (root / "etc" / "netplan" / "60-sparkserve-fabric.yaml").chmod(0o640)
    put(root, NETWORKD_B, "the other backend\n", 0o644)
    node = FakeNode(comes_up=False, live={"enp1s0f0np0": ["10.77.1.5/24"]})
    result = run_main(dict(args(root, files={NETPLAN_FILE: NETPLAN, "/etc/netplan/60-sparkserve-extra.yaml": "x\n"}),
                           wait_s=10), node, capsys)
    assert result["failed"] is True and result["changed"] is True and result["applied"] is True
    assert result["msg"] == (
        "the fabric addresses did not come up within 10 s (enp1s0f0np0: wanted 10.77.1.11/24, has [10.77.1.5/24]; "
        "enp1s0f1np1: wanted 10.77.2.11/24, has []); the previous fabric configuration was restored")
    # Byte for byte, with its mode; the removed file is back; the new one is gone.
    assert (root / NETPLAN_FILE.lstrip("/")).read_bytes() == old_bytes and mode_of(root, NETPLAN_FILE) == 0o640
    assert (root / NETWORKD_B.lstrip("/")).read_text(encoding="utf-8") == "the other backend\n"
    assert not (root / "etc" / "netplan" / "60-sparkserve-extra.yaml").exists()
    assert node.acting() == CHECK + APPLY_NETPLAN + APPLY_NETPLAN  # applied, then the old files applied again
    assert sum(node.sleeps) == pytest.approx(10) and max(node.sleeps) <= 0.5 and len(node.sleeps) == 20


def test_a_failing_apply_restores_and_says_what_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    put(root, NETPLAN_FILE, NETPLAN_OLD, 0o600)
    before = (root / NETPLAN_FILE.lstrip("/")).read_bytes()
    node = FakeNode()
    node.failing[("networkctl", "reload")] = (1, "Failed to reload network settings: Connection timed out\n")
    result = run_main(args(root), node, capsys)
    assert result["failed"] is True
    assert result["msg"] == (
        "applying the fabric configuration failed: networkctl reload exited 1: Failed to reload network settings: "
        "Connection timed out; the previous fabric configuration was restored (applying it again: networkctl "
        "reload exited 1: Failed to reload network settings: Connection timed out)")
    assert (root / NETPLAN_FILE.lstrip("/")).read_bytes() == before
    assert node.acting() == CHECK + APPLY_NETPLAN[:2] + APPLY_NETPLAN
    assert node.sleeps == []


def test_a_missing_address_with_unchanged_files_applies_again(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    run_main(args(root), FakeNode(), capsys)
    before = snapshot(root)
    node = FakeNode(live={"enp1s0f0np0": ["10.77.1.11/24"], "enp1s0f1np1": []})  # its address was flushed
    result = run_main(dict(args(root), _ansible_diff=True), node, capsys)
    assert result["changed"] is True and result["applied"] is True and "diff" not in result
    assert result["files_written"] == [] and result["files_removed"] == []
    assert result["addresses"]["enp1s0f1np1"] == ["10.77.2.11/24"]
    assert node.acting() == APPLY_NETPLAN  # no generator check: no file changes
    assert snapshot(root) == before


def test_a_missing_address_that_stays_missing_leaves_the_files(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    run_main(args(root), FakeNode(), capsys)
    before = snapshot(root)
    node = FakeNode(comes_up=False, live={"enp1s0f0np0": ["10.77.1.11/24"]})
    result = run_main(dict(args(root), wait_s=1), node, capsys)
    assert result["failed"] is True
    assert result["msg"] == ("the fabric addresses did not come up within 1 s (enp1s0f1np1: wanted 10.77.2.11/24, "
                             "has []); the fabric configuration files were already as wanted and were left as they are")
    assert snapshot(root) == before and node.acting() == APPLY_NETPLAN


def test_an_address_with_another_prefix_is_not_the_address(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    run_main(args(root), FakeNode(), capsys)
    node = FakeNode(live={"enp1s0f0np0": ["10.77.1.11/16"], "enp1s0f1np1": ["10.77.2.11/24"]})
    result = run_main(args(root), node, capsys)
    assert result["changed"] is True and result["addresses"]["enp1s0f0np0"] == ["10.77.1.11/24"]


@pytest.mark.parametrize(("change", "message"), [
    ({"files": {"/etc/netplan/01-netcfg.yaml": "x\n"}},
     "files: /etc/netplan/01-netcfg.yaml matches no pattern of owned"),
    ({"files": {"etc/netplan/60-sparkserve-fabric.yaml": "x\n"}}, "is not an absolute path"),
    ({"owned": ["etc/netplan/*.yaml"]}, "owned: 'etc/netplan/*.yaml' is not an absolute pattern"),
    ({"interfaces": [{"name": "enp1s0f0np0", "address": "10.77.1.11"}]},
     "interfaces[0] (enp1s0f0np0): '10.77.1.11' is not an IPv4 address with its prefix length"),
    ({"interfaces": [{"name": "enp1s0f0np0", "address": "10.77.1.300/24"}]}, "'10.77.1.300/24' is not an IPv4"),
])
def test_refused_options_change_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any],
                                        message: str) -> None:
    root = node_root(tmp_path)
    before = snapshot(root)
    node = FakeNode()
    result = run_main({**args(root), **change}, node, capsys)
    assert result["failed"] is True and message in result["msg"]
    assert snapshot(root) == before and node.commands == []


def test_an_owned_path_that_is_not_a_regular_file_is_refused(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    (root / NETPLAN_FILE.lstrip("/")).symlink_to(root / CLOUD_INIT.lstrip("/"))
    before = snapshot(root)
    result = run_main(args(root), FakeNode(), capsys)
    assert result["failed"] is True and f"{NETPLAN_FILE} exists and is not a regular file" in result["msg"]
    assert snapshot(root) == before


def test_an_unreadable_ip_fails_before_anything_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    before = snapshot(root)

    def broken(argv: Sequence[str]) -> tuple[int, str, str]:
        if argv != IP:
            return FakeNode()(argv)
        return 1, "", "Cannot open netlink socket: Permission denied\n"

    with patch_module_args(args(root)), pytest.raises(SystemExit):
        fn.main(runner=broken)
    result = json.loads(capsys.readouterr().out)
    assert result["msg"] == "ip -j -4 addr show exited 1: Cannot open netlink socket: Permission denied"
    assert snapshot(root) == before


def test_a_stopped_networkd_is_enabled_and_started_before_the_addresses_are_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    run_main(args(root), FakeNode(), capsys)
    before = snapshot(root)
    node = FakeNode(live=dict((k, [v]) for k, v in WANTED.items()))
    node.networkd = {"enabled": False, "active": False}
    result = run_main(args(root), node, capsys)
    assert result["changed"] is True and result["service_changed"] is True and result["applied"] is False
    assert node.commands == [*SERVICE_READS, ["systemctl", "enable", NETWORKD_UNIT],
                             ["systemctl", "start", NETWORKD_UNIT], IP]
    assert node.networkd == {"enabled": True, "active": True} and snapshot(root) == before
    again = run_main(args(root), node, capsys)
    assert again["changed"] is False and again["service_changed"] is False


def test_check_mode_says_networkd_would_start_and_starts_nothing(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    put(root, NETPLAN_FILE, NETPLAN, 0o600)
    node = FakeNode(live=dict((k, [v]) for k, v in WANTED.items()))
    node.networkd = {"enabled": True, "active": False}
    result = run_main(dict(args(root), _ansible_check_mode=True), node, capsys)
    assert result["changed"] is True and result["service_changed"] is True and result["files_written"] == []
    assert node.commands == READS and node.networkd["active"] is False


def test_a_networkd_that_does_not_start_fails_before_any_file_changes(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    before = snapshot(root)
    node = FakeNode()
    node.networkd["active"] = False
    node.failing[("systemctl", "start", NETWORKD_UNIT)] = (1, "Job for systemd-networkd.service failed.\n")
    result = run_main(args(root), node, capsys)
    assert result["failed"] is True
    assert result["msg"] == ("the fabric's addresses need systemd-networkd.service running: systemctl start "
                             "systemd-networkd.service exited 1: Job for systemd-networkd.service failed. "
                             "(journalctl -u systemd-networkd.service says why)")
    assert snapshot(root) == before and IP not in node.commands


def test_an_empty_service_leaves_every_unit_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = node_root(tmp_path)
    node = FakeNode()
    node.networkd = {"enabled": False, "active": False}
    result = run_main(args(root, service=""), node, capsys)
    assert result["service_changed"] is False and not [c for c in node.commands if c[0] == "systemctl"]


def test_globs_match_as_glob_does_one_folder_at_a_time() -> None:
    assert fn.matches("/etc/netplan/60-sparkserve-fabric.yaml", "/etc/netplan/60-sparkserve-*.yaml")
    assert not fn.matches("/etc/netplan/60-sparkserve-x/y.yaml", "/etc/netplan/60-sparkserve-*.yaml")
    assert not fn.matches("/etc/netplan/50-cloud-init.yaml", "/etc/netplan/60-sparkserve-*.yaml")


def test_ip_output_is_read_per_interface() -> None:
    text = json.dumps([{}, {"ifname": "enp1s0f0np0", "addr_info": [
        {"family": "inet", "local": "10.77.1.11", "prefixlen": 24},
        {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]}, {"ifname": "enp1s0f1np1", "addr_info": []}])
    assert fn.parse_addresses(text) == {"enp1s0f0np0": ["10.77.1.11/24"], "enp1s0f1np1": []}


def test_the_real_runner_reports_a_missing_program() -> None:
    missing = "sparkserve-no-such-program-anywhere"
    assert fn.run([missing]) == (127, "", f"{missing}: not found")


def test_the_roce_devices_are_read_in_the_same_call_only_when_nothing_changed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sysfs = spark(tmp_path / "sysfs")
    roce = {k: v for k, v in sysfs.items() if k != "fail_on_problems"}
    root = node_root(tmp_path)
    node = FakeNode()
    # The first run applies the addresses: the GID table is read by a call of its own, after it.
    first = run_main(dict(args(root), roce=roce), node, capsys)
    assert first["changed"] is True and "roce" not in first and "ansible_facts" not in first
    again = run_main(dict(args(root), roce=roce), node, capsys)
    assert again["changed"] is False
    assert again["roce"] == rf.gather(sysfs) and again["ansible_facts"] == {"sparkserve_roce": again["roce"]}
    assert again["roce"]["gid_index"] == 3 and again["roce"]["problems"] == []
    # Problems are returned, not failed on (roce_facts, called for them, fails naming them).
    broken = spark(tmp_path / "broken", (3, 5))
    said = run_main(dict(args(root), roce={k: v for k, v in broken.items() if k != "fail_on_problems"}), node, capsys)
    assert not said.get("failed") and said["roce"]["problems"] == rf.gather(broken)["problems"] != []
    # Options roce_facts refuses leave the read to its call; nothing asked, nothing read.
    mismatched = dict(roce, addresses=roce["addresses"][:1])
    assert "roce" not in run_main(dict(args(root), roce=mismatched), node, capsys)
    assert "roce" not in run_main(args(root), node, capsys)
