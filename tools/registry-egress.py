#!/usr/bin/env python3
"""The bytes a lab registry served of one repository's blobs, against the size of one image.

Reads the registry container's access log (Debian's docker-registry logs each request in the combined
format: ``"GET /v2/REPO/blobs/sha256:... HTTP/1.1" 200 BYTES``), adds up the bytes of every blob GET of the
repository (by client address), and, given the image's digest, reads its manifest from the registry and
divides: 1.00 is the image served once in all, N is every one of N nodes pulling it for itself.

    tools/registry-egress.py --repo sparkserve/engine [--digest sha256:...] [--container NAME]
                             [--registry http://127.0.0.1:15000] [--since RFC3339]

Prints one JSON object: repo, bytes_served, blob_gets, by_client, and with --digest image_bytes and ratio.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
from typing import Any, Dict, Iterable
from urllib.parse import urlsplit

ACCESS = re.compile(r'^(?P<client>\S+) \S+ \S+ \[[^\]]*\] "GET /v2/(?P<repo>\S+)/blobs/(?P<digest>sha256:[0-9a-f]{64}) '
                    r'HTTP/[\d.]+" (?P<status>\d{3}) (?P<bytes>\d+|-)')
MANIFEST_TYPES = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                            "application/vnd.oci.image.manifest.v1+json"])


def served(lines: Iterable[str], repo: str) -> Dict[str, Any]:
    """The blob bytes the registry sent for repo: in all, how many GETs, and by client address."""
    total, gets, by_client = 0, 0, {}  # type: int, int, Dict[str, int]
    for line in lines:
        match = ACCESS.match(line.strip())
        if not match or match.group("repo") != repo or match.group("status") not in ("200", "206"):
            continue
        sent = int(match.group("bytes")) if match.group("bytes") != "-" else 0
        total += sent
        gets += 1
        by_client[match.group("client")] = by_client.get(match.group("client"), 0) + sent
    return {"repo": repo, "bytes_served": total, "blob_gets": gets, "by_client": by_client}


def image_bytes(manifest: Dict[str, Any]) -> int:
    """What one pull of the image transfers: its config and its layers, as the manifest gives their sizes."""
    return int(manifest["config"]["size"]) + sum(int(layer["size"]) for layer in manifest["layers"])


def registry_log(container: str, since: str) -> list[str]:
    argv = ["docker", "logs", *(["--since", since] if since else []), container]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return (done.stdout + done.stderr).splitlines()


def read_manifest(registry: str, repo: str, digest: str) -> Dict[str, Any]:
    address = urlsplit(registry)
    connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port or 80, timeout=30)
    try:
        connection.request("GET", f"/v2/{repo}/manifests/{digest}", headers={"Accept": MANIFEST_TYPES})
        answer = connection.getresponse()
        if answer.status != 200:
            raise SystemExit(f"registry-egress: {registry} answered {answer.status} for the manifest {digest}")
        return dict(json.load(answer))
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="the repository, as in the registry (sparkserve/engine)")
    parser.add_argument("--digest", default="", help="the image's manifest digest, to give the ratio")
    parser.add_argument("--container", default="sparkserve-lab-registry")
    parser.add_argument("--registry", default="http://127.0.0.1:15000", help="the registry, from here")
    parser.add_argument("--since", default="", help="count only requests after this time (docker logs --since)")
    args = parser.parse_args(argv)
    result = served(registry_log(args.container, args.since), args.repo)
    if args.digest:
        result["image_bytes"] = image_bytes(read_manifest(args.registry, args.repo, args.digest))
        result["ratio"] = round(result["bytes_served"] / result["image_bytes"], 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
