"""Read the output of sparkserve's NCCL probe and gate it against a recipe's floor.

The probe (roles/fabric/files/sparkserve-nccl-probe.py) prints one
``SPARKSERVE_NCCL {json}`` line per message size and a closing
``SPARKSERVE_NCCL_DONE {json}``; NCCL itself, run with NCCL_DEBUG=INFO, says
which transport each channel uses (``via NET/IB/0``, ``via NET/Socket/0``,
``via P2P/CUMEM``, ``via SHM/direct``) and which network it loaded
(``Using network IB`` or ``Using network Socket``). The channels are the
truth: NCCL loads a network even when every channel goes over NVLink, so the
loaded network counts only where no channel line was logged. Standard
library only.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Sequence

RESULT_TAG = "SPARKSERVE_NCCL"
DONE_TAG = "SPARKSERVE_NCCL_DONE"
TRANSPORTS = ("NET/IB", "NET/Socket", "P2P", "SHM")

_CHANNEL = re.compile(r"\bvia (NET/IB\w*|NET/Socket|P2P|SHM)\b")
_NETWORK = re.compile(r"\bUsing network (IB\w*|Socket)\b")
_NET_DEVICES = re.compile(r"\bNET/(IB|Socket) : Using (.+?)(?:; OOB .*)?$")
_WARN = re.compile(r"\bNCCL WARN (.+)$")


def _transport(token: str) -> str:
    """NET/IB plug-ins (NET/IBext_v8, ...) count as NET/IB."""
    if token.startswith("NET/IB") or token.startswith("IB"):
        return "NET/IB"
    if token in ("Socket", "NET/Socket"):
        return "NET/Socket"
    return token


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
    """What one run of the probe measured and which transports NCCL used."""
    results: List[Dict[str, Any]] = []
    done: Optional[Dict[str, Any]] = None
    seen: set = set()
    networks: set = set()
    devices: List[str] = []
    warnings: List[str] = []
    for line in text.splitlines():
        result = _tagged(line, RESULT_TAG)
        if result is not None:
            results.append(result)
            continue
        closing = _tagged(line, DONE_TAG)
        if closing is not None:
            done = closing
            continue
        seen.update(_transport(m) for m in _CHANNEL.findall(line))
        networks.update(_transport(m) for m in _NETWORK.findall(line))
        match = _NET_DEVICES.search(line)
        if match:
            devices += [d for d in match.group(2).split() if d != "[RO]" and d not in devices]
        warn = _WARN.search(line)
        if warn and len(warnings) < 5:
            warnings.append(warn.group(1).strip())
    transport = _between_ranks(seen if seen else networks)
    largest = max(results, key=lambda r: r.get("size_bytes", 0)) if results else None
    return {
        "results": results,
        "complete": done is not None,
        "correct": bool(done and done.get("correct")),
        "world_size": (done or {}).get("world_size"),
        "transport": transport,
        "transports_seen": sorted(seen),
        "network": sorted(networks)[0] if networks else None,
        "net_devices": devices,
        "warnings": warnings,
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
