#!/usr/bin/env python3
"""How much longer a no-op site.yml takes with three deployments on two nodes than with one, in one sitting.

From the lab's cluster file (``inventory/lab/cluster.sparks.yml``, 2 nodes) it writes two inventories beside
each other in a temporary folder: ONE, lab-tp2 over both nodes; THREE, the same lab-tp2 plus lab-tp1 on
spark-1 and a second lab-tp1 (``lab-tp1-b``) on spark-2, each placed by memory and given its own ports. It
converges THREE once (so every deployment serves), then runs, ROUNDS times, a no-op ``site.yml`` over ONE and
one over THREE, back to back, and prints each pair's wall times and their ratio. THREE's extra deployments
keep running while ONE runs (an inventory that does not list a deployment leaves it alone). Both run without
the gateway, whose play is the same for one deployment or three.

    tools/bench-fleet.py [--rounds N] [--keep]

Exits 1 when a no-op changed something, 2 when a run failed. Leaves the extra deployments stopped unless --keep.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)")
ONE = [{"recipe": "lab-tp2"}]
THREE = ONE + [{"recipe": "lab-tp1", "nodes": ["spark-1"]},
               {"name": "lab-tp1-b", "recipe": "lab-tp1", "nodes": ["spark-2"]}]


def run(playbook: str, inventory: Path, *extra: str) -> tuple[float, int, int]:
    """Run one playbook over INVENTORY: its wall time, task-hosts run (ok) and changes."""
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), str(ROOT / playbook), *extra]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-2000:])
        raise SystemExit(2)
    ok = changed = 0
    for line in done.stdout.splitlines():
        match = RECAP.match(line)
        if match:
            ok += int(match.group(2))
            changed += int(match.group(3))
    return seconds, ok, changed


def write(folder: Path, cluster: dict[str, Any], deployments: list[dict[str, Any]]) -> Path:
    folder.mkdir()
    data = {key: value for key, value in cluster.items() if key != "recipe"}
    data["deployments"] = deployments
    # The gateway off in both: ONE does not list THREE's other deployments, so its gateway would drop their
    # routes and THREE's put them back, and no run would be a no-op (lab-tp1-b also serves lab-tp1's names).
    data["vars"] = dict(data.get("vars") or {}, sparkserve_gateway=False)
    (folder / "cluster.sparks.yml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="pairs of no-op runs (default 3)")
    parser.add_argument("--keep", action="store_true", help="leave the extra deployments running")
    args = parser.parse_args(argv)
    cluster = yaml.safe_load((ROOT / "inventory/lab/cluster.sparks.yml").read_text(encoding="utf-8"))
    if len(cluster.get("nodes") or []) != 2:
        raise SystemExit("bench-fleet: needs the 2-node lab (make lab)")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as temp:
        one = write(Path(temp) / "one", cluster, ONE)
        three = write(Path(temp) / "three", cluster, THREE)
        print("converging three deployments ...", flush=True)
        run("site.yml", three)
        ratios, worst = [], 0
        for number in range(1, args.rounds + 1):
            one_s, one_ok, one_changed = run("site.yml", one)
            three_s, three_ok, three_changed = run("site.yml", three)
            worst = max(worst, one_changed, three_changed)
            ratios.append(three_s / one_s)
            print(f"round {number}: one deployment {one_s:.1f} s ({one_ok} task-hosts), three {three_s:.1f} s "
                  f"({three_ok} task-hosts): {three_s / one_s:.2f}x; changed {one_changed} and {three_changed}",
                  flush=True)
        print(f"median ratio {statistics.median(ratios):.2f}x over {args.rounds} rounds (target: at most 1.5x)")
        if not args.keep:
            # Over THREE, limited to the extra deployments: their ports are THREE's (assigned with lab-tp2's).
            run("playbooks/stop.yml", three, "--limit", "deployment_lab_tp1:deployment_lab_tp1_b:localhost")
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
