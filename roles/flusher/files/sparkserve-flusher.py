#!/usr/bin/python3
"""Page-cache flusher of a sparkserve node while the ranks load their weights.

On a DGX Spark the page cache of the weights being read competes with the GPU
for the same unified memory, and loads run out of memory without a flusher.
Each pass syncs, then writes ``3`` to /proc/sys/vm/drop_caches, and logs how
much page cache it freed and how much memory is available afterwards.

Modes:

* ``unconditional`` (default): flush at every pass.  A flusher that waited for
  a threshold still let loads run out of memory.
* ``threshold``: flush only when Cached exceeds ``--threshold-bytes``; a pass
  below it does nothing and logs nothing.

The flusher stops by itself, with status 0, when the ``--until-file`` exists
(checked before every pass, the first one included), when ``--timeout-s``
seconds have passed, after ``--passes`` passes (skipped ones count), or on
SIGTERM; it logs why.  It exits 1 when it cannot write the drop-caches file
(it must run as root) or cannot read Cached and MemAvailable, and 2 for bad
arguments.  Log lines go to stdout, one per event.

Usage::

    sparkserve-flusher.py --until-file /run/sparkserve/NAME.loaded
    sparkserve-flusher.py --mode threshold --threshold-bytes 17179869184
    sparkserve-flusher.py --until-file /run/sparkserve/NAME.loaded --deployment NAME
        --metrics-path /var/lib/node_exporter/textfile/sparkserve-flusher-NAME.prom   # one line

Metrics: with ``--metrics-path PATH`` (which needs ``--deployment NAME``, the
value of the ``deployment`` label) the flusher writes a Prometheus
node-exporter textfile (node_exporter's textfile collector reads only files
named ``*.prom``) once at start, after every pass, and a last time when it
exits, for whatever reason, with ``running`` 0; it leaves that file in place,
so that its counters stay visible.  Each write replaces the whole file
(written to a hidden temporary file beside it, then renamed); the folder must
exist.
A file that cannot be written is said once on stderr and the flusher carries
on.  Families, each with the label ``deployment``::

    sparkserve_flusher_passes_total                  counter  passes done (skipped ones count)
    sparkserve_flusher_freed_bytes_total             counter  page cache its passes freed, bytes
    sparkserve_flusher_running                       gauge    1 while it runs, 0 once it exited
    sparkserve_flusher_last_pass_timestamp_seconds   gauge    unix time the last pass ended; 0 before

The flusher imports sparkserve's node library (``sparkserve_node``), which the
sparkserve role installs once per node in ``sparkserve_node_library_dir``; the
unit puts that folder on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from sparkserve_node.config import NAME_PATTERN, NAME_RULE
from sparkserve_node.lifecycle import Terminated, log, on_signal
from sparkserve_node.meminfo import MeminfoError, read_meminfo
from sparkserve_node.textfile import MetricFamily, TextfileWriter

MODES = ("unconditional", "threshold")
DEFAULT_INTERVAL_S = 2.0
DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_DROP_CACHES_PATH = "/proc/sys/vm/drop_caches"
DEFAULT_MEMINFO_PATH = "/proc/meminfo"
GIB = 1024**3

Reader = Callable[[str], Mapping[str, int]]


class FlushError(Exception):
    """The drop-caches file cannot be written."""


@dataclass(frozen=True)
class Options:
    mode: str
    interval_s: float
    threshold_bytes: int | None
    drop_caches_path: str
    meminfo_path: str
    until_file: str | None
    timeout_s: float
    passes: int | None
    metrics_path: str | None = None  # None: no metrics
    deployment: str | None = None  # the metrics' deployment label; given with metrics_path


@dataclass(frozen=True)
class Sample:
    cached: int
    available: int


# --- meminfo ----------------------------------------------------------------


def take_sample(read: Reader, path: str) -> Sample:
    values = read(path)
    for key in ("Cached", "MemAvailable"):
        if key not in values:
            raise MeminfoError(f"{path} has no {key} value")
    return Sample(cached=values["Cached"], available=values["MemAvailable"])


def gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


# --- one pass ---------------------------------------------------------------


def drop_caches(path: str) -> None:
    try:
        with open(path, "w", encoding="ascii") as drop:
            drop.write("3")
    except PermissionError as err:
        raise FlushError(f"cannot write 3 to {path}: {err.strerror}; run the flusher as root") from err
    except OSError as err:
        raise FlushError(f"cannot write 3 to {path}: {err.strerror}; check --drop-caches-path") from err


def should_flush(options: Options, before: Sample) -> bool:
    if options.mode == "unconditional" or options.threshold_bytes is None:
        return True
    return before.cached > options.threshold_bytes


@dataclass(frozen=True)
class Flush:
    """The memory before and after a pass that flushed."""

    before: Sample
    after: Sample

    @property
    def freed(self) -> int:
        """The bytes of page cache the pass freed; 0 when the cache grew meanwhile."""
        return max(0, self.before.cached - self.after.cached)

    def line(self, number: int) -> str:
        return (f"flusher: pass {number} freed {gib(self.freed)} of page cache "
                f"(Cached {gib(self.before.cached)} -> {gib(self.after.cached)}); "
                f"MemAvailable {gib(self.after.available)}")


def flush_pass(options: Options, read: Reader, sync: Callable[[], None]) -> Flush | None:
    """One pass; None when the threshold skipped it."""
    before = take_sample(read, options.meminfo_path)
    if not should_flush(options, before):
        return None
    sync()
    drop_caches(options.drop_caches_path)
    return Flush(before, take_sample(read, options.meminfo_path))


# --- metrics: a node_exporter textfile ------------------------------------------
# (the file, its text and its writer: sparkserve_node.textfile)


@dataclass
class Tally:
    """What the flusher did so far, for its metrics."""

    passes: int = 0
    freed_bytes: int = 0
    last_pass_at: float = 0.0  # unix time; 0 before the first pass


def flusher_families(deployment: str, tally: Tally, running: bool) -> list[MetricFamily]:
    labels = {"deployment": deployment}
    return [
        MetricFamily("sparkserve_flusher_passes_total", "counter",
                     "Passes the flusher made since it started, those the threshold skipped included.",
                     [(labels, tally.passes)]),
        MetricFamily("sparkserve_flusher_freed_bytes_total", "counter",
                     "Bytes of page cache the flusher's passes freed since it started.",
                     [(labels, tally.freed_bytes)]),
        MetricFamily("sparkserve_flusher_running", "gauge",
                     "1 while the flusher runs, 0 once it exited.", [(labels, 1 if running else 0)]),
        MetricFamily("sparkserve_flusher_last_pass_timestamp_seconds", "gauge",
                     "Unix time the flusher's last pass ended; 0 before the first pass.",
                     [(labels, tally.last_pass_at)]),
    ]


# --- the loop ---------------------------------------------------------------


def stop_reason(options: Options, passes_done: int, elapsed_s: float) -> str | None:
    if options.until_file is not None and os.path.exists(options.until_file):
        return f"{options.until_file} exists"
    if elapsed_s >= options.timeout_s:
        return f"the timeout of {options.timeout_s:g} s is reached"
    if options.passes is not None and passes_done >= options.passes:
        return f"{options.passes} passes are done"
    return None


def describe(options: Options) -> str:
    when = ("at every pass" if options.mode == "unconditional"
            else f"when Cached exceeds {gib(options.threshold_bytes or 0)}")
    until = f"until {options.until_file} exists or " if options.until_file else "for "
    return (f"flusher: flushing {when}, every {options.interval_s:g} s, "
            f"{until}{options.timeout_s:g} s at most")


def run(options: Options, read: Reader = read_meminfo, sync: Callable[[], None] = os.sync,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic, now: Callable[[], float] = time.time) -> int:
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    start = clock()
    tally = Tally()
    metrics = TextfileWriter(options.metrics_path, "flusher") if options.metrics_path is not None else None
    deployment = options.deployment or ""

    def write_metrics(running: bool) -> None:
        if metrics is not None:
            metrics.write(flusher_families(deployment, tally, running))

    log(describe(options))
    try:
        write_metrics(running=True)
        while True:
            reason = stop_reason(options, tally.passes, clock() - start)
            if reason is not None:
                log(f"flusher: stopping after {tally.passes} passes: {reason}")
                return 0
            flush = flush_pass(options, read, sync)
            tally.passes += 1  # counted before it is logged: the log never runs ahead of the count
            tally.freed_bytes += flush.freed if flush is not None else 0
            tally.last_pass_at = now()
            if flush is not None:
                log(flush.line(tally.passes))
            write_metrics(running=True)
            if options.passes is None or tally.passes < options.passes:
                remaining = options.timeout_s - (clock() - start)
                sleep(max(0.0, min(options.interval_s, remaining)))
    except Terminated:
        log(f"flusher: terminated after {tally.passes} passes; exiting")
        return 0
    except (FlushError, MeminfoError) as err:
        log(f"flusher: {err}")
        return 1
    finally:
        for sig in previous:  # a second signal does not cut the last write short
            signal.signal(sig, signal.SIG_IGN)
        write_metrics(running=False)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- arguments --------------------------------------------------------------


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
    return value


def whole_number(text: str, minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is below {minimum}")
    return value


def pass_count(text: str) -> int:
    return whole_number(text, minimum=1)


def file_path(text: str) -> str:
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file path")
    return text


def deployment_name(text: str) -> str:
    if not NAME_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {NAME_RULE}")
    return text


def parse_args(argv: Sequence[str]) -> Options:
    parser = argparse.ArgumentParser(
        description="Sync and drop the page cache while the ranks load their weights.")
    parser.add_argument("--mode", choices=MODES, default="unconditional",
                        help="flush at every pass (default), or only above --threshold-bytes")
    parser.add_argument("--interval-s", type=positive_float, default=DEFAULT_INTERVAL_S,
                        help="seconds between two passes (default 2)")
    parser.add_argument("--threshold-bytes", type=whole_number,
                        help="threshold mode: flush only when Cached exceeds this many bytes")
    parser.add_argument("--drop-caches-path", default=DEFAULT_DROP_CACHES_PATH)
    parser.add_argument("--meminfo-path", default=DEFAULT_MEMINFO_PATH)
    parser.add_argument("--until-file", help="stop when this file exists")
    parser.add_argument("--timeout-s", type=positive_float, default=DEFAULT_TIMEOUT_S,
                        help="stop after this many seconds (default 3600)")
    parser.add_argument("--passes", type=pass_count,
                        help="stop after this many passes")
    parser.add_argument("--metrics-path", type=file_path,
                        help="write a node-exporter textfile (*.prom) here at start, after every pass and at exit "
                             "(needs --deployment)")
    parser.add_argument("--deployment", type=deployment_name,
                        help="the deployment's name, the metrics' deployment label")
    args = parser.parse_args(argv)
    if args.metrics_path is not None and args.deployment is None:
        parser.error("--metrics-path needs --deployment NAME (the metrics' deployment label)")
    if args.mode == "threshold" and args.threshold_bytes is None:
        parser.error("--mode threshold needs --threshold-bytes")
    if args.mode == "unconditional" and args.threshold_bytes is not None:
        parser.error("--threshold-bytes applies only to --mode threshold")
    return Options(
        mode=args.mode, interval_s=args.interval_s, threshold_bytes=args.threshold_bytes,
        drop_caches_path=args.drop_caches_path, meminfo_path=args.meminfo_path,
        until_file=args.until_file, timeout_s=args.timeout_s, passes=args.passes,
        metrics_path=args.metrics_path, deployment=args.deployment,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
