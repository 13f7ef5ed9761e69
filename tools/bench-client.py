#!/usr/bin/env python3
"""Benchmark the bench client itself: does it measure what the engine does, and is it never the limit?

Starts the lab's vLLM double (``lab/engine/bin/vllm serve``, one rank,
``--load-format dummy``) on 127.0.0.1 with known delays and draft
acceptance (configuration A below), runs ``sparkserve_bench`` against it
and prints, measured in this one run, each figure beside the one the
configuration gives and their ratio:

- per cell (sustained, concurrency 1, 8 and 64): TTFT p50 against
  TTFT_BASE_MS + TTFT_PER_1K_MS x prompt tokens / 1000; ITL mean and p50
  against ITL_MS; TPOT against ITL_MS / accept length; accept length, rate
  and per-position acceptance against their exact expectation;
- prefill of 2000 tokens: prompt tokens reached, TTFT and prefill tok/s;
- the client's own load in the c64 cell: CPU share of one core, CPU per
  chunk, event-loop lag p50 / p90 against ITL_MS;
- the ceiling: against a second double with no delays at all, the chunk
  rate the client drained against the rate the c64 cell needs.

Usage::

    .venv/bin/python tools/bench-client.py [--json FILE]

A benchmark, not a test: it judges nothing and exits 0 once it has
measured (2 when the double does not start). Good numbers: ratios within
a few percent of 1.00 on an idle machine, CPU share well under 0.5, loop
lag p90 under ITL/4, a ceiling of at least 3x. A loaded machine moves
them, which is why they are printed here rather than asserted in tests/.

The tests in tests/bench/ start the same double with the same knobs
(``Double``, ``KNOBS_A``) through this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT / "lab/engine/bin/vllm"
BENCH = str(ROOT / "bench")
COLLECTIONS = str(ROOT / "collections")
# sparkserve_bench, and the collection whose engine adapters name the metrics it reads.
for _folder in (COLLECTIONS, BENCH):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)

# Configuration A: the engine the measurements are checked against.
TTFT_BASE_MS = 300.0
TTFT_PER_1K_MS = 40.0
ITL_MS = 10.0
ACCEPT = (0.95, 0.9, 0.8)
SPEC_TOKENS = 3
KNOBS_A = {"VLLM_DOUBLE_TTFT_BASE_MS": "%g" % TTFT_BASE_MS, "VLLM_DOUBLE_TTFT_PER_1K_MS": "%g" % TTFT_PER_1K_MS,
           "VLLM_DOUBLE_ITL_MS": "%g" % ITL_MS, "VLLM_DOUBLE_ACCEPT": ",".join("%g" % p for p in ACCEPT)}
# No delays at all (and no drafts): the double, not the client, is the limit.
KNOBS_FAST = {"VLLM_DOUBLE_TTFT_BASE_MS": "0", "VLLM_DOUBLE_TTFT_PER_1K_MS": "0", "VLLM_DOUBLE_ITL_MS": "0"}

OUTPUT_TOKENS = {1: 300, 8: 300, 64: 100}
ACCURACY_SUITES: list[dict[str, Any]] = [
    # c1 runs longest: acceptance is random per step, and one stream makes few steps.
    {"name": "single", "kind": "sustained", "concurrency": 1, "duration_s": 3.0, "max_tokens": OUTPUT_TOKENS[1]},
    {"name": "eight", "kind": "sustained", "concurrency": 8, "duration_s": 3.0, "max_tokens": OUTPUT_TOKENS[8]},
    # Shorter answers at c64: the double plans every token of a request before its
    # first one (a hash per token), one request after another, so a burst of 64
    # long answers delays the last first tokens by tens of milliseconds.
    {"name": "sixtyfour", "kind": "sustained", "concurrency": 64, "duration_s": 2.0,
     "max_tokens": OUTPUT_TOKENS[64]},
    {"name": "prefill", "contexts": [2000], "runs": 3},
]
CELLS = {1: "single/c1-ctx0", 8: "eight/c8-ctx0", 64: "sixtyfour/c64-ctx0"}
PREFILL_CELL, PREFILL_CONTEXT = "prefill/ctx2000", 2000
CEILING_SUITE: list[dict[str, Any]] = [{"name": "ceiling", "kind": "sustained", "concurrency": 64,
                                        "duration_s": 1.0, "max_tokens": 200}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Double:
    """One `vllm serve` of the double with known knobs, as its own process.

    Its threads never share the client's interpreter: timings are the
    double's schedule plus real HTTP, and the client's CPU time is its alone.
    """

    def __init__(self, folder: Path, knobs: dict[str, str], speculative_tokens: int = 0) -> None:
        model = folder / "model"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps({"max_position_embeddings": 65536}), encoding="utf-8")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.knobs = knobs
        self.log = folder / "double.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv(model, speculative_tokens), stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **knobs, **self.extra_env()})
        try:
            self._wait()
        except RuntimeError:
            self.stop()
            raise

    def argv(self, model: Path, speculative_tokens: int) -> list[str]:
        """The double's command line, serving MODEL on self.port."""
        argv = [sys.executable, str(VLLM), "serve", str(model), "--served-model-name", "tiny",
                "--host", "127.0.0.1", "--port", str(self.port), "--load-format", "dummy"]
        if speculative_tokens:
            argv += ["--speculative-config", json.dumps({"method": "mtp",
                                                         "num_speculative_tokens": speculative_tokens})]
        return argv

    def extra_env(self) -> dict[str, str]:
        """What the double's process gets beside the environment and the knobs."""
        return {}

    def _wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the double exited: " + self.log.read_text(errors="replace"))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the double did not get healthy: " + self.log.read_text(errors="replace"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def expected_acceptance(output_tokens: int) -> tuple[float, float, list[float]]:
    """(acceptance length, rate, per position) configuration A gives for answers of this length.

    Exact expectation, not a simulation: each decode step drafts SPEC_TOKENS and
    accepts a run of positions; the last step of an answer keeps only the
    tokens still owed, which lowers acceptance a little for short answers.
    """
    reach = [1.0]
    for p in ACCEPT[:SPEC_TOKENS]:
        reach.append(reach[-1] * p)  # reach[i]: positions 0..i-1 all accepted
    runs = [reach[a] - (reach[a + 1] if a < SPEC_TOKENS else 0.0) for a in range(SPEC_TOKENS + 1)]

    # counts[r]: expected (drafts, accepted at position 0, 1, ...) to emit r more tokens.
    counts = [[0.0] * (SPEC_TOKENS + 1)]
    for remaining in range(1, output_tokens):
        total = [1.0] + [0.0] * SPEC_TOKENS
        for accepted, probability in enumerate(runs):
            kept = min(1 + accepted, remaining) - 1
            rest = counts[remaining - kept - 1]
            for i in range(SPEC_TOKENS + 1):
                total[i] += probability * (rest[i] + (1.0 if 0 < i <= kept else 0.0))
        counts.append(total)
    drafts, *per_position = counts[output_tokens - 1]  # the first token comes from the prefill
    share = [n / drafts for n in per_position]
    return 1 + sum(share), sum(share) / SPEC_TOKENS, share


def configured_ttft_ms(prompt_tokens: float) -> float:
    return TTFT_BASE_MS + TTFT_PER_1K_MS * prompt_tokens / 1000


def measure(url: str, suites: list[dict[str, Any]], seed: int = 7) -> dict[str, Any]:
    """One run of the bench client (as ``sparkserve-bench run`` does it); the results document."""
    from sparkserve_bench.runner import RunOptions, run_bench
    from sparkserve_bench.suites import parse_suites

    options = RunOptions(base_url=url, model="tiny", suites=parse_suites(suites), context={}, seed=seed,
                         warmup_requests=2, warmup_tokens=16)
    return asyncio.run(run_bench(options))


# --- the printed comparison -------------------------------------------------------


def _row(rows: list[dict[str, Any]], cell: str, figure: str, configured: float | None, measured: float | None,
         unit: str = "") -> None:
    ratio = measured / configured if configured and measured is not None else None
    rows.append({"cell": cell, "figure": figure, "unit": unit, "configured": configured, "measured": measured,
                 "ratio": ratio})


def accuracy_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measured figure beside the configured one."""
    cells = {cell["id"]: cell for cell in results["cells"]}
    rows: list[dict[str, Any]] = []
    for concurrency, cell_id in CELLS.items():
        cell = cells[cell_id]
        metrics, percentiles = cell["metrics"], cell["percentiles"]
        length, rate, share = expected_acceptance(OUTPUT_TOKENS[concurrency])
        _row(rows, cell_id, "output tokens", OUTPUT_TOKENS[concurrency], metrics["output_tokens"])
        _row(rows, cell_id, "TTFT p50", configured_ttft_ms(metrics["prompt_tokens"]),
             percentiles["ttft_ms"]["p50"], "ms")
        _row(rows, cell_id, "ITL mean", ITL_MS, metrics["itl_ms"], "ms")
        _row(rows, cell_id, "ITL p50", ITL_MS, percentiles["itl_ms"]["p50"], "ms")
        measured_length = metrics["accept_length"]
        _row(rows, cell_id, "TPOT (ITL/accept length)", ITL_MS / length, metrics["tpot_ms"], "ms")
        _row(rows, cell_id, "accept length", length, measured_length)
        _row(rows, cell_id, "accept rate", rate, metrics["accept_rate"])
        for position, (expected, measured) in enumerate(zip(share, metrics["acceptance_per_position"] or [],
                                                            strict=False), 1):
            _row(rows, cell_id, "acceptance pos %d" % position, expected, measured)
    cell = cells[PREFILL_CELL]
    metrics = cell["metrics"]
    expected_s = configured_ttft_ms(metrics["prompt_tokens"]) / 1000
    _row(rows, PREFILL_CELL, "prompt tokens", PREFILL_CONTEXT, metrics["prompt_tokens"])
    _row(rows, PREFILL_CELL, "TTFT", expected_s, metrics["ttft_s"], "s")
    _row(rows, PREFILL_CELL, "prefill rate", metrics["prompt_tokens"] / expected_s, metrics["prefill_tok_s"], "tok/s")
    return rows


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return "%.*f" % (digits, value) if abs(value) < 1000 else "%.0f" % value


def print_rows(rows: list[dict[str, Any]]) -> None:
    print("%-20s %-30s %11s %11s %7s" % ("cell", "figure", "configured", "measured", "ratio"))
    for row in rows:
        figure = row["figure"] + (" (%s)" % row["unit"] if row["unit"] else "")
        print("%-20s %-30s %11s %11s %7s" % (row["cell"], figure, _num(row["configured"]), _num(row["measured"]),
                                             _num(row["ratio"])))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def measure_double(folder: Path, knobs: dict[str, str], suites: list[dict[str, Any]],
                   speculative_tokens: int = 0) -> dict[str, Any]:
    """Start a double with these knobs in folder, run the suites against it, stop it; the results.

    Raises RuntimeError when the double does not start.
    """
    double = Double(folder, knobs, speculative_tokens)
    try:
        return measure(double.url, suites)
    finally:
        double.stop()


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-client-") as folder:
        try:
            accuracy = measure_double(Path(folder) / "a", KNOBS_A, ACCURACY_SUITES, SPEC_TOKENS)
            ceiling = measure_double(Path(folder) / "fast", KNOBS_FAST, CEILING_SUITE)
        except RuntimeError as exc:
            print("bench-client: %s" % exc, file=sys.stderr)
            return 2

    rows = accuracy_rows(accuracy)
    busiest = next(c for c in accuracy["cells"] if c["id"] == CELLS[64])
    client = busiest["client"]
    needed = 64 * 1000.0 / ITL_MS
    drained = ceiling["cells"][0]["client"]["chunks_per_s"]
    lag = client["loop_lag_ms"] or {}
    figures = {
        "configuration": {"ttft_base_ms": TTFT_BASE_MS, "ttft_per_1k_ms": TTFT_PER_1K_MS, "itl_ms": ITL_MS,
                          "accept": list(ACCEPT), "speculative_tokens": SPEC_TOKENS},
        "rows": rows,
        "errors": accuracy["summary"]["errors"] + ceiling["summary"]["errors"],
        "client_c64": {"cpu_share_of_one_core": client["cpu_share_of_one_core"],
                       "cpu_us_per_chunk": client["cpu_us_per_chunk"], "chunks_per_s": client["chunks_per_s"],
                       "loop_lag_p50_ms": lag.get("p50"), "loop_lag_p90_ms": lag.get("p90")},
        "ceiling": {"chunks_per_s": drained, "needed_chunks_per_s": needed,
                    "ratio": drained / needed if drained else None},
        "load_average": os.getloadavg()[0],
    }
    print("configuration A: TTFT %g ms + %g ms per 1k prompt tokens, ITL %g ms, %d drafts accepted with %s"
          % (TTFT_BASE_MS, TTFT_PER_1K_MS, ITL_MS, SPEC_TOKENS, ", ".join("%g" % p for p in ACCEPT)))
    print("requests: %d measured, %d failed; load average %.2f on %d cores"
          % (accuracy["summary"]["requests"], figures["errors"], figures["load_average"], os.cpu_count() or 0))
    print()
    print_rows(rows)
    worst = max(abs(row["ratio"] - 1) for row in rows if row["ratio"] is not None)
    print()
    print("worst ratio: %.3f off 1.000 (goal: within 0.05 on an idle machine)" % worst)
    print("client at c64   CPU %.3f of one core, %.1f us per chunk, %.0f chunks/s (goal: CPU share < 0.5)"
          % (client["cpu_share_of_one_core"], client["cpu_us_per_chunk"], client["chunks_per_s"]))
    print("event loop      a 5 ms ticker woke %.2f ms late (p50), %.2f ms (p90) against ITL %g ms (goal p90 < %g ms)"
          % (lag.get("p50", float("nan")), lag.get("p90", float("nan")), ITL_MS, ITL_MS / 4))
    print("ceiling         %.0f chunks/s drained from a double with no delays, %.0f needed at c64: %.1fx (goal >= 3x)"
          % (drained, needed, figures["ceiling"]["ratio"] or 0.0))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
