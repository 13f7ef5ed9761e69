"""Tests for peer_links: every probe runs at once, and who did not answer is named."""

from __future__ import annotations

import json
import threading
from typing import Sequence

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import peer_links as pl

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")


def test_probes_use_full_mtu_with_dont_fragment_and_batch_ssh() -> None:
    seen: list[list[str]] = []
    lock = threading.Lock()

    def runner(argv: Sequence[str], timeout_s: int) -> int:
        with lock:
            seen.append(list(argv))
        return 0

    result = pl.check(["10.77.1.12"], 9000, ["spark-2"], 5, runner)
    assert result == {"unanswered_pings": [], "unanswered_ssh": []}
    assert ["ping", "-c", "1", "-W", "5", "-M", "do", "-s", "8972", "10.77.1.12"] in seen
    assert ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "spark-2", "true"] in seen


def test_silent_peers_are_named_in_order() -> None:
    def runner(argv: Sequence[str], timeout_s: int) -> int:
        return 1 if argv[-1] in ("10.77.2.13", "10.77.1.14") or argv[-2] == "spark-3" else 0

    result = pl.check(["10.77.1.12", "10.77.1.14", "10.77.2.13"], 9000, ["spark-2", "spark-3"], 5, runner)
    assert result == {"unanswered_pings": ["10.77.1.14", "10.77.2.13"], "unanswered_ssh": ["spark-3"]}


def test_probes_run_at_once() -> None:
    # Eight probes: each waits until all eight are running. Run in turn (or fewer at a time), the first
    # would wait in vain, the barrier would break after 30 s, and the check would raise.
    together = threading.Barrier(8, timeout=30)
    passed: list[str] = []
    lock = threading.Lock()

    def slow(argv: Sequence[str], timeout_s: int) -> int:
        together.wait()
        with lock:
            passed.append(argv[-1] if argv[0] == "ping" else argv[-2])
        return 0

    result = pl.check([f"10.77.1.{n}" for n in range(10, 16)], 9000, ["a", "b"], 5, slow)
    assert result == {"unanswered_pings": [], "unanswered_ssh": []}
    assert sorted(passed) == sorted([f"10.77.1.{n}" for n in range(10, 16)] + ["a", "b"])


def test_main_fails_naming_the_silent_peers(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(pl, "run", lambda argv, timeout_s: 1 if argv[0] == "ping" else 0)
    args = {"addresses": ["10.77.1.12"], "mtu": 9000, "ssh_hosts": ["spark-2"]}
    with patch_module_args(args), pytest.raises(SystemExit):
        pl.main()
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] is True
    assert "no answer at MTU 9000 with don't-fragment set from 10.77.1.12" in out["msg"]
    assert out["unanswered_ssh"] == []


def test_main_refuses_an_mtu_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    with patch_module_args({"addresses": [], "mtu": 65000}), pytest.raises(SystemExit):
        pl.main()
    assert "mtu 65000 is outside 1280..9216" in json.loads(capsys.readouterr().out)["msg"]


IP_ADDR = [
    {"ifname": "lo", "mtu": 65536, "addr_info": [{"local": "127.0.0.1"}]},
    {"ifname": "enp1s0f1np1", "mtu": 9000, "addr_info": [{"local": "10.77.1.11"}]},
    {"ifname": "enP2p1s0f1np1", "mtu": 1500, "addr_info": [{"local": "10.77.2.11"}]},
    {"ifname": "enp9", "mtu": 9000, "addr_info": []},
]


def test_each_twin_is_checked_for_its_address_and_mtu() -> None:
    links = [{"interface": "enp1s0f1np1", "address": "10.77.1.11"},
             {"interface": "enP2p1s0f1np1", "address": "10.77.2.11"},
             {"interface": "enp9", "address": "10.77.9.11"},
             {"interface": "missing0", "address": "10.77.3.11"}]
    assert pl.link_problems(links, IP_ADDR, 9000) == [
        "enP2p1s0f1np1 has MTU 1500, the fabric needs 9000 on every node; set it the same everywhere",
        "enp9 lacks its fabric address 10.77.9.11 (it has none); apply the fabric configuration",
        "missing0 does not exist; check sparkserve_fabric_interfaces against `ip link`",
    ]
    assert pl.link_problems(links[:1], IP_ADDR, 9000) == []


def test_main_stops_at_a_bad_twin_before_any_probe(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    probes: list[Sequence[str]] = []
    monkeypatch.setattr(pl, "read_links", lambda: IP_ADDR)
    monkeypatch.setattr(pl, "run", lambda argv, timeout_s: probes.append(argv) or 0)
    args = {"links": [{"interface": "enP2p1s0f1np1", "address": "10.77.2.11"}], "addresses": ["10.77.2.12"],
            "mtu": 9000}
    with patch_module_args(args), pytest.raises(SystemExit):
        pl.main()
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] is True and probes == []
    assert out["msg"] == "enP2p1s0f1np1 has MTU 1500, the fabric needs 9000 on every node; set it the same everywhere"
