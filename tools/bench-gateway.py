#!/usr/bin/env python3
"""Benchmark: sparkserve-bench through the gateway and straight at the engine, same deployment, same run.

Both paths go through one ssh tunnel to the gateway's node (its loopback: the engine's API binds there while
the gateway runs, so it has no other door), so the only difference between them is the gateway. Rounds
alternate the order of the two paths. It prints the throughput ratio (gateway / direct, summed over every
cell and round) and what the gateway adds to the median TTFT: for each cell of each round, the cell's median
TTFT through the gateway less its median straight at the engine, then the median of those differences (a
paired comparison: the machine's load drifts between rounds, not within a cell pair). The targets are a
ratio of at least 0.98 and at most 2 ms. A benchmark, not a test: it prints numbers and asserts nothing.

    .venv/bin/python tools/bench-gateway.py --model tiny-model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


def tunnel(cluster: dict[str, Any], state: Path, ports: list[tuple[int, int]]) -> subprocess.Popen[bytes]:
    node = cluster["nodes"][0]
    forwards = [arg for local, remote in ports for arg in ("-L", f"{local}:127.0.0.1:{remote}")]
    return subprocess.Popen(["ssh", "-N", "-o", f"UserKnownHostsFile={state}/ssh/known_hosts",
                             "-o", "StrictHostKeyChecking=yes", "-o", "ExitOnForwardFailure=yes",
                             "-i", str(state / "ssh" / "id_ed25519"), *forwards,
                             f"{cluster.get('user', 'root')}@{node['address']}"])


def bench(url: str, model: str, suites: str, out: Path, key: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT / "collections")]))
    env.pop("SPARKSERVE_BENCH_API_KEY", None)
    if key:
        env["SPARKSERVE_BENCH_API_KEY"] = key
    subprocess.run([sys.executable, "-m", "sparkserve_bench", "run", "--base-url", url, "--model", model,
                    "--suites", suites, "--out", str(out), "--quiet", "--seed", "1"], env=env, check=True)
    return dict(json.loads(out.read_text()))


def figures(results: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """(summed tok_s over the cells, each cell's median TTFT in ms by the cell's id)."""
    cells = results.get("cells") or []
    throughput = sum(float(cell["metrics"].get("tok_s") or 0.0) for cell in cells)
    ttft = {str(cell["id"]): float(cell["percentiles"]["ttft_ms"]["p50"]) for cell in cells
            if ((cell.get("percentiles") or {}).get("ttft_ms") or {}).get("p50") is not None}
    return throughput, ttft


def ttft_added_ms(direct: list[dict[str, float]], gateway: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per cell, what the gateway added to its median TTFT in each round (ms); cells both paths measured."""
    added: dict[str, list[float]] = {}
    for straight, through in zip(direct, gateway, strict=True):
        for cell in straight.keys() & through.keys():
            added.setdefault(cell, []).append(through[cell] - straight[cell])
    return added


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default=str(ROOT / "inventory" / "lab" / "cluster.sparks.yml"))
    parser.add_argument("--state-dir", default=str(ROOT / ".lab"), help="the lab's ssh key and gateway key")
    parser.add_argument("--model", required=True)
    parser.add_argument("--suites", default=str(ROOT / "bench" / "examples" / "gateway-overhead.yml"),
                        help="a recipe (its bench.suites) or a suites file")
    parser.add_argument("--api-port", type=int, default=8000)
    parser.add_argument("--gateway-port", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    cluster = yaml.safe_load(Path(args.inventory).read_text())
    state = Path(args.state_dir)
    key = (state / "gateway-key").read_text().strip()
    direct_port, gateway_port = 18400, 18401
    ssh = tunnel(cluster, state, [(direct_port, args.api_port), (gateway_port, args.gateway_port)])
    time.sleep(2)
    totals = {"direct": 0.0, "gateway": 0.0}
    ttfts: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
    try:
        with tempfile.TemporaryDirectory() as folder:
            for round_ in range(args.rounds):
                order = ["direct", "gateway"] if round_ % 2 == 0 else ["gateway", "direct"]
                for path in order:
                    port = direct_port if path == "direct" else gateway_port
                    results = bench(f"http://127.0.0.1:{port}", args.model, args.suites,
                                    Path(folder) / f"{path}-{round_}.json", key if path == "gateway" else "")
                    throughput, ttft = figures(results)
                    totals[path] += throughput
                    ttfts[path].append(ttft)
                    print(f"round {round_ + 1} {path:8s} tok_s {throughput:9.2f}  median ttft per cell (ms): "
                          + ", ".join(f"{cell} {ms:.2f}" for cell, ms in sorted(ttft.items())))
    finally:
        ssh.terminate()
    ratio = totals["gateway"] / totals["direct"] if totals["direct"] else float("nan")
    added = ttft_added_ms(ttfts["direct"], ttfts["gateway"])
    for cell, values in sorted(added.items()):
        print(f"  {cell}: the gateway added {', '.join(f'{ms:+.2f}' for ms in values)} ms to its median TTFT")
    every = [ms for values in added.values() for ms in values]
    delta_ms = statistics.median(every) if every else float("nan")
    print(f"throughput through the gateway / direct: {ratio:.4f} (target >= 0.98)")
    print(f"median TTFT added by the gateway (median over cells and rounds): {delta_ms:+.2f} ms (target <= +2 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
