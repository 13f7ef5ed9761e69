"""Read the output of sparkserve's NCCL probe and gate it against a recipe's floor.

The probe (roles/fabric/files/sparkserve-nccl-probe.py) prints one
``SPARKSERVE_NCCL {json}`` line per message size and a closing
``SPARKSERVE_NCCL_DONE {json}``; NCCL itself, run with NCCL_DEBUG=INFO, says
which network and transports it uses, which the node library's reader
(module_utils/node/nccl_log.py) reads, as it does for every rank's log at a
launch. Standard library only.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import nccl_log

RESULT_TAG = "SPARKSERVE_NCCL"
DONE_TAG = "SPARKSERVE_NCCL_DONE"
TRANSPORTS = nccl_log.TRANSPORTS


def _tagged(line: str, tag: str) -> Optional[Dict[str, Any]]:
    head, _, rest = line.strip().partition(" ")
    if head != tag:
        return None
    try:
        value = json.loads(rest)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _between_ranks(transports: set) -> Optional[str]:
    """The transport that bounds the collective: the network when any channel crosses it (a channel
    that fell back to sockets drags the whole all-reduce down), else the fastest one seen."""
    if "NET/Socket" in transports:
        return "NET/Socket"
    return next((t for t in TRANSPORTS if t in transports), None)


def parse(text: str) -> Dict[str, Any]:
    """What one run of the probe measured and which transports NCCL used (node/nccl_log.py reads NCCL's lines)."""
    results: List[Dict[str, Any]] = []
    done: Optional[Dict[str, Any]] = None
    for line in text.splitlines():
        result = _tagged(line, RESULT_TAG)
        if result is not None:
            results.append(result)
            continue
        closing = _tagged(line, DONE_TAG)
        if closing is not None:
            done = closing
    nccl = nccl_log.read(text)
    largest = max(results, key=lambda r: r.get("size_bytes", 0)) if results else None
    return {
        "results": results,
        "complete": done is not None,
        "correct": bool(done and done.get("correct")),
        "world_size": (done or {}).get("world_size"),
        "transport": nccl["transport"],
        "transports_seen": nccl["transports_seen"],
        "network": nccl["network"],
        "net_devices": nccl["net_devices"],
        "warnings": nccl["warnings"],
        "busbw_gbps": largest.get("busbw_gbps") if largest else None,
        "size_bytes": largest.get("size_bytes") if largest else None,
    }


def gate(report: Dict[str, Any], min_busbw_gbps: float, transports: Sequence[str]) -> List[str]:
    """Why the probe's report fails the recipe's gate; empty when it passes."""
    problems: List[str] = []
    if not report.get("complete"):
        reason = "; ".join(report.get("warnings") or []) or "no closing line; see the probe's log"
        return ["the NCCL probe did not finish: %s" % reason]
    if not report.get("correct"):
        problems.append("the all-reduce gave a wrong sum: a rank computes or communicates wrongly")
    transport = report.get("transport")
    if transport not in transports:
        if transport == "NET/Socket":
            problems.append(
                "NCCL fell back to NET/Socket (TCP) instead of %s: check NCCL_IB_HCA names the RoCE devices, "
                "NCCL_IB_GID_INDEX is this node's, and the container sees /dev/infiniband" % " or ".join(transports))
        else:
            problems.append("NCCL used %s between ranks; the recipe allows %s"
                            % (transport or "no transport it reported (run with NCCL_DEBUG=INFO)",
                               ", ".join(transports)))
    busbw = report.get("busbw_gbps")
    if busbw is None:
        problems.append("the probe reported no bandwidth")
    elif busbw < min_busbw_gbps:
        problems.append("all-reduce bus bandwidth %.2f GB/s at %d MiB is below the recipe's %.2f GB/s"
                        % (busbw, (report.get("size_bytes") or 0) // (1024 * 1024), min_busbw_gbps))
    return problems
