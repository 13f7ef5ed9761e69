"""The sparkserve command: one verb per playbook, run through ansible-runner, shown as it runs."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from ansible_collections.sparkserve.deploy.plugins.module_utils import run_stats
from sparkserve import recipe_cmd
from sparkserve.ask import AskError, complete
from sparkserve.deployments import Reader, read_inventory, scope
from sparkserve.display import Display, JsonDisplay, LiveDisplay, PlainDisplay, QuietDisplay, duration
from sparkserve.events import RunModel
from sparkserve.project import PLAYBOOKS, ROOT, UsageError, keep_runs, resolve_inventory
from sparkserve.runner import (
    PRIVATE_DIRS,
    RUNS_DIR,
    Interrupt,
    Invocation,
    RunResult,
    build_run_kwargs,
    new_ident,
    private_data_dir,
    prune_runs,
    run_playbook,
    sigint_to,
)
from sparkserve.status import render_statuses, status_document
from sparkserve.summary import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    classify,
    diagnose_lines,
    endpoint_lines,
    endpoints,
    failure_lines,
    follow_argv,
    logs_lines,
    message_lines,
    stage_lines,
    summary_json,
)

VERBS = {
    "up": "bring the deployments up: every stage of site.yml, from preflight to a serving endpoint",
    "down": "stop the engine on every node (playbooks/stop.yml): one deployment's (--deployment) or all (--all)",
    "status": "show each deployment's ranks, the API's readiness and each node's guard, flusher, fabric and weights",
    "logs": "show each rank's last log lines; --follow keeps following one rank",
    "render": "print every rank's container command line and environment, touching no host",
    "check": "run the preflight checks only (playbooks/preflight.yml)",
    "bench": "benchmark the serving deployment (playbooks/bench.yml)",
    "rollback": "relaunch the previous render (playbooks/rollback.yml)",
    "upgrade": "stage the recipe's new release while the old one serves, swap, qualify, roll back on failure "
               "(playbooks/upgrade.yml)",
    "diagnose": "collect the deployment's state and logs into one archive",
}


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("ansible options")
    group.add_argument("-i", "--inventory", metavar="INVENTORY",
                       help="inventory file or folder (default: inventory/lab when the lab wrote one)")
    group.add_argument("--recipe", metavar="NAME", help="serve this recipe (-e sparkserve_recipe=NAME)")
    group.add_argument("--tags", action="append", default=[], metavar="TAGS",
                       help="only run plays and tasks tagged with these (comma-separated; repeatable)")
    group.add_argument("--limit", metavar="SUBSET", help="limit the run to these hosts (ansible's --limit)")
    group.add_argument("--deployment", action="append", default=[], metavar="NAME",
                       help="act on this deployment of the inventory only (repeatable; default: every deployment, "
                            "but logs, upgrade, rollback and bench act on one and down needs --all for several)")
    group.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                       help="extra variables, passed to ansible-playbook as given (repeatable)")
    group.add_argument("--vault-id", action="append", default=[], metavar="ID", help="vault identity (repeatable)")
    group.add_argument("--vault-password-file", metavar="FILE", help="vault password file")
    group.add_argument("--ask-vault-pass", action="store_true", help="ask for the vault password")
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="ansible's verbosity (repeatable); also prints ansible-playbook's own output")
    out = common.add_argument_group("output")
    out.add_argument("--json", action="store_true",
                     help="JSON lines of the run's events, then a summary (status: one JSON document)")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkserve",
        description="Deploy, watch and diagnose a model served across DGX Sparks. Each verb runs one of the "
                    "project's playbooks through ansible-runner; ansible-playbook site.yml works the same.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    common = _common_options()
    for verb, text in VERBS.items():
        sub = verbs.add_parser(verb, parents=[common], help=text, description=text, epilog=EXIT_CODES_HELP,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        if verb == "logs":
            sub.add_argument("--rank", type=int, metavar="N", help="only this rank (default: every rank)")
            sub.add_argument("--lines", type=int, default=100, metavar="N", help="lines per rank (default: 100)")
            sub.add_argument("--follow", action="store_true",
                             help="then follow the rank's log (rank 0 without --rank) until Ctrl-C")
        if verb == "upgrade":
            sub.add_argument("--no-rollback", action="store_true",
                             help="leave a release that fails readiness or its gates as it is, for inspection")
        if verb == "down":
            sub.add_argument("--all", action="store_true", dest="all_deployments",
                             help="stop every deployment of the inventory (needed when it has several)")
        if verb == "up":
            sub.add_argument("--ask", metavar="PROMPT",
                             help="once it serves, send the endpoint this prompt and print the completion")
    recipe_cmd.add_parser(verbs)
    return parser


def from_cwd(path: str, cwd: Path) -> str:
    """A file named relative to where the command was typed, made absolute (ansible-playbook runs in the root)."""
    candidate = Path(path).expanduser()
    if not candidate.is_absolute() and (cwd / candidate).exists():
        return str(cwd / candidate)
    return path


def _vault_id(value: str, cwd: Path) -> str:
    label, at, source = value.rpartition("@")
    if source == "prompt" or not source:
        return value
    return f"{label}{at}{from_cwd(source, cwd)}"


def invocation(args: argparse.Namespace, root: Path, cwd: Path) -> Invocation:
    """The playbook run a parsed command line asks for."""
    playbook, fixed_tags = PLAYBOOKS[args.verb]
    extra: list[str] = []
    if args.verb == "logs":
        if args.lines < 1:
            raise UsageError(f"--lines {args.lines}: give at least 1")
        if args.rank is not None:
            extra.append(f"sparkserve_logs_rank={args.rank}")
        extra.append(f"sparkserve_logs_lines={args.lines}")
    if args.recipe:
        extra.append(f"sparkserve_recipe={args.recipe}")
    if getattr(args, "no_rollback", False):
        extra.append("release_rollback=false")
    tags = list(fixed_tags)
    for value in args.tags:
        tags += [t.strip() for t in value.split(",") if t.strip() and t.strip() not in tags]
    return Invocation(
        verb=args.verb,
        playbook=playbook,
        inventory=resolve_inventory(root, args.inventory, cwd),
        extra_vars=(*extra, *(f"@{from_cwd(v[1:], cwd)}" if v.startswith("@") else v for v in args.extra_vars)),
        tags=tuple(tags),
        limit=args.limit,
        vault_ids=tuple(_vault_id(v, cwd) for v in args.vault_id),
        vault_password_file=from_cwd(args.vault_password_file, cwd) if args.vault_password_file else None,
        ask_vault_pass=args.ask_vault_pass,
        verbosity=args.verbose,
    )


@dataclass
class Context:
    """What the command touches outside itself; tests replace the parts they need."""

    root: Path = ROOT
    cwd: Path = field(default_factory=Path.cwd)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    stdout: IO[str] = field(default_factory=lambda: sys.stdout)
    stderr: IO[str] = field(default_factory=lambda: sys.stderr)
    run: Callable[[dict[str, Any]], RunResult] = run_playbook
    ask_password: Callable[[str], str] = getpass.getpass
    ask: Callable[[str], str] = input  # a yes or no
    follow: Callable[[list[str]], int] = subprocess.call
    read_deployments: Reader = read_inventory  # the inventory's deployments, for --deployment
    kill: Callable[[int, int], None] = os.kill  # how Ctrl-C reaches ansible-playbook
    tty: bool | None = None  # None: ask stdout
    runs_dir: Path | None = None  # None: ROOT/artifacts/runs
    private_dirs: Path | None = None  # None: ROOT/.cache/runner
    # The gateway key --ask passes, taken out of the environment that ansible-runner records in each run's folder.
    api_key: str = field(default_factory=lambda: os.environ.pop("SPARKSERVE_API_KEY", ""))

    @property
    def is_tty(self) -> bool:
        return self.stdout.isatty() if self.tty is None else self.tty


def choose_display(args: argparse.Namespace, model: RunModel, ctx: Context, lock: threading.Lock) -> Display:
    if args.json and args.verb == "status":
        return QuietDisplay()
    if args.json:
        return JsonDisplay(ctx.stdout)
    if ctx.is_tty and not args.verbose:
        return LiveDisplay(model, Console(file=ctx.stdout), lock)
    return PlainDisplay(model, ctx.stdout, echo=args.verbose > 0)


def _write(stream: IO[str], lines: list[str]) -> None:
    for line in lines:
        stream.write(line + "\n")
    stream.flush()


def execute(args: argparse.Namespace, ctx: Context) -> int:
    """Run one verb and report it; returns the exit code."""
    inv = invocation(args, ctx.root, ctx.cwd)
    inv = scope(inv, args.deployment, getattr(args, "all_deployments", False), ctx.read_deployments, ctx.root,
                ctx.environ)
    if not (ctx.root / inv.playbook).is_file():
        ctx.stderr.write(f"sparkserve {inv.verb}: {inv.playbook} is missing from {ctx.root}\n")
        return EXIT_FAILED
    keep = keep_runs(ctx.environ)
    password = ctx.ask_password("Vault password: ") if inv.prompts_for_vault else None
    runs_dir = ctx.runs_dir or ctx.root / RUNS_DIR
    runs_dir.mkdir(parents=True, exist_ok=True)
    ident = new_ident(inv.verb, runs_dir)

    model, lock = RunModel(), threading.Lock()
    display = choose_display(args, model, ctx, lock)

    def notify(message: str) -> None:
        ctx.stderr.write(f"sparkserve: {message}\n")
        ctx.stderr.flush()

    broken: list[str] = []

    def on_event(event: dict[str, Any]) -> bool:
        try:
            with lock:
                notes = model.feed(event)
            display.handle(event, notes)
        except Exception as error:  # noqa: BLE001 - a fault in the display must not stop a deployment mid-run
            if not broken:
                broken.append(repr(error))
                notify(f"cannot show the run ({error!r}); it goes on, its events are kept in {runs_dir / ident}")
        return True  # runner keeps every event in job_events/

    interrupt = Interrupt(pid=lambda: model.playbook_pid, kill=ctx.kill, notify=notify)
    with private_data_dir(ctx.private_dirs or ctx.root / PRIVATE_DIRS, ident) as private_dir:
        kwargs = build_run_kwargs(inv, ctx.root, ident, private_dir, event_handler=on_event,
                                  cancel_callback=interrupt.cancel, vault_password=password, environ=ctx.environ,
                                  runs_dir=runs_dir)
        display.start()
        try:
            with sigint_to(interrupt.handle):
                result = ctx.run(kwargs)
        finally:
            display.stop()
    prune_runs(runs_dir, keep)

    code = EXIT_INTERRUPTED if interrupt.interrupted and result.rc != 0 else classify(model, result.rc)
    return report(args, ctx, model, result, code)


def report(args: argparse.Namespace, ctx: Context, model: RunModel, result: RunResult, code: int) -> int:
    """What the verb ends with: on stdout, what it showed; on stderr, the failure (so --json stays JSON)."""
    verb = args.verb
    status = model.stats.get(run_stats.STATUS)
    if args.json and verb == "status":
        document = status_document(model.stats) if code == EXIT_OK and isinstance(status, Mapping) else {
            "error": summary_json(model, verb, result.rc, code, result.artifacts)}
        ctx.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    elif args.json:
        JsonDisplay(ctx.stdout).write({"summary": summary_json(model, verb, result.rc, code, result.artifacts)})
    elif verb != "up" and not isinstance(status, Mapping) and not (verb == "logs" and run_stats.LOGS in model.stats):
        # What the playbook's debug tasks said: render's command lines, bench's comparison (also on failure);
        # the logs are shown once, under each rank's header, from the run's stats.
        _write(ctx.stdout, message_lines(model))

    if code == EXIT_INTERRUPTED:
        _write(ctx.stderr, [f"interrupted; run artifacts: {result.artifacts}"])
        return code
    if code != EXIT_OK:
        _write(ctx.stderr, failure_lines(model, result.rc, code, result.artifacts))
        return code
    if not args.json:
        if verb == "status" and isinstance(status, Mapping):
            Console(file=ctx.stdout, width=None if ctx.is_tty else 100).print(render_statuses(model.stats))
        else:
            _write(ctx.stdout, success_lines(verb, model))
    if verb == "logs" and args.follow:
        return follow(args, ctx, model)
    if verb == "up" and getattr(args, "ask", None):
        return ask(args.ask, ctx, model)
    return EXIT_OK


def ask(prompt: str, ctx: Context, model: RunModel) -> int:
    """One real completion from the endpoint the run reported (from each one, when it brought up several)."""
    found = endpoints(model.stats) or {"": {}}
    gateway = model.stats.get(run_stats.GATEWAY)
    key = ctx.api_key
    if isinstance(gateway, Mapping) and gateway.get("url"):
        if not gateway.get("open") and not key:
            _write(ctx.stderr, ["sparkserve up --ask: the gateway asks for a key; set SPARKSERVE_API_KEY to one of "
                                "gateway_keys (" + ", ".join(str(k) for k in gateway.get("keys") or []) + ")"])
            return EXIT_FAILED
        # Asked through the gateway, the one door, by each deployment's model name.
        found = {name: dict(endpoint, url=gateway["url"], loopback=bool(gateway.get("open")))
                 for name, endpoint in found.items()}
    code = EXIT_OK
    for name, endpoint in found.items():
        who = f"deployment {name}" if len(found) > 1 else "the deployment"
        try:
            text = complete(endpoint, prompt, key=key)
        except AskError as error:
            _write(ctx.stderr, [f"sparkserve up --ask: {name + ': ' if len(found) > 1 else ''}{error}"])
            code = EXIT_FAILED
            continue
        _write(ctx.stdout, [f"Asked {prompt!r}; {who} answered: {text!r}"])
    return code


def success_lines(verb: str, model: RunModel) -> list[str]:
    if verb in ("up", "rollback") and endpoints(model.stats):
        return endpoint_lines(model)
    if verb == "logs":
        return logs_lines(model)
    if verb == "diagnose":
        return diagnose_lines(model) or ["diagnose finished, but the run named no archive"]
    total = sum(s.elapsed(model.last_time) for s in model.stages) if model.last_time else 0.0
    return [f"{verb} done in {duration(total)}", *stage_lines(model)]


def follow(args: argparse.Namespace, ctx: Context, model: RunModel) -> int:
    """Follow one rank's log with the command the run named, until Ctrl-C."""
    argv = follow_argv(model, args.rank)
    if argv is None:
        rank = 0 if args.rank is None else args.rank
        _write(ctx.stderr, [f"sparkserve logs --follow: the run gave no follow command for rank {rank}"])
        return EXIT_FAILED
    try:
        ctx.follow(argv)
    except KeyboardInterrupt:
        return EXIT_OK
    except OSError as error:
        _write(ctx.stderr, [f"sparkserve logs --follow: {argv[0]}: {error}"])
        return EXIT_FAILED
    return EXIT_OK


def main(argv: Sequence[str] | None = None, ctx: Context | None = None) -> int:
    args = build_parser().parse_args(argv)
    ctx = ctx or Context()
    try:
        if args.verb == "recipe":
            return recipe_cmd.execute(args, ctx.root, ctx.cwd, ctx.environ, ctx.stdout, ctx.stderr, ctx.ask,
                                      ctx.ask_password, ctx.is_tty)
        return execute(args, ctx)
    except UsageError as error:
        ctx.stderr.write(f"sparkserve {args.verb}: {error}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        ctx.stderr.write("\nsparkserve: interrupted\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
