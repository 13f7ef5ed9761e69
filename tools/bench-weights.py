#!/usr/bin/env python3
"""Benchmark the weights stage on the lab: hub traffic, fan-out, verification.

Needs a lab of at least 4 nodes (``make lab LAB_NODES=4``). It serves a
bench model of its own from the lab's hub double, caps every node's fabric
egress with ``tc`` (as a real link is capped), and prints, measured in this
one run:

- bytes the hub served for a full ``playbooks/weights.yml`` run on every
  node, against one copy of the model (goal: exactly 1.00);
- fan-out wall time to 1 worker and to 3 workers along the relay chain, and
  their ratio (goal: at most 1.3);
- verify throughput (parallel, cache off) against one core's ``sha256sum``
  of the same files;
- re-verify time of unchanged files (cache on) against the full hash
  (goal: under 2 %).

Usage::

    tools/bench-weights.py [--rate-mbit 100] [--shards 16] [--shard-mib 8] [--json FILE]

It talks only to the lab's containers and to the hub's port on loopback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "inventory/lab"
LAB = ROOT / ".lab"
REPO = "sparkserve-lab/bench-model"
REVISION = hashlib.sha1(REPO.encode()).hexdigest()
MODELS = "/var/lib/sparkserve/models"
FOLDER = "%s/%s/%s" % (MODELS, REPO, REVISION)
HUB_STATS = "http://127.0.0.1:15080/sparkserve-lab/stats"
RSYNC_PORT = 8730
FABRIC_IF = "enp1s0f1np1"
NODES = ["spark-1", "spark-2", "spark-3", "spark-4"]


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PATH"] = "%s:%s" % (ROOT / ".venv/bin", out.get("PATH", ""))
    out["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    return out


def run(argv: Sequence[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), text=True, capture_output=True, env={**env(), **(extra_env or {})}, check=False)
    if done.returncode != 0:
        raise SystemExit("bench-weights: %s failed (%d): %s" % (" ".join(argv[:3]), done.returncode,
                                                              (done.stdout + done.stderr)[-2000:]))
    return done


def node(name: str, command: str) -> str:
    """Run a shell command in a lab node."""
    return run(["docker", "exec", "sparkserve-lab-" + name, "sh", "-c", command]).stdout


def hub(path: str = "", method: str = "GET") -> dict[str, Any]:
    request = urllib.request.Request(HUB_STATS + path, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def make_model(shards: int, shard_mib: int) -> int:
    """The bench model in the hub's folder (made once); its size in bytes."""
    folder = LAB / "hub" / REPO / REVISION
    if not (folder / "config.json").exists():
        run([sys.executable, str(ROOT / "lab/engine/make_tiny_model.py"), str(folder),
             "--shards", str(shards), "--shard-mib", str(shard_mib)])
    (LAB / "hub" / REPO / "refs").mkdir(exist_ok=True)
    (LAB / "hub" / REPO / "refs" / "main").write_text(REVISION + "\n")
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def fabric_ip(name: str) -> str:
    return "10.77.1.%d" % (10 + int(name.split("-")[1]))


def weights_playbook() -> float:
    repos = json.dumps({"weights_repos": [{"repo": REPO, "revision": REVISION}], "weights_fetch_poll_s": 0.1})
    started = time.monotonic()
    run(["ansible-playbook", "-i", str(INVENTORY), str(ROOT / "playbooks/weights.yml"), "-e", repos])
    return time.monotonic() - started


def fetch(workers: Sequence[str]) -> float:
    """Fan out to these workers at once along the chain spark-1 -> spark-2 -> ...; the slowest one's seconds."""
    upstream = {w: fabric_ip(NODES[NODES.index(w) - 1]) for w in workers}
    for worker in workers:
        node(worker, "rm -rf %s/model-*.safetensors %s/.sparkserve-partial" % (FOLDER, FOLDER))
    args = json.dumps({
        "source": "rsync://{{ bench_upstream[inventory_hostname] }}:%d/weights/%s/%s/" % (RSYNC_PORT, REPO, REVISION),
        "path": FOLDER, "manifest": FOLDER + "/.sparkserve-manifest.json", "poll_s": 0.1})
    result = run(["ansible", "-i", str(INVENTORY), ",".join(workers), "-m", "sparkserve.deploy.weights_fetch",
                  "-a", args, "-e", json.dumps({"bench_upstream": upstream})],
                 {"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"})
    hosts = json.loads(result.stdout)["plays"][0]["tasks"][0]["hosts"]
    return max(float(hosts[w]["seconds"]) for w in workers)


VERIFY_TIMER = r"""
import sys, time, json, os, subprocess
sys.path.insert(0, "/tmp/sparkserve-bench")
import weights
root = sys.argv[1]
manifest = weights.load_manifest(root + "/.sparkserve-manifest.json")
t = time.perf_counter(); full = weights.verify(root, manifest, use_cache=False, write_cache=False)
full_s = time.perf_counter() - t
weights.verify(root, manifest, use_cache=True)  # fills the cache
t = time.perf_counter(); again = weights.verify(root, manifest, use_cache=True)
again_s = time.perf_counter() - t
files = sorted(f for f in os.listdir(root) if not f.startswith("."))
t = time.perf_counter(); subprocess.run(["sha256sum"] + files, cwd=root, check=True, stdout=subprocess.DEVNULL)
sha256sum_s = time.perf_counter() - t
print(json.dumps({"full_s": full_s, "again_s": again_s, "sha256sum_s": sha256sum_s, "hashed": full["hashed_bytes"],
                  "again_hashed": again["hashed_bytes"], "ok": len(full["ok"])}))
"""


def verify_times(name: str) -> dict[str, Any]:
    node(name, "mkdir -p /tmp/sparkserve-bench")
    run(["docker", "cp", str(ROOT / "plugins/module_utils/weights.py"),
         "sparkserve-lab-%s:/tmp/sparkserve-bench/weights.py" % name])
    # Files written in the last two seconds are not cached (they may still be written).
    node(name, "touch -d '-1 hour' %s/*" % FOLDER)
    return json.loads(run(["docker", "exec", "sparkserve-lab-" + name, "python3", "-c", VERIFY_TIMER, FOLDER]).stdout)


def limit(names: Sequence[str], rate_mbit: int | None) -> None:
    for name in names:
        if rate_mbit:
            node(name, "tc qdisc replace dev %s root tbf rate %dmbit burst 256kb latency 200ms"
                 % (FABRIC_IF, rate_mbit))
        else:
            node(name, "tc qdisc del dev %s root 2>/dev/null; true" % FABRIC_IF)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate-mbit", type=int, default=100, help="each node's fabric egress cap")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-mib", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    sparks = run(["ansible-inventory", "-i", str(INVENTORY), "--graph", "sparks"]).stdout
    if not all(n in sparks for n in NODES):
        print("bench-weights: the lab needs 4 nodes; run: make lab LAB_NODES=4", file=sys.stderr)
        return 2
    model_bytes = make_model(args.shards, args.shard_mib)
    for name in NODES:
        node(name, "rm -rf %s/%s" % (MODELS, REPO))
    hub("/reset", "POST")
    limit(NODES, args.rate_mbit)
    try:
        playbook_s = weights_playbook()
        served = hub()["by_repo"].get(REPO, 0)
        one = fetch(["spark-2"])
        three = fetch(["spark-2", "spark-3", "spark-4"])
    finally:
        limit(NODES, None)
    timed = verify_times("spark-2")
    mib = model_bytes / 2**20
    figures = {
        "model_mib": round(mib, 1), "files": args.shards + 5, "rate_mbit": args.rate_mbit,
        "hub_bytes_served": served, "hub_copies": round(served / model_bytes, 3),
        "weights_playbook_4_nodes_s": round(playbook_s, 2),
        "fanout_1_worker_s": round(one, 2), "fanout_3_workers_s": round(three, 2),
        "fanout_ratio": round(three / one, 3),
        "verify_mib_s": round(mib / timed["full_s"], 1), "sha256sum_mib_s": round(mib / timed["sha256sum_s"], 1),
        "verify_speedup": round(timed["sha256sum_s"] / timed["full_s"], 2),
        "reverify_s": round(timed["again_s"], 4), "reverify_hashed_bytes": timed["again_hashed"],
        "reverify_fraction": round(timed["again_s"] / timed["full_s"], 4),
    }
    print("model            %.1f MiB in %d files, fabric capped at %d Mbit/s per node"
          % (mib, figures["files"], args.rate_mbit))
    print("hub traffic      %d bytes = %.3f copies of the model (goal 1.000)" % (served, figures["hub_copies"]))
    print("fan-out          1 worker %.2f s, 3 workers %.2f s: ratio %.2f (goal <= 1.30)"
          % (one, three, figures["fanout_ratio"]))
    print("verify           %.0f MiB/s in parallel vs %.0f MiB/s sha256sum on one core (%.2fx)"
          % (figures["verify_mib_s"], figures["sha256sum_mib_s"], figures["verify_speedup"]))
    print("re-verify        %.4f s unchanged vs %.3f s full hash: %.2f %% (goal < 2 %%)"
          % (timed["again_s"], timed["full_s"], 100 * figures["reverify_fraction"]))
    print(json.dumps(figures, sort_keys=True))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
