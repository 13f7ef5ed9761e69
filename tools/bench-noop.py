#!/usr/bin/env python3
"""How long a site.yml that changes nothing takes, against a yardstick run just before.

Runs, back to back over the same inventory, ``tools/noop-baseline.yml`` (21
module calls per node that change nothing) and ``site.yml`` on a deployment
that already serves, and prints both wall times and their ratio. The ratio is
what to read: both runs share this machine's cores with the nodes, so the
seconds move with the load and the ratio much less.

    tools/bench-noop.py [-i inventory/lab] [--rounds N] [-- EXTRA ANSIBLE ARGS]

Exits 1 when site.yml changed something (it was not a no-op), 2 when a run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)")


def run(playbook: Path, inventory: str, extra: list[str]) -> tuple[float, dict[str, dict[str, int]]]:
    """Run one playbook; its wall time and, per host, the recap's counts."""
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", inventory, str(playbook), *extra]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-2000:])
        raise SystemExit(f"bench-noop: {playbook.name} failed (exit {done.returncode})")
    counts = {}
    for line in done.stdout.splitlines():
        match = RECAP.match(line)
        if match:
            keys = ("ok", "changed", "unreachable", "failed", "skipped")
            counts[match.group(1)] = dict(zip(keys, map(int, match.groups()[1:]), strict=True))
    return seconds, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", default=str(ROOT / "inventory/lab"))
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs; each pair prints its ratio")
    parser.add_argument("extra", nargs="*", help="more ansible-playbook arguments, after --")
    args = parser.parse_args(argv)
    worst = 0.0
    for number in range(1, args.rounds + 1):
        base_s, _ = run(ROOT / "tools/noop-baseline.yml", args.inventory, args.extra)
        site_s, counts = run(ROOT / "site.yml", args.inventory, args.extra)
        changed = sum(c["changed"] for c in counts.values())
        tasks = max((c["ok"] for c in counts.values()), default=0)
        ratio = site_s / base_s
        worst = max(worst, ratio)
        print(f"round {number}: {len(counts) - 1 if 'localhost' in counts else len(counts)} nodes, "
              f"21-call playbook {base_s:.1f} s, no-op site.yml {site_s:.1f} s "
              f"(changed={changed}, at most {tasks} ok tasks on one host), ratio {ratio:.2f}")
        if changed:
            print("bench-noop: site.yml changed something; it was not a no-op", file=sys.stderr)
            return 1
    print(f"worst ratio {worst:.2f} (target at most 1.50)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
