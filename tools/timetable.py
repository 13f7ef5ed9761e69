#!/usr/bin/env python3
"""The test suite's time table: one line per stage with its wall time.

Every stage of ``make test`` and ``make check`` runs through this program,
which appends the stage's name, wall time and outcome to the table (a TSV
file, ``$SPARKSERVE_TIMETABLE``, by default ``.cache/timetable.tsv``); the
molecule scenarios add one line per fault through the ``timetable`` callback
plugin. ``make`` prints the table at the end, and a stage that fails prints
it at once, so a slowdown or a failure shows with its place in the run.
Stages may run side by side (``make test`` runs pytest and the linters beside
the lab's scenarios), so the total is the wall time since ``reset``, which
the table's first line records.

Usage::

    timetable.py reset                    # start a new table
    timetable.py run STAGE -- CMD ARGS... # run CMD, record STAGE, exit as CMD did
    timetable.py print                    # the table, with the total
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_TABLE = ".cache/timetable.tsv"


def table_path() -> Path:
    return Path(os.environ.get("SPARKSERVE_TIMETABLE") or DEFAULT_TABLE)


def record(table: Path, stage: str, seconds: float, outcome: str) -> None:
    """Append one stage's line to the table."""
    table.parent.mkdir(parents=True, exist_ok=True)
    with table.open("a", encoding="utf-8") as out:
        out.write(f"{stage}\t{seconds:.1f}\t{outcome}\n")


STARTED = "# started\t"


def started_at(table: Path) -> float | None:
    """When the table was reset (epoch seconds), from its first line; None for a table without it."""
    if not table.exists():
        return None
    first = table.read_text(encoding="utf-8").partition("\n")[0]
    try:
        return float(first[len(STARTED):]) if first.startswith(STARTED) else None
    except ValueError:
        return None


def read(table: Path) -> list[tuple[str, float, str]]:
    """The table's lines as (stage, seconds, outcome); lines that are not three fields are skipped."""
    if not table.exists():
        return []
    rows = []
    for line in table.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) == 3:
            try:
                rows.append((fields[0], float(fields[1]), fields[2]))
            except ValueError:
                continue
    return rows


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def render(rows: list[tuple[str, float, str]], wall_s: float | None = None) -> str:
    """The table as text, ending with the total: the wall time when given, else the sum of the top stages
    (nested lines, the faults within a scenario, are not added)."""
    if not rows:
        return "time table: no stage recorded"
    width = max(len(stage) for stage, _, _ in rows)
    lines = ["time table (wall time, m:ss):"]
    for stage, seconds, outcome in rows:
        lines.append(f"  {stage.ljust(width)}  {minutes(seconds):>7}  {outcome}")
    if wall_s is None:
        total = sum(seconds for stage, seconds, _ in rows if " / " not in stage)
        lines.append(f"  {'total'.ljust(width)}  {minutes(total):>7}")
    else:
        lines.append(f"  {'total (wall time)'.ljust(width)}  {minutes(wall_s):>7}")
    return "\n".join(lines)


def run_stage(table: Path, stage: str, argv: list[str]) -> int:
    """Run one stage's command; record it; on failure print the table so far. Its exit status."""
    started = time.monotonic()
    try:
        rc = subprocess.call(argv)
    except OSError as err:
        print(f"timetable: cannot run {argv[0]}: {err}", file=sys.stderr)
        rc = 127
    record(table, stage, time.monotonic() - started, "ok" if rc == 0 else f"FAILED (exit {rc})")
    if rc != 0:
        print(render(read(table)), flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("reset", help="start a new table")
    sub.add_parser("print", help="print the table")
    run = sub.add_parser("run", help="run one stage and record its wall time")
    run.add_argument("stage")
    run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    table = table_path()
    if args.action == "reset":
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(f"{STARTED}{time.time():.1f}\n", encoding="utf-8")
        return 0
    if args.action == "print":
        started = started_at(table)
        print(render(read(table), None if started is None else time.time() - started))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run needs a command after the stage name")
    return run_stage(table, args.stage, command)


if __name__ == "__main__":
    sys.exit(main())
