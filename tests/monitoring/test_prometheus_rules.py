"""The monitoring's Prometheus rules, checked and unit-tested by promtool.

The alerts (roles/monitoring/files/sparkserve.alerts.yml) are static; their unit tests are
tests/monitoring/alerts.test.yml. The recording rules are a template (roles/monitoring/templates/
deployment.rules.yml.j2) rendered per deployment with its engine adapter's ``metric_names``: these tests
render it the way Ansible's template module does (trim_blocks) for each engine, from the real adapters,
and write the recording rules' unit tests next to the rendering, from
raw engine series whose rates and histogram quantiles are computed here the way Prometheus computes them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import jinja2
import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
queries = load_script("tools/monitoring-queries.py", "monitoring_queries")
TEMPLATE = ROOT / "roles" / "monitoring" / "templates" / "deployment.rules.yml.j2"
ALERTS = ROOT / "roles" / "monitoring" / "files" / "sparkserve.alerts.yml"
ALERT_TESTS = Path(__file__).resolve().parent / "alerts.test.yml"
GATEWAY_PROGRAM = ROOT / "roles" / "gateway" / "files" / "gateway.mtail"
DEPLOYMENT = "lab-tp2"

# Each engine's meanings and its metric names (counters without _total, histograms without _bucket): the
# adapters' own metric_names, which the engine doubles expose under the real engines' names.
CONTRACT: Dict[str, Dict[str, str]] = {name: dict(ENGINES[name].metric_names) for name in ("vllm", "sglang")}
ENGINE_NAMES = sorted(CONTRACT)
QUANTILES = ("0.5", "0.9", "0.99")
HISTOGRAM_RECORDS = {"ttft": "sparkserve:time_to_first_token_seconds:quantile_5m",
                     "itl": "sparkserve:inter_token_latency_seconds:quantile_5m",
                     "e2e_latency": "sparkserve:e2e_request_latency_seconds:quantile_5m"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool; a machine without it fails the test (make setup installs it)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run tools/setup-controller.sh (it installs Debian's prometheus package)")
    return subprocess.run([path, *args], capture_output=True, text=True, check=False, timeout=120)


def assert_promtool(*args: str) -> None:
    done = promtool(*args)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def names_of(engine: str) -> Dict[str, str]:
    """The metric_names of ENGINE's adapter."""
    return dict(CONTRACT[engine])


def render(names: Mapping[str, str], deployment: str = DEPLOYMENT) -> str:
    """The template rendered as Ansible's template module renders it."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
    return env.get_template(TEMPLATE.name).render(ansible_managed="Ansible managed", monitoring_deployment=deployment,
                                                  monitoring_engine_metric_names=dict(names))


def rules_of(text: str) -> List[Dict[str, Any]]:
    groups = yaml.safe_load(text)["groups"]
    assert len(groups) == 1
    return list(groups[0]["rules"] or [])


def record_names() -> Set[str]:
    """Every record the template can write (for the contract's engines)."""
    return {rule["record"] for engine in ENGINE_NAMES for rule in rules_of(render(CONTRACT[engine]))}


def load_yaml(path: Path) -> Dict[str, Any]:
    data: Dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data


# --- promtool check and the alerts' unit tests ---------------------------------------------------------


def test_alert_rules_pass_promtool_check() -> None:
    assert_promtool("check", "rules", str(ALERTS))


def test_alert_unit_tests_pass() -> None:
    assert_promtool("test", "rules", str(ALERT_TESTS))


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_rendered_recording_rules_pass_promtool_check(engine: str, tmp_path: Path) -> None:
    rules = tmp_path / f"{DEPLOYMENT}.rules.yml"
    rules.write_text(render(names_of(engine)), encoding="utf-8")
    assert_promtool("check", "rules", str(rules))


# --- what the template writes ----------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_every_expression_selects_the_deployment_and_aggregates_by_it(engine: str) -> None:
    rules = rules_of(render(CONTRACT[engine]))
    assert rules
    for rule in rules:
        expr = rule["expr"]
        tokens = [t for t in queries.tokens(expr) if t.kind not in ("space", "comment")]
        selectors = [t.text for t in tokens if t.kind == "braces"]
        assert selectors and all(s == f'{{deployment="{DEPLOYMENT}"}}' for s in selectors), (rule["record"], expr)
        groupings = [tokens[i + 2].text for i, t in enumerate(tokens[:-2]) if t.text == "by"]
        assert groupings and all(g == "deployment" for g in groupings), (rule["record"], expr)
        assert "by (deployment" in expr


def test_the_records_of_each_engine() -> None:
    quantiles = [f"{record}{{quantile={q}}}" for record in HISTOGRAM_RECORDS.values() for q in QUANTILES]
    common = ["sparkserve:generation_tokens:rate1m", "sparkserve:prompt_tokens:rate1m", "sparkserve:requests_running",
              "sparkserve:requests_waiting", "sparkserve:kv_cache_usage:ratio", *quantiles,
              "sparkserve:spec_acceptance_length:ratio_5m"]

    def written(engine: str) -> List[str]:
        return [rule["record"] + ("{quantile=%s}" % rule["labels"]["quantile"] if "labels" in rule else "")
                for rule in rules_of(render(CONTRACT[engine]))]

    assert written("vllm") == common + ["sparkserve:spec_acceptance_by_position:ratio_5m"]
    assert written("sglang") == common


def test_a_record_whose_meanings_are_absent_is_left_out() -> None:
    only_tokens = rules_of(render({"generation_tokens": "toy:generated"}))
    assert [rule["record"] for rule in only_tokens] == ["sparkserve:generation_tokens:rate1m"]
    assert only_tokens[0]["expr"] == (f'sum by (deployment) (rate(toy:generated_total{{deployment="{DEPLOYMENT}"}}'
                                      '[1m]))')
    # Drafts without accepted tokens make no acceptance length; a gauge of it does.
    drafts_only = rules_of(render({"spec_drafts": "toy:drafts", "ttft": "toy:ttft"}))
    assert {rule["record"] for rule in drafts_only} == {HISTOGRAM_RECORDS["ttft"]}
    gauge = rules_of(render({"spec_accept_length": "toy:accept_length"}))
    assert [rule["expr"] for rule in gauge] == [f'max by (deployment) (toy:accept_length{{deployment="{DEPLOYMENT}"}})']


# --- the recording rules' values, from raw engine series ------------------------------------------------

INTERVAL_S = 60
EVAL_MINUTES = 10
ENGINE_LABELS = 'job="sparkserve-engine", instance="spark-1:8000", node="spark-1"'
# Histogram buckets (upper bound, increase per minute) of each latency, cumulative as Prometheus exposes them.
BUCKETS: Dict[str, List[Tuple[float, int]]] = {
    "ttft": [(0.25, 120), (1.0, 240), (4.0, 252), (float("inf"), 252)],
    "itl": [(0.025, 600), (0.1, 1140), (float("inf"), 1200)],
    "e2e_latency": [(2.5, 12), (10.0, 54), (float("inf"), 60)],
}


def counter(increase_per_minute: float) -> str:
    return f"0+{increase_per_minute:g}x{EVAL_MINUTES}"


def rate(increase_per_minute: float, window_minutes: int) -> float:
    """rate() over a window of WINDOW_MINUTES of a counter sampled each minute, as Prometheus computes it
    (the samples lie on the window's both ends, so it extrapolates nothing)."""
    delta = float(increase_per_minute * window_minutes)
    sampled = float(window_minutes * INTERVAL_S)
    return delta * (sampled / sampled) / sampled


def bucket_quantile(q: float, buckets: Sequence[Tuple[float, float]]) -> float:
    """histogram_quantile over cumulative (upper bound, rate) buckets, as Prometheus 2 computes it."""
    rank = q * buckets[-1][1]
    b = next((i for i in range(len(buckets) - 1) if buckets[i][1] >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def series(name: str, labels: str, values: str, deployment: str = DEPLOYMENT) -> Dict[str, str]:
    return {"series": f'{name}{{deployment="{deployment}", {ENGINE_LABELS}{labels}}}', "values": values}


def sample(record: str, value: float, labels: str = "") -> Dict[str, Any]:
    return {"labels": f'{record}{{deployment="{DEPLOYMENT}"{labels}}}', "value": value}


def recording_cases(names: Mapping[str, str]) -> Tuple[List[Dict[str, str]], List[Dict[str, Any]]]:
    """Raw series of the engine named by NAMES (and of another deployment, which the rules must not read),
    and the records they must give at EVAL_MINUTES, for the meanings NAMES has."""
    inputs: List[Dict[str, str]] = []
    tests: List[Dict[str, Any]] = []
    at = f"{EVAL_MINUTES}m"

    def expect(record: str, samples: List[Dict[str, Any]], expr: Optional[str] = None) -> None:
        tests.append({"expr": expr or record, "eval_time": at, "exp_samples": samples})

    for meaning, per_minute, record in (("generation_tokens", 600, "sparkserve:generation_tokens:rate1m"),
                                        ("prompt_tokens", 1500, "sparkserve:prompt_tokens:rate1m")):
        if meaning in names:
            inputs.append(series(f"{names[meaning]}_total", ', rank="0"', counter(per_minute)))
            inputs.append(series(f"{names[meaning]}_total", ', rank="0"', counter(per_minute * 7), "other"))
            expect(record, [sample(record, rate(per_minute, 1))])
    for meaning, values, record, want in (("requests_running", (3, 2), "sparkserve:requests_running", 5.0),
                                          ("requests_waiting", (4, 0), "sparkserve:requests_waiting", 4.0),
                                          ("kv_cache_usage", (0.25, 0.5), "sparkserve:kv_cache_usage:ratio", 0.5)):
        if meaning in names:
            for rank, value in enumerate(values):
                inputs.append(series(names[meaning], f', rank="{rank}"', f"{value:g}x{EVAL_MINUTES}"))
            inputs.append(series(names[meaning], ', rank="0"', f"0.75x{EVAL_MINUTES}", "other"))
            expect(record, [sample(record, want)])
    for meaning, record in HISTOGRAM_RECORDS.items():
        if meaning not in names:
            continue
        for bound, per_minute in BUCKETS[meaning]:
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            inputs.append(series(f"{names[meaning]}_bucket", f', rank="0", le="{le}"', counter(per_minute)))
            inputs.append(series(f"{names[meaning]}_bucket", f', rank="0", le="{le}"',
                                 counter(BUCKETS[meaning][-1][1]), "other"))
        rates = [(bound, rate(per_minute, 5)) for bound, per_minute in BUCKETS[meaning]]
        for q in QUANTILES:
            expect(record, [sample(record, bucket_quantile(float(q), rates), f', quantile="{q}"')],
                   f'{record}{{quantile="{q}"}}')
    if "spec_drafts" in names and "spec_accepted_tokens" in names:
        inputs.append(series(f"{names['spec_drafts']}_total", ', rank="0"', counter(120)))
        inputs.append(series(f"{names['spec_accepted_tokens']}_total", ', rank="0"', counter(180)))
        inputs.append(series(f"{names['spec_drafts']}_total", ', rank="0"', counter(120), "other"))
        inputs.append(series(f"{names['spec_accepted_tokens']}_total", ', rank="0"', counter(30), "other"))
        record = "sparkserve:spec_acceptance_length:ratio_5m"
        expect(record, [sample(record, 1 + rate(180, 5) / rate(120, 5))])
        if "spec_accepted_per_position" in names:
            record = "sparkserve:spec_acceptance_by_position:ratio_5m"
            per_position = (108, 60, 12)
            for position, per_minute in enumerate(per_position):
                inputs.append(series(f"{names['spec_accepted_per_position']}_total",
                                     f', rank="0", position="{position}"', counter(per_minute)))
            expect(record, [sample(record, rate(per_minute, 5) / rate(120, 5), f', position="{position}"')
                            for position, per_minute in enumerate(per_position)])
    elif "spec_accept_length" in names:
        for rank, value in enumerate((3.25, 2.75)):
            inputs.append(series(names["spec_accept_length"], f', rank="{rank}"', f"{value:g}x{EVAL_MINUTES}"))
        inputs.append(series(names["spec_accept_length"], ', rank="0"', f"5x{EVAL_MINUTES}", "other"))
        record = "sparkserve:spec_acceptance_length:ratio_5m"
        expect(record, [sample(record, 3.25)])
    return inputs, tests


def no_draft_case(names: Mapping[str, str]) -> Optional[Dict[str, Any]]:
    """A deployment that drafts nothing (its counters stand still) has its acceptance records, NaN (0/0) as an
    idle deployment's latency quantiles are. promtool cannot expect NaN, so the test counts the samples
    that differ from themselves (only NaN does)."""
    if "spec_drafts" not in names or "spec_accepted_tokens" not in names:
        return None
    inputs = [series(f"{names['spec_drafts']}_total", ', rank="0"', f"0x{EVAL_MINUTES}"),
              series(f"{names['spec_accepted_tokens']}_total", ', rank="0"', f"0x{EVAL_MINUTES}")]
    if "spec_accepted_per_position" in names:
        inputs.append(series(f"{names['spec_accepted_per_position']}_total", ', rank="0", position="0"',
                             f"0x{EVAL_MINUTES}"))
    records = ["sparkserve:spec_acceptance_length:ratio_5m"]
    if "spec_accepted_per_position" in names:
        records.append("sparkserve:spec_acceptance_by_position:ratio_5m")
    return {"interval": f"{INTERVAL_S}s", "input_series": inputs,
            "promql_expr_test": [{"expr": f"count({record} != {record})", "eval_time": f"{EVAL_MINUTES}m",
                                  "exp_samples": [{"labels": "{}", "value": 1}]} for record in records]}


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_recording_rules_give_the_expected_values(engine: str, tmp_path: Path) -> None:
    names = names_of(engine)
    rules = tmp_path / f"{DEPLOYMENT}.rules.yml"
    rules.write_text(render(names), encoding="utf-8")
    inputs, tests = recording_cases(names)
    if not tests:
        pytest.fail(f"{engine}'s adapter names none of the meanings the recording rules read: {sorted(names)}")
    groups = [{"interval": f"{INTERVAL_S}s", "input_series": inputs, "promql_expr_test": tests}]
    no_draft = no_draft_case(names)
    if no_draft is not None:
        groups.append(no_draft)
    unit = tmp_path / "recording.test.yml"
    unit.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": groups},
                                   sort_keys=False), encoding="utf-8")
    assert_promtool("test", "rules", str(unit))


def test_the_contracts_cases_cover_every_record() -> None:
    for engine in ENGINE_NAMES:
        _, tests = recording_cases(CONTRACT[engine])
        tested = {queries.series_names(test["expr"]).pop() for test in tests}
        assert tested == {rule["record"] for rule in rules_of(render(CONTRACT[engine]))}, engine


# --- the bool form of each alert on a healthy lab ------------------------------------------------------


def test_each_alerts_bool_form_answers_zeros_on_a_healthy_lab(tmp_path: Path) -> None:
    """tools/monitoring-queries.py's form of each alert, over alerts.test.yml's healthy lab (its first test),
    gives a non-empty vector of zeros."""
    healthy = load_yaml(ALERT_TESTS)["tests"][0]
    checks = healthy["alert_rule_test"]
    alerts = queries.alert_rules(load_yaml(ALERTS))
    assert {check["alertname"] for check in checks} == {rule["alert"] for rule in alerts}
    assert all(check["exp_alerts"] == [] for check in checks)
    at = max(check["eval_time"] for check in checks)
    tests = [{"expr": f"max({query.expr})", "eval_time": at, "exp_samples": [{"labels": "{}", "value": 0}]}
             for query in queries.alert_queries(load_yaml(ALERTS))]
    unit = tmp_path / "healthy.test.yml"
    unit.write_text(yaml.safe_dump({"evaluation_interval": "15s", "tests": [
        {"interval": healthy["interval"], "input_series": healthy["input_series"], "promql_expr_test": tests}]},
        sort_keys=False), encoding="utf-8")
    assert_promtool("test", "rules", str(unit))


# --- names -----------------------------------------------------------------------------------------------

METRIC_NAME = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


def test_every_record_and_alert_is_named_as_prometheus_names_them() -> None:
    for record in sorted(record_names()):
        # level:metric:operations, the level being sparkserve (aggregated by deployment).
        assert re.match(METRIC_NAME, record) and re.match(r"^sparkserve:[a-z0-9_]+(:[a-z0-9_]+)?$", record), record
    for engine in ENGINE_NAMES:
        for rule in rules_of(render(CONTRACT[engine])):
            assert all(re.match(LABEL_NAME, label) for label in rule.get("labels") or {}), rule
    for rule in queries.alert_rules(load_yaml(ALERTS)):
        assert re.match(r"^Sparkserve[A-Z][A-Za-z0-9]*$", rule["alert"]), rule["alert"]
        assert all(re.match(LABEL_NAME, label) for label in rule["labels"]), rule["alert"]
    for name in queries.TEXTFILE_SERIES:
        assert re.match(r"^sparkserve_[a-z0-9_]+$", name), name


def test_every_alert_has_a_severity_a_wait_and_says_what_to_do() -> None:
    for rule in queries.alert_rules(load_yaml(ALERTS)):
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert ("for" in rule) == (name != "SparkserveRestarted"), name
        summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
        assert "$labels.deployment" in summary + description or "$labels.node" in summary + description, name
        assert "sparkserve " in description or "systemctl" in description, f"{name}: say what to do"


def gateway_series() -> Set[str]:
    """The series the gateway's mtail program exports (its declarations that are not hidden; a histogram as its
    _bucket, _sum and _count)."""
    declared = re.findall(r"^(counter|gauge|histogram)\s+([A-Za-z_][A-Za-z0-9_]*)",
                          GATEWAY_PROGRAM.read_text(encoding="utf-8"), re.MULTILINE)
    return {f"{name}{suffix}" for kind, name in declared
            for suffix in (("_bucket", "_sum", "_count") if kind == "histogram" else ("",))}


def test_the_gateway_series_are_sparkserves() -> None:
    names = gateway_series()
    assert {"sparkserve_gateway_requests_total", "sparkserve_gateway_request_duration_seconds_bucket",
            "sparkserve_gateway_time_to_first_byte_seconds_bucket"} <= names
    assert all(re.match(r"^sparkserve_gateway_[a-z0-9_]+$", name) for name in names), sorted(names)


def allowed(name: str, records: Set[str]) -> bool:
    return (name in records or name in queries.TEXTFILE_SERIES or name in gateway_series() or name == "up"
            or name.startswith("node_"))


def test_the_dashboard_and_alerts_read_only_recorded_textfile_and_node_series() -> None:
    records = record_names()
    dashboard = queries.load_dashboard(queries.DASHBOARD)
    used: Dict[str, Set[str]] = {}
    for query in queries.dashboard_queries(dashboard, DEPLOYMENT) + queries.alert_queries(load_yaml(ALERTS)):
        for name in queries.series_names(query.expr):
            used.setdefault(name, set()).add(query.source)
    for variable in dashboard["templating"]["list"]:
        query = queries.variable_query(variable)
        if query.startswith("label_values("):
            used.setdefault(query[len("label_values("):].split(",")[0].strip(), set()).add(variable["name"])
    assert "sparkserve:time_to_first_token_seconds:quantile_5m" in used and "up" in used  # the scan finds them
    wrong = {name: sorted(sources) for name, sources in used.items() if not allowed(name, records)}
    assert not wrong, f"series that are neither recorded, textfile, the gateway's, node_* nor up: {wrong}"
