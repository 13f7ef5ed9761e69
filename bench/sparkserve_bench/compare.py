"""Candidate against reference: per-cell ratios, gates, a pass/fail table.

Gates (a mapping; a recipe's ``bench.gates``, or ``--gates``):

- ``throughput_floor``: every matched cell's speed metric (``tok_s``,
  ``decode_tok_s`` for long-context cells, ``prefill_tok_s`` for prefill
  cells) at least this share of the reference's (seed 003: 0.98);
- ``ttft_ceiling``: every matched cell's ``ttft_s`` at most this share
  (seed 003: 1.05);
- ``geomean_floor``: the geometric mean of the speed ratios of the cells in
  ``geomean_cells`` (patterns of cell ids; default: every matched cell) at
  least this;
- ``acceptance_floor``: every matched ``accept_length`` at least this share;
- ``min_context_tokens`` / ``min_kv_tokens`` (``min_logical_kv_tokens``):
  the candidate server's ``max_model_len`` / KV tokens at least this;
- ``require_all_cells`` (default true): every reference cell was measured;
- ``summary``: the name of the reported summary, informational.

A candidate cell with failed requests always fails. A cell gate is skipped
(SKIP, not a failure) when no matched reference cell gives its figure, as
seed 003 publishes no TTFT; a figure the reference gives and the candidate
lacks fails. With no gates given anywhere, seed 003's two are used.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import COMPARISON_FORMAT
from .errors import BenchError
from .reference import RefCell, Reference, matches
from .stats import geometric_mean

DEFAULT_GATES = {"throughput_floor": 0.98, "ttft_ceiling": 1.05}
GATE_KEYS = ("throughput_floor", "ttft_ceiling", "geomean_floor", "geomean_cells", "acceptance_floor",
             "min_context_tokens", "min_kv_tokens", "min_logical_kv_tokens", "require_all_cells", "summary")
SUMMARIES = ("geometric_mean_speed_ratio",)


@dataclass(frozen=True)
class Gates:
    throughput_floor: float | None = None
    ttft_ceiling: float | None = None
    geomean_floor: float | None = None
    geomean_cells: tuple[str, ...] = ()
    acceptance_floor: float | None = None
    min_context_tokens: int | None = None
    min_kv_tokens: int | None = None
    require_all_cells: bool = True
    summary: str | None = None
    source: str = "default"

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, ())}


def parse_gates(raw: Any, source: str) -> Gates:
    """Gates from a mapping; BenchError listing every problem."""
    if not isinstance(raw, dict):
        raise BenchError("gates (%s): give a mapping such as {\"throughput_floor\": 0.98, \"ttft_ceiling\": 1.05}"
                         % source)
    problems = ["gates (%s): unknown gate %r; gates are %s" % (source, key, ", ".join(GATE_KEYS))
                for key in raw if key not in GATE_KEYS]

    def ratio(key: str) -> float | None:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 100:
            problems.append("gates (%s): %s is %r; give a ratio such as 0.98 (98 %%)" % (source, key, value))
            return None
        return float(value)

    def count(key: str) -> int | None:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append("gates (%s): %s is %r; give a positive integer" % (source, key, value))
            return None
        return value

    cells = raw.get("geomean_cells", [])
    if not isinstance(cells, list) or not all(isinstance(c, str) and c for c in cells):
        problems.append("gates (%s): geomean_cells is %r; give a list of cell ids or patterns (speed/*-c1)"
                        % (source, cells))
        cells = []
    require = raw.get("require_all_cells", True)
    if not isinstance(require, bool):
        problems.append("gates (%s): require_all_cells is %r; give true or false" % (source, require))
        require = True
    summary = raw.get("summary")
    if summary is not None and summary not in SUMMARIES:
        problems.append("gates (%s): summary is %r; give %s" % (source, summary, " or ".join(SUMMARIES)))
    if "min_kv_tokens" in raw and "min_logical_kv_tokens" in raw:
        problems.append("gates (%s): give min_kv_tokens or min_logical_kv_tokens, not both" % source)
    gates = Gates(throughput_floor=ratio("throughput_floor"), ttft_ceiling=ratio("ttft_ceiling"),
                  geomean_floor=ratio("geomean_floor"), geomean_cells=tuple(cells),
                  acceptance_floor=ratio("acceptance_floor"), min_context_tokens=count("min_context_tokens"),
                  min_kv_tokens=count("min_kv_tokens") or count("min_logical_kv_tokens"),
                  require_all_cells=require, summary=summary, source=source)
    if problems:
        raise BenchError("\n".join(problems))
    return gates


@dataclass
class Row:
    """One matched cell: the figures side by side and their ratios."""

    id: str
    reference: str
    speed_metric: str
    candidate: dict[str, Any]
    ref: dict[str, Any]
    errors: int
    ratios: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def ratio(self, metric: str) -> float | None:
        return self.ratios.get(metric)


@dataclass
class GateResult:
    name: str
    passed: bool
    detail: str
    status: str = ""  # "pass", "fail", or "skip" (the reference gives no such figure: not checked)

    def __post_init__(self) -> None:
        if not self.status:
            self.status = "pass" if self.passed else "fail"


def _ratios(candidate: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for key, ref in reference.items():
        cand = candidate.get(key)
        if isinstance(ref, (int, float)) and isinstance(cand, (int, float)) and ref > 0:
            out[key] = float(cand) / float(ref)
    return out


def match_cells(candidate: Mapping[str, Any], reference: Reference) -> tuple[list[tuple[RefCell, dict[str, Any]]],
                                                                            list[RefCell]]:
    """(reference cell, candidate cell) pairs and the reference cells nobody measured; BenchError if ambiguous."""
    pairs, missing, ambiguous = [], [], []
    for ref in reference.cells:
        found = [cell for cell in candidate["cells"] if matches(ref, cell)]
        if len(found) == 1:
            pairs.append((ref, found[0]))
        elif not found:
            missing.append(ref)
        else:
            ambiguous.append("%s matches %s; give cell, concurrency, context or temperature to pick one"
                             % (ref.label, ", ".join(c["id"] for c in found)))
    if ambiguous:
        raise BenchError("reference cells that match several candidate cells:\n" + "\n".join(ambiguous))
    return pairs, missing


def compare(candidate: Mapping[str, Any], reference: Reference, gates: Gates) -> dict[str, Any]:
    """Every matched cell's ratios and every gate's verdict, as the comparison document."""
    pairs, missing = match_cells(candidate, reference)
    rows = []
    for ref, cell in pairs:
        row = Row(id=cell["id"], reference=ref.label, speed_metric=cell.get("speed_metric", "tok_s"),
                  candidate=dict(cell["metrics"]), ref=dict(ref.metrics), errors=int(cell.get("errors", 0)))
        row.ratios = _ratios(row.candidate, row.ref)
        rows.append(row)
    results = _gate_results(candidate, rows, missing, gates)
    geo = _geomean(rows, gates)
    passed = all(g.passed for g in results)
    return {
        "format": COMPARISON_FORMAT,
        "passed": passed,
        "candidate": {"context": candidate.get("context"), "server": candidate.get("server")},
        "reference": {"kind": reference.kind, "source": reference.source, "context": reference.context,
                      "facts": reference.facts},
        "gates": gates.as_dict(),
        "geometric_mean_speed_ratio": geo[0],
        "geomean_cells": geo[1],
        "gate_results": [g.__dict__ for g in results],
        "cells": [{"id": r.id, "reference": r.reference, "speed_metric": r.speed_metric, "candidate": r.candidate,
                   "reference_metrics": r.ref, "ratios": r.ratios, "errors": r.errors, "failures": r.failures}
                  for r in rows],
        "unmatched_reference_cells": [m.label for m in missing],
    }


def _geomean(rows: list[Row], gates: Gates) -> tuple[float | None, list[str]]:
    chosen = [r for r in rows if r.ratio(r.speed_metric) is not None
              and (not gates.geomean_cells or any(fnmatch.fnmatchcase(r.id, p) for p in gates.geomean_cells))]
    if not chosen:
        return None, []
    return geometric_mean([r.ratios[r.speed_metric] for r in chosen]), [r.id for r in chosen]


def _cell_gate(rows: list[Row], name: str, metric: str | None, limit: float, floor: bool) -> GateResult:
    """Every matched cell whose reference gives the metric; skipped when no reference cell gives it."""
    checked, failed, unmeasured = [], [], []
    for row in rows:
        key = metric or row.speed_metric
        if not isinstance(row.ref.get(key), (int, float)):
            continue
        value = row.ratio(key)
        if value is None:
            unmeasured.append(row.id)
            row.failures.append("no %s measured" % key)
            continue
        checked.append((value, row.id))
        ok = value >= limit if floor else value <= limit
        if not ok:
            row.failures.append("%s %.3f %s %.3f" % (key, value, "<" if floor else ">", limit))
            failed.append("%s (%.3f)" % (row.id, value))
    if not checked and not unmeasured:
        return GateResult(name, True, "not checked: the reference gives no %s" % (metric or "speed figure"),
                          status="skip")
    detail = "%d/%d cells %s %.3f" % (len(checked) - len(failed), len(checked) + len(unmeasured),
                                      ">=" if floor else "<=", limit)
    if checked:
        worst = (min if floor else max)(checked)
        detail += "; %s %.3f (%s)" % ("lowest" if floor else "highest", worst[0], worst[1])
    if failed:
        detail += "; failing: " + ", ".join(failed)
    if unmeasured:
        detail += "; not measured by the candidate: " + ", ".join(unmeasured)
    return GateResult(name, not failed and not unmeasured, detail)


def _gate_results(candidate: Mapping[str, Any], rows: list[Row], missing: list[RefCell],
                  gates: Gates) -> list[GateResult]:
    results = []
    errored = [r for r in rows if r.errors]
    results.append(GateResult("no_request_errors", not errored,
                              "every matched cell's requests succeeded" if not errored else
                              "failed requests in " + ", ".join("%s (%d)" % (r.id, r.errors) for r in errored)))
    if not rows:
        results.append(GateResult("matched_cells", False, "no reference cell matches a candidate cell: are the "
                                  "suite names and coordinates the same?"))
    if gates.require_all_cells:
        results.append(GateResult("require_all_cells", not missing,
                                  "all %d reference cells measured" % len(rows) if not missing else
                                  "not measured: " + ", ".join(m.label for m in missing)))
    if gates.throughput_floor is not None:
        results.append(_cell_gate(rows, "throughput_floor", None, gates.throughput_floor, floor=True))
    if gates.ttft_ceiling is not None:
        results.append(_cell_gate(rows, "ttft_ceiling", "ttft_s", gates.ttft_ceiling, floor=False))
    if gates.acceptance_floor is not None:
        results.append(_cell_gate(rows, "acceptance_floor", "accept_length", gates.acceptance_floor, floor=True))
    if gates.geomean_floor is not None:
        value, cells = _geomean(rows, gates)
        if value is None:
            results.append(GateResult("geomean_floor", False, "no matched speed ratio among %s"
                                      % (", ".join(gates.geomean_cells) or "the matched cells")))
        else:
            results.append(GateResult("geomean_floor", value >= gates.geomean_floor,
                                      "geometric mean %.4f of %d speed ratios %s %.3f"
                                      % (value, len(cells), ">=" if value >= gates.geomean_floor else "<",
                                         gates.geomean_floor)))
    server = candidate.get("server") or {}
    for name, key, want in (("min_context_tokens", "max_model_len", gates.min_context_tokens),
                            ("min_kv_tokens", "kv_tokens", gates.min_kv_tokens)):
        if want is None:
            continue
        have = server.get(key)
        if not isinstance(have, int):
            results.append(GateResult(name, False, "the candidate's server reported no %s" % key))
        else:
            results.append(GateResult(name, have >= want, "%s %d %s %d" % (key, have, ">=" if have >= want else "<",
                                                                           want)))
    return results


# --- the terminal table ---------------------------------------------------------


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "-"
    return "%.*f" % (digits, value) if isinstance(value, (int, float)) else str(value)


def table(comparison: Mapping[str, Any]) -> str:
    """The pass/fail table a person reads."""
    header = ("cell", "metric", "cand", "ref", "ratio", "TTFT s", "ref", "ratio", "accept", "ref", "result")
    lines = []
    for cell in comparison["cells"]:
        metric = cell["speed_metric"]
        cand, ref, ratios = cell["candidate"], cell["reference_metrics"], cell["ratios"]
        verdict = "FAIL " + "; ".join(cell["failures"]) if cell["failures"] or cell["errors"] else "ok"
        if cell["errors"]:
            verdict = "FAIL %d failed requests" % cell["errors"] + ("; " + "; ".join(cell["failures"])
                                                                    if cell["failures"] else "")
        lines.append((cell["id"], metric, _fmt(cand.get(metric), 1), _fmt(ref.get(metric), 1),
                      _fmt(ratios.get(metric), 3), _fmt(cand.get("ttft_s"), 3), _fmt(ref.get("ttft_s"), 3),
                      _fmt(ratios.get("ttft_s"), 3), _fmt(cand.get("accept_length")), _fmt(ref.get("accept_length")),
                      verdict))
    widths = [max(len(str(row[i])) for row in [header] + lines) for i in range(len(header))]
    out = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in [header] + lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    for label in comparison["unmatched_reference_cells"]:
        out.append("not measured: %s" % label)
    out.append("")
    if comparison["geometric_mean_speed_ratio"] is not None:
        out.append("geometric mean of speed ratios: %.4f over %d cells"
                   % (comparison["geometric_mean_speed_ratio"], len(comparison["geomean_cells"])))
    for gate in comparison["gate_results"]:
        out.append("%s  %s: %s" % (gate["status"].upper(), gate["name"], gate["detail"]))
    out.append("QUALIFIED" if comparison["passed"] else "NOT QUALIFIED")
    return "\n".join(out)
