#!/usr/bin/env python3
"""How long the supervisor takes to make a deployment serve again after a rank is killed, on the lab.

On the lab's serving deployment (site.yml has run; the supervisor watches it),
each round kills the last node's rank container, then waits for the
supervisor's ``healed`` event and for a completion from the controller. It
prints, per round and as medians:

- detect: from the kill to the supervisor's ``heal_started`` event;
- heal: the event's own figures (stop, memory gate, start until ready);
- serving: from the kill to the first completion answered;
- overhead: serving minus the engine double's configured load time (its
  ``VLLM_DOUBLE_LOAD_DELAY_S`` plus the model's size read at
  ``VLLM_DOUBLE_LOAD_MIB_S``), which a real engine's load replaces.

    tools/bench-supervisor.py [--rounds 3] [--deployment lab-tp2]

Each round is one restart of the hour: keep --rounds within the recipe's
supervise.max_restarts_per_hour (lab-tp2: 3). Lab only: it reaches the nodes with ``docker exec`` into the lab's node
containers and the API at the head's management address. Exits 1 when a round
does not heal within --timeout-s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NODE_CONTAINER = "sparkserve-lab-{node}"
STATE_DIR = "/var/lib/sparkserve/supervisor"
RENDER = "/var/lib/sparkserve/deployments/{deployment}/current.json"
CONFIG = "/etc/sparkserve/supervisor/{deployment}.json"
MIB = 1024 * 1024


def on_node(node: str, *argv: str) -> str:
    done = subprocess.run(["docker", "exec", NODE_CONTAINER.format(node=node), *argv],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench-supervisor: {' '.join(argv)} on {node} failed: {done.stderr.strip()}")
    return done.stdout


def events(head: str, deployment: str) -> list[dict[str, Any]]:
    text = on_node(head, "sh", "-c", f"cat {STATE_DIR}/{deployment}.events.jsonl 2>/dev/null || true")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_time_s(render: dict[str, Any], model_bytes: int) -> float:
    """The double's configured load: its init delay plus the model read at its rate."""
    env = render["recipe"].get("env") or {}
    delay = float(env.get("VLLM_DOUBLE_LOAD_DELAY_S") or 0)
    rate = float(env.get("VLLM_DOUBLE_LOAD_MIB_S") or 0)
    return delay + (model_bytes / (rate * MIB) if rate > 0 else 0.0)


def completion(url: str, model: str, timeout: float) -> bool:
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


def one_round(args: argparse.Namespace, head: str, worker: str, container: str, url: str, model: str
              ) -> dict[str, float]:
    seen = len(events(head, args.deployment))
    killed = time.time()
    on_node(worker, "docker", "kill", container)
    deadline = time.monotonic() + args.timeout_s
    serving = None
    while time.monotonic() < deadline:
        if serving is None and completion(url, model, 2.0):
            serving = time.time() - killed
        new = events(head, args.deployment)[seen:]
        healed = [e for e in new if e["event"] == "healed"]
        if healed and serving is not None:
            started = next(e for e in new if e["event"] == "heal_started")
            detect = datetime.fromisoformat(started["time"]).timestamp() - killed
            return {"detect_s": max(detect, 0.0), "heal_s": healed[0]["seconds"], "stop_s": healed[0]["stopped_s"],
                    "memory_s": healed[0]["memory_s"], "ready_s": healed[0]["ready_s"], "serving_s": serving}
        if any(e["event"] in ("gave_up", "needs_reboot", "heal_failed") for e in new):
            raise SystemExit(f"bench-supervisor: the heal did not succeed: {new}")
        time.sleep(0.2)
    raise SystemExit(f"bench-supervisor: not serving again within {args.timeout_s} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployment", default="lab-tp2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()

    config = json.loads(on_node("spark-1", "cat", CONFIG.format(deployment=args.deployment)))
    head = config["head"]
    render = json.loads(on_node(head, "cat", RENDER.format(deployment=args.deployment)))
    last = max(int(rank) for rank in config["rank_hosts"])
    worker = config["rank_hosts"][str(last)]
    ranks = render["ranks"]
    container = (ranks[str(last)] if isinstance(ranks, dict) else ranks[last])["container_name"]
    model = render["recipe"]["model"]["served_name"]
    inventory = json.loads(subprocess.run(
        [str(Path(sys.executable).with_name("ansible-inventory")), "-i", str(ROOT / "inventory/lab"), "--host", head],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    url = f"http://{inventory['ansible_host']}:{render['recipe']['launch']['api_port']}"
    model_bytes = int(on_node(head, "sh", "-c", "du -sb /var/lib/sparkserve/models | cut -f1").split()[0])
    load_s = load_time_s(render, model_bytes)
    nodes = len(config["rank_hosts"])
    print(f"supervisor heal on {nodes} lab nodes, deployment {args.deployment}, killing rank {last} on {worker}; "
          f"the double's configured load: {load_s:.1f} s")
    results = []
    for number in range(1, args.rounds + 1):
        result = one_round(args, head, worker, container, url, model)
        results.append(result)
        print(f"round {number}: detect {result['detect_s']:.1f} s, heal {result['heal_s']:.1f} s (stop "
              f"{result['stop_s']:.1f}, memory {result['memory_s']:.1f}, start to ready {result['ready_s']:.1f}), "
              f"serving again after {result['serving_s']:.1f} s, overhead {result['serving_s'] - load_s:.1f} s")
        time.sleep(2.0)
    serving = statistics.median(r["serving_s"] for r in results)
    print(f"median: serving again after {serving:.1f} s; overhead beyond the load {serving - load_s:.1f} s "
          f"(target 15 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
