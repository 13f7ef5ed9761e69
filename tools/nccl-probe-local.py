#!/usr/bin/env python3
"""Run sparkserve's NCCL probe as several ranks on one host with several GPUs.

Each rank is its own process on its own GPU, standing for one Spark: it gets
the fabric environment that the fabric role renders for a node (through the
same `fabric_env` filter), and, with --net-only, NCCL is kept off NVLink and
shared memory so that the ranks talk through NCCL's network transport as
separate nodes would. The combined output is parsed and gated by the same
code the playbook uses, and the report is printed as JSON.

Usage::

    tools/nccl-probe-local.py --ranks 2 --interface eth0 --rdma-devices mlx5_0,mlx5_1 \
        --net-only --min-busbw-gbps 15 --transports NET/IB [--log FILE]

Exit status: 0 when the gate passes, 1 when it fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
# module_utils/nccl_probe.py reads NCCL's lines with the node library, which it imports from the collection.
sys.path.insert(0, str(ROOT / "collections"))
PROBE = ROOT / "roles/fabric/files/sparkserve-nccl-probe.py"


def load(relative: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rank_env(base: dict[str, str], fabric: dict[str, str], rank: int, net_only: bool) -> dict[str, str]:
    """The environment of one local rank: the node's fabric variables, NCCL's debug output, one GPU."""
    env = dict(base)
    env.update(fabric)
    env.update({"CUDA_VISIBLE_DEVICES": str(rank), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"})
    if net_only:
        env.update({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
    return env


def probe_argv(python: str, ranks: int, rank: int, port: int, sizes_mib: str, iters: int) -> list[str]:
    return [python, str(PROBE), "--master-addr", "127.0.0.1", "--master-port", str(port), "--nnodes", str(ranks),
            "--node-rank", str(rank), "--sizes-mib", sizes_mib, "--iters", str(iters)]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--interface", default="lo", help="the 'fabric' interface the ranks' sockets use")
    parser.add_argument("--rdma-devices", default="rocep1s0f1,roceP2p1s0f1")
    parser.add_argument("--gid-index", type=int, default=3)
    parser.add_argument("--net-only", action="store_true", help="keep NCCL off NVLink and shared memory")
    parser.add_argument("--port", type=int, default=29599)
    parser.add_argument("--sizes-mib", default="1,16,128,512")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--min-busbw-gbps", type=float, default=15.0)
    parser.add_argument("--transports", default="NET/IB")
    parser.add_argument("--log", type=Path, help="write every rank's output here")
    args = parser.parse_args(argv)
    if args.ranks < 2:
        parser.error("--ranks must be at least 2")
    return args


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    fabric_env = load("plugins/filter/fabric_env.py", "fabric_env").fabric_env
    nccl = load("plugins/module_utils/nccl_probe.py", "nccl_probe")
    node = {"sparkserve_fabric_interfaces": [args.interface], "sparkserve_rdma_devices": args.rdma_devices.split(","),
            "sparkserve_fabric_ip": "127.0.0.1"}
    fabric = fabric_env(node, "VLLM_HOST_IP", args.gid_index)  # the NCCL probe is no engine; any host-IP name does
    procs = [subprocess.Popen(probe_argv(sys.executable, args.ranks, r, args.port, args.sizes_mib, args.iters),
                              env=rank_env(dict(os.environ), fabric, r, args.net_only),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(args.ranks)]
    outputs = [p.communicate()[0] for p in procs]
    if args.log:
        args.log.write_text("".join("=== rank %d (exit %d)\n%s" % (r, p.returncode, out)
                                    for r, (p, out) in enumerate(zip(procs, outputs, strict=True))))
    report: dict[str, Any] = nccl.parse(outputs[0])
    problems = nccl.gate(report, args.min_busbw_gbps, args.transports.split(","))
    print(json.dumps({"fabric_env": fabric, "net_only": args.net_only, "report": report, "problems": problems},
                     indent=1, sort_keys=True))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
