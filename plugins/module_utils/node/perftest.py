"""What perftest's ``ib_write_bw`` printed: a run's figures (client or server side), or why it gave none; the gate.

``ib_write_bw`` (the ``perftest`` package) prints a header (the test, ``Device``, ``Link type``, ``Mtu``, ``GID
index``, ...), one ``local address`` and one ``remote address`` line per queue pair (each with its ``GID`` line
on RoCE), then a table: ``#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]`` with
``--report_gbits`` (``[MB/sec]`` or ``[MiB/sec]`` without it: perftest's mega is 2**20 bytes), one row per message
size, or one per interval with ``--run_infinitely``. The server prints the same, its table filled with the
client's figures, after a ``* Waiting for client to connect... *`` banner. With ``-D`` (a duration) the peak is
not measured and the column says 0.00. A run that gives no table says why on stderr (``Couldn't connect to
HOST:PORT``, ``IB device X not found``, ``Port number 1 state is Down``); ``read`` turns that into a
PerftestError that says what it means. The ``link_bench`` module reads the output here on the nodes, and the
lab's stand-in prints the same format (tests/fixtures/perftest/ holds real outputs).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

TOOL = "ib_write_bw"
DEFAULT_PORT = 18515  # perftest's own default port
MEBI_GBPS = 2**20 * 8 / 1e9  # one perftest MB/sec (2**20 bytes a second) in Gb/s
# The table's header: its unit, whatever perftest's version spaces it with.
TABLE = re.compile(r"#bytes\s+#iterations\s+BW peak\[([^\]]+)\]\s+BW average\[([^\]]+)\]\s+MsgRate\[Mpps\]")
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\b")
TITLE = re.compile(r"^\s+(\S.*\bTest)\s*$")
RULE = re.compile(r"^-{20,}\s*$")
# One "Key : value" of the header; a line may hold two, apart by tabs or several spaces.
SETTING = re.compile(r"([A-Za-z][\w*.\-]*(?: [\w*.\-]+)*)\s*:\s*(\S+(?: \S+)*)")
ADDRESS = re.compile(r"^\s*(local|remote) address:\s*(.*)$")
ADDRESS_FIELD = re.compile(r"\b(LID|QPN|PSN|OUT|RKey|VAddr)\s+(\S+)")
GID = re.compile(r"^\s*GID:\s*(\S+)\s*$")
SERVER_BANNER = "* Waiting for client to connect... *"
NO_PEAK = "BW peak won't be measured"
# What a run that printed no table said, in the order perftest checks it, and what that means.
FAILURES = (
    (re.compile(r"IB device (\S+) not found"), "this node has no RDMA device {0} (ibv_devices lists them)"),
    (re.compile(r"No IB devices found"), "this node has no RDMA device at all (the mlx5 driver is not loaded)"),
    (re.compile(r"Unable to find the Infiniband/RoCE device"), "ib_write_bw found no such RDMA device on this node"),
    (re.compile(r"Port number (\d+) state is (\S+)"),
     "the device's port {0} is {1}, not ACTIVE: its twin is down (the cable, the peer's port or the interface)"),
    (re.compile(r"Couldn't listen to port (\d+)"),
     "port {0} is taken on this node (another ib_write_bw, or another program, listens there)"),
    (re.compile(r"Couldn't connect to (\S+)"),
     "no ib_write_bw server answered at {0}: the server did not start, ended, or that address is not the peer's "
     "on this twin's subnet"),
    (re.compile(r"Couldn't allocate MR|ibv_reg_mr\w* failed|Couldn't create CQ"),
     "RDMA memory registration failed: the locked-memory limit (ulimit -l) is too low"),
    (re.compile(r"Unable to Connect the HCA's through the link|Failed to modify QP \w+ to RTR"),
     "the queue pairs could not connect: a wrong GID index, or the two devices are not on one link"),
    (re.compile(r"Couldn't read remote address|Failed to exchange data between server and clients"),
     "server and client lost each other during the set-up (the other side ended)"),
    (re.compile(r"Couldn't get context for the device"),
     "ib_write_bw could not open the device (its driver, permissions, or a GID index it does not have)"),
    (re.compile(r"Unable to open file descriptor for socket connection|Unable to init the socket connection"),
     "the TCP connection between server and client could not be set up"),
)


class PerftestError(ValueError):
    """The output holds no result of a bandwidth test; the message says what ib_write_bw said instead."""


def _lines(text: str) -> List[str]:
    """The output's lines, without a first comment line (a recorded output's ``# source`` line)."""
    lines = text.splitlines()
    if lines and lines[0].startswith("#"):
        lines = lines[1:]
    return lines


def failure(text: str) -> Optional[str]:
    """What the first line of a failure ib_write_bw printed means, with that line; None when there is none."""
    for line in _lines(text):
        for pattern, meaning in FAILURES:
            match = pattern.search(line)
            if match:
                return f"{meaning.format(*match.groups())} ({line.strip()})"
    return None


def _gbps(value: float, unit: str) -> float:
    if unit == "Gb/sec":
        return value
    if unit in ("MB/sec", "MiB/sec"):
        return round(value * MEBI_GBPS, 4)
    raise PerftestError(f"{TOOL}'s table is in {unit}, which is not a bandwidth unit perftest prints")


def _gid_ipv4(gid: str) -> Optional[str]:
    """The IPv4 address of an IPv4-mapped GID as perftest prints it (16 decimal bytes: 00:..:255:255:10:77:01:11)."""
    parts = gid.split(":")
    if len(parts) != 16 or not all(p.isdigit() for p in parts):
        return None
    octets = [int(p) for p in parts]
    if octets[:10] != [0] * 10 or octets[10:12] != [255, 255] or any(o > 255 for o in octets):
        return None
    return ".".join(str(o) for o in octets[12:])


def _setting_value(settings: Mapping[str, str], key: str) -> Optional[int]:
    match = re.match(r"\d+", settings.get(key, ""))
    return int(match.group(0)) if match else None


def read(text: str) -> Dict[str, Any]:
    """The figures of one ib_write_bw run, from its output (stdout and stderr together).

    Returns side (``server`` when the output has the server's banner, else ``client``), test, device,
    link_type, mtu_bytes, gid_index (None when not printed), qps, settings (every header ``Key: value``),
    local and remote (each queue pair's address fields, its ``gid`` and the gid's ``ipv4`` when it maps one),
    unit (the table's), rows (each ``bytes``, ``iterations``, ``bw_peak_gbps``, ``bw_average_gbps``,
    ``msg_rate_mpps``) and the figures of the last row (the largest size of a sweep, the latest interval of an
    endless run): bytes, iterations, bw_peak_gbps (None when the run did not measure a peak), bw_average_gbps,
    msg_rate_mpps; peak_measured. Raises PerftestError when the output holds no result row.
    """
    lines = _lines(text)
    test = None
    settings: Dict[str, str] = {}
    addresses: Dict[str, List[Dict[str, Any]]] = {"local": [], "remote": []}
    last: Optional[Dict[str, Any]] = None
    unit: Optional[str] = None
    rows: List[Dict[str, Any]] = []
    in_header = False
    for line in lines:
        if unit is None:
            table = TABLE.search(line)
            if table:
                unit = table.group(2)
                in_header = False
                continue
            title = TITLE.match(line)
            if title and test is None:
                test, in_header = title.group(1), True
                continue
            if RULE.match(line):
                if in_header and settings:
                    in_header = False
                continue
            address = ADDRESS.match(line)
            if address:
                last = dict(ADDRESS_FIELD.findall(address.group(2)))
                addresses[address.group(1)].append(last)
                continue
            gid = GID.match(line)
            if gid and last is not None:
                last["gid"] = gid.group(1)
                last["ipv4"] = _gid_ipv4(gid.group(1))
                continue
            if in_header:
                settings.update((key, value) for key, value in SETTING.findall(line))
            continue
        row = ROW.match(line)
        if row:
            rows.append({"bytes": int(row.group(1)), "iterations": int(row.group(2)),
                         "bw_peak_gbps": _gbps(float(row.group(3)), unit),
                         "bw_average_gbps": _gbps(float(row.group(4)), unit),
                         "msg_rate_mpps": float(row.group(5))})
    if not rows:
        said = failure(text)
        if said:
            raise PerftestError(f"{TOOL} gave no result: {said}")
        if unit is not None:
            raise PerftestError(f"{TOOL} printed its table's header but no result row: the test did not finish")
        if any(SERVER_BANNER in line for line in lines):
            raise PerftestError(f"{TOOL}'s server saw no client: no result after its banner")
        tail = " | ".join(line.strip() for line in lines if line.strip())[-300:]
        raise PerftestError(f"this is not a result of {TOOL} (no result table): {tail or 'the output is empty'}")
    if test is not None and " BW " not in f" {test} ":
        raise PerftestError(f"this is the output of a {test}, not of a bandwidth test")
    result = rows[-1]
    # A duration or an endless run measures no peak: it says so, and the column reads 0.00 (a run that moved
    # bytes had a peak above zero).
    peak_measured = not any(NO_PEAK in line for line in lines) and result["bw_peak_gbps"] > 0
    return {
        "side": "server" if any(SERVER_BANNER in line for line in lines) else "client",
        "test": test,
        "device": settings.get("Device"),
        "link_type": settings.get("Link type"),
        "mtu_bytes": _setting_value(settings, "Mtu"),
        "gid_index": _setting_value(settings, "GID index"),
        "qps": _setting_value(settings, "Number of qps"),
        "settings": settings,
        "local": addresses["local"],
        "remote": addresses["remote"],
        "unit": unit,
        "rows": rows,
        "bytes": result["bytes"],
        "iterations": result["iterations"],
        "bw_peak_gbps": result["bw_peak_gbps"] if peak_measured else None,
        "bw_average_gbps": result["bw_average_gbps"],
        "msg_rate_mpps": result["msg_rate_mpps"],
        "peak_measured": peak_measured,
    }


def command(device: str, port: int, duration_s: int, size_bytes: int, gid_index: Optional[int] = None,
            server: Optional[str] = None, executable: str = TOOL) -> List[str]:
    """The argv of one side of a bandwidth run: the server (no ``server``) or the client to ``server``.

    ``-F`` keeps a CPU frequency warning from ending the run, ``--report_gbits`` reports Gb/s, ``-D`` runs for a
    duration (so the peak is not measured), ``-s`` sets the message size, ``-x`` the RoCE GID index.
    """
    argv = [executable, "-d", device, "-p", str(port), "-D", str(duration_s), "-s", str(size_bytes), "-F",
            "--report_gbits"]
    if gid_index is not None:
        argv += ["-x", str(gid_index)]
    return argv + ([server] if server else [])


def link_name(node: str, device: str, peer: str, peer_device: str) -> str:
    """A link as the messages name it: the side that writes (the client) to the side written to."""
    return f"{node}:{device} -> {peer}:{peer_device}"


# The ConnectX-7 state that caps a healthy-looking rail (NVIDIA's connect-two-sparks guide).
DEGRADED_GBPS = (8.0, 25.0)


def likely_causes(measured_gbps: Optional[float], report: Optional[Mapping[str, Any]] = None) -> str:
    """The likely causes of a link under its floor, the ones its figures point at first."""
    causes = []
    mtu = (report or {}).get("mtu_bytes")
    if isinstance(mtu, int) and mtu < 4096:
        causes.append(f"RoCE ran at an MTU of {mtu} bytes, so an interface on either end is below the fabric's "
                      "MTU (9000 gives 4096; check ip link on both nodes)")
    if measured_gbps is not None and DEGRADED_GBPS[0] <= measured_gbps <= DEGRADED_GBPS[1]:
        causes.append("the 8-25 Gb/s of a ConnectX-7 left degraded after a boot or a cable change (reboot both "
                      "nodes; if it stays, power them off and on)")
    causes.append("a twin down or flapping on either end (the port's state in ibv_devinfo), a link at a lower "
                  "speed than 200 Gb/s (ethtool's Speed on both ends), or an MTU below the fabric's on either end")
    return "likely " + "; or ".join(causes)


def gate(measured_gbps: Optional[float], floor_gbps: float, link: str,
         report: Optional[Mapping[str, Any]] = None) -> Optional[str]:
    """A sentence naming the link, its figure, the floor and the likely cause when it is under the floor; None
    when it is at or above it. A link that gave no figure (measured_gbps None) is under any floor."""
    if measured_gbps is not None and measured_gbps >= floor_gbps:
        return None
    figure = "no figure" if measured_gbps is None else f"{measured_gbps:.2f} Gb/s"
    return (f"{link}: {figure}, under the floor of {floor_gbps:g} Gb/s; "
            f"{likely_causes(measured_gbps, report)}")


def summary(report: Mapping[str, Any]) -> Dict[str, Any]:
    """The figures of a run, without its rows and settings (what a play prints and records)."""
    keys: Sequence[str] = ("side", "device", "link_type", "mtu_bytes", "gid_index", "bytes", "iterations",
                           "bw_peak_gbps", "bw_average_gbps", "msg_rate_mpps")
    return {key: report.get(key) for key in keys}
