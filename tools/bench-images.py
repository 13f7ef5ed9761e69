#!/usr/bin/env python3
"""How the engine image reaches every lab node: one pull and the fabric, against every node pulling for itself.

On a lab whose nodes run no container of the engine image (after ``make lab LAB_NODES=4``, before ``make
site``, or after playbooks/stop.yml), with the lab registry's link limited (tc on the registry container's
interface, as an owner's internet link), in one run and per round:

1. relay: the image removed from every node, then ``site.yml --tags image`` (the head pulls, the others receive
   it over the fabric); then the same run again, which finds everything in place (the run's own overhead);
2. every node pulls: the image removed again, then every node pulls it by digest at once (what each node did
   before the relay).

Prints, per round, the bytes the registry served over the image's size (target 1.00 for the relay) and the
seconds of each way; staging by relay is the first run less the second. Leaves the link unlimited and every
node holding the image under its local name.

    tools/bench-images.py [-i inventory/lab] [--rate 200mbit] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

import yaml

ROOT = Path(__file__).resolve().parents[1]


def sh(argv: List[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)


def lab_settings(inventory: Path) -> Dict[str, Any]:
    """The lab's engine image, registry and node containers, from the inventory the lab wrote."""
    cluster = yaml.safe_load((inventory / "cluster.sparks.yml").read_text(encoding="utf-8"))
    settings = cluster["vars"]
    lab = settings["lab_registry"]["container"].rsplit("-registry", 1)[0]
    names = sh(["docker", "ps", "--format", "{{.Names}}", "--filter", f"label=sparkserve.lab.name={lab}",
                "--filter", "label=sparkserve.lab=node"]).stdout.split()
    nodes = sorted(names, key=lambda name: int(re.sub(r"\D", "", name.rsplit("-", 1)[-1]) or 0))
    return {"image": settings["lab_engine_image"], "registry": settings["lab_registry"], "nodes": nodes}


def limit_link(container: str, image: str, rate: str) -> None:
    """Shape the registry container's egress (tc tbf), or unshape it with an empty rate."""
    base = ["docker", "run", "--rm", "--net", f"container:{container}", "--cap-add", "NET_ADMIN",
            "--entrypoint", "tc", image]
    sh(base + ["qdisc", "del", "dev", "eth0", "root"])
    if rate:
        done = sh(base + ["qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "256kb",
                          "latency", "100ms"])
        if done.returncode != 0:
            raise SystemExit(f"bench-images: cannot limit the registry's link: {done.stderr.strip()}")


def egress(settings: Dict[str, Any]) -> Dict[str, Any]:
    registry = settings["registry"]
    digest = settings["image"].split("@")[-1]
    repo = re.sub(r"^[^/]+/", "", settings["image"].split("@")[0])
    done = sh([sys.executable, str(ROOT / "tools/registry-egress.py"), f"--repo={repo}", f"--digest={digest}",
               f"--container={registry['container']}", f"--registry={registry['url']}"])
    if done.returncode != 0:
        raise SystemExit(f"bench-images: registry-egress failed: {done.stderr.strip()}")
    return dict(json.loads(done.stdout))


def remove_image(settings: Dict[str, Any]) -> None:
    """Remove the engine image from every node (refused while a container of it exists there)."""
    local_ref = load_local_ref()
    for node in settings["nodes"]:
        image_id = sh(["docker", "exec", node, "docker", "image", "inspect", "--format", "{{.Id}}",
                       local_ref(settings["image"])]).stdout.strip()
        ids = {image_id} | {sh(["docker", "exec", node, "docker", "image", "inspect", "--format", "{{.Id}}",
                                settings["image"]]).stdout.strip()}
        for found in sorted(i for i in ids if i):
            users = sh(["docker", "exec", node, "docker", "ps", "--all", "--quiet", "--filter",
                        f"ancestor={found}"]).stdout.split()
            if users:
                raise SystemExit(f"bench-images: {node} has containers of the engine image; stop the deployment "
                                 "first (ansible-playbook -i inventory/lab playbooks/stop.yml)")
            sh(["docker", "exec", node, "docker", "rmi", "--force", found])


def load_local_ref() -> Any:
    """The image stage's local name of an image (the node library, from the checkout's collection)."""
    if str(ROOT / "collections") not in sys.path:
        sys.path.insert(0, str(ROOT / "collections"))
    from ansible_collections.sparkserve.deploy.plugins.module_utils.node.images import local_ref

    return local_ref


def timed(argv: List[str], env: Dict[str, str]) -> float:
    start = time.monotonic()
    done = sh(argv, cwd=ROOT, env=env)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-1000:])
        raise SystemExit(f"bench-images: {' '.join(argv[:4])} ... failed")
    return time.monotonic() - start


def every_node_pulls(settings: Dict[str, Any]) -> float:
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(settings["nodes"])) as pool:
        results = list(pool.map(lambda node: sh(["docker", "exec", node, "docker", "pull", settings["image"]]),
                                settings["nodes"]))
    failed = [r.stderr.strip() for r in results if r.returncode != 0]
    if failed:
        raise SystemExit(f"bench-images: a node's pull failed: {failed[0]}")
    return time.monotonic() - start


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", default=str(ROOT / "inventory/lab"))
    parser.add_argument("--rate", default="200mbit", help="the registry link's rate (tc tbf), as an internet link")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    settings = lab_settings(Path(args.inventory))
    tc_image = sh(["docker", "inspect", "--format", "{{.Config.Image}}", settings["nodes"][0]]).stdout.strip()
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    site = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", args.inventory, str(ROOT / "site.yml"),
            "--tags", "image"]
    print(f"{len(settings['nodes'])} nodes, registry link {args.rate}, image {settings['image']}")
    limit_link(settings["registry"]["container"], tc_image, args.rate)
    try:
        for number in range(1, args.rounds + 1):
            remove_image(settings)
            before = egress(settings)
            relay_s = timed(site, env)
            relayed = egress(settings)
            overhead_s = timed(site, env)
            remove_image(settings)
            pull_s = every_node_pulls(settings)
            pulled = egress(settings)
            size = before["image_bytes"]
            relay_ratio = (relayed["bytes_served"] - before["bytes_served"]) / size
            pull_ratio = (pulled["bytes_served"] - relayed["bytes_served"]) / size
            print(f"round {number}: image {size / 1e6:.1f} MB; relay: registry served {relay_ratio:.2f}x the image "
                  f"(target 1.00), site.yml --tags image {relay_s:.1f} s, "
                  f"of which staging {relay_s - overhead_s:.1f} s "
                  f"(the same run with nothing to do: {overhead_s:.1f} s); every node pulling: served "
                  f"{pull_ratio:.2f}x, {pull_s:.1f} s; staging by relay / every node pulling "
                  f"{(relay_s - overhead_s) / pull_s:.2f}")
        # Every node holds the image under its local name again, as the image stage leaves it.
        timed(site, env)
    finally:
        limit_link(settings["registry"]["container"], tc_image, "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
