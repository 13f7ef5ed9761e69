#!/usr/bin/env python3
"""An NCCL all-reduce bus-bandwidth probe, one process per GPU of this node.

sparkserve runs it in the recipe's own engine image (which has PyTorch and
NCCL), on every node at once, with the node's fabric environment, before any
rank of the engine starts. Rank 0 prints one line per message size::

    SPARKSERVE_NCCL {"size_bytes": ..., "time_us": ..., "algbw_gbps": ..., "busbw_gbps": ...}

and a last ``SPARKSERVE_NCCL_DONE {"world_size": N, "correct": true}`` line.
Bus bandwidth is the all-reduce's algorithm bandwidth times 2(n-1)/n, as
nccl-tests reports it, in GB/s (10^9 bytes). Run NCCL with NCCL_DEBUG=INFO to
see which transport it picked (NET/IB or NET/Socket): the controller parses
both from the same output.

Usage::

    sparkserve-nccl-probe.py --master-addr HEAD --master-port P --nnodes N \
        --node-rank R [--gpus-per-node G] [--sizes-mib 1,16,128,512] [--iters 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any, Sequence

MIB = 1024 * 1024
WARMUP = 5


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=1)
    parser.add_argument("--sizes-mib", default="1,16,128,512",
                        help="comma-separated message sizes in MiB")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout-s", type=int, default=300)
    args = parser.parse_args(argv)
    if not 0 <= args.node_rank < args.nnodes:
        parser.error("--node-rank must be between 0 and --nnodes - 1")
    args.sizes = [int(float(s) * MIB) // 4 * 4 for s in args.sizes_mib.split(",") if s.strip()]
    if not args.sizes or min(args.sizes) <= 0:
        parser.error("--sizes-mib needs sizes of at least 4 bytes")
    return args


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce correction: bytes each rank sends over the slowest link."""
    return 2.0 * (world_size - 1) / world_size


def emit(tag: str, payload: dict[str, Any]) -> None:
    print("%s %s" % (tag, json.dumps(payload, sort_keys=True)), flush=True)


def run_rank(local_rank: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    world = args.nnodes * args.gpus_per_node
    rank = args.node_rank * args.gpus_per_node + local_rank
    torch.cuda.set_device(local_rank)
    dist.init_process_group(
        "nccl", init_method="tcp://%s:%d" % (args.master_addr, args.master_port),
        rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout_s),
        device_id=torch.device("cuda", local_rank))
    try:
        check = torch.full((1024,), float(rank + 1), device="cuda")
        dist.all_reduce(check)
        correct = bool(torch.all(check == world * (world + 1) / 2).item())
        for size in args.sizes:
            buf = torch.ones(size // 4, dtype=torch.float32, device="cuda")
            for _ in range(WARMUP):
                dist.all_reduce(buf)
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(buf)
            torch.cuda.synchronize()
            seconds = (time.perf_counter() - start) / args.iters
            algbw = size / seconds / 1e9
            if rank == 0:
                emit("SPARKSERVE_NCCL", {"size_bytes": size, "time_us": round(seconds * 1e6, 1),
                                         "algbw_gbps": round(algbw, 3),
                                         "busbw_gbps": round(algbw * bus_factor(world), 3)})
        if rank == 0:
            emit("SPARKSERVE_NCCL_DONE", {"world_size": world, "correct": correct})
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as err:
        print("sparkserve-nccl-probe: this image has no PyTorch (%s); the probe runs in an engine image" % err,
              file=sys.stderr)
        return 3
    if torch.cuda.device_count() < args.gpus_per_node:
        print("sparkserve-nccl-probe: %d GPU(s) visible, --gpus-per-node is %d"
              % (torch.cuda.device_count(), args.gpus_per_node), file=sys.stderr)
        return 3
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.gpus_per_node == 1:
        run_rank(0, args)
    else:
        mp.spawn(run_rank, args=(args,), nprocs=args.gpus_per_node, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
