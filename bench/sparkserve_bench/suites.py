"""Suites: what to measure, checked in full, and expanded into cells.

A suite file is a YAML or JSON list of suites (or a mapping with ``suites:``,
or a recipe, whose ``bench.suites`` is used). Each suite is a mapping; its
``kind`` says how it is measured, and is implied by the names the seeds use
(``coding-peak``, ``sustained-decode``, ``prefill``, ``long-context``,
``speed``, ``smoke``). Unknown keys are errors; every problem is reported at
once. bench/README.md has the full table.

A *cell* is one measured point (a concurrency, a context length, a
temperature, ...). Its id is ``SUITE/CELL``: for grids the cell name is built
from the coordinates (``c4-ctx4096``, with ``-t0`` or ``-tdefault`` when the
suite lists several temperatures); the cells of ``speed`` suites are named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from .errors import BenchError
from .prompts import CODING_PEAK_PROMPT, FAMILIES

KINDS = ("coding_peak", "sustained", "prefill", "long_context", "cells", "smoke")
NAME_KINDS = {"coding-peak": "coding_peak", "sustained-decode": "sustained", "prefill": "prefill",
              "long-context": "long_context", "speed": "cells", "smoke": "smoke"}
# The speed metric of each kind: what the throughput gate and the geometric mean compare.
SPEED_METRIC = {"coding_peak": "tok_s", "sustained": "tok_s", "prefill": "prefill_tok_s",
                "long_context": "decode_tok_s", "cells": "tok_s", "smoke": "tok_s"}
STATISTICS = ("median", "mean", "max")
APIS = ("chat", "completions")
# Recorded in the results as given, not used: they describe how the source measured.
INFORMATIONAL = ("tool", "command", "env", "statistic", "description", "notes")

COMMON = ("name", "kind", "api", "prompt", "prompts", "temperature", "temperatures", "max_tokens", "ignore_eos",
          "thinking", "reasoning_effort", "extra_body", "runs", "repetitions", "report", "warmup") + INFORMATIONAL
PER_KIND: dict[str, tuple[str, ...]] = {
    "coding_peak": ("concurrency",),
    "smoke": (),
    "sustained": ("concurrency", "contexts", "context", "duration_s"),
    "prefill": ("concurrency", "contexts", "context"),
    "long_context": ("contexts", "context", "long_context", "cached"),
    "cells": ("primary", "long_context", "concurrency", "context"),
}
CELL_KEYS = ("cell", "prompt", "prompts", "concurrency", "max_tokens", "context", "input_tokens_approx", "cached",
             "temperature", "ignore_eos", "runs")
DEFAULTS: dict[str, dict[str, Any]] = {
    "coding_peak": {"prompt": CODING_PEAK_PROMPT, "temperature": 0.0, "max_tokens": 2000, "ignore_eos": False,
                    "runs": 3},
    "smoke": {"prompts": "mixed", "max_tokens": 16, "ignore_eos": False, "runs": 1},
    "sustained": {"prompts": "mixed", "max_tokens": 512, "ignore_eos": True, "runs": 1, "duration_s": 30.0},
    "prefill": {"prompts": "mixed", "max_tokens": 1, "ignore_eos": True, "runs": 1},
    "long_context": {"prompts": "mixed", "max_tokens": 256, "ignore_eos": True, "runs": 1},
    "cells": {"prompts": "mixed", "max_tokens": 512, "ignore_eos": True, "runs": 1},
}


@dataclass(frozen=True)
class Cell:
    """One measured point: how its requests look and how often they are sent."""

    suite: str
    kind: str
    name: str
    mode: str  # "burst": each run sends `concurrency` requests at once; "sustained": closed loop for duration_s
    concurrency: int
    context: int
    temperature: float | None  # None: the server's default (the request carries none)
    max_tokens: int
    ignore_eos: bool
    api: str
    family: str | None
    prompt: str | None
    runs: int
    repetitions: int
    statistic: str
    warmup: int
    duration_s: float | None = None
    cached: bool = False
    thinking: bool | None = None
    reasoning_effort: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return "%s/%s" % (self.suite, self.name)

    @property
    def speed_metric(self) -> str:
        return SPEED_METRIC[self.kind]

    def coordinates(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "context": self.context,
                "temperature": "default" if self.temperature is None else self.temperature}


@dataclass(frozen=True)
class Suite:
    name: str
    kind: str
    cells: tuple[Cell, ...]
    definition: Mapping[str, Any]  # as given, for the results


def temperature_label(value: float | None) -> str:
    return "default" if value is None else "%g" % value


def load_document(path: str | Path) -> Any:
    """A YAML or JSON file (JSON is YAML); raises BenchError naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchError("cannot read %s: %s" % (path, exc.strerror or exc)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BenchError("%s is not valid YAML or JSON: %s" % (path, exc)) from None


def suites_from_document(doc: Any, where: str) -> list[Any]:
    """The raw suite list of a document: a list, ``{suites: [...]}`` or a recipe's ``bench.suites``."""
    if isinstance(doc, dict) and isinstance(doc.get("bench"), dict):
        doc = doc["bench"].get("suites")
    elif isinstance(doc, dict) and "suites" in doc:
        doc = doc["suites"]
    if not isinstance(doc, list) or not doc:
        raise BenchError("%s: give a non-empty list of suites (or a mapping with suites:, or a recipe with "
                         "bench.suites)" % where)
    return doc


class _Checker:
    """Collects every problem of one suite."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.problems: list[str] = []

    def add(self, message: str) -> None:
        self.problems.append("%s: %s" % (self.where, message))

    def integer(self, value: Any, key: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.add("%s is %r; give an integer of at least %d" % (key, value, minimum))
            return minimum
        return value

    def integers(self, value: Any, key: str, minimum: int) -> list[int]:
        items = value if isinstance(value, list) else [value]
        if not items:
            self.add("%s is an empty list" % key)
        return [self.integer(item, key, minimum) for item in items]

    def number(self, value: Any, key: str, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0):
            self.add("%s is %r; give a number %s 0" % (key, value, "above" if positive else "of at least"))
            return 1.0
        return float(value)

    def temperature(self, value: Any, key: str) -> float | None:
        if value is None or value == "default":
            return None
        return self.number(value, key)

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            self.add("%s is %r; give true or false" % (key, value))
            return False
        return value

    def choice(self, value: Any, key: str, choices: Sequence[str]) -> str:
        if value not in choices:
            self.add("%s is %r; give one of %s" % (key, value, ", ".join(choices)))
            return choices[0]
        return str(value)

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            self.add("%s is %r; give a non-empty string" % (key, value))
            return "?"
        return value


def _prompt_source(check: _Checker, raw: Mapping[str, Any], base: tuple[str | None, str | None],
                   key_prefix: str = "") -> tuple[str | None, str | None]:
    """(family, literal) from prompt/prompts; ``prompt`` naming a family means that family."""
    family, literal = base
    if "prompt" in raw and "prompts" in raw:
        check.add("%sgive prompt (a literal prompt) or prompts (a family), not both" % key_prefix)
    if "prompts" in raw:
        family = check.choice(raw["prompts"], key_prefix + "prompts", tuple(sorted(FAMILIES)))
        literal = None
    elif "prompt" in raw:
        value = check.text(raw["prompt"], key_prefix + "prompt")
        family, literal = (value, None) if value in FAMILIES else (None, value)
    return family, literal


def _kind(check: _Checker, raw: Mapping[str, Any], name: str) -> str:
    if "kind" in raw:
        return check.choice(raw["kind"], "kind", KINDS)
    if name in NAME_KINDS:
        return NAME_KINDS[name]
    check.add("no kind; give kind: one of %s (or name the suite %s)"
              % (", ".join(KINDS), ", ".join(sorted(NAME_KINDS))))
    return "smoke"


def parse_suite(raw: Any, index: int) -> Suite:
    """One suite, checked; raises BenchError listing every problem."""
    if not isinstance(raw, dict):
        raise BenchError("suite %d: give a mapping with name and kind, not %r" % (index + 1, raw))
    name = raw.get("name")
    check = _Checker("suite %s" % (name if isinstance(name, str) and name else index + 1))
    if not isinstance(name, str) or not name or "/" in name:
        check.add("name is %r; give a non-empty name without '/'" % (name,))
        name = "suite%d" % (index + 1)
    kind = _kind(check, raw, name)
    allowed = set(COMMON) | set(PER_KIND[kind])
    for key in raw:
        if key not in allowed:
            hint = (" (it applies to kinds %s)" % ", ".join(k for k in KINDS if key in PER_KIND[k])
                    if any(key in PER_KIND[k] for k in KINDS) else "")
            check.add("unknown key %r for kind %s%s" % (key, kind, hint))
    defaults = dict(DEFAULTS[kind])
    if {"prompt", "prompts"} & set(raw):
        defaults.pop("prompt", None)
        defaults.pop("prompts", None)
    if {"temperature", "temperatures"} & set(raw):
        defaults.pop("temperature", None)
    spec = {**defaults, **raw}
    base = _Base.read(check, spec)
    decode_tokens = raw.get("max_tokens", DEFAULTS["long_context"]["max_tokens"])
    cells = _cells(check, spec, kind, name, base, decode_tokens)
    names = [cell.name for cell in cells]
    for duplicate in sorted({n for n in names if names.count(n) > 1}):
        check.add("two cells are named %r" % duplicate)
    if check.problems:
        raise BenchError("\n".join(check.problems))
    return Suite(name=name, kind=kind, cells=tuple(cells), definition=dict(raw))


@dataclass
class _Base:
    """Suite-wide values every cell starts from."""

    api: str
    family: str | None
    literal: str | None
    temperatures: list[float | None]
    several_temperatures: bool
    max_tokens: int
    ignore_eos: bool
    runs: int
    repetitions: int
    statistic: str
    warmup: int
    thinking: bool | None
    reasoning_effort: str | None
    extra_body: dict[str, Any]

    @classmethod
    def read(cls, check: _Checker, spec: Mapping[str, Any]) -> "_Base":
        if "temperature" in spec and "temperatures" in spec:
            check.add("give temperature or temperatures, not both")
        if "temperatures" in spec:
            raw = spec["temperatures"] if isinstance(spec["temperatures"], list) else [spec["temperatures"]]
            if not raw:
                check.add("temperatures is an empty list")
            temperatures = [check.temperature(value, "temperatures") for value in raw]
        else:
            temperatures = [check.temperature(spec.get("temperature"), "temperature")]
        family, literal = _prompt_source(check, spec, (None, None))
        extra = spec.get("extra_body", {})
        if not isinstance(extra, dict):
            check.add("extra_body is %r; give a mapping merged into each request body" % (extra,))
            extra = {}
        thinking = spec.get("thinking")
        effort = spec.get("reasoning_effort")
        return cls(
            api=check.choice(spec.get("api", "chat"), "api", APIS),
            family=family, literal=literal, temperatures=temperatures,
            several_temperatures="temperatures" in spec and len(temperatures) > 1,
            max_tokens=check.integer(spec["max_tokens"], "max_tokens", 1),
            ignore_eos=check.boolean(spec["ignore_eos"], "ignore_eos"),
            runs=check.integer(spec["runs"], "runs", 1),
            repetitions=check.integer(spec.get("repetitions", 1), "repetitions", 1),
            statistic=check.choice(spec.get("report", "median"), "report", STATISTICS),
            warmup=check.integer(spec.get("warmup", 0), "warmup", 0),
            thinking=None if thinking is None else check.boolean(thinking, "thinking"),
            reasoning_effort=None if effort is None else check.text(effort, "reasoning_effort"),
            extra_body=dict(extra),
        )

    def cell(self, suite: str, kind: str, name: str, mode: str, concurrency: int, context: int,
             temperature: float | None, **overrides: Any) -> Cell:
        values: dict[str, Any] = dict(
            suite=suite, kind=kind, name=name, mode=mode, concurrency=concurrency, context=context,
            temperature=temperature, max_tokens=self.max_tokens, ignore_eos=self.ignore_eos, api=self.api,
            family=self.family, prompt=self.literal, runs=self.runs, repetitions=self.repetitions,
            statistic=self.statistic, warmup=self.warmup, thinking=self.thinking,
            reasoning_effort=self.reasoning_effort, extra_body=self.extra_body)
        values.update(overrides)
        return Cell(**values)


def _t_suffix(base: _Base, temperature: float | None) -> str:
    return "-t%s" % temperature_label(temperature) if base.several_temperatures else ""


def _contexts(check: _Checker, spec: Mapping[str, Any], required: bool) -> list[int]:
    if "contexts" in spec and "context" in spec:
        check.add("give context or contexts, not both")
    value = spec.get("contexts", spec.get("context"))
    if value is None:
        if required:
            check.add("give contexts, a list of prompt lengths in tokens")
        return [0]
    return check.integers(value, "contexts", 0)


def _cells(check: _Checker, spec: Mapping[str, Any], kind: str, suite: str, base: _Base,
           decode_tokens: Any) -> list[Cell]:
    if kind in ("coding_peak", "smoke"):
        concurrency = check.integer(spec.get("concurrency", 1), "concurrency", 1)
        label = "smoke" if kind == "smoke" else "c%d" % concurrency
        return [base.cell(suite, kind, label + _t_suffix(base, t), "burst", concurrency, 0, t)
                for t in base.temperatures]
    if kind == "sustained":
        duration = check.number(spec["duration_s"], "duration_s", positive=True)
        return [base.cell(suite, kind, "c%d-ctx%d%s" % (c, ctx, _t_suffix(base, t)), "sustained", c, ctx, t,
                          duration_s=duration)
                for t in base.temperatures
                for ctx in _contexts(check, spec, False)
                for c in check.integers(spec.get("concurrency", 1), "concurrency", 1)]
    if kind == "prefill":
        return [base.cell(suite, kind, "c%d-ctx%d%s" % (c, ctx, _t_suffix(base, t)) if c > 1
                          else "ctx%d%s" % (ctx, _t_suffix(base, t)), "burst", c, ctx, t)
                for t in base.temperatures
                for ctx in _contexts(check, spec, True)
                for c in check.integers(spec.get("concurrency", 1), "concurrency", 1)]
    if kind == "long_context":
        cells: list[Cell] = []
        if "long_context" in spec:
            if "contexts" in spec or "context" in spec:
                check.add("give contexts or a long_context list of cells, not both")
            cells += _cell_list(check, spec["long_context"], "long_context", suite, kind, base, decode_tokens)
        else:
            cached = check.boolean(spec.get("cached", False), "cached")
            cells += [base.cell(suite, kind, "ctx%d%s%s" % (ctx, "-cached" if cached else "", _t_suffix(base, t)),
                                "burst", 1, ctx, t, cached=cached)
                      for t in base.temperatures for ctx in _contexts(check, spec, True)]
        return cells
    # cells (a "speed" suite): named cells, as seed 003 reports them.
    if "primary" not in spec and "long_context" not in spec:
        check.add("give primary (and/or long_context): lists of named cells")
    cells = _cell_list(check, spec.get("primary", []), "primary", suite, kind, base, base.max_tokens)
    cells += _cell_list(check, spec.get("long_context", []), "long_context", suite, "long_context", base,
                        decode_tokens)
    return cells


def _cell_list(check: _Checker, raw: Any, key: str, suite: str, kind: str, base: _Base,
               max_tokens: Any) -> list[Cell]:
    if not isinstance(raw, list):
        check.add("%s is %r; give a list of cells, each with a name in cell:" % (key, raw))
        return []
    cells = []
    for number, entry in enumerate(raw, 1):
        where = "%s[%d]" % (key, number)
        if not isinstance(entry, dict):
            check.add("%s is %r; give a mapping with cell:" % (where, entry))
            continue
        for extra in sorted(set(entry) - set(CELL_KEYS)):
            check.add("%s: unknown key %r (cells take %s)" % (where, extra, ", ".join(CELL_KEYS)))
        name = entry.get("cell")
        if not isinstance(name, str) or not name or "/" in name:
            check.add("%s: cell is %r; give each cell a name without '/'" % (where, name))
            name = "%s%d" % (key, number)
        if "context" in entry and "input_tokens_approx" in entry:
            check.add("%s: give context or input_tokens_approx, not both" % where)
        context = check.integer(entry.get("context", entry.get("input_tokens_approx", 0)), where + ".context", 0)
        family, literal = _prompt_source(check, entry, (base.family, base.literal), where + ".")
        temperature = (check.temperature(entry["temperature"], where + ".temperature") if "temperature" in entry
                       else base.temperatures[0])
        cells.append(base.cell(
            suite, kind, name, "burst", check.integer(entry.get("concurrency", 1), where + ".concurrency", 1),
            context, temperature, family=family, prompt=literal,
            max_tokens=check.integer(entry.get("max_tokens", max_tokens), where + ".max_tokens", 1),
            ignore_eos=check.boolean(entry.get("ignore_eos", base.ignore_eos), where + ".ignore_eos"),
            runs=check.integer(entry.get("runs", base.runs), where + ".runs", 1),
            cached=check.boolean(entry.get("cached", False), where + ".cached")))
    return cells


def parse_suites(raw: list[Any]) -> list[Suite]:
    """Every suite of a list, checked; raises BenchError with every problem of every suite."""
    suites: list[Suite] = []
    problems: list[str] = []
    for index, entry in enumerate(raw):
        try:
            suites.append(parse_suite(entry, index))
        except BenchError as exc:
            problems.append(str(exc))
    names = [suite.name for suite in suites]
    problems += ["two suites are named %r; suite names make the cell ids" % n
                 for n in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        raise BenchError("\n".join(problems))
    return suites


def load_suites(path: str | Path) -> list[Suite]:
    return parse_suites(suites_from_document(load_document(path), str(path)))
