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


def dashboard() -> Dict[str, Any]:
    data: Dict[str, Any] = queries.load_dashboard(GRAFANA / "sparkserve-dashboard.json")
    return data


def panels() -> List[Dict[str, Any]]:
    return list(queries.panels(dashboard()))


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
    assert [panel["title"] for panel in panels()] == PANELS
    for panel in panels():
        assert panel["type"] == "timeseries" and panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"] and panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["legendFormat"], panel["title"]
            assert '{deployment="$deployment"' in target["expr"] or 'deployment="$deployment"' in target["expr"], \
                f"{panel['title']}: {target['expr']} does not select $deployment"


def test_the_panels_show_what_they_say() -> None:
    exprs = {panel["title"]: [target["expr"] for target in panel["targets"]] for panel in panels()}
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
