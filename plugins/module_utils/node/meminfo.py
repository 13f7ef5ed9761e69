"""Reading /proc/meminfo: the memory guard, the flusher, the supervisor, host_preflight and memory_gate."""

from __future__ import annotations

from typing import Dict

KIB = 1024


class MeminfoError(Exception):
    """A meminfo file cannot be read, or lacks a value the reader needs."""


def parse_meminfo(text: str) -> Dict[str, int]:
    """The values of /proc/meminfo text, in bytes where the line gives ``kB`` (counts stay counts)."""
    values: Dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not fields or not fields[0].isdigit():
            continue
        unit = fields[1] if len(fields) > 1 else ""
        values[name.strip()] = int(fields[0]) * (KIB if unit == "kB" else 1)
    return values


def read_meminfo(path: str) -> Dict[str, int]:
    """The values of the meminfo file at path; MeminfoError (``cannot read PATH: WHY``) when it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return parse_meminfo(handle.read())
    except OSError as err:
        raise MeminfoError(f"cannot read {path}: {err.strerror}") from err


def mem_available(text: str) -> int:
    """MemAvailable in bytes from the text of /proc/meminfo; ValueError when there is no such line."""
    values = parse_meminfo(text)
    if "MemAvailable" not in values:
        raise ValueError("meminfo has no MemAvailable line")
    return values["MemAvailable"]


def read_mem_available(path: str) -> int:
    """MemAvailable in bytes from the meminfo file at path; OSError when it cannot be read."""
    with open(path, encoding="ascii", errors="replace") as handle:
        return mem_available(handle.read())
