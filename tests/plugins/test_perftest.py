"""The node library's reader of ib_write_bw's output (module_utils/node/perftest.py), on real recorded outputs.

tests/fixtures/perftest/ holds outputs published from real runs, each with its source on its first line
(README.md there): two DGX Spark clients (an endless run, a timed one), a server over RoCE, and a client with
no server to answer it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import perftest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "perftest"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_every_fixture_names_its_source_on_its_first_line() -> None:
    names = sorted(p.name for p in FIXTURES.glob("*.txt"))
    assert names == ["client-no-server.txt", "server-roce-rdma-cm.txt", "spark-client-duration.txt",
                     "spark-client-run-infinitely.txt"]
    for name in names:
        assert fixture(name).startswith("# Source: https://github.com/"), name


def test_a_spark_client_of_a_timed_run_gives_its_figures_and_no_peak() -> None:
    report = perftest.read(fixture("spark-client-duration.txt"))
    assert perftest.summary(report) == {
        "side": "client", "device": "roceP2p1s0f1", "link_type": "Ethernet", "mtu_bytes": 4096, "gid_index": 3,
        "bytes": 1048576, "iterations": 71244, "bw_peak_gbps": None, "bw_average_gbps": 99.61,
        "msg_rate_mpps": 0.011874}
    assert report["qps"] == 4 and report["unit"] == "Gb/sec" and not report["peak_measured"]
    assert report["settings"]["rdma_cm QPs"] == "OFF" and report["settings"]["TX depth"] == "128"
    assert [a["ipv4"] for a in report["local"]] == ["10.252.161.208"]
    assert report["remote"] == [{"LID": "0000", "QPN": "0x02bc", "PSN": "0xa81962", "RKey": "0x1e05f1",
                                 "VAddr": "0x00d1e83af21000",
                                 "gid": "00:00:00:00:00:00:00:00:00:00:255:255:10:252:161:209",
                                 "ipv4": "10.252.161.209"}]


def test_an_endless_spark_run_gives_the_last_interval_and_keeps_every_row() -> None:
    report = perftest.read(fixture("spark-client-run-infinitely.txt"))
    assert report["device"] == "rocep1s0f0" and report["mtu_bytes"] == 1024 and report["side"] == "client"
    assert [row["bw_average_gbps"] for row in report["rows"]] == [92.57, 92.57, 92.57, 92.56, 92.57]
    assert report["iterations"] == 882821 and report["bw_average_gbps"] == 92.57
    assert report["bw_peak_gbps"] is None  # the run said so: "BW peak won't be measured"
    assert report["local"][0]["ipv4"] == "192.168.200.13" and report["remote"][0]["ipv4"] == "192.168.200.12"


def test_the_server_side_prints_the_clients_figures_after_its_banner_and_other_noise() -> None:
    report = perftest.read(fixture("server-roce-rdma-cm.txt"))
    assert report["side"] == "server" and report["device"] == "mlx5_1" and report["qps"] == 16
    assert len(report["local"]) == 16 and len(report["remote"]) == 16  # one address line per queue pair
    assert report["bw_average_gbps"] == 181.46 and report["iterations"] == 10384867
    assert report["settings"]["Data ex. method"] == "rdma_cm" and report["settings"]["TOS"] == "41"
    assert report["local"][0]["ipv4"] == "10.6.145.32"


def test_a_client_with_no_server_is_an_error_that_says_what_it_means() -> None:
    with pytest.raises(perftest.PerftestError) as raised:
        perftest.read(fixture("client-no-server.txt"))
    message = str(raised.value)
    assert message.startswith("ib_write_bw gave no result: no ib_write_bw server answered at 192.168.125.211:18515")
    assert message.endswith("(Couldn't connect to 192.168.125.211:18515)")


@pytest.mark.parametrize(("output", "said"), [
    ("IB device mlx5_9 not found\n Unable to find the Infiniband/RoCE device\n", "this node has no RDMA device mlx5_9"),
    (" Port number 1 state is Down\n Couldn't get context for the device\n",
     "the device's port 1 is Down, not ACTIVE: its twin is down"),
    ("\n************************************\n* Waiting for client to connect... *\n"
     "************************************\nCouldn't listen to port 18515\n", "port 18515 is taken on this node"),
    ("\n************************************\n* Waiting for client to connect... *\n"
     "************************************\n", "ib_write_bw's server saw no client"),
    ("", "no result table): the output is empty"),
    ("bash: ib_write_bw: command not found\n", "no result table): bash: ib_write_bw: command not found"),
])
def test_outputs_that_are_no_result_are_named(output: str, said: str) -> None:
    with pytest.raises(perftest.PerftestError) as raised:
        perftest.read(output)
    assert said in str(raised.value)


def test_a_table_without_a_row_and_a_latency_test_are_no_bandwidth_result() -> None:
    text = fixture("spark-client-duration.txt")
    cut = text[: text.index(" 1048576    71244")]
    with pytest.raises(perftest.PerftestError, match="table's header but no result row"):
        perftest.read(cut)
    latency = ("---\n                    RDMA_Write Latency Test\n Link type       : Ethernet\n"
               " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]\n"
               " 2       1000          1.42           1.93         1.47                1.47\n")
    with pytest.raises(perftest.PerftestError, match="no result table"):
        perftest.read(latency)


def test_a_table_in_mebibytes_is_read_in_gigabits() -> None:
    text = fixture("spark-client-duration.txt").replace("[Gb/sec]", "[MB/sec]").replace("99.61", "11874.50")
    report = perftest.read(text)
    assert report["unit"] == "MB/sec"
    assert report["bw_average_gbps"] == pytest.approx(11874.50 * 2**20 * 8 / 1e9, abs=1e-3)


def test_the_gate_names_the_link_the_figure_the_floor_and_the_likely_cause() -> None:
    link = perftest.link_name("spark-2", "rocep1s0f0", "spark-1", "rocep1s0f0")
    assert link == "spark-2:rocep1s0f0 -> spark-1:rocep1s0f0"
    endless = perftest.read(fixture("spark-client-run-infinitely.txt"))
    assert perftest.gate(endless["bw_average_gbps"], 80, link, endless) is None
    assert perftest.gate(80.0, 80, link) is None  # at the floor passes
    under = perftest.gate(endless["bw_average_gbps"], 95, link, endless)
    assert under is not None and under.startswith(f"{link}: 92.57 Gb/s, under the floor of 95 Gb/s; likely ")
    assert "MTU of 1024 bytes" in under  # that run's RoCE MTU points at the interfaces' MTU first
    timed = perftest.read(fixture("spark-client-duration.txt"))
    degraded = perftest.gate(13.23, 80, link, timed)
    assert degraded is not None and "MTU of" not in degraded and "8-25 Gb/s of a ConnectX-7" in degraded
    assert "a twin down" in degraded and "lower speed than 200 Gb/s" in degraded
    nothing = perftest.gate(None, 80, link)
    assert nothing is not None and nothing.startswith(f"{link}: no figure, under the floor of 80 Gb/s")


def test_the_command_of_each_side() -> None:
    assert perftest.command("rocep1s0f1", 18515, 5, 65536, 3) == [
        "ib_write_bw", "-d", "rocep1s0f1", "-p", "18515", "-D", "5", "-s", "65536", "-F", "--report_gbits", "-x", "3"]
    client = perftest.command("roceP2p1s0f1", 18600, 10, 1048576, None, "10.77.2.11", "/usr/bin/ib_write_bw")
    assert client[0] == "/usr/bin/ib_write_bw" and client[-1] == "10.77.2.11" and "-x" not in client
