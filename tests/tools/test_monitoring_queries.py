"""tools/monitoring-queries.py: every dashboard target and alert as a query to run against a lab."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.scripts import ROOT, load_script

queries = load_script("tools/monitoring-queries.py", "monitoring_queries")


@pytest.mark.parametrize(("expr", "want"), [
    ("a > b", "a > bool b"),
    ("a>b", "a> bool b"),
    ("a == 0", "a == bool 0"),
    ("a != 0", "a != bool 0"),
    ("a >= 1 and b <= 2", "a >= bool 1 and b <= bool 2"),
    ("a < 1.25 * b", "a < bool 1.25 * b"),
    # An existing bool is kept, whatever the spacing or case around it.
    ("a > bool b", "a > bool b"),
    ("a >bool b", "a >bool b"),
    ("a > bool on(x) b", "a > bool on(x) b"),
    # The vector-matching modifiers follow the bool.
    ("a > on(deployment) group_left() b", "a > bool on(deployment) group_left() b"),
    ("a{x=\"1\"} != ignoring(y) group_right(z) b", "a{x=\"1\"} != bool ignoring(y) group_right(z) b"),
    # Nothing inside label matchers, strings or ranges is an operator.
    ('a{l!="x", m=~"a>b|c<d", n!~"=="} > 0', 'a{l!="x", m=~"a>b|c<d", n!~"=="} > bool 0'),
    ('label_replace(a, "d", "$1", "s", "(.*)>=(.*)") < 1', 'label_replace(a, "d", "$1", "s", "(.*)>=(.*)") < bool 1'),
    ("a{l='>'} > `<`", "a{l='>'} > bool `<`"),
    ('a{l="q\\"uote>"} == 1', 'a{l="q\\"uote>"} == bool 1'),
    ("rate(a[5m:1m]) > 0", "rate(a[5m:1m]) > bool 0"),
    # Each comparison, nested ones and both sides of or included.
    ("(x == 0) or (y == 0)", "(x == bool 0) or (y == bool 0)"),
    ("increase(r[15m]) > 0 or changes(s[15m]) > 0", "increase(r[15m]) > bool 0 or changes(s[15m]) > bool 0"),
    ("a > 0 # a comment with > and ==", "a > bool 0 # a comment with > and =="),
    ("a\n  >\n  b", "a\n  > bool\n  b"),
    ("sum(a)", "sum(a)"),
])
def test_bool_form(expr: str, want: str) -> None:
    assert queries.bool_form(expr) == want


def test_bool_form_is_idempotent() -> None:
    expr = 'x{a="b"} > on(d) group_left() y or z < 1'
    once = queries.bool_form(expr)
    assert queries.bool_form(once) == once


def test_an_unreadable_expression_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot read"):
        queries.bool_form("a > 0 ?")


@pytest.mark.parametrize(("expr", "want"), [
    ('sum by (deployment, le) (rate(x_bucket{deployment="d"}[5m]))', {"x_bucket"}),
    ("a and on(node) b", {"a", "b"}),
    ("sum(rate(a[1m])) by (node) / ignoring(x) group_left(y) count without (z) (b:rec:ratio offset 5m)",
     {"a", "b:rec:ratio"}),
    ("histogram_quantile(0.9, sum by (le) (rate(h_bucket[5m]))) > bool 1e3", {"h_bucket"}),
    ('label_replace(up, "n", "$1", "instance", "(.*)") > Inf', {"up"}),
    ("max(x) by (deployment)", {"x"}),
])
def test_series_names(expr: str, want: set[str]) -> None:
    assert queries.series_names(expr) == want


def test_substitute_fills_each_variable_form() -> None:
    values = {"deployment": "lab-tp2", "fabric_device": "eth1|eth2", "__rate_interval": "1m", "__interval": "1m"}
    expr = ('rate(x{deployment="$deployment", device=~"${fabric_device}"}[$__rate_interval]) '
            '+ y{d="[[deployment]]", e="${deployment:regex}"}[$__interval]')
    assert queries.substitute(expr, values) == ('rate(x{deployment="lab-tp2", device=~"eth1|eth2"}[1m]) '
                                                '+ y{d="lab-tp2", e="lab-tp2"}[1m]')
    with pytest.raises(ValueError, match=r"\$nowhere"):
        queries.substitute("x{a=\"$nowhere\"}", values)


def test_a_variables_default() -> None:
    assert queries.variable_default({"type": "textbox", "query": "a|b"}) == "a|b"
    assert queries.variable_default({"type": "textbox", "query": "a|b", "current": {"value": "c"}}) == "c"
    assert queries.variable_default({"type": "custom", "query": "x, y"}) == "x"
    assert queries.variable_default({"type": "query", "query": {"query": "label_values(m, l)"}}) is None


def dashboard() -> Dict[str, Any]:
    data: Dict[str, Any] = queries.load_dashboard(queries.DASHBOARD)
    return data


def listing(*args: str) -> List[Dict[str, str]]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert queries.main(["list", *args]) == 0
    data: List[Dict[str, str]] = json.loads(out.getvalue())
    return data


def test_the_fabric_regex_defaults_to_the_sparks_interfaces() -> None:
    values = queries.dashboard_values(dashboard(), "lab-tp2")
    assert values["deployment"] == "lab-tp2" and values["__rate_interval"] == "1m"
    fabric = re.compile(f"^(?:{values['fabric_device']})$")
    assert all(fabric.match(name) for name in ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1"))
    assert not any(fabric.match(name) for name in ("enP7s7", "lo", "docker0"))


def test_the_list_covers_every_panel_target_and_alert() -> None:
    got = listing("--deployment", "lab-tp2")
    board = dashboard()
    targets = [(panel["title"], target) for panel in queries.panels(board) for target in panel.get("targets", [])]
    alerts = queries.alert_rules(queries.load_rules(queries.ALERTS))
    assert len(got) == len(targets) + len(alerts)
    assert [entry["source"] for entry in got] == [title for title, _ in targets] + [rule["alert"] for rule in alerts]
    assert all(set(entry) == {"source", "expr"} for entry in got)
    for entry, (_, target) in zip(got, targets, strict=False):
        assert "$" not in entry["expr"] and "[[" not in entry["expr"], entry
        if "$deployment" in target["expr"]:
            assert 'deployment="lab-tp2"' in entry["expr"], entry
        if "$__rate_interval" in target["expr"]:
            assert "[1m]" in entry["expr"], entry
    for entry, rule in zip(got[len(targets):], alerts, strict=True):
        assert entry["expr"] == queries.bool_form(rule["expr"].strip())
        comparisons = [t for t in queries.tokens(entry["expr"]) if t.kind == "op" and t.text in queries.COMPARISONS]
        assert comparisons, entry
        assert entry["expr"].count(" bool") == len(comparisons), entry
    # Every panel of the dashboard but a row has at least one query.
    graphs = {panel["title"] for panel in queries.panels(board) if panel["type"] != "row"}
    assert {title for title, _ in targets} == graphs


def test_the_list_reads_other_files(tmp_path: Path) -> None:
    board = {"templating": {"list": [{"name": "fabric_device", "type": "textbox", "query": "eth.*"}]},
             "panels": [{"type": "row", "title": "row", "panels": [
                 {"title": "Inside a row", "targets": [{"expr": 'x{d="$deployment", i=~"$fabric_device"}'}]}]}]}
    (tmp_path / "board.json").write_text(json.dumps(board), encoding="utf-8")
    (tmp_path / "alerts.yml").write_text("groups:\n  - name: g\n    rules:\n      - record: r\n        expr: x\n"
                                         "      - alert: A\n        expr: x > y\n", encoding="utf-8")
    got = listing("--deployment", "d1", "--dashboard", str(tmp_path / "board.json"),
                  "--alerts", str(tmp_path / "alerts.yml"))
    assert got == [{"source": "Inside a row", "expr": 'x{d="d1", i=~"eth.*"}'}, {"source": "A", "expr": "x > bool y"}]


def test_the_program_runs_from_the_command_line() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "monitoring-queries.py"), "list", "--deployment", "x"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout)[0]["expr"].endswith('{deployment="x"}')
