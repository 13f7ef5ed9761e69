"""`sparkserve status` on one screen, from the playbook's sparkserve_status and sparkserve_statuses stats.

playbooks/status.yml runs one batch per deployment. Each batch adds its deployment to ``sparkserve_statuses``
(aggregated, by name: the recipe, the endpoint and the ranks) and writes ``sparkserve_status`` whole (the last
batch's: its nodes, readiness and supervisor too). The screen has one block per deployment, the last one's with
everything sparkserve_status says; with one deployment it is sparkserve_status's screen alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ansible_collections.sparkserve.deploy.plugins.module_utils import run_stats

# Keys playbooks/status.yml writes that plugins/module_utils/run_stats.py does not name yet.
STATUSES: str = getattr(run_stats, "STATUSES", "sparkserve_statuses")
UNMANAGED: str = getattr(run_stats, "UNMANAGED", "sparkserve_unmanaged")

GOOD_STATES = {"running", "active", "armed", "up", "ok", "healthy", "verified"}


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _cell(value: object, missing: str = "-") -> str:
    return missing if value in (None, "") else str(value)


def _state(value: object) -> Text:
    text = _cell(value, "unknown")
    return Text(text, style="green" if text.lower() in GOOD_STATES else "yellow")


def short_image(image: object) -> str:
    """registry:5000/path/engine@sha256:141cd527a97a… as engine@sha256:141cd527."""
    text = _cell(image)
    name, at, digest = text.partition("@")
    name = name.rsplit("/", 1)[-1]
    if at:
        algo, _, value = digest.partition(":")
        return f"{name}@{algo}:{value[:8]}" if value else f"{name}@{digest[:15]}"
    return name


def short_time(value: object) -> str:
    """An ISO time as month, day and time of day: 2026-12-02T00:51:55.123Z as 12-02 00:51:55."""
    text = _cell(value)
    if len(text) >= 19 and text[4] == "-" and text[10] in "T ":
        return f"{text[5:10]} {text[11:19]}"
    return text


def fingerprint(rank: Mapping[str, Any]) -> Text:
    """Whether the running container is the one the recipe renders now (nothing to compare when absent)."""
    value = rank.get("fingerprint_matches")
    if str(rank.get("state") or "").lower() in ("absent", "") and not rank.get("image"):
        return Text("-", style="dim")
    if value is True:
        return Text("ok", style="green")
    if value is False:
        return Text("changed", style="red")
    return Text("-", style="dim")


def rank_table(ranks: list[Any]) -> Table:
    table = Table(title="Ranks", title_justify="left", box=box.SIMPLE_HEAD, expand=False,
                  show_edge=False, pad_edge=False, collapse_padding=True)
    for column in ("rank", "node", "state", "started", "image", "fingerprint"):
        table.add_column(column, overflow="fold")
    for rank in sorted((r for r in ranks if isinstance(r, Mapping)), key=lambda r: str(r.get("rank"))):
        table.add_row(_cell(rank.get("rank")), _cell(rank.get("node")), _state(rank.get("state")),
                      short_time(rank.get("started_at")), short_image(rank.get("image")), fingerprint(rank))
    return table


def readiness_text(readiness: Mapping[str, Any]) -> Text:
    health = readiness.get("health")
    models = [str(m) for m in _list(readiness.get("models"))]
    text = Text("Readiness: ", style="bold")
    if isinstance(health, int) and not isinstance(health, bool) and health > 0:
        text.append(f"health {health}", style="green" if health == 200 else "red")
    else:
        text.append("health not answered", style="red")
    text.append(" · models: ")
    text.append(", ".join(models) if models else "none served", style="green" if models else "yellow")
    return text


def _fabric(fabric: Mapping[str, Any]) -> str:
    links = [link for link in _list(fabric.get("links")) if isinstance(link, Mapping)]
    parts = [f"gid {fabric['gid_index']}"] if fabric.get("gid_index") is not None else []
    parts += [f"{_cell(link.get('device'))} {_cell(link.get('state'))}" for link in links]
    parts += [str(problem) for problem in _list(fabric.get("problems"))]
    return "\n".join(parts) or "-"


def _weights(weights: Mapping[str, Any]) -> Text:
    verified, problem = weights.get("verified"), str(weights.get("problem") or "")
    if verified is True:
        return Text("verified", style="green")
    if verified is False:
        return Text("NOT verified" + (f": {problem}" if problem else ""), style="red")
    return Text("-", style="dim")


def node_table(nodes: list[Any]) -> Table:
    table = Table(title="Nodes", title_justify="left", box=box.SIMPLE_HEAD, expand=False,
                  show_edge=False, pad_edge=False, collapse_padding=True)
    for column in ("node", "guard", "flusher", "fabric", "weights"):
        table.add_column(column, overflow="fold")
    for node in (n for n in nodes if isinstance(n, Mapping)):
        table.add_row(_cell(node.get("node")), _state(_mapping(node.get("guard")).get("state")),
                      _state(_mapping(node.get("flusher")).get("state")), _fabric(_mapping(node.get("fabric"))),
                      _weights(_mapping(node.get("weights"))))
    return table


def guard_events(nodes: list[Any]) -> list[Text]:
    lines: list[Text] = []
    for node in (n for n in nodes if isinstance(n, Mapping)):
        events = _list(_mapping(node.get("guard")).get("last_events"))
        if events:
            lines.append(Text(f"Guard on {_cell(node.get('node'))}, last events:", style="bold"))
            lines += [Text(f"  {event}") for event in events]
    return lines


def supervisor_lines(supervisor: Mapping[str, Any]) -> list[Text]:
    """The supervisor's state and restart count, and its last events, one a line."""
    if not supervisor:
        return []
    state = _cell(supervisor.get("state"))
    style = "red" if state.startswith("needs") else "green" if state == "watching" else "yellow"
    lines = [Text.assemble(("Supervisor: ", "bold"), (state, style),
                           f" · {_cell(supervisor.get('restarts_total'), '0')} restarts,"
                           f" {_cell(supervisor.get('restarts_last_hour'), '0')} in the last hour")]
    for event in (e for e in _list(supervisor.get("last_events")) if isinstance(e, Mapping)):
        cause = f": {event['cause']}" if event.get("cause") else ""
        lines.append(Text(f"  {short_time(event.get('time'))} {_cell(event.get('event'))}{cause}"))
    return lines


def render_status(data: Mapping[str, Any]) -> RenderableType:
    """Ranks, readiness, the supervisor, each node's guard, flusher, fabric and weights, the guard's events."""
    parts: list[RenderableType] = []
    title = " · ".join(f"{k} {data[k]}" for k in ("deployment", "recipe") if data.get(k))
    if title:
        parts.append(Text(title, style="bold"))
    endpoint = _mapping(data.get("endpoint"))
    if endpoint.get("url"):
        served = f" serving {endpoint['model_name']}" if endpoint.get("model_name") else ""
        parts.append(Text(f"Endpoint: {endpoint['url']}{served}"))
    ranks = _list(data.get("ranks"))
    if ranks:
        parts.append(rank_table(ranks))
    elif "ranks" in data:
        parts.append(Text("No rank is running.", style="yellow"))
    if isinstance(data.get("readiness"), Mapping):
        parts.append(readiness_text(data["readiness"]))
    parts += supervisor_lines(_mapping(data.get("supervisor")))
    nodes = _list(data.get("nodes"))
    if nodes:
        parts.append(node_table(nodes))
        parts += guard_events(nodes)
    if not parts:
        parts.append(Text("The status run reported nothing.", style="yellow"))
    return Group(*parts)


def deployment_statuses(stats: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every deployment's status, by name, in the run's order: sparkserve_statuses' entries, the one that
    sparkserve_status describes completed with it (a run that wrote only sparkserve_status: that one)."""
    found: dict[str, dict[str, Any]] = {}
    for name, entry in _mapping(stats.get(STATUSES)).items():
        if isinstance(entry, Mapping):
            found[str(name)] = {"deployment": str(name), **entry}
    status = _mapping(stats.get(run_stats.STATUS))
    if status:
        name = str(status.get("deployment") or "")
        found[name] = {**found.get(name, {}), **status}
    return found


def unmanaged(stats: Mapping[str, Any]) -> dict[str, list[str]]:
    """node -> the deployments running there that the inventory does not list."""
    return {str(node): [str(d) for d in names] for node, names in _mapping(stats.get(UNMANAGED)).items()
            if isinstance(names, list) and names}


def unmanaged_lines(stats: Mapping[str, Any]) -> list[Text]:
    return [Text(f"{node} runs {', '.join(names)}, of no deployment this inventory lists (left running)",
                 style="yellow") for node, names in unmanaged(stats).items()]


def render_statuses(stats: Mapping[str, Any]) -> RenderableType:
    """One block per deployment (render_status's), then the deployments the inventory does not list."""
    deployments = list(deployment_statuses(stats).values())
    parts: list[RenderableType] = []
    for index, data in enumerate(deployments):
        if index:
            parts.append(Text(""))
        parts.append(render_status(data))
    if not parts:
        parts.append(render_status({}))
    return Group(*parts, *unmanaged_lines(stats))


def status_document(stats: Mapping[str, Any]) -> dict[str, Any]:
    """status --json: sparkserve_status's fields where the run read one deployment, and always `deployments`,
    every deployment's status by name (and `unmanaged`, node -> deployments the inventory does not list)."""
    deployments = deployment_statuses(stats)
    document: dict[str, Any] = dict(_mapping(stats.get(run_stats.STATUS))) if len(deployments) <= 1 else {}
    document["deployments"] = deployments
    if unmanaged(stats):
        document["unmanaged"] = unmanaged(stats)
    return document
