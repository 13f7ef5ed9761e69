"""Tests for the play_hosts filters: the gateway's node, the inventory's nodes, and whether any rank must start."""

from __future__ import annotations

from ansible_collections.sparkserve.deploy.plugins.filter.play_hosts import (
    gateway_hosts,
    gateway_leaving_hosts,
    inventory_nodes,
    monitoring,
    relaunching,
    serving_nodes,
)

GROUPS = {"all": ["spark-1", "spark-2", "spark-3", "localhost"], "sparks": ["spark-1", "spark-2", "spark-3"]}


def test_the_gateway_node_every_spark_noted_is_named_once() -> None:
    hostvars = {host: {"recipe_gateway_node": "spark-2"} for host in GROUPS["sparks"]}
    assert gateway_hosts(GROUPS, hostvars) == ["spark-2"]


def test_no_gateway_or_no_context_play_is_no_host() -> None:
    assert gateway_hosts(GROUPS, {host: {"recipe_gateway_node": ""} for host in GROUPS["sparks"]}) == []
    assert gateway_hosts(GROUPS, {host: {} for host in GROUPS["sparks"]}) == []
    assert gateway_hosts({"all": ["localhost"]}, {}) == []


def test_a_node_the_inventory_does_not_hold_is_left_out() -> None:
    hostvars = {"spark-1": {"recipe_gateway_node": "spark-9"}, "spark-2": {"recipe_gateway_node": "spark-1"}}
    assert gateway_hosts(GROUPS, hostvars) == ["spark-1"]


def test_in_a_fleet_the_gateway_runs_on_the_node_s_host_of_the_nodes_group() -> None:
    # Two deployments share spark-1; a host of molecule's named as the node itself holds no Spark's variables.
    groups = {"all": ["a@spark-1", "b@spark-1", "b@spark-2", "spark-1", "localhost"],
              "sparks": ["a@spark-1", "b@spark-1", "b@spark-2"], "nodes": ["b@spark-1", "b@spark-2"]}
    hostvars = {host: {"recipe_gateway_node": "spark-1", "sparkserve_node": host.split("@")[1]}
                for host in groups["sparks"]}
    assert gateway_hosts(groups, hostvars) == ["b@spark-1"]
    assert gateway_hosts(groups, {**hostvars, "a@spark-1": {"recipe_gateway_node": "spark-2",
                                                            "sparkserve_node": "spark-1"}}) == ["b@spark-2",
                                                                                                "b@spark-1"]


def test_the_gateway_leaves_each_node_whose_preflight_found_its_units_that_is_not_its_node() -> None:
    units = {"present_paths": ["/etc/systemd/system/sparkserve-gateway.service"]}
    hostvars = {"spark-1": {"recipe_gateway_node": "spark-2", "preflight_node": units},
                "spark-2": {"recipe_gateway_node": "spark-2", "preflight_node": units},
                "spark-3": {"recipe_gateway_node": "spark-2", "preflight_node": {"present_paths": []}}}
    assert gateway_leaving_hosts(GROUPS, hostvars) == ["spark-1"]
    # Turned off: no Spark notes a gateway node, and every node that has it leaves it.
    off = {host: {**vars_, "recipe_gateway_node": ""} for host, vars_ in hostvars.items()}
    assert gateway_leaving_hosts(GROUPS, off) == ["spark-1", "spark-2"]
    # No preflight ran (a run under other tags): none.
    assert gateway_leaving_hosts(GROUPS, {host: {"recipe_gateway_node": ""} for host in GROUPS["sparks"]}) == []


def test_in_a_fleet_the_gateway_leaves_the_node_s_host_of_the_nodes_group() -> None:
    groups = {"all": ["a@spark-1", "b@spark-1", "b@spark-2", "localhost"],
              "sparks": ["a@spark-1", "b@spark-1", "b@spark-2"], "nodes": ["b@spark-1", "b@spark-2"]}
    units = {"present_paths": ["/etc/systemd/system/sparkserve-gateway-metrics.service"]}
    hostvars = {host: {"recipe_gateway_node": "spark-2", "sparkserve_node": host.split("@")[1],
                       "preflight_node": units} for host in groups["sparks"]}
    assert gateway_leaving_hosts(groups, hostvars) == ["b@spark-1"]


def test_inventory_nodes_names_each_node_once_with_the_nodes_only_absent_deployments_use() -> None:
    # alpha (absent) alone is on spark-1; beta serves on spark-2, beside gamma (absent); spark-3 has nothing.
    groups = {"all": ["alpha@spark-1", "beta@spark-2", "gamma@spark-2", "localhost"], "sparks": ["beta@spark-2"],
              "nodes": ["beta@spark-2"], "absent": ["alpha@spark-1", "gamma@spark-2"]}
    hostvars = {host: {"sparkserve_node": host.split("@")[1]} for host in groups["all"] if "@" in host}
    assert inventory_nodes(groups, hostvars) == ["spark-2", "spark-1"]
    # Every deployment absent: their nodes, each once.
    assert inventory_nodes({**groups, "sparks": [], "nodes": []}, hostvars) == ["spark-1", "spark-2"]


def test_serving_nodes_leave_out_a_node_where_every_deployment_is_absent() -> None:
    groups = {"all": ["alpha@spark-1", "beta@spark-2", "delta@spark-2", "gamma@spark-3", "localhost"],
              "sparks": ["beta@spark-2", "delta@spark-2"], "nodes": ["beta@spark-2"],
              "absent": ["alpha@spark-1", "gamma@spark-3"]}
    hostvars = {host: {"sparkserve_node": host.split("@")[1]} for host in groups["all"] if "@" in host}
    assert serving_nodes(groups, hostvars) == ["spark-2"]
    assert serving_nodes({**groups, "nodes": []}, hostvars) == ["spark-2"]
    assert serving_nodes({**groups, "sparks": [], "nodes": []}, hostvars) == []
    assert serving_nodes(GROUPS, {}) == ["spark-1", "spark-2", "spark-3"]


def test_the_nodes_of_a_plain_inventory_are_its_sparks() -> None:
    assert inventory_nodes(GROUPS, {}) == ["spark-1", "spark-2", "spark-3"]
    assert inventory_nodes({"all": ["localhost"]}, {}) == []


def test_relaunching_is_any_spark_whose_ranks_must_start() -> None:
    assert relaunching(GROUPS, {host: {"engine_relaunch": False} for host in GROUPS["sparks"]}) is False
    assert relaunching(GROUPS, {"spark-1": {"engine_relaunch": False}, "spark-2": {"engine_relaunch": "True"},
                                "spark-3": {"engine_relaunch": False}}) is True
    assert relaunching(GROUPS, {"spark-1": {"engine_relaunch": "false"}, "spark-2": {"engine_relaunch": "no"},
                                "spark-3": {"engine_relaunch": 0}}) is False


def test_a_spark_that_noted_nothing_counts_as_one_to_start() -> None:
    assert relaunching(GROUPS, {"spark-1": {"engine_relaunch": False}, "spark-2": {}}) is True
    assert relaunching({"all": ["localhost"]}, {}) is False


def test_monitoring_is_any_spark_whose_inventory_asks_for_it() -> None:
    assert monitoring(GROUPS, {host: {} for host in GROUPS["sparks"]}) is False
    assert monitoring(GROUPS, {"spark-1": {"sparkserve_monitoring": False}, "spark-2": {"sparkserve_monitoring": "yes"},
                               "spark-3": {}}) is True
    assert monitoring({"all": ["localhost"]}, {}) is False
