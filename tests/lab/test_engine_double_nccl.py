"""Tests of the lab double's NCCL log lines (lab/engine/vllm_double/nccl.py): what a multi-node rank prints
with NCCL_DEBUG=INFO, per VLLM_DOUBLE_NCCL_NET, so that sparkserve can read each rank's network transport.

The line-producing function is pure; the last tests run real ranks (vLLM's and SGLang's command lines) on
127.0.0.1 and read the lines from their stdout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_double import nccl
from vllm_double.knobs import NCCL_NETS, KnobError, Knobs, read_knobs, read_nccl_net

ENGINE = Path(__file__).resolve().parents[2] / "lab/engine"
VLLM = ENGINE / "bin/vllm"

SPARK = {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1",
         "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "VLLM_HOST_IP": "10.77.1.11"}

HEAD = [
    "spark-1:812:812 [0] NCCL INFO Bootstrap : Using enp1s0f1np1:10.77.1.11<0>",
    "spark-1:812:812 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
]
IB_DEVICES = ("spark-1:812:812 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; "
              "OOB enp1s0f1np1:10.77.1.11<0>")
SOCKET = [
    "spark-1:812:812 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:10.77.1.11<0>",
    "spark-1:812:812 [0] NCCL INFO Using network Socket",
]
NO_DEVICE = "spark-1:812:812 [0] NCCL INFO NET/IB : No device found."


def channels(transport: str) -> list[str]:
    return ["spark-1:812:901 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via %s" % transport,
            "spark-1:812:901 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via %s" % transport]


def lines(env: dict[str, str], node_rank: int = 0, world_size: int = 2) -> list[str]:
    return nccl.nccl_log_lines(env, "spark-1", 812, node_rank, world_size)


# --- the pure function -----------------------------------------------------


def test_ib_by_default_lists_the_hcas_and_uses_net_ib() -> None:
    expected = HEAD + [IB_DEVICES, "spark-1:812:812 [0] NCCL INFO Using network IB"] + channels("NET/IB/0")
    assert lines(SPARK) == expected
    assert lines({**SPARK, "VLLM_DOUBLE_NCCL_NET": "IB"}) == expected
    assert lines({**SPARK, "VLLM_DOUBLE_NCCL_NET": "ib"}) == expected


def test_socket_finds_no_ib_device_and_uses_net_socket() -> None:
    assert lines({**SPARK, "VLLM_DOUBLE_NCCL_NET": "Socket"}) == (
        HEAD + [NO_DEVICE] + SOCKET + channels("NET/Socket/0"))


def test_regmr_shows_the_devices_the_failed_registration_then_sockets() -> None:
    assert lines({**SPARK, "VLLM_DOUBLE_NCCL_NET": "regmr"}) == HEAD + [
        IB_DEVICES,
        "spark-1:812:901 [0] NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
        "spark-1:812:901 [0] NCCL INFO transport/net_ib.cc:1063 -> 2",
    ] + SOCKET + channels("NET/Socket/0")


@pytest.mark.parametrize("net", ["IB", "regmr"])
@pytest.mark.parametrize("hca", [None, "", " , "])
def test_without_an_hca_ib_falls_back_to_sockets(net: str, hca: str | None) -> None:
    env = {key: value for key, value in SPARK.items() if key != "NCCL_IB_HCA"}
    if hca is not None:
        env["NCCL_IB_HCA"] = hca
    assert lines({**env, "VLLM_DOUBLE_NCCL_NET": net}) == HEAD + [NO_DEVICE] + SOCKET + channels("NET/Socket/0")


@pytest.mark.parametrize("debug", ["INFO", "info", " Info "])
def test_nccl_debug_info_in_any_case(debug: str) -> None:
    assert lines({**SPARK, "NCCL_DEBUG": debug})[0] == HEAD[0]


@pytest.mark.parametrize("debug", [None, "", "WARN", "VERSION", "TRACE", "INFOS"])
def test_nothing_without_nccl_debug_info(debug: str | None) -> None:
    env = {key: value for key, value in SPARK.items() if key != "NCCL_DEBUG"}
    if debug is not None:
        env["NCCL_DEBUG"] = debug
    for net in NCCL_NETS:
        assert lines({**env, "VLLM_DOUBLE_NCCL_NET": net}) == []


@pytest.mark.parametrize("net", NCCL_NETS)
def test_nothing_on_one_node(net: str) -> None:
    assert lines({**SPARK, "VLLM_DOUBLE_NCCL_NET": net}, node_rank=0, world_size=1) == []


def test_one_send_and_one_receive_line_per_peer_rank() -> None:
    out = nccl.nccl_log_lines(SPARK, "spark-2", 77, 1, 4)
    assert [line for line in out if " Channel " in line] == [
        "spark-2:77:166 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/IB/0",
        "spark-2:77:166 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/IB/0",
        "spark-2:77:166 [0] NCCL INFO Channel 00/0 : 2[0] -> 1[0] [receive] via NET/IB/0",
        "spark-2:77:166 [0] NCCL INFO Channel 00/0 : 1[0] -> 2[0] [send] via NET/IB/0",
        "spark-2:77:166 [0] NCCL INFO Channel 00/0 : 3[0] -> 1[0] [receive] via NET/IB/0",
        "spark-2:77:166 [0] NCCL INFO Channel 00/0 : 1[0] -> 3[0] [send] via NET/IB/0",
    ]
    assert all(line.startswith("spark-2:77:") for line in out)


def test_hcas_interface_and_address_from_the_environment() -> None:
    assert nccl.ib_hcas({"NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1"}) == ["rocep1s0f1", "roceP2p1s0f1"]
    assert nccl.ib_hcas({"NCCL_IB_HCA": "^mlx5_0:1, mlx5_1 ,"}) == ["mlx5_0", "mlx5_1"]
    assert nccl.ib_hcas({}) == [] and nccl.ib_hcas({"NCCL_IB_HCA": "="}) == []
    assert nccl.socket_ifname({"NCCL_SOCKET_IFNAME": "=enp1s0f1np1,eth1"}) == "enp1s0f1np1"
    assert nccl.socket_ifname({}) == nccl.socket_ifname({"NCCL_SOCKET_IFNAME": "^lo,docker"}) == "eth0"
    assert nccl.host_address({}) == "127.0.0.1"
    assert nccl.host_address({"SGLANG_HOST_IP": "10.77.1.12"}) == "10.77.1.12"
    assert nccl.host_address({"VLLM_HOST_IP": "10.77.1.11", "SGLANG_HOST_IP": "10.77.1.12"}) == "10.77.1.11"
    bare = {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "rocep1s0f1"}
    assert lines(bare)[:3] == [
        "spark-1:812:812 [0] NCCL INFO Bootstrap : Using eth0:127.0.0.1<0>",
        HEAD[1],
        "spark-1:812:812 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB eth0:127.0.0.1<0>",
    ]
    sglang = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "SGLANG_HOST_IP": "10.77.1.12"}
    assert lines(sglang, node_rank=1)[0] == "spark-1:812:812 [0] NCCL INFO Bootstrap : Using enp1s0f1np1:10.77.1.12<0>"


def test_the_knob_is_read_and_checked() -> None:
    assert Knobs().nccl_net == read_knobs({}).nccl_net == "IB"
    assert read_knobs({"VLLM_DOUBLE_NCCL_NET": "SOCKET"}).nccl_net == "Socket"
    assert read_knobs({"VLLM_DOUBLE_NCCL_NET": " RegMR "}).nccl_net == "regmr"
    assert read_nccl_net({"VLLM_DOUBLE_NCCL_NET": ""}) == "IB"
    with pytest.raises(KnobError, match="VLLM_DOUBLE_NCCL_NET"):
        read_knobs({"VLLM_DOUBLE_NCCL_NET": "RoCE"})
    with pytest.raises(KnobError, match="VLLM_DOUBLE_NCCL_NET"):
        lines({**SPARK, "VLLM_DOUBLE_NCCL_NET": "tcp"})


# --- real ranks --------------------------------------------------------------

FAST = {"VLLM_DOUBLE_HEARTBEAT_S": "0.2", "VLLM_DOUBLE_HEARTBEAT_TIMEOUT_S": "3", "VLLM_DOUBLE_JOIN_TIMEOUT_S": "20",
        "VLLM_ENGINE_READY_TIMEOUT_S": "20"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(path: Path, text: str, procs: list[subprocess.Popen[bytes]], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(encoding="utf-8", errors="replace"):
            return
        if any(proc.poll() is not None for proc in procs):
            break
        time.sleep(0.05)
    raise AssertionError("%r never in %s:\n%s" % (text, path.name, path.read_text(encoding="utf-8", errors="replace")))


def run_ranks(tmp_path: Path, argvs: list[list[str]], envs: list[dict[str, str]], ready: str) -> list[str]:
    """Start the ranks, wait for the head's `ready` line, stop them; each rank's log."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text('{"max_position_embeddings": 4096}', encoding="utf-8")
    logs = [tmp_path / ("rank%d.log" % rank) for rank in range(len(argvs))]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv, env, log in zip(argvs, envs, logs, strict=True):
            with log.open("wb") as out:
                procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                                              env={**os.environ, "PYTHONPATH": str(ENGINE), **FAST, **env}))
        wait_for(logs[0], ready, procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
    texts = [log.read_text(encoding="utf-8") for log in logs]
    for proc, text in zip(procs, texts, strict=True):
        assert "NCCL" not in text or ":%d:%d [0] NCCL INFO Bootstrap" % (proc.pid, proc.pid) in text, text
    return texts


def nccl_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if " NCCL " in line and "[rank " not in line]


def test_vllm_ranks_print_the_lines_after_the_rendezvous_before_ready(tmp_path: Path) -> None:
    master, port = free_port(), free_port()
    base = [str(VLLM), "serve", "model", "--load-format", "dummy", "--tensor-parallel-size", "2", "--nnodes", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(master)]
    head_env = {**SPARK, "VLLM_HOST_IP": "10.77.1.11", "NCCL_DEBUG": "info"}
    # The worker has no NCCL_DEBUG: it prints none of NCCL's lines.
    worker_env = {key: value for key, value in SPARK.items() if key != "NCCL_DEBUG"}
    head, worker = run_ranks(tmp_path, [base + ["--node-rank", "0", "--host", "127.0.0.1", "--port", str(port)],
                                        base + ["--node-rank", "1", "--headless"]],
                             [head_env, worker_env], "Application startup complete")
    got = nccl_lines(head)
    hostname = socket.gethostname()
    prefix = got[0].split(" ")[0]
    assert prefix.startswith(hostname + ":")
    pid = int(prefix.split(":")[1])
    expected = HEAD + [IB_DEVICES, "spark-1:812:812 [0] NCCL INFO Using network IB"] + channels("NET/IB/0")
    assert got == [line.replace("spark-1:812:812", "%s:%d:%d" % (hostname, pid, pid))
                   .replace("spark-1:812:901", "%s:%d:%d" % (hostname, pid, pid + 89)) for line in expected]
    order = head.splitlines()
    joined = next(i for i, line in enumerate(order) if "node rank 1 joined" in line)
    first = order.index(got[0])
    ready = next(i for i, line in enumerate(order) if "engine ready" in line)
    assert joined < first < ready and order[first:first + len(got)] == got, "one block, after the join, before ready"
    assert nccl_lines(worker) == []


def test_sglang_worker_prints_socket_lines_with_its_host_ip(tmp_path: Path) -> None:
    master, port = free_port(), free_port()
    base = [sys.executable, "-m", "sglang.launch_server", "--model-path", "model", "--load-format", "dummy",
            "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:%d" % master]
    env = {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "rocep1s0f1", "NCCL_SOCKET_IFNAME": "lo",
           "VLLM_DOUBLE_NCCL_NET": "Socket"}
    head, worker = run_ranks(tmp_path, [base + ["--node-rank", "0", "--port", str(port)], base + ["--node-rank", "1"]],
                             [{**env, "SGLANG_HOST_IP": "127.0.0.1"}, {**env, "SGLANG_HOST_IP": "127.0.0.2"}],
                             "Application startup complete")
    for text, rank, peer, address in ((head, 0, 1, "127.0.0.1"), (worker, 1, 0, "127.0.0.2")):
        got = [line.split(" ", 1)[1] for line in nccl_lines(text)]
        assert got == [
            "[0] NCCL INFO Bootstrap : Using lo:%s<0>" % address,
            "[0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
            "[0] NCCL INFO NET/IB : No device found.",
            "[0] NCCL INFO NET/Socket : Using [0]lo:%s<0>" % address,
            "[0] NCCL INFO Using network Socket",
            "[0] NCCL INFO Channel 00/0 : %d[0] -> %d[0] [receive] via NET/Socket/0" % (peer, rank),
            "[0] NCCL INFO Channel 00/0 : %d[0] -> %d[0] [send] via NET/Socket/0" % (rank, peer),
        ], text
    lines_of_worker = worker.splitlines()
    joined = next(i for i, line in enumerate(lines_of_worker) if "joined the head" in line)
    assert "NCCL INFO Bootstrap" in lines_of_worker[joined + 1], "right after the join, before the load"


def test_one_node_prints_none_of_them(tmp_path: Path) -> None:
    port = free_port()
    (head,) = run_ranks(tmp_path, [[str(VLLM), "serve", "model", "--load-format", "dummy", "--host", "127.0.0.1",
                                    "--port", str(port)]], [SPARK], "Application startup complete")
    assert nccl_lines(head) == [] and "engine ready" in head


def test_three_ranks_each_print_once_with_both_peers(tmp_path: Path) -> None:
    master, port = free_port(), free_port()
    base = [str(VLLM), "serve", "model", "--load-format", "dummy", "--tensor-parallel-size", "3", "--nnodes", "3",
            "--master-addr", "127.0.0.1", "--master-port", str(master)]
    env = {**SPARK, "VLLM_DOUBLE_NCCL_NET": "regmr"}
    texts = run_ranks(tmp_path, [base + ["--node-rank", "0", "--host", "127.0.0.1", "--port", str(port)],
                                 base + ["--node-rank", "1", "--headless"], base + ["--node-rank", "2", "--headless"]],
                      [env, env, env], "Application startup complete")
    for rank, text in enumerate(texts):
        got = nccl_lines(text)
        assert len(got) == 7 + 2 * 2 and sum("Bootstrap" in line for line in got) == 1, text
        assert sum("NCCL WARN Call to ibv_reg_mr failed" in line for line in got) == 1
        peers = [peer for peer in range(3) if peer != rank]
        assert [line.split(" : ", 1)[1] for line in got if " Channel " in line] == [
            line for peer in peers for line in ("%d[0] -> %d[0] [receive] via NET/Socket/0" % (peer, rank),
                                                "%d[0] -> %d[0] [send] via NET/Socket/0" % (rank, peer))]
    head = texts[0].splitlines()
    assert max(i for i, line in enumerate(head) if "joined from" in line) < next(
        i for i, line in enumerate(head) if "Bootstrap" in line) < next(
        i for i, line in enumerate(head) if "engine ready" in line)
