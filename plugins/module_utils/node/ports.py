"""Which TCP ports of this node's network namespace are listening, read from /proc (connecting to nothing)."""

from __future__ import annotations

from typing import Sequence

TCP_LISTEN = "0A"  # the state of a listening socket in /proc/net/tcp
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def listening(port: int, tables: Sequence[str] = TCP_TABLES) -> bool:
    """Whether a TCP socket of this network namespace listens on port, on any address (read from /proc,
    connecting to nothing: an ib_write_bw server takes the first connection it is offered as its client)."""
    wanted = f":{port:04X}"
    for table in tables:
        try:
            with open(table, encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[1].endswith(wanted) and fields[3] == TCP_LISTEN:
                return True
    return False
