"""The lab's stand-in for ib_write_bw (lab/node/rootfs/usr/local/bin/ib_write_bw), read by the reader of real runs.

Server and client run here on 127.0.0.1, over a device of an RDMA tree that the lab's own hardware tool writes
(sparkserve-lab-hw), and really move bytes over TCP. Their output is read with the node library's reader, the one
that reads the recorded outputs of real Sparks (tests/fixtures/perftest), and laid line by line beside one of them.
The module link_bench runs the stand-in as it runs the real tool: the server detached and bounded, then ended.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import perftest
from ansible_collections.sparkserve.deploy.plugins.modules import link_bench
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = ROOT / "lab/node/rootfs/usr/local/bin/ib_write_bw"
FIXTURES = ROOT / "tests/fixtures/perftest"
hw = load_script("lab/node/rootfs/usr/local/sbin/sparkserve-lab-hw", "lab_hw_for_ib_write_bw")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Any]:
    """A lab node's config and RDMA tree, as sparkserve-lab-hw writes them: rocep1s0f1 on 127.0.0.1 (RoCE v2 GID
    at 3), roceP2p1s0f1 capped at 0.3 Gb/s, rocep9s0f0 with its port DOWN."""
    raw = {"hostname": "spark-1", "rdma_root": str(tmp_path / "infiniband"), "interfaces": [
        {"name": "lo", "subnet": "127.0.0.0/24", "address": "127.0.0.1", "rdma": {"device": "rocep1s0f1"}},
        {"name": "lo-slow", "subnet": "127.0.1.0/24", "address": "127.0.1.1",
         "rdma": {"device": "roceP2p1s0f1", "gid_index": 4, "bench_gbps": 0.3}},
        {"name": "lo-down", "subnet": "127.0.2.0/24", "address": "127.0.2.1",
         "rdma": {"device": "rocep9s0f0", "port_state": "DOWN"}}]}
    config = hw.parse_config(raw)
    addresses = {i.name: i.address for i in config.interfaces}
    hw.write_rdma_tree(config.rdma_root, config.interfaces, addresses, "spark-1", tmp_path / "net")
    path = tmp_path / "node.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return {"config": str(path), "env": {**os.environ, "SPARKSERVE_LAB_NODE_CONFIG": str(path)}, "tmp": tmp_path}


def argv(device: str, port: int, server: str | None = None, gid: int | None = 3, duration: int = 1) -> list[str]:
    """The command the module gives the real tool, with the stand-in in its place."""
    return perftest.command(device, port, duration, 65536, gid, server, str(STAND_IN))


def serve(node: dict[str, Any], device: str, port: int, gid: int | None = 3) -> subprocess.Popen[str]:
    server = subprocess.Popen([sys.executable, *argv(device, port, None, gid)], env=node["env"], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while not link_bench.listening(port):
        assert server.poll() is None, server.communicate()[0]
        assert time.monotonic() < deadline, "the stand-in's server did not listen"
        time.sleep(0.05)
    return server


def write(node: dict[str, Any], device: str, port: int, gid: int | None = 3) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv(device, port, "127.0.0.1", gid)], env=node["env"], text=True,
                          capture_output=True, timeout=60, check=False)


def shape(line: str) -> str:
    """A line with what differs between runs and devices (names, numbers, made-up keys) taken out."""
    line = re.sub(r"\broce\w+|\bmlx5_\d+", "DEV", line)
    line = re.sub(r"0x[0-9a-f]+", "H", line)
    return re.sub(r" +", " ", re.sub(r"\d+(\.\d+)?", "N", line))  # the tabs stay


def test_the_stand_in_is_an_executable_python3_program() -> None:
    assert STAND_IN.read_text(encoding="utf-8").startswith("#!/usr/bin/python3\n")
    assert os.access(STAND_IN, os.X_OK)


def test_a_run_moves_bytes_and_both_sides_print_what_the_reader_of_real_runs_reads(node: dict[str, Any]) -> None:
    port = free_port()
    server = serve(node, "rocep1s0f1", port)
    client = write(node, "rocep1s0f1", port)
    served = server.communicate(timeout=60)[0]
    assert client.returncode == 0 and server.returncode == 0, client.stdout + client.stderr + served
    mine, theirs = perftest.read(client.stdout), perftest.read(served)
    assert mine["side"] == "client" and theirs["side"] == "server"
    assert mine["device"] == "rocep1s0f1" and mine["gid_index"] == 3 and mine["link_type"] == "Ethernet"
    assert mine["local"][0]["ipv4"] == "127.0.0.1"  # the RoCE v2 GID the hardware tool wrote at index 3
    assert mine["mtu_bytes"] == 4096 and mine["bytes"] == 65536  # RoCE's MTU from lo's, as the kernel's for a twin
    assert mine["bw_average_gbps"] > 0.05 and mine["bw_peak_gbps"] is None  # a timed run measures no peak
    # the figures agree as perftest's do: every message counted, over a run of at least its one second
    seconds = mine["iterations"] * 65536 * 8 / 1e9 / mine["bw_average_gbps"]
    assert 0.95 <= seconds < 30
    assert mine["msg_rate_mpps"] * 65536 * 8 / 1e3 == pytest.approx(mine["bw_average_gbps"], rel=0.01)
    # the server prints the client's figures, as the real one does
    assert perftest.summary(theirs) | {"side": "client"} == perftest.summary(mine)
    assert theirs["local"][0]["QPN"] == mine["remote"][0]["QPN"]
    assert theirs["remote"][0]["QPN"] == mine["local"][0]["QPN"]


def test_the_output_is_laid_out_as_a_real_sparks_line_by_line(node: dict[str, Any]) -> None:
    port = free_port()
    server = serve(node, "rocep1s0f1", port)
    client = write(node, "rocep1s0f1", port)
    served = server.communicate(timeout=60)[0]
    real = (FIXTURES / "spark-client-duration.txt").read_text(encoding="utf-8").splitlines()[1:]
    warning, *lines = client.stdout.splitlines()
    assert warning == " WARNING: BW peak won't be measured in this run."  # a timed run's first line, as perftest's
    assert [shape(line) for line in lines] == [shape(line) for line in real]
    # the server: its banner, then the client's header without the TX depth (perftest's server prints none)
    server_real = (FIXTURES / "server-roce-rdma-cm.txt").read_text(encoding="utf-8").splitlines()
    banner = server_real[server_real.index("* Waiting for client to connect... *") - 1:][:3]
    served_lines = served.splitlines()
    start = served_lines.index(banner[1]) - 1
    assert served_lines[start:start + 3] == banner and served_lines[start - 1] == ""
    assert not any("TX depth" in line for line in server_real + served_lines)
    header = [shape(line) for line in real if "TX depth" not in line]
    assert [shape(line) for line in served_lines[start + 3:]] == header


def test_a_capped_device_bounds_the_link_and_fails_the_gate(node: dict[str, Any]) -> None:
    port = free_port()
    server = serve(node, "roceP2p1s0f1", port, gid=4)  # the slow end is the server's: it reads at 0.3 Gb/s
    client = write(node, "rocep1s0f1", port)
    server.communicate(timeout=60)
    report = perftest.read(client.stdout)
    assert 0.15 < report["bw_average_gbps"] <= 0.3 * 1.1
    link = perftest.link_name("spark-2", "rocep1s0f1", "spark-1", "roceP2p1s0f1")
    problem = perftest.gate(report["bw_average_gbps"], 80, link, report)
    assert problem is not None and problem.startswith(f"{link}: 0.") and "under the floor of 80 Gb/s" in problem


def test_it_fails_where_the_real_tool_fails_and_says_it_the_same_way(node: dict[str, Any]) -> None:
    port = free_port()
    cases = {
        "rocep1s0f1": "no ib_write_bw server answered at 127.0.0.1:%d" % port,  # nothing listens
        "mlx5_7": "this node has no RDMA device mlx5_7",
        "rocep9s0f0": "the device's port 1 is Down, not ACTIVE",
    }
    for device, said in cases.items():
        done = write(node, device, port)
        assert done.returncode == 1, done.stdout + done.stderr
        with pytest.raises(perftest.PerftestError) as raised:
            perftest.read(done.stdout + done.stderr)
        assert said in str(raised.value)
    no_gid = write(node, "rocep1s0f1", port, gid=9)
    assert no_gid.returncode == 1 and "Couldn't get context for the device" in no_gid.stderr
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("", port))
    taken.listen(1)
    with taken:
        busy = subprocess.run([sys.executable, *argv("rocep1s0f1", port)], env=node["env"], text=True,
                              capture_output=True, timeout=30, check=False)
    assert busy.returncode == 1 and "Couldn't listen to port %d" % port in busy.stderr


def test_the_module_starts_the_server_detached_measures_and_ends_what_is_left(node: dict[str, Any],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKSERVE_LAB_NODE_CONFIG", node["config"])
    state, port = str(node["tmp"] / "state"), free_port()
    started = link_bench.start_server(argv("rocep1s0f1", port), 30, state, port)
    assert started["listening"] and link_bench._alive(started["pid"])
    result = link_bench.measure(argv("rocep1s0f1", port, "127.0.0.1"), 30, "spark-2:rocep1s0f1 -> spark-1:rocep1s0f1",
                                0.01)
    assert result["problem"] is None and result["bandwidth_gbps"] > 0.05
    deadline = time.monotonic() + 10
    while link_bench._alive(started["pid"]) and time.monotonic() < deadline:  # one run, and the server ends
        time.sleep(0.05)
    stopped = link_bench.stop_server(state, port)
    assert not stopped["was_running"]
    assert perftest.read(stopped["output"])["bw_average_gbps"] == result["bandwidth_gbps"]
    # a server no client comes to is ended by its bound, and stop ends one that still waits
    waiting = link_bench.start_server(argv("rocep1s0f1", port), 1, state, port)
    deadline = time.monotonic() + 15
    while link_bench._alive(waiting["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not link_bench._alive(waiting["pid"]) and not link_bench.listening(port)
    again = link_bench.start_server(argv("rocep1s0f1", port), 60, state, port)
    assert again["listening"]
    assert link_bench.stop_server(state, port)["was_running"] and not link_bench._alive(again["pid"])
    # a device the server cannot open: it ends before it listens, and says why
    refused = link_bench.start_server(argv("rocep9s0f0", port), 30, state, port)
    assert not refused["listening"] and "Port number 1 state is Down" in refused["output"]
    assert refused["problem"].startswith("it ended with status 1: the device's port 1 is Down, not ACTIVE")
    # a port another program holds is refused before anything starts (its listener would pass for the server)
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the runs above leave it in TIME_WAIT
        other.bind(("", port))
        other.listen(1)
        taken = link_bench.start_server(argv("rocep1s0f1", port), 30, state, port)
    assert not taken["listening"] and taken["pid"] is None and taken["problem"].startswith(f"port {port} is taken")
