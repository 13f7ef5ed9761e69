"""``sparkserve-bench run | compare | report | suites``.

Exit codes: 0 done (and, for compare, every gate passed); 1 a gate failed
(compare) or requests failed (run; the results are still written); 2 a
problem with the inputs or the server (the message says what and how to fix
it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from . import VERSION, engines
from .compare import DEFAULT_GATES, Gates, compare, parse_gates, table
from .errors import BenchError
from .reference import load_reference, recipe_gates
from .report import render, text_summary
from .results import build_context, load_context_file, load_results, write_results
from .runner import RunOptions, run_bench
from .suites import load_document, load_suites


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkserve-bench", description="Benchmark an OpenAI-compatible engine "
                                     "(%s) and qualify it against a reference." % ", ".join(engines.names()))
    parser.add_argument("--version", action="version", version=VERSION)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="Measure the suites against a served model; write results JSON.")
    run.add_argument("--base-url", required=True, help="The head's API, e.g. http://127.0.0.1:8000.")
    run.add_argument("--model", required=True, help="The served model name (the recipe's model.served_name).")
    run.add_argument("--suites", required=True, help="YAML/JSON list of suites, or a recipe (bench.suites).")
    run.add_argument("--suite", action="append", default=[], metavar="NAME", help="Run only this suite (repeat).")
    run.add_argument("--out", required=True, help="Where the results JSON goes.")
    run.add_argument("--engine", choices=engines.names(), help="The deployment's engine (the recipe's engine): "
                     "/metrics is read by its adapter's metric names (default: the engine whose metrics the first "
                     "/metrics reading holds).")
    run.add_argument("--context", help="YAML/JSON mapping: recipe, model_revision, image_digest, overlays, "
                     "node_count, notes, extra.")
    run.add_argument("--recipe", help="Context: the recipe name (overrides --context).")
    run.add_argument("--model-revision", help="Context: the model's 40-hex commit.")
    run.add_argument("--image-digest", help="Context: the engine image, REPO@sha256:...")
    run.add_argument("--overlay", action="append", default=[], help="Context: an overlay applied (repeat).")
    run.add_argument("--node-count", type=int, help="Context: nodes serving the model.")
    run.add_argument("--seed", type=int, help="Seed of the prompt nonces (default: random; recorded).")
    run.add_argument("--warmup-requests", type=int, default=4, help="Unmeasured completions first (default 4).")
    run.add_argument("--warmup-tokens", type=int, default=128, help="max_tokens of each (default 128).")
    run.add_argument("--timeout", type=float, default=600.0, help="Seconds a stream may stay silent (default 600).")
    run.add_argument("--api-key", default=os.environ.get("SPARKSERVE_BENCH_API_KEY"),
                     help="Bearer key for /v1 (default: $SPARKSERVE_BENCH_API_KEY).")
    run.add_argument("--quiet", action="store_true", help="No progress lines.")

    cmp_ = commands.add_parser("compare", help="Check candidate results against a reference with gates.")
    cmp_.add_argument("--candidate", required=True, help="Results JSON of the candidate.")
    source = cmp_.add_mutually_exclusive_group(required=True)
    source.add_argument("--reference", help="Results JSON of the reference run.")
    source.add_argument("--recipe-reference", help="A recipe (its bench.reference), or a file of published figures.")
    cmp_.add_argument("--gates", help="Gates as JSON text or a YAML/JSON file (default: the recipe's bench.gates, "
                      "else throughput_floor 0.98 and ttft_ceiling 1.05).")
    cmp_.add_argument("--baseline", help="Which of several published values to compare with (e.g. qualified).")
    cmp_.add_argument("--report", help="Write the PNG report here.")
    cmp_.add_argument("--out", help="Write the comparison JSON here.")

    rep = commands.add_parser("report", help="Print a results file; draw it, beside a reference if given.")
    rep.add_argument("results", help="Results JSON.")
    rsource = rep.add_mutually_exclusive_group()
    rsource.add_argument("--reference", help="Results JSON to draw beside it.")
    rsource.add_argument("--recipe-reference", help="Published figures to draw beside it.")
    rep.add_argument("--baseline", help="Which of several published values to draw.")
    rep.add_argument("--png", help="Write the PNG report here.")

    suites = commands.add_parser("suites", help="Check a suite file and list the cells it measures.")
    suites.add_argument("file", help="YAML/JSON list of suites, or a recipe.")
    return parser


def _gates(args: argparse.Namespace) -> Gates:
    if args.gates:
        text = args.gates.strip()
        if text.startswith("{"):
            try:
                raw: Any = json.loads(text)
            except ValueError as exc:
                raise BenchError("--gates is not valid JSON: %s" % exc) from None
            return parse_gates(raw, "--gates")
        return parse_gates(load_document(text), args.gates)
    if args.recipe_reference:
        raw = recipe_gates(args.recipe_reference)
        if raw is not None:
            return parse_gates(raw, "%s bench.gates" % args.recipe_reference)
    return parse_gates(DEFAULT_GATES, "default: seed 003's throughput floor and TTFT ceiling")


def cmd_run(args: argparse.Namespace) -> int:
    suites = load_suites(args.suites)
    if args.suite:
        unknown = sorted(set(args.suite) - {s.name for s in suites})
        if unknown:
            raise BenchError("--suite %s: not in %s (it has %s)" % (", ".join(unknown), args.suites,
                                                                     ", ".join(s.name for s in suites)))
        suites = [s for s in suites if s.name in args.suite]
    if args.warmup_requests < 0 or args.warmup_tokens < 1:
        raise BenchError("--warmup-requests must be at least 0 and --warmup-tokens at least 1")
    flags = {"recipe": args.recipe, "model_revision": args.model_revision, "image_digest": args.image_digest,
             "overlays": args.overlay, "node_count": args.node_count}
    context, warnings = build_context(load_context_file(args.context), flags, args.context or "context flags")

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    for warning in warnings:
        log("warning: " + warning)
    if not Path(args.out).parent.is_dir():
        raise BenchError("--out %s: the folder %s does not exist" % (args.out, Path(args.out).parent))
    options = RunOptions(base_url=args.base_url, model=args.model, suites=suites, context=context,
                         api_key=args.api_key, seed=args.seed, warmup_requests=args.warmup_requests,
                         warmup_tokens=args.warmup_tokens, timeout_s=args.timeout, log=log, engine=args.engine)
    results = asyncio.run(run_bench(options))
    write_results(args.out, results)
    if not args.quiet:
        print(text_summary(results))
    errors = results["summary"]["errors"]
    if errors:
        print("%d requests failed; see error_examples in %s" % (errors, args.out), file=sys.stderr)
        return 1
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    candidate = load_results(args.candidate)
    published = args.reference is None
    reference = load_reference(args.recipe_reference if published else args.reference, published, args.baseline)
    gates = _gates(args)
    comparison = compare(candidate, reference, gates)
    print("candidate: %s" % args.candidate)
    print("reference: %s" % reference.source)
    print("gates (%s): %s" % (gates.source, json.dumps({k: v for k, v in gates.as_dict().items() if k != "source"})))
    _print_context_differences(candidate.get("context") or {}, reference.context)
    print(table(comparison))
    if args.out:
        try:
            Path(args.out).write_text(json.dumps(comparison, indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            raise BenchError("cannot write %s: %s" % (args.out, exc.strerror or exc)) from None
    if args.report:
        width, height = render(args.report, candidate, reference, comparison)
        print("report: %s (%dx%d)" % (args.report, width, height))
    return 0 if comparison["passed"] else 1


def _print_context_differences(candidate: dict[str, Any], reference: dict[str, Any] | None) -> None:
    if not reference:
        return
    for key in ("recipe", "model_revision", "image_digest", "overlays", "node_count", "model"):
        if candidate.get(key) != reference.get(key):
            print("context differs: %s: candidate %r, reference %r" % (key, candidate.get(key), reference.get(key)))


def cmd_report(args: argparse.Namespace) -> int:
    results = load_results(args.results)
    print(text_summary(results))
    if args.png:
        reference = None
        if args.reference or args.recipe_reference:
            published = args.reference is None
            reference = load_reference(args.recipe_reference if published else args.reference, published,
                                       args.baseline)
        width, height = render(args.png, results, reference)
        print("report: %s (%dx%d)" % (args.png, width, height))
    return 0


def cmd_suites(args: argparse.Namespace) -> int:
    for suite in load_suites(args.file):
        print("%s (%s)" % (suite.name, suite.kind))
        for cell in suite.cells:
            print("  %s: %s, concurrency %d, context %d, temperature %s, max_tokens %d, runs %d x %d%s"
                  % (cell.id, cell.mode, cell.concurrency, cell.context,
                     "default" if cell.temperature is None else "%g" % cell.temperature, cell.max_tokens,
                     cell.repetitions, cell.runs, ", %g s" % cell.duration_s if cell.duration_s else ""))
    return 0


COMMANDS = {"run": cmd_run, "compare": cmd_compare, "report": cmd_report, "suites": cmd_suites}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except BenchError as exc:
        print("sparkserve-bench %s: %s" % (args.command, exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sparkserve-bench %s: interrupted" % args.command, file=sys.stderr)
        return 130
