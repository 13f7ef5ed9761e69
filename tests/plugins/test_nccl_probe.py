"""Tests for the NCCL probe: the program's arithmetic, the output parser and the recipe's gate."""

from __future__ import annotations

import json

import pytest

from ansible_collections.sparkserve.deploy.plugins.filter import nccl_probe as nf
from ansible_collections.sparkserve.deploy.plugins.module_utils import nccl_probe as np_
from tests.scripts import ROOT, load_script

probe = load_script("roles/fabric/files/sparkserve-nccl-probe.py", "sparkserve_nccl_probe")

IB_LOG = """\
spark-1:812:812 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to enp1s0f1np1
spark-1:812:812 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:10.77.1.11<0>
spark-1:812:812 [0] NCCL INFO Using network IB
spark-1:812:830 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
spark-1:812:830 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/1/GDRDMA
spark-1:812:830 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
SPARKSERVE_NCCL {"algbw_gbps": 9.1, "busbw_gbps": 9.1, "size_bytes": 16777216, "time_us": 1843.7}
SPARKSERVE_NCCL {"algbw_gbps": 20.4, "busbw_gbps": 20.4, "size_bytes": 536870912, "time_us": 26317.2}
SPARKSERVE_NCCL {"algbw_gbps": 19.8, "busbw_gbps": 19.8, "size_bytes": 134217728, "time_us": 6778.6}
SPARKSERVE_NCCL_DONE {"correct": true, "world_size": 2}
"""  # noqa: E501 (NCCL's log lines, verbatim)

SOCKET_LOG = """\
spark-1:812:812 [0] NCCL INFO NET/IB : No device found.
spark-1:812:812 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:10.77.1.11<0>
spark-1:812:812 [0] NCCL INFO Using network Socket
spark-1:812:830 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
SPARKSERVE_NCCL {"algbw_gbps": 1.1, "busbw_gbps": 1.1, "size_bytes": 536870912, "time_us": 488064.0}
SPARKSERVE_NCCL_DONE {"correct": true, "world_size": 2}
"""


def test_bus_factor_matches_nccl_tests() -> None:
    assert probe.bus_factor(2) == 1.0
    assert probe.bus_factor(4) == 1.5
    assert probe.bus_factor(8) == 1.75


def test_probe_arguments_become_byte_sizes_and_bad_ranks_are_refused() -> None:
    args = probe.parse_args(["--master-addr", "10.77.1.11", "--master-port", "29599", "--nnodes", "2",
                             "--node-rank", "1", "--sizes-mib", "1,0.5,512"])
    assert args.sizes == [1048576, 524288, 536870912]
    with pytest.raises(SystemExit):
        probe.parse_args(["--master-addr", "h", "--master-port", "1", "--nnodes", "2", "--node-rank", "2"])


def test_probe_without_torch_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch raises ImportError
    rc = probe.main(["--master-addr", "h", "--master-port", "1", "--nnodes", "1", "--node-rank", "0"])
    assert rc == 3
    assert "no PyTorch" in capsys.readouterr().err


def test_rdma_run_reports_ib_and_the_largest_size() -> None:
    report = np_.parse(IB_LOG)
    assert report["transport"] == "NET/IB"
    assert report["busbw_gbps"] == 20.4 and report["size_bytes"] == 536870912
    assert report["complete"] and report["correct"] and report["world_size"] == 2
    assert report["net_devices"] == ["[0]rocep1s0f1:1/RoCE", "[1]roceP2p1s0f1:1/RoCE"]
    assert report["network"] == "NET/IB"
    assert len(report["results"]) == 3
    assert np_.gate(report, 15, ["NET/IB"]) == []


def test_socket_fallback_is_named_with_what_to_check() -> None:
    report = np_.parse(SOCKET_LOG)
    assert report["transport"] == "NET/Socket"
    problems = np_.gate(report, 15, ["NET/IB"])
    assert len(problems) == 2
    assert "fell back to NET/Socket" in problems[0] and "NCCL_IB_HCA" in problems[0]
    assert "1.10 GB/s at 512 MiB is below the recipe's 15.00 GB/s" in problems[1]
    assert np_.gate(report, 1, ["NET/IB", "NET/Socket"]) == []


def test_one_channel_falling_back_counts_as_socket() -> None:
    mixed = IB_LOG + "x [0] NCCL INFO Channel 02/0 : 0[0] -> 1[0] [send] via NET/Socket/1\n"
    assert np_.parse(mixed)["transport"] == "NET/Socket"


def test_ib_plugins_count_as_ib_and_intra_node_transports_are_seen() -> None:
    log = ("x NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
           "x NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IBext_v8/0/GDRDMA\n"
           'SPARKSERVE_NCCL {"busbw_gbps": 30.0, "size_bytes": 1048576}\n'
           'SPARKSERVE_NCCL_DONE {"correct": true, "world_size": 4}\n')
    report = np_.parse(log)
    assert report["transport"] == "NET/IB"
    assert report["transports_seen"] == ["NET/IB", "P2P"]
    p2p_only = np_.parse("x NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n" + log.split("\n", 2)[2])
    assert p2p_only["transport"] == "P2P"
    assert "NCCL used P2P between ranks; the recipe allows NET/IB" in np_.gate(p2p_only, 1, ["NET/IB"])[0]


def test_an_unfinished_probe_fails_with_nccls_warning() -> None:
    log = ("x [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE\n"
           "x [0] NCCL WARN NET/IB : rocep1s0f1:1 Got completion from peer 10.77.1.12<0> with error 12\n")
    report = np_.parse(log)
    assert not report["complete"] and report["busbw_gbps"] is None
    assert np_.gate(report, 15, ["NET/IB"]) == [
        "the NCCL probe did not finish: NET/IB : rocep1s0f1:1 Got completion from peer 10.77.1.12<0> with error 12"]


def test_a_wrong_sum_fails_even_when_fast() -> None:
    log = IB_LOG.replace('"correct": true', '"correct": false')
    assert np_.gate(np_.parse(log), 15, ["NET/IB"]) == [
        "the all-reduce gave a wrong sum: a rank computes or communicates wrongly"]


def test_malformed_result_lines_are_ignored() -> None:
    report = np_.parse("SPARKSERVE_NCCL {not json\nSPARKSERVE_NCCL [1, 2]\nSPARKSERVE_NCCLX {}\n")
    assert report["results"] == [] and not report["complete"]


def test_filters_are_the_same_functions() -> None:
    filters = nf.FilterModule().filters()
    report = filters["nccl_probe_report"](IB_LOG)
    assert report == np_.parse(IB_LOG)
    assert filters["nccl_probe_gate"](report, "25", ("NET/IB",))[0].startswith("all-reduce bus bandwidth 20.40")
    assert json.dumps(report)  # plain data, fit for Ansible


# Real output of rank 0 of the probe on two H200s of one host (NCCL 2.28.9), run by
# tools/nccl-probe-local.py: once kept off NVLink and shared memory with no RDMA
# device (the fallback to sockets a Spark shows with a wrong NCCL_IB_HCA), once
# with NVLink allowed (NCCL still loads its socket network then, unused).
def fixture(name: str) -> str:
    return (ROOT / "tests/fixtures/nccl" / name).read_text()


def test_real_socket_fallback_is_caught() -> None:
    report = np_.parse(fixture("h200x2-a-net-only.log"))
    assert report["transport"] == "NET/Socket" and report["transports_seen"] == ["NET/Socket"]
    assert report["net_devices"] == ["[0]lo:127.0.0.1<0>"]
    assert report["complete"] and report["correct"] and report["world_size"] == 2
    assert [r["size_bytes"] for r in report["results"]] == [1048576, 16777216, 134217728, 536870912]
    assert 0 < report["busbw_gbps"] < 15
    problems = np_.gate(report, 15, ["NET/IB"])
    assert "fell back to NET/Socket" in problems[0] and "below the recipe's 15.00 GB/s" in problems[1]


def test_real_nvlink_run_counts_channels_not_the_loaded_network() -> None:
    report = np_.parse(fixture("h200x2-c-p2p.log"))
    assert report["network"] == "NET/Socket"
    assert report["transport"] == "P2P" and report["transports_seen"] == ["P2P"]
    assert report["busbw_gbps"] > 100
    assert np_.gate(report, 50, ["P2P"]) == []
