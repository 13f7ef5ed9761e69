"""What NCCL says of its network in a process's log (NCCL_DEBUG=INFO): the transport, the HCAs, the failures.

NCCL, run with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET is enough), says which network it loaded
(``Using network IB`` or ``Using network Socket``), which devices that network uses
(``NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB ...``), and which transport each
channel between ranks takes (``via NET/IB/0``, ``via NET/Socket/0``, ``via P2P/CUMEM``, ``via SHM/direct``).
The channels are the truth: NCCL loads a network even when every channel goes over NVLink, so the loaded
network counts only where no channel line was logged. The NCCL probe's reader (module_utils/nccl_probe.py),
the launch's check of every rank and the supervisor's after a heal read the same lines here.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Sequence

TRANSPORTS = ("NET/IB", "NET/Socket", "P2P", "SHM")
IB, SOCKET = "NET/IB", "NET/Socket"

CHANNEL = re.compile(r"\bvia (NET/IB\w*|NET/Socket|P2P|SHM)\b")
NETWORK = re.compile(r"\bUsing network (IB\w*|Socket)\b")
NET_DEVICES = re.compile(r"\bNET/(IB|Socket) : Using (.+?)(?:; OOB .*)?$")
NO_IB_DEVICE = re.compile(r"\bNET/IB : No device found")
REG_MR_FAILED = re.compile(r"\bibv_reg_mr\w* failed", re.IGNORECASE)
WARN = re.compile(r"\bNCCL WARN (.+)$")
NCCL_LINE = re.compile(r"\bNCCL (INFO|WARN)\b")
# A device of a NET/IB line: [0]rocep1s0f1:1/RoCE -> rocep1s0f1
_DEVICE = re.compile(r"^\[\d+\]([^:\s]+)")


def transport_of(token: str) -> str:
    """NET/IB plug-ins (NET/IBext_v8, ...) count as NET/IB."""
    if token.startswith("NET/IB") or token.startswith("IB"):
        return IB
    if token in ("Socket", "NET/Socket"):
        return SOCKET
    return token


def between_ranks(transports: Iterable[str]) -> Optional[str]:
    """The transport that bounds the collectives: sockets when any channel fell back to them (they drag the
    whole collective down), else the fastest one seen."""
    seen = set(transports)
    if SOCKET in seen:
        return SOCKET
    return next((t for t in TRANSPORTS if t in seen), None)


def hca_names(devices: Sequence[str]) -> List[str]:
    """The HCAs of NET/IB device words (``[0]rocep1s0f1:1/RoCE`` -> ``rocep1s0f1``)."""
    names = []
    for word in devices:
        match = _DEVICE.match(word)
        if match and match.group(1) not in names:
            names.append(match.group(1))
    return names


def read(text: str) -> Dict[str, Any]:
    """What NCCL said of its network in a log: transport (the one bounding the collectives, None when NCCL
    said nothing), transports_seen (of the channels), network (the one loaded), net_devices (the words of
    its NET/... : Using line), hcas (the HCAs of NET/IB), no_ib_device, reg_mr_failed, warnings (up to 5),
    line (NCCL's own line that says the network it uses, or its first warning), said (any NCCL line)."""
    seen: set = set()
    networks: List[str] = []
    devices: List[str] = []
    ib_devices: List[str] = []
    warnings: List[str] = []
    said = no_ib = reg_mr = False
    line_of: Dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.rstrip()
        if not NCCL_LINE.search(line):
            continue
        said = True
        for token in CHANNEL.findall(line):
            seen.add(transport_of(token))
        for token in NETWORK.findall(line):
            network = transport_of(token)
            if network not in networks:
                networks.append(network)
            line_of.setdefault(network, line.strip())
        match = NET_DEVICES.search(line)
        if match:
            network = transport_of(match.group(1))
            words = [d for d in match.group(2).split() if d != "[RO]"]
            devices += [d for d in words if d not in devices]
            if network == IB:
                ib_devices += [d for d in words if d not in ib_devices]
            line_of.setdefault(network, line.strip())
        no_ib = no_ib or bool(NO_IB_DEVICE.search(line))
        if REG_MR_FAILED.search(line):
            reg_mr = True
            line_of.setdefault("reg_mr", line.strip())
        warn = WARN.search(line)
        if warn and len(warnings) < 5:
            warnings.append(warn.group(1).strip())
    transport = between_ranks(seen if seen else networks)
    return {
        "transport": transport,
        "transports_seen": sorted(seen),
        "network": networks[-1] if networks else None,
        "net_devices": devices,
        "hcas": hca_names(ib_devices),
        "no_ib_device": no_ib,
        "reg_mr_failed": reg_mr,
        "warnings": warnings,
        "line": line_of.get("reg_mr") or line_of.get(transport or "") or (warnings[0] if warnings else ""),
        "said": said,
    }


# The series of each rank's transport: the launch (module rank_transport) and the supervisor write it alike.
TRANSPORT_METRIC = "sparkserve_rank_transport_info"
TRANSPORT_HELP = "The network NCCL uses between the nodes on each rank, as its log says (NET/IB is RDMA)."


def rank_report(rc: int, out: str, err: str, hcas: Sequence[str]) -> Dict[str, Any]:
    """One rank's network from ``docker logs`` of its container (exit status, stdout, stderr): transport,
    hcas, line and problem (None when it uses RDMA over every one of hcas)."""
    if rc != 0:
        said = " ".join((err or out).split())[:200] or f"exit {rc}"
        return {"transport": None, "hcas": [], "line": "", "problem": f"its log could not be read: {said}"}
    report = read(out + "\n" + err)  # docker logs gives the rank's stdout and stderr apart
    return {"transport": report["transport"], "hcas": report["hcas"], "line": report["line"],
            "problem": problem(report, hcas)}


def transport_samples(deployment: str, ranks: Sequence[Dict[str, Any]]) -> List[Any]:
    """The samples of TRANSPORT_METRIC for ranks (each with rank, node and transport)."""
    return [({"deployment": deployment, "rank": str(r["rank"]), "node": r["node"],
              "transport": r["transport"] or "none"}, 1.0) for r in ranks]


def problem(report: Dict[str, Any], hcas: Sequence[str]) -> Optional[str]:
    """Why a rank's network is not RDMA over every HCA it was given, with the likely cause and the fix; None
    when it is. hcas: the HCAs of the node's NCCL_IB_HCA (its twins' RoCE devices)."""
    transport = report.get("transport")
    if not report.get("said"):
        return ("NCCL said nothing of its network in the rank's log: it runs without NCCL_DEBUG=INFO (a recipe "
                "env that sets NCCL_DEBUG overrides the launch's); remove NCCL_DEBUG from the recipe's env")
    if report.get("reg_mr_failed"):
        return (f"RDMA memory registration failed ({report.get('line')}): the rank's locked-memory limit is too "
                "low or the kernel refuses it (a kernel or driver update known to break ibv_reg_mr); check "
                "`ulimit -l` in the rank is unlimited (sparkserve_container_memlock) and the node's kernel and "
                "OFED/driver versions, then relaunch")
    if transport == SOCKET:
        cause = ("NCCL found no RDMA device" if report.get("no_ib_device")
                 else "NCCL chose TCP sockets over RDMA")
        return (f"NCCL runs over TCP sockets, not RDMA: {cause} ({report.get('line') or 'Using network Socket'}); "
                "the likely causes are a twin's RDMA device missing or down (site.yml --tags fabric checks "
                "them), /dev/infiniband not given to the container, or NCCL_IB_HCA naming no device of this "
                "node; decode runs at about half speed this way")
    if transport not in (IB, None, "P2P", "SHM"):
        return f"NCCL uses {transport} between ranks, not RDMA (NET/IB)"
    if transport == IB and hcas:
        missing = [hca for hca in hcas if hca not in report.get("hcas", [])]
        if missing:
            return (f"NCCL uses RDMA over {', '.join(report.get('hcas') or ['no HCA'])} but not over "
                    f"{', '.join(missing)} ({report.get('line')}): half the fabric's bandwidth; a twin's link "
                    "is down or NCCL_IB_HCA lacks it (site.yml --tags fabric rewrites the fabric environment)")
    if transport is None:
        return ("NCCL named no network in the rank's log (no 'Using network' nor channel line): the ranks may "
                "not have formed their groups yet")
    return None
