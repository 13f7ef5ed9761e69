"""NCCL's own log lines (NCCL_DEBUG=INFO), as one rank of a multi-node engine prints them.

A real vLLM or SGLang rank that runs NCCL with ``NCCL_DEBUG=INFO`` prints, when
it initialises its distributed groups, which network NCCL loaded and which
transport each channel to a peer rank uses. sparkserve reads those lines from
every rank's container log; the double prints them in NCCL 2.2x's shape::

    spark-1:812:812 [0] NCCL INFO Using network IB
    spark-1:812:901 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0

(``HOSTNAME:PID:TID [LOCALRANK] NCCL INFO ...``). Which network they report is
the knob VLLM_DOUBLE_NCCL_NET: ``IB`` (RoCE), ``Socket`` (no RDMA device) or
``regmr`` (RDMA devices, memory registration refused, then sockets). The
devices come from NCCL_IB_HCA, the interface from NCCL_SOCKET_IFNAME and the
address from VLLM_HOST_IP or SGLANG_HOST_IP.

``nccl_log_lines`` is pure (the environment, hostname, pid, node rank and
world size in; the lines out); ``print_nccl_init`` writes them for this process.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Mapping

from .knobs import read_nccl_net
from .logs import Logger

# The thread of NCCL's connection setup (proxy) is another thread than the main one: its id in the lines is
# the pid plus this (812 -> 901 in a real log).
CHANNEL_TID_OFFSET = 89
# The interface when NCCL_SOCKET_IFNAME names none (unset, or only interfaces to exclude): a container's.
DEFAULT_IFNAME = "eth0"
DEFAULT_ADDRESS = "127.0.0.1"
LOCAL_RANK = 0  # one GPU per node: every rank is local rank 0 on device 0


def nccl_debug_info(env: Mapping[str, str]) -> bool:
    """Whether NCCL_DEBUG asks for INFO (any case)."""
    return env.get("NCCL_DEBUG", "").strip().upper() == "INFO"


def ib_hcas(env: Mapping[str, str]) -> list[str]:
    """The HCA names of NCCL_IB_HCA: ``=`` or ``^`` prefix and ``:port`` suffixes dropped, empty entries skipped."""
    text = env.get("NCCL_IB_HCA", "").strip().lstrip("=^").strip()
    names = (entry.strip().partition(":")[0].strip() for entry in text.split(","))
    return [name for name in names if name]


def socket_ifname(env: Mapping[str, str]) -> str:
    """The first interface NCCL_SOCKET_IFNAME names (``=`` prefix dropped); a ``^`` list names none to use."""
    text = env.get("NCCL_SOCKET_IFNAME", "").strip()
    if text.startswith("^"):
        return DEFAULT_IFNAME
    names = [entry.strip() for entry in text.lstrip("=").split(",") if entry.strip()]
    return names[0] if names else DEFAULT_IFNAME


def host_address(env: Mapping[str, str]) -> str:
    """This node's address between the ranks: VLLM_HOST_IP, else SGLANG_HOST_IP, else 127.0.0.1."""
    for name in ("VLLM_HOST_IP", "SGLANG_HOST_IP"):
        value = env.get(name, "").strip()
        if value:
            return value
    return DEFAULT_ADDRESS


def nccl_log_lines(env: Mapping[str, str], hostname: str, pid: int, node_rank: int, world_size: int) -> list[str]:
    """NCCL's INFO (and WARN) lines of node rank ``node_rank`` of ``world_size`` at its communicator's init.

    Empty unless NCCL_DEBUG is INFO and there is more than one node. Raises KnobError when
    VLLM_DOUBLE_NCCL_NET holds another value than IB, Socket or regmr.
    """
    if world_size <= 1 or not nccl_debug_info(env):
        return []
    net = read_nccl_net(env)
    hcas = ib_hcas(env)
    if not hcas:
        net = "Socket"  # no HCA: NCCL finds no IB device, as real NCCL without NCCL_IB_HCA's devices
    oob = "%s:%s<0>" % (socket_ifname(env), host_address(env))
    main = "%s:%d:%d [%d] NCCL " % (hostname, pid, pid, LOCAL_RANK)
    conn = "%s:%d:%d [%d] NCCL " % (hostname, pid, pid + CHANNEL_TID_OFFSET, LOCAL_RANK)
    lines = [main + "INFO Bootstrap : Using %s" % oob,
             main + "INFO NET/Plugin: No plugin found (libnccl-net.so)"]
    ib_devices = main + "INFO NET/IB : Using %s [RO]; OOB %s" % (
        " ".join("[%d]%s:1/RoCE" % (index, name) for index, name in enumerate(hcas)), oob)
    socket_lines = [main + "INFO NET/Socket : Using [0]%s" % oob, main + "INFO Using network Socket"]
    if net == "IB":
        lines += [ib_devices, main + "INFO Using network IB"]
        transport = "NET/IB/0"
    elif net == "regmr":
        lines += [ib_devices,
                  conn + "WARN Call to ibv_reg_mr failed with error Cannot allocate memory",
                  conn + "INFO transport/net_ib.cc:1063 -> 2"]
        lines += socket_lines
        transport = "NET/Socket/0"
    else:
        lines += [main + "INFO NET/IB : No device found."] + socket_lines
        transport = "NET/Socket/0"
    for peer in range(world_size):
        if peer == node_rank:
            continue
        lines.append(conn + "INFO Channel 00/0 : %d[0] -> %d[0] [receive] via %s" % (peer, node_rank, transport))
        lines.append(conn + "INFO Channel 00/0 : %d[0] -> %d[0] [send] via %s" % (node_rank, peer, transport))
    return lines


def print_nccl_init(log: Logger, env: Mapping[str, str], node_rank: int, world_size: int) -> None:
    """Print this process's NCCL init lines to stdout (the container log), if NCCL_DEBUG=INFO asks for them."""
    lines = nccl_log_lines(env, socket.gethostname(), os.getpid(), node_rank, world_size)
    if not lines:
        return
    # Under the logger's lock, so that no log line of another thread lands inside the block (logs.py itself
    # stays as it is: the lab recipes' overlay pins its sha256).
    with log._lock:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
