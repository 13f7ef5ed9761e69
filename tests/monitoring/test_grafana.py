"""The Grafana dashboard (grafana/sparkserve-dashboard.json) and its provisioning files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import yaml

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
queries = load_script("tools/monitoring-queries.py", "monitoring_queries")
DATASOURCE = {"type": "prometheus", "uid": "sparkserve-prometheus"}
PANELS = [
    "Tokens per second", "Time to first token", "Inter-token latency", "End-to-end request latency",
    "Requests running and waiting", "KV cache use", "Speculative acceptance length", "Acceptance per draft position",
    "Memory available and page cache per node", "Memory guard: available vs floor", "Fabric traffic per node",
    "Restarts and guard actions", "Flusher: page cache freed", "NCCL bus bandwidth", "Weights verified",
]
# The row of the gateway, which serves every deployment: its panels read the gateway's series (mtail on its access
# log, roles/gateway/files/gateway.mtail), not one deployment's.
GATEWAY_ROW = "Gateway"
GATEWAY_PANELS = [
    "Gateway requests per second by model", "Gateway requests per second by key",
    "Gateway 5xx responses per second by model", "Gateway request latency by model",
    "Gateway time to first byte by model",
]


def dashboard() -> Dict[str, Any]:
    data: Dict[str, Any] = queries.load_dashboard(GRAFANA / "sparkserve-dashboard.json")
    return data


def panels() -> List[Dict[str, Any]]:
    return list(queries.panels(dashboard()))


def graphs() -> List[Dict[str, Any]]:
    """The panels that draw queries (not the rows)."""
    return [panel for panel in panels() if panel["type"] != "row"]


def test_the_dashboard_is_grafana_10s() -> None:
    board = dashboard()
    assert board["schemaVersion"] == 38 and board["uid"] == "sparkserve" and board["title"] == "sparkserve"
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in panels():
        place = panel["gridPos"]
        assert place["x"] + place["w"] <= 24, panel["title"]
        for x in range(place["x"], place["x"] + place["w"]):
            for y in range(place["y"], place["y"] + place["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))


def test_the_panels() -> None:
    assert [panel["title"] for panel in graphs()] == PANELS + GATEWAY_PANELS
    for panel in graphs():
        assert panel["type"] == "timeseries" and panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"] and panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["legendFormat"], panel["title"]
            if panel["title"] in GATEWAY_PANELS:
                assert "sparkserve_gateway_" in target["expr"] and "$deployment" not in target["expr"], panel["title"]
                continue
            assert '{deployment="$deployment"' in target["expr"] or 'deployment="$deployment"' in target["expr"], \
                f"{panel['title']}: {target['expr']} does not select $deployment"


def test_the_gateway_row_holds_the_gateway_panels_below_the_others() -> None:
    board = dashboard()
    [row] = [panel for panel in board["panels"] if panel["type"] == "row"]
    assert row["title"] == GATEWAY_ROW and not row["collapsed"] and row["panels"] == []
    assert row["gridPos"]["w"] == 24
    below = [panel["title"] for panel in board["panels"] if panel["gridPos"]["y"] > row["gridPos"]["y"]]
    assert below == GATEWAY_PANELS


def test_the_panels_show_what_they_say() -> None:
    exprs = {panel["title"]: [target["expr"] for target in panel["targets"]] for panel in graphs()}
    for title, record, quantiles in (("Time to first token", "time_to_first_token", ("0.5", "0.9", "0.99")),
                                     ("Inter-token latency", "inter_token_latency", ("0.5", "0.9", "0.99")),
                                     ("End-to-end request latency", "e2e_request_latency", ("0.5", "0.99"))):
        assert exprs[title] == [f'sparkserve:{record}_seconds:quantile_5m{{deployment="$deployment", quantile="{q}"}}'
                                for q in quantiles]
    assert any("node_memory_Cached_bytes" in e for e in exprs["Memory available and page cache per node"])
    assert all('device=~"$fabric_device"' in e and "[$__rate_interval]" in e for e in exprs["Fabric traffic per node"])
    restarts = " ".join(exprs["Restarts and guard actions"])
    assert all(name in restarts for name in ("sparkserve_supervisor_restarts_total",
                                              "changes(sparkserve_deployment_start_time_seconds",
                                              "sparkserve_memguard_actions_total"))
    requests = "sum by ({}) (rate(sparkserve_gateway_requests_total[$__rate_interval]))"
    assert exprs["Gateway requests per second by model"] == [requests.format("model")]
    assert exprs["Gateway requests per second by key"] == [requests.format("key")]
    # A model without a 5xx reads 0, not "no data".
    assert exprs["Gateway 5xx responses per second by model"] == [
        'sum by (model) (rate(sparkserve_gateway_requests_total{code=~"5.."}[$__rate_interval]))'
        f' or 0 * {requests.format("model")}']
    quantile = ("histogram_quantile({}, sum by (model, le) "
                "(rate(sparkserve_gateway_{}_seconds_bucket[$__rate_interval])))")
    assert exprs["Gateway request latency by model"] == [quantile.format(q, "request_duration")
                                                         for q in ("0.5", "0.95")]
    assert exprs["Gateway time to first byte by model"] == [quantile.format("0.5", "time_to_first_byte")]


def test_the_variables() -> None:
    variables = {variable["name"]: variable for variable in dashboard()["templating"]["list"]}
    assert sorted(variables) == ["deployment", "fabric_device"]
    deployment = variables["deployment"]
    assert deployment["type"] == "query" and deployment["datasource"] == DATASOURCE
    assert queries.variable_query(deployment) == "label_values(sparkserve_deployment_info, deployment)"
    assert deployment["definition"] == queries.variable_query(deployment)
    fabric = variables["fabric_device"]
    assert fabric["type"] == "textbox" and fabric["query"] == fabric["current"]["value"]
    assert set(fabric["query"].split("|")) == {"enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1"}


def test_the_datasource_is_the_tunnels_prometheus() -> None:
    provisioning = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "sparkserve.yml").read_text("utf-8"))
    assert provisioning["apiVersion"] == 1
    [source] = provisioning["datasources"]
    assert (source["uid"], source["type"], source["url"]) == ("sparkserve-prometheus", "prometheus",
                                                              "http://127.0.0.1:9090")


def test_the_dashboard_provider_reads_a_folder() -> None:
    path = GRAFANA / "provisioning" / "dashboards" / "sparkserve.yml"
    provisioning = yaml.safe_load(path.read_text("utf-8"))
    [provider] = provisioning["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert "sparkserve-dashboard.json" in path.read_text("utf-8")  # its comment says where the JSON goes
