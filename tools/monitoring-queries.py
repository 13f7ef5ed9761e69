#!/usr/bin/env python3
"""Every PromQL query of the monitoring: the dashboard's targets and the alerts' expressions, ready to run.

    tools/monitoring-queries.py list --deployment NAME [--dashboard FILE] [--alerts FILE]

prints a JSON list of {"source": PANEL TITLE or ALERT NAME, "expr": PROMQL}. A dashboard target has its
variables filled in: $deployment with NAME, every other dashboard variable (the fabric interfaces' regex)
with its default, $__rate_interval and $__interval with 1m. An alert's expression has each comparison in
its bool form (``a > b`` becomes ``a > bool b``), so that it answers 0 or 1 for every series it compares
instead of filtering them: on a healthy lab each query returns a non-empty vector (of zeros, for the
alerts), and an empty one names a series that is missing.

``TEXTFILE_SERIES`` lists the series the nodes' textfile collector exposes; the tests check that the
dashboard and the alerts read only those, the recorded sparkserve:* series, the node exporter's node_*
series and ``up``. Standard library and PyYAML only: it runs on the controller.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Set

import yaml

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "grafana" / "sparkserve-dashboard.json"
ALERTS = ROOT / "roles" / "monitoring" / "files" / "sparkserve.alerts.yml"

# What the sparkserve programs write for the node exporter's textfile collector (the exporter adds job,
# instance and node). The one list of them: the tests check every series the dashboard and the alerts read
# against it.
TEXTFILE_SERIES = (
    "sparkserve_memguard_floor_bytes",
    "sparkserve_memguard_mem_available_bytes",
    "sparkserve_memguard_mem_free_bytes",
    "sparkserve_memguard_actions_total",
    "sparkserve_memguard_rank_running",
    "sparkserve_memguard_last_sample_timestamp_seconds",
    "sparkserve_flusher_passes_total",
    "sparkserve_flusher_freed_bytes_total",
    "sparkserve_flusher_running",
    "sparkserve_flusher_last_pass_timestamp_seconds",
    "sparkserve_supervisor_state",
    "sparkserve_supervisor_restarts_total",
    "sparkserve_supervisor_paused",
    "sparkserve_supervisor_last_check_timestamp_seconds",
    "sparkserve_bench_ttft_p99_seconds",
    "sparkserve_bench_timestamp_seconds",
    "sparkserve_weights_verified_bytes",
    "sparkserve_weights_verified_files",
    "sparkserve_weights_last_verify_timestamp_seconds",
    "sparkserve_nccl_busbw_gbps",
    "sparkserve_nccl_transport_info",
    "sparkserve_nccl_probe_timestamp_seconds",
    "sparkserve_deployment_info",
    "sparkserve_deployment_start_time_seconds",
    "sparkserve_rank_transport_info",
    "sparkserve_deployment_ttft_p99_limit_seconds",
)

# Grafana's interval variables, as this tool fills them in.
INTERVAL = "1m"
INTERVAL_VARIABLES = {"__rate_interval": INTERVAL, "__interval": INTERVAL}

COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
# Keywords of PromQL that read like names; each of the first kind is followed by a list of labels.
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = LABEL_LIST_KEYWORDS | {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<braces>\{(?:"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`|[^}"'`])*\})
  | (?P<brackets>\[[^\]]*\])
  | (?P<number>(?:\d+(?:ms|[smhdwy]))+(?![\w:])|0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=@(),])
""", re.VERBOSE)

_VARIABLE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)|\[\[(\w+)\]\]")


class Token(NamedTuple):
    kind: str
    text: str


class Query(NamedTuple):
    source: str
    expr: str


def tokens(expr: str) -> Iterator[Token]:
    """PromQL's tokens, whitespace and comments included; a label matcher set ``{...}`` and a range or
    subquery ``[...]`` are one token each, so nothing inside them counts as an operator or a name."""
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None or match.lastgroup is None:
            raise ValueError(f"cannot read the PromQL at {position}: {expr[position:position + 30]!r}")
        yield Token(match.lastgroup, match.group())
        position = match.end()


def bool_form(expr: str) -> str:
    """EXPR with every comparison operator outside braces and strings given the bool modifier.

    ``a > b`` becomes ``a > bool b`` and ``a > on(x) group_left() b`` becomes ``a > bool on(x) group_left() b``;
    a comparison that already has it is kept as it is.
    """
    parts = list(tokens(expr))
    out: List[str] = []
    for index, token in enumerate(parts):
        out.append(token.text)
        if token.kind != "op" or token.text not in COMPARISONS:
            continue
        following = next((t for t in parts[index + 1:] if t.kind not in ("space", "comment")), None)
        if following is not None and following.kind == "name" and following.text == "bool":
            continue
        nxt = parts[index + 1] if index + 1 < len(parts) else None
        out.append(" bool" if nxt is not None and nxt.kind == "space" else " bool ")
    return "".join(out)


def series_names(expr: str) -> Set[str]:
    """The metric names EXPR selects (not its functions, keywords, labels or numbers)."""
    parts = [t for t in tokens(expr) if t.kind not in ("space", "comment")]
    names: Set[str] = set()
    index = 0
    while index < len(parts):
        token = parts[index]
        following = parts[index + 1] if index + 1 < len(parts) else None
        if token.kind == "name" and token.text in LABEL_LIST_KEYWORDS:
            if following is not None and following.text == "(":
                # Skip the label list up to its closing parenthesis.
                index += 2
                while index < len(parts) and parts[index].text != ")":
                    index += 1
        elif token.kind == "name" and token.text.lower() not in KEYWORDS:
            # A function or an aggregation (``sum(...)``, ``sum by (...) (...)``) is no series.
            if following is None or (following.text != "(" and following.text not in ("by", "without")):
                names.add(token.text)
        index += 1
    return names


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """EXPR with each Grafana variable ($name, ${name}, ${name:format}, [[name]]) replaced by its value."""
    def fill(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group is not None)
        if name not in values:
            raise ValueError(f"no value for the dashboard variable ${name} in {expr!r}")
        return values[name]
    return _VARIABLE.sub(fill, expr)


def variable_default(variable: Mapping[str, Any]) -> Optional[str]:
    """A dashboard variable's default: its current value, else (a textbox, custom or constant) its query."""
    current = variable.get("current") or {}
    value = current.get("value") if isinstance(current, dict) else None
    if isinstance(value, list):
        value = "|".join(str(v) for v in value)
    if value not in (None, ""):
        return str(value)
    query = variable.get("query")
    if not isinstance(query, str):
        return None
    if variable.get("type") in ("textbox", "constant"):
        return query
    if variable.get("type") == "custom":  # its options, comma-separated: the first is the default
        return query.split(",")[0].strip()
    return None


def variable_query(variable: Mapping[str, Any]) -> str:
    """The query of a dashboard's query variable (Grafana 10 keeps it as a string or as {"query": ...})."""
    query = variable.get("query")
    if isinstance(query, dict):
        query = query.get("query")
    return str(query or variable.get("definition") or "")


def dashboard_values(dashboard: Mapping[str, Any], deployment: str) -> Dict[str, str]:
    """The value of each variable of DASHBOARD: DEPLOYMENT for $deployment, every other one its default."""
    values = dict(INTERVAL_VARIABLES)
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        default = variable_default(variable)
        if default is not None:
            values[str(variable["name"])] = default
    values["deployment"] = deployment
    return values


def panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel of DASHBOARD, those inside (collapsed) rows included."""
    for panel in dashboard.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []


def panel_targets(panel: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """The targets of PANEL that hold a PromQL expression."""
    return [target for target in panel.get("targets") or [] if target.get("expr")]


def dashboard_queries(dashboard: Mapping[str, Any], deployment: str) -> List[Query]:
    """Each target of DASHBOARD, its variables filled in for DEPLOYMENT."""
    values = dashboard_values(dashboard, deployment)
    return [Query(str(panel.get("title", "")), substitute(str(target["expr"]), values))
            for panel in panels(dashboard) for target in panel_targets(panel)]


def alert_rules(rules: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """Every alerting rule of a Prometheus rule file."""
    return [rule for group in rules.get("groups") or [] for rule in group.get("rules") or [] if "alert" in rule]


def alert_queries(rules: Mapping[str, Any]) -> List[Query]:
    """Each alert of RULES, its expression in bool form."""
    return [Query(str(rule["alert"]), bool_form(str(rule["expr"]).strip())) for rule in alert_rules(rules)]


def load_dashboard(path: Path) -> Dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        data: Dict[str, Any] = json.load(handle)
    return data


def load_rules(path: Path) -> Dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        data: Dict[str, Any] = yaml.safe_load(handle) or {}
    return data


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="print every query of the dashboard and the alerts as JSON")
    listing.add_argument("--deployment", required=True, help="the deployment whose queries to print")
    listing.add_argument("--dashboard", type=Path, default=DASHBOARD, help="the Grafana dashboard (JSON)")
    listing.add_argument("--alerts", type=Path, default=ALERTS, help="the Prometheus alert rules (YAML)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    queries = dashboard_queries(load_dashboard(args.dashboard), args.deployment)
    queries += alert_queries(load_rules(args.alerts))
    json.dump([query._asdict() for query in queries], sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
