"""What a run ends with: its exit code by cause, the endpoint after up, the failure when it failed.

The stages listed (``stage_lines``) are the ones that did something (events.py says what counts: a failure,
a change, or a task that is not bookkeeping), in the order they ran, each with what it did: the hosts it
changed and the first task that changed something there, or the hosts it failed on. A failure shows its
first cause; "N more failed tasks" counts only the other causes, not the failures that echo one (a later
failure on a host that already failed, an undefined variable after a failure).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.sparkserve.deploy.plugins.module_utils import run_stats
from sparkserve.display import duration
from sparkserve.events import RUNNING, Failure, RunModel, Stage

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_PREFLIGHT = 4
EXIT_LAUNCH = 5
EXIT_INTERRUPTED = 130

CAUSES = {
    EXIT_OK: "success",
    EXIT_FAILED: "failure",
    EXIT_BAD_INPUT: "bad input",
    EXIT_UNREACHABLE: "unreachable host",
    EXIT_PREFLIGHT: "preflight refusal",
    EXIT_LAUNCH: "launch failure",
    EXIT_INTERRUPTED: "interrupted",
}

EXIT_CODES_HELP = """\
exit codes:
  0    success
  1    any other failure
  2    bad input: the recipe or the inventory was refused (the recipe role failed, or
       ansible-playbook stopped before any task: a parse or inventory error)
  3    a host was unreachable
  4    preflight refused a host
  5    the launch failed (the launch play or the engine role)
  130  interrupted (Ctrl-C)"""

# Every deployment's endpoint by name (aggregated over the launch's batches), where the run records it; a key
# plugins/module_utils/run_stats.py does not name yet.
ENDPOINTS: str = getattr(run_stats, "ENDPOINTS", "sparkserve_endpoints")

STDOUT_TAIL_LINES = 20
# ansible-runner's exit status when ansible-playbook could not be started at all (not found).
RC_NOT_STARTED = 127


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _rank(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _classify_place(play: str, role: str) -> int:
    play, role = play.lower(), role.lower()
    if role == "recipe":
        return EXIT_BAD_INPUT
    if "preflight" in play or role == "preflight":
        return EXIT_PREFLIGHT
    if "launch" in play or role == "engine":
        return EXIT_LAUNCH
    return EXIT_FAILED


def classify(model: RunModel, rc: int) -> int:
    """The exit code of a finished run (see EXIT_CODES_HELP)."""
    if rc == 0:
        return EXIT_OK
    failures = model.open_failures()
    if any(f.unreachable for f in failures):
        return EXIT_UNREACHABLE
    primary = model.primary_failure()
    if primary is not None:
        return _classify_place(primary.stage, primary.role)
    stat = _mapping(model.stats.get(run_stats.FAILURE))
    if stat.get("stage"):
        return _classify_place(str(stat["stage"]), "")
    if model.task_events == 0 and rc != RC_NOT_STARTED:
        return EXIT_BAD_INPUT
    return EXIT_FAILED


@dataclass
class FailureReport:
    """The one failure to show: the playbook's own sparkserve_failure stat where it set one, else the event's."""

    stage: str = ""
    node: str = ""
    rank: int | None = None
    task: str = ""
    role: str = ""
    message: str = ""
    log_tail: list[str] = field(default_factory=list)
    logs_dir: str = ""

    @classmethod
    def of(cls, model: RunModel) -> FailureReport | None:
        event: Failure | None = model.primary_failure()
        stat = _mapping(model.stats.get(run_stats.FAILURE))
        if event is None and not stat:
            return None
        report = cls()
        if event is not None:
            report.stage, report.node, report.task = event.stage, event.host, event.task
            report.role, report.message = event.role, event.message
        if stat:
            report.stage = str(stat.get("stage") or report.stage)
            report.node = str(stat.get("node") or report.node)
            report.rank = _rank(stat.get("rank"))
            report.message = str(stat.get("message") or report.message)
            tail = stat.get("log_tail")
            report.log_tail = [str(line) for line in tail] if isinstance(tail, list) else []
            report.logs_dir = str(stat.get("logs_dir") or "")
        return report

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "node": self.node, "rank": self.rank, "task": self.task, "role": self.role,
                "message": self.message, "log_tail": self.log_tail, "logs_dir": self.logs_dir}


def failure_lines(model: RunModel, rc: int, code: int, artifacts: Path) -> list[str]:
    """What failed, where, why, and where the rest is."""
    report = FailureReport.of(model)
    lines: list[str] = []
    if report is None:
        if model.task_events == 0:
            lines.append(f"ansible-playbook stopped (exit {rc}) before running any task; its last lines:")
        else:
            lines.append(f"ansible-playbook failed (exit {rc}) without a failed task; its last lines:")
        tail = [line for line in model.stdout_tail if line.strip()][-STDOUT_TAIL_LINES:]
        lines += [f"  {line}" for line in tail] or ["  (no output)"]
    else:
        where = [f'stage "{report.stage}"'] if report.stage else []
        if report.node:
            where.append(f"node {report.node}")
        if report.rank is not None:
            where.append(f"rank {report.rank}")
        lines.append("FAILED: " + (", ".join(where) or "the run"))
        lines.append(f"  {report.message}")
        if report.task:
            role = f" (role {report.role})" if report.role else ""
            lines.append(f"  task: {report.task}{role}")
        if report.log_tail:
            whose = f"rank {report.rank}" if report.rank is not None else report.node or "the rank"
            lines.append(f"  last log lines of {whose}:")
            lines += [f"    | {line}" for line in report.log_tail]
        if report.logs_dir:
            lines.append(f"  full logs: {report.logs_dir}")
        others = len(model.causes()) - 1
        if others > 0:
            lines.append(f"  {others} more failed task{'s' if others > 1 else ''} (in the run's events)")
    lines.append(f"  run artifacts: {artifacts}")
    lines.append(f"exit {code}: {CAUSES.get(code, 'failure')}")
    return lines


def stage_outcome(model: RunModel, stage: Stage) -> str:
    """What a stage did, in a few words: where it failed, what it changed, or that it changed nothing."""
    index = model.stages.index(stage)
    failed = [f for f in model.open_failures() if f.stage_index == index]
    if failed:
        causes = [f for f in model.causes() if f.stage_index == index]
        hosts = ", ".join(dict.fromkeys(f.host for f in causes or failed))
        return f"failed on {hosts}" if causes else f"failed on {hosts}, after the first failure"
    if stage.state == RUNNING:
        return "running"
    if stage.changed_tasks:
        more = len(stage.changed_tasks) - 1
        tail = f", and {more} more task{'s' if more > 1 else ''}" if more else ""
        return f"changed on {', '.join(stage.changed_hosts)}: {stage.changed_tasks[0]}{tail}"
    return "ok, nothing changed"


def stage_lines(model: RunModel) -> list[str]:
    """One line for each stage that did something, in order, with what it did."""
    now = model.last_time or datetime.now().astimezone()
    return [f"    {duration(s.elapsed(now)):>7}  {s.name}: {stage_outcome(model, s)}"
            for s in model.stages if s.did_something]


def _port(endpoint: Mapping[str, Any]) -> int | None:
    port = endpoint.get("api_port")
    if isinstance(port, int) and not isinstance(port, bool):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    try:
        return urlsplit(str(endpoint.get("url") or "")).port
    except ValueError:
        return None


def curl_command(base_url: str, model_name: str) -> str:
    body = json.dumps({"model": model_name, "prompt": "Hello", "max_tokens": 16})
    url = base_url.rstrip("/") + "/v1/completions"
    return f"curl -s {shlex.quote(url)} -H 'Content-Type: application/json' -d {shlex.quote(body)}"


def reach_lines(endpoint: Mapping[str, Any]) -> list[str]:
    """How to send a first request: curl, through an ssh tunnel when the API is on the head's loopback."""
    name = str(endpoint.get("model_name") or "MODEL")
    url = str(endpoint.get("url") or "")
    if not endpoint.get("loopback"):
        return ["Try it:", f"  {curl_command(url, name)}"] if url else []
    port = _port(endpoint)
    if port is None:
        return ["The API listens on the head's loopback, on a port the run did not report."]
    host = str(endpoint.get("head_address") or endpoint.get("head") or "HEAD")
    user = str(endpoint.get("ssh_user") or "")
    target = f"{user}@{host}" if user else host
    head = endpoint.get("head") or host
    return [
        f"The API listens on {head}'s loopback only; open a tunnel from this machine first:",
        f"  ssh -N -L {port}:127.0.0.1:{port} {target}",
        "then, in another terminal:",
        f"  {curl_command(f'http://127.0.0.1:{port}', name)}",
    ]


def gateway_lines(gateway: Mapping[str, Any]) -> list[str]:
    """Where the gateway is and how to pass a key (never a key), in place of each engine's own address."""
    url = str(gateway.get("url") or "")
    models = ", ".join(str(m) for m in gateway.get("models") or [])
    body = json.dumps({"model": str((gateway.get("models") or ["MODEL"])[0]), "prompt": "Hello", "max_tokens": 16})
    curl = (f"curl -s {shlex.quote(url.rstrip('/') + '/v1/completions')} -H 'Content-Type: application/json'"
            f" -d {shlex.quote(body)}")
    if gateway.get("open"):
        port, node = gateway.get("port") or urlsplit(url).port, gateway.get("node") or "the gateway's node"
        user, address = str(gateway.get("ssh_user") or ""), gateway.get("address") or node
        return [f"Gateway: {url} (OpenAI base URL {url.rstrip('/')}/v1) for {models}",
                f"  no key is set (gateway_keys): it listens on {node}'s loopback only; add keys to open it to the",
                "  network, or reach it from this machine through a tunnel:",
                f"  ssh -N -L {port}:127.0.0.1:{port} {user + '@' if user else ''}{address}",
                f"  {curl}"]
    names = ", ".join(str(k) for k in gateway.get("keys") or [])
    return [f"Gateway: {url} (OpenAI base URL {url.rstrip('/')}/v1) for {models}",
            f"  pass a key of gateway_keys ({names}) as Authorization: Bearer KEY (OPENAI_API_KEY for OpenAI clients):",
            f"  {curl} -H \"Authorization: Bearer $SPARKSERVE_API_KEY\""]


def monitoring_lines(model: RunModel) -> list[str]:
    """Where Prometheus is, when the run had the monitoring stage, and the tunnel to it on loopback."""
    monitoring = _mapping(model.stats.get(run_stats.MONITORING))
    if not monitoring:
        return []
    server, url, port = monitoring.get("server"), monitoring.get("url"), monitoring.get("port")
    lines = [f"Prometheus on {server} at {url}, {monitoring.get('targets_up')} targets up"]
    if monitoring.get("loopback"):
        host, user = monitoring.get("address") or server, monitoring.get("ssh_user")
        target = f"{user}@{host}" if user else host
        lines.append(f"  reach it from this machine: ssh -N -L {port}:127.0.0.1:{port} {target}")
    return lines


def endpoints(stats: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Every deployment's endpoint by name, in the run's order.

    sparkserve_endpoint is the last deployment's (each launch batch writes it whole); sparkserve_endpoints,
    where the run writes it (aggregated by deployment name), has every deployment's. A run of one deployment
    gives {its name: sparkserve_endpoint}.
    """
    found: dict[str, Mapping[str, Any]] = {str(name): value for name, value in _mapping(stats.get(ENDPOINTS)).items()
                                           if isinstance(value, Mapping) and value}
    last = _mapping(stats.get(run_stats.ENDPOINT))
    name = str(last.get("deployment") or last.get("recipe") or "") if last else ""
    if last and (name or not found):
        found[name] = last
    return found


def endpoint_lines(model: RunModel) -> list[str]:
    """The summary after a successful up (or rollback): where it serves, what, and how to reach it; with several
    deployments, each one's block, the stages once, then how to reach each."""
    found = endpoints(model.stats)
    if len(found) > 1:
        lines: list[str] = []
        for name, endpoint in found.items():
            lines += _endpoint_block(endpoint, name)
        if model.stages:
            lines.append("Stages")
            lines += stage_lines(model)
        gateway = _mapping(model.stats.get(run_stats.GATEWAY))
        if gateway:
            return lines + gateway_lines(gateway) + monitoring_lines(model)
        for name, endpoint in found.items():
            reach = reach_lines(endpoint)
            lines += [f"Try {name}:" if line == "Try it:" else line for line in reach]
        return lines + monitoring_lines(model)
    endpoint = next(iter(found.values()), {})
    if not endpoint:
        return []
    lines = _endpoint_block(endpoint)
    if model.stages:
        lines.append("  stages")
        lines += stage_lines(model)
    gateway = _mapping(model.stats.get(run_stats.GATEWAY))
    reach = gateway_lines(gateway) if gateway else reach_lines(endpoint)
    return lines + reach + monitoring_lines(model)


def _endpoint_block(endpoint: Mapping[str, Any], name: str = "") -> list[str]:
    """Where one deployment serves (named, when there are several) and what: model, weights, image, nodes, ranks."""
    url = str(endpoint.get("url") or "")
    where = f" on {endpoint['head']}'s loopback" if endpoint.get("loopback") and endpoint.get("head") else ""
    serving = f"Serving {name}" if name else "Serving"
    lines = [f"{serving} at {url}{where}" if url else f"{serving} (the run reported no URL)"]

    def row(label: str, value: object) -> None:
        if value not in (None, "", [], {}):
            lines.append(f"  {label:<11}{value}")

    row("model", endpoint.get("model_name"))
    repo, revision = endpoint.get("model_repo"), endpoint.get("model_revision")
    row("from", f"{repo} @ {revision}" if repo and revision else repo or revision)
    image, digest = str(endpoint.get("image") or ""), str(endpoint.get("image_digest") or "")
    row("image", image)
    if digest and not image.endswith(digest):
        row("digest", digest)
    row("engine", endpoint.get("engine"))
    deployment, recipe = endpoint.get("deployment"), endpoint.get("recipe")
    row("deployment", f"{deployment} (recipe {recipe})" if deployment and recipe and deployment != recipe
        else deployment or recipe)
    nodes = endpoint.get("nodes")
    if isinstance(nodes, list):
        row("nodes", ", ".join(str(n) for n in nodes))
    ranks = endpoint.get("ranks")
    if isinstance(ranks, list):
        pairs = [f"{r.get('rank')} → {r.get('node')}" for r in ranks if isinstance(r, Mapping)]
        row("ranks", ", ".join(pairs))
    return lines


def message_lines(model: RunModel) -> list[str]:
    """What the playbook's debug tasks said (render's command lines, bench's comparison), per host."""
    lines: list[str] = []
    for message in model.messages:
        lines.append(f"{message.host}: {message.task}")
        lines += [f"  {line}" for line in message.lines]
    return lines


def logs_lines(model: RunModel) -> list[str]:
    """Each rank's last log lines under a header naming the rank, its node and its container."""
    ranks = _mapping(model.stats.get(run_stats.LOGS)).get("ranks")
    if not isinstance(ranks, list):
        return []
    lines: list[str] = []
    for entry in ranks:
        if not isinstance(entry, Mapping):
            continue
        head = " · ".join(str(x) for x in (f"rank {entry.get('rank')}", entry.get("node"), entry.get("container"))
                          if x not in (None, ""))
        lines.append(f"==> {head} <==")
        text = entry.get("lines")
        lines += [str(line) for line in text] if isinstance(text, list) else ["(no lines)"]
        lines.append("")
    return lines


def follow_argv(model: RunModel, rank: int | None) -> list[str] | None:
    """The command that follows one rank's log (rank 0 when none is named), as the run gave it."""
    ranks = _mapping(model.stats.get(run_stats.LOGS)).get("ranks")
    want = 0 if rank is None else rank
    for entry in ranks if isinstance(ranks, list) else []:
        if isinstance(entry, Mapping) and entry.get("rank") == want:
            argv = entry.get("follow")
            if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
                return list(argv)
    return None


def diagnose_lines(model: RunModel) -> list[str]:
    archive = _mapping(model.stats.get(run_stats.DIAGNOSE)).get("archive")
    return [f"diagnostic archive: {archive}"] if archive else []


def summary_json(model: RunModel, verb: str, rc: int, code: int, artifacts: Path) -> dict[str, Any]:
    """The final {"summary": ...} record of --json."""
    now = model.last_time or datetime.now().astimezone()
    report = FailureReport.of(model) if code else None
    return {
        "verb": verb,
        "rc": rc,
        "exit_code": code,
        "cause": CAUSES.get(code, "failure"),
        "artifacts": str(artifacts),
        "stages": [{"name": s.name, "state": s.state, "elapsed": round(s.elapsed(now), 3), "changed": s.changed,
                    "did_something": s.did_something, "changed_tasks": s.changed_tasks} for s in model.stages],
        "failure": report.as_dict() if report else None,
        "failures": [f.as_dict() for f in model.open_failures()],
        "stats": model.stats,
        "messages": [{"host": m.host, "task": m.task, "lines": m.lines} for m in model.messages],
    }
