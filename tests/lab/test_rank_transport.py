"""Which network NCCL uses, read from a rank's log: real NCCL output, the lab double's, and the launch's module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import nccl_log
from ansible_collections.sparkserve.deploy.plugins.modules import rank_transport
from vllm_double.nccl import nccl_log_lines  # the lab's engine double, as it prints them (tests/lab/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/nccl"

pytestmark = pytest.mark.usefixtures("as_module")

TWINS = ["rocep1s0f1", "roceP2p1s0f1"]
FABRIC_ENV = {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1",
              "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "VLLM_HOST_IP": "10.77.1.11"}


def double_log(net: str, env: dict[str, str] | None = None) -> str:
    lines = nccl_log_lines({**FABRIC_ENV, "VLLM_DOUBLE_NCCL_NET": net, **(env or {})}, "spark-1", 812, 0, 2)
    return "INFO 12-06 01:00:00 loading\n" + "\n".join(lines) + "\nINFO 12-06 01:00:05 engine ready\n"


def test_real_nccl_on_sockets_is_read_as_sockets_with_its_own_line() -> None:
    report = nccl_log.read((FIXTURES / "h200x2-a-net-only.log").read_text(encoding="utf-8"))
    assert report["transport"] == "NET/Socket" and report["no_ib_device"] and report["said"]
    assert report["hcas"] == []  # the socket interface is no HCA
    assert report["line"] == "vm:611:611 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>"
    problem = nccl_log.problem(report, TWINS)
    assert problem is not None and problem.startswith("NCCL runs over TCP sockets, not RDMA: NCCL found no RDMA device")


def test_rdma_over_both_twins_is_no_problem_and_one_twin_is_half_the_bandwidth() -> None:
    report = nccl_log.read(double_log("IB"))
    assert report["transport"] == "NET/IB" and report["hcas"] == TWINS
    assert "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE" in report["line"]
    assert nccl_log.problem(report, TWINS) is None
    one = nccl_log.read(double_log("IB", {"NCCL_IB_HCA": "rocep1s0f1"}))
    problem = nccl_log.problem(one, TWINS)
    assert problem is not None and "not over roceP2p1s0f1" in problem and "half the fabric's bandwidth" in problem


def test_a_failed_memory_registration_is_named_before_the_fallback_it_causes() -> None:
    report = nccl_log.read(double_log("regmr"))
    assert report["reg_mr_failed"] and report["transport"] == "NET/Socket"
    problem = nccl_log.problem(report, TWINS)
    assert problem is not None and problem.startswith("RDMA memory registration failed")
    assert "ibv_reg_mr failed with error Cannot allocate memory" in problem and "ulimit -l" in problem


def test_a_log_without_nccl_lines_says_to_let_nccl_speak() -> None:
    report = nccl_log.read("INFO loading\nINFO engine ready\n")
    assert not report["said"] and report["transport"] is None
    assert "NCCL_DEBUG" in (nccl_log.problem(report, TWINS) or "")


def test_channels_decide_over_the_loaded_network() -> None:
    text = ("h:1:1 [0] NCCL INFO Using network IB\n"
            "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
            "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n")
    assert nccl_log.read(text)["transport"] == "NET/Socket"
    assert nccl_log.read((FIXTURES / "h200x2-c-p2p.log").read_text(encoding="utf-8"))["transport"] == "P2P"


class FakeRunner:
    """docker logs of each container, here or over ssh; what each call got."""

    def __init__(self, logs: dict[str, str], failing: Sequence[str] = ()) -> None:
        self.logs, self.failing, self.calls = logs, set(failing), []  # type: ignore[var-annotated]

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        name = argv[-1].split()[-1]
        if name in self.failing:
            return 255, "", "ssh: connect to host spark-2 port 22: No route to host"
        return 0, self.logs[name], ""


def test_the_module_names_each_rank_its_node_and_nccls_line(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    runner = FakeRunner({"lab-tp2-rank0": double_log("IB"), "lab-tp2-rank1": double_log("Socket")})
    monkeypatch.setattr(rank_transport, "run_command", runner)
    containers = [{"name": "lab-tp2-rank0", "rank": 0, "host": ""},
                  {"name": "lab-tp2-rank1", "rank": 1, "host": "spark-2"}]
    args = {"containers": containers, "deployment": "lab-tp2", "hcas": TWINS, "this_node": "spark-1"}
    with patch_module_args(args), \
            pytest.raises(SystemExit):
        rank_transport.main()
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert out["changed"] is False
    assert [(r["rank"], r["node"], r["transport"]) for r in out["ranks"]] == [(0, "spark-1", "NET/IB"),
                                                                              (1, "spark-2", "NET/Socket")]
    assert len(out["problems"]) == 1 and out["problems"][0].startswith("rank 1 on spark-2: NCCL runs over TCP sockets")
    assert runner.calls[0] == ["docker", "logs", "lab-tp2-rank0"]
    assert runner.calls[1][:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    assert runner.calls[1][5:] == ["spark-2", "--", "docker logs lab-tp2-rank1"]


def test_a_log_that_cannot_be_read_is_a_problem_of_that_rank() -> None:
    runner = FakeRunner({}, failing=["lab-tp2-rank1"])
    entry = rank_transport.read_rank({"name": "lab-tp2-rank1", "rank": 1, "host": "spark-2"}, TWINS, "spark-1", runner)
    assert entry["node"] == "spark-2" and entry["transport"] is None
    assert entry["problem"].startswith("its log could not be read: ssh: connect to host spark-2")
