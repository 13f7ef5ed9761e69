"""What a candidate is compared with: another results file, or published figures.

Published figures (a recipe's ``bench.reference``, or a file holding that
mapping) name each cell by its suite and coordinates and give some metrics::

    source: seed 003, five original control blocks and three optimized blocks
    baseline: qualified          # picks from {original: x, qualified: y} values
    facts: {context_tokens: 262144, kv_tokens: 808020}
    cells:
      - {suite: speed, cell: prose-c1, tok_s: {original: 25.53, qualified: 31.18}}
      - {suite: sustained-decode, concurrency: 1, context: 0, temperature: default,
         tok_s: 36.7, ttft_s: 0.35, accept_length: 2.93}

A reference cell matches the one candidate cell of its suite whose
coordinates (``cell``, ``concurrency``, ``context``, ``temperature``) equal
every coordinate it gives. A results file matches cell by cell id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import BenchError
from .results import is_results, load_results
from .runner import SCALAR_METRICS
from .suites import load_document

METRICS = SCALAR_METRICS + ("accept_length", "accept_rate", "acceptance_per_position")
SELECTORS = ("suite", "cell", "concurrency", "context", "temperature")
TOP_KEYS = ("source", "baseline", "facts", "cells", "notes")


@dataclass
class RefCell:
    """One reference cell: how it is found among the candidate's cells, and its figures."""

    label: str
    selector: dict[str, Any]  # {"id": ...} for results; suite and coordinates for published figures
    metrics: dict[str, Any]
    samples: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reference:
    kind: str  # "results" or "published"
    source: str
    cells: list[RefCell]
    facts: dict[str, Any]
    context: dict[str, Any] | None = None
    server: dict[str, Any] | None = None


def _same_temperature(a: Any, b: Any) -> bool:
    if a == "default" or b == "default" or a is None or b is None:
        return (a in ("default", None)) == (b in ("default", None))
    try:
        return abs(float(a) - float(b)) < 1e-9
    except (TypeError, ValueError):
        return False


def matches(ref: RefCell, cell: Mapping[str, Any]) -> bool:
    """Whether a candidate results cell is the one a reference cell names."""
    for key, want in ref.selector.items():
        if key == "temperature":
            if not _same_temperature(want, cell.get("temperature")):
                return False
        elif cell.get(key) != want:
            return False
    return True


def from_results(doc: Mapping[str, Any], where: str) -> Reference:
    cells = [RefCell(label=c["id"], selector={"id": c["id"]}, metrics=dict(c["metrics"])) for c in doc["cells"]]
    context = doc.get("context") or {}
    return Reference(kind="results", source="results file %s (%s, %s)" % (where, context.get("recipe") or "no recipe",
                                                                          context.get("time") or "no time"),
                     cells=cells, facts=dict(doc.get("server") or {}), context=dict(context),
                     server=dict(doc.get("server") or {}))


def _pick(value: Any, baseline: str | None, where: str, problems: list[str]) -> Any:
    """A figure, or the baseline's figure of a {original: x, qualified: y} mapping."""
    if isinstance(value, dict):
        if baseline is None:
            problems.append("%s has several values (%s); set baseline: (or --baseline) to one of them"
                            % (where, ", ".join(sorted(value))))
            return None
        if baseline not in value:
            problems.append("%s has no %r value (it has %s)" % (where, baseline, ", ".join(sorted(value))))
            return None
        return value[baseline]
    return value


def _figure(value: Any, where: str, problems: list[str]) -> Any:
    if isinstance(value, list):
        if not value or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value):
            problems.append("%s is %r; give a list of numbers" % (where, value))
            return None
        return [float(v) for v in value]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        problems.append("%s is %r; give a number of at least 0" % (where, value))
        return None
    return float(value)


def from_published(raw: Any, where: str, baseline: str | None = None) -> Reference:
    """Published figures (a recipe's bench.reference); BenchError listing every problem."""
    if not isinstance(raw, dict):
        raise BenchError("%s: the reference must be a mapping with source and cells" % where)
    problems = ["%s: unknown key %r (a reference takes %s)" % (where, key, ", ".join(TOP_KEYS))
                for key in raw if key not in TOP_KEYS]
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        problems.append("%s: source is %r; say where the figures come from" % (where, source))
    chosen = baseline if baseline is not None else raw.get("baseline")
    if chosen is not None and not isinstance(chosen, str):
        problems.append("%s: baseline is %r; give the key of the values to compare with" % (where, chosen))
    facts = raw.get("facts") or {}
    if not isinstance(facts, dict):
        problems.append("%s: facts is %r; give a mapping" % (where, facts))
        facts = {}
    entries = raw.get("cells")
    if not isinstance(entries, list) or not entries:
        problems.append("%s: cells is %r; give a list of cells, each with suite and figures" % (where, entries))
        entries = []
    cells = []
    for number, entry in enumerate(entries, 1):
        here = "%s: cells[%d]" % (where, number)
        if not isinstance(entry, dict):
            problems.append("%s is %r; give a mapping" % (here, entry))
            continue
        suite = entry.get("suite")
        if not isinstance(suite, str) or not suite:
            problems.append("%s: suite is %r; name the suite of bench.suites it belongs to" % (here, suite))
        selector = {key: entry[key] for key in SELECTORS if key in entry}
        metrics: dict[str, Any] = {}
        samples: dict[str, Any] = {}
        for key, value in entry.items():
            if key in SELECTORS or key == "notes":
                continue
            if key == "samples":
                if not isinstance(value, dict):
                    problems.append("%s: samples is %r; give metric: [values]" % (here, value))
                else:
                    samples = {k: _figure(v, "%s: samples.%s" % (here, k), problems) for k, v in value.items()}
                continue
            if key not in METRICS:
                problems.append("%s: unknown key %r; metrics are %s" % (here, key, ", ".join(METRICS)))
                continue
            picked = _pick(value, chosen, "%s: %s" % (here, key), problems)
            if picked is not None:
                metrics[key] = _figure(picked, "%s: %s" % (here, key), problems)
        if not metrics:
            problems.append("%s gives no figure" % here)
        label = "/".join(str(v) for v in [suite] + [("%s=%s" % (k, selector[k])) if k != "cell" else selector[k]
                                                       for k in SELECTORS[1:] if k in selector])
        cells.append(RefCell(label=label, selector=selector, metrics=metrics, samples=samples))
    if problems:
        raise BenchError("\n".join(problems))
    return Reference(kind="published", source=str(source), cells=cells, facts=dict(facts))


def load_reference(path: str, published: bool, baseline: str | None = None) -> Reference:
    """--reference (a results file) or --recipe-reference (a recipe, or a file holding bench.reference)."""
    if not published:
        return from_results(load_results(path), path)
    doc = load_document(path)
    if is_results(doc):
        raise BenchError("%s is a results file; give it with --reference" % path)
    if isinstance(doc, dict) and isinstance(doc.get("bench"), dict):
        raw = doc["bench"].get("reference")
        if raw is None:
            raise BenchError("%s: the recipe has no bench.reference" % path)
        return from_published(raw, "%s bench.reference" % path, baseline)
    if isinstance(doc, dict) and "reference" in doc and "cells" not in doc:
        return from_published(doc["reference"], "%s reference" % path, baseline)
    return from_published(doc, path, baseline)


def recipe_gates(path: str) -> dict[str, Any] | None:
    """A recipe's bench.gates, when the --recipe-reference file is a recipe that has them."""
    doc = load_document(path)
    if isinstance(doc, dict) and isinstance(doc.get("bench"), dict):
        gates = doc["bench"].get("gates")
        return gates if isinstance(gates, dict) and gates else None
    return None
