"""Tests for the gateway_hosts filter: the hosts a play of the gateway runs on."""

from __future__ import annotations

from ansible_collections.sparkserve.deploy.plugins.filter.gateway_hosts import gateway_hosts

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
