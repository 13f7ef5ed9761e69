"""The link_bench module: the client's figures and gate on real outputs, check mode, the server's bookkeeping.

Its runs of the lab's stand-in (a server detached and ended, a client over TCP) are in tests/lab/test_ib_write_bw.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import link_bench

pytestmark = pytest.mark.usefixtures("as_module")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "perftest"
LINK = "spark-2:roceP2p1s0f1 -> spark-1:roceP2p1s0f1"


class Runner:
    """A recorded output as the client's; the argv and timeout it was given."""

    def __init__(self, fixture: str, rc: int = 0) -> None:
        self.text = (FIXTURES / fixture).read_text(encoding="utf-8")
        self.rc = rc
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        self.calls.append((list(argv), timeout_s))
        # The failure lines go to stderr, the figures to stdout, as ib_write_bw writes them.
        return (self.rc, self.text, "") if self.rc == 0 else (self.rc, "", self.text)


def test_a_client_over_its_floor_gives_its_figures_and_no_problem() -> None:
    runner = Runner("spark-client-duration.txt")
    result = link_bench.measure(["ib_write_bw", "10.77.2.11"], 65, LINK, 80.0, runner)
    assert runner.calls == [(["ib_write_bw", "10.77.2.11"], 65)]
    assert result["problem"] is None and result["bandwidth_gbps"] == 99.61
    assert result["report"]["device"] == "roceP2p1s0f1" and result["report"]["bw_peak_gbps"] is None
    assert "RDMA_Write BW Test" in result["output"]


def test_a_client_under_its_floor_names_the_link_and_keeps_its_figures() -> None:
    result = link_bench.measure(["ib_write_bw"], 65, LINK, 100.0, Runner("spark-client-duration.txt"))
    assert result["bandwidth_gbps"] == 99.61
    assert result["problem"].startswith(f"{LINK}: 99.61 Gb/s, under the floor of 100 Gb/s; likely ")


def test_a_client_without_a_floor_is_not_gated() -> None:
    assert link_bench.measure(["x"], 5, LINK, None, Runner("spark-client-duration.txt"))["problem"] is None


def test_a_client_that_found_no_server_names_the_link_and_what_perftest_said() -> None:
    result = link_bench.measure(["ib_write_bw"], 65, LINK, 80.0, Runner("client-no-server.txt", rc=1))
    assert result["bandwidth_gbps"] is None and result["report"] is None
    assert result["problem"].startswith(f"{LINK}: ib_write_bw gave no result: no ib_write_bw server answered at "
                                        "192.168.125.211:18515")


def test_a_client_that_hung_says_so() -> None:
    def hung(argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        return 124, " WARNING: BW peak won't be measured in this run.\n", "no answer after 65 s"

    result = link_bench.measure(["ib_write_bw"], 65, LINK, 80.0, hung)
    assert result["problem"].startswith(f"{LINK}: ib_write_bw did not end within 65 s")


def test_figures_from_a_run_that_exited_non_zero_are_not_trusted() -> None:
    result = link_bench.measure(["x"], 5, LINK, 80.0, Runner("spark-client-duration.txt", rc=1))
    assert result["problem"] == f"{LINK}: ib_write_bw exited with status 1 after printing its figures"


def test_check_mode_runs_nothing_and_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing runs in check mode")

    monkeypatch.setattr(link_bench, "run_command", no_run)
    monkeypatch.setattr(link_bench, "start_server", no_run)
    for role in ("server", "stop", "client"):
        args = {"role": role, "device": "rocep1s0f1", "server_address": "10.77.1.11", "node": "spark-2",
                "peer": "spark-1", "peer_device": "rocep1s0f1", "state_dir": str(tmp_path), "_ansible_check_mode": True}
        with patch_module_args(args), pytest.raises(SystemExit):
            link_bench.main()
        out = json.loads(capsys.readouterr().out)
        assert out["ran"] is False and out["changed"] is False and "failed" not in out
        assert out["msg"] == f"check mode: ib_write_bw was not run ({role})"
    assert out["link"] == "spark-2:rocep1s0f1 -> spark-1:rocep1s0f1" and out["bandwidth_gbps"] is None


def test_a_client_needs_its_server_address(capsys: pytest.CaptureFixture[str]) -> None:
    with patch_module_args({"role": "client", "device": "rocep1s0f1"}), pytest.raises(SystemExit):
        link_bench.main()
    assert "server_address" in json.loads(capsys.readouterr().out)["msg"]


def test_stopping_a_port_with_no_server_ends_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ib_write_bw-18515.log").write_text(
        (FIXTURES / "server-roce-rdma-cm.txt").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "ib_write_bw-18515.pid").write_text("1\n", encoding="ascii")  # init: not a server of ours
    with patch_module_args({"role": "stop", "state_dir": str(tmp_path)}), pytest.raises(SystemExit):
        link_bench.main()
    out = json.loads(capsys.readouterr().out)
    assert out["changed"] is False and out["ran"] is False and out["msg"] == "no server of this port was running"
    assert out["bandwidth_gbps"] == 181.46 and out["report"]["side"] == "server"  # what the server printed
    assert not (tmp_path / "ib_write_bw-18515.pid").exists()


def test_a_listening_port_is_read_from_the_kernels_tables(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000:4863 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n"
        "   1: 0100007F:4864 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1\n",
        encoding="ascii")
    assert link_bench.listening(18531, [str(table)])  # 0x4863
    assert not link_bench.listening(18532, [str(table)])  # 0x4864 is connected, not listening
    assert not link_bench.listening(18531, [str(tmp_path / "absent")])
