"""The deployment_batches filter: a play's batches, one per deployment, or one for every host."""

from __future__ import annotations

from ansible_collections.sparkserve.deploy.plugins.filter.deployment_batches import FilterModule

deployment_batches = FilterModule().filters()["deployment_batches"]
GROUPS = {
    "all": ["lab-tp2@spark-1", "lab-tp2@spark-2", "lab-tp1@spark-1", "lab-tp1-b@spark-2"],
    "sparks": ["lab-tp2@spark-1", "lab-tp2@spark-2", "lab-tp1@spark-1", "lab-tp1-b@spark-2"],
    "deployment_lab_tp2": ["lab-tp2@spark-1", "lab-tp2@spark-2"],
    "deployment_lab_tp1": ["lab-tp1@spark-1"],
    "deployment_lab_tp1_b": ["lab-tp1-b@spark-2"],
    "head": ["lab-tp2@spark-1", "lab-tp1@spark-1", "lab-tp1-b@spark-2"],
}


def test_each_deployment_is_one_batch() -> None:
    assert deployment_batches(GROUPS, GROUPS["sparks"]) == [2, 1, 1]


def test_a_limit_keeps_the_batches_of_the_hosts_left() -> None:
    assert deployment_batches(GROUPS, ["lab-tp2@spark-2", "lab-tp1-b@spark-2"]) == [1, 1]
    assert deployment_batches(GROUPS, ["lab-tp2@spark-1", "lab-tp2@spark-2"]) == [2]


def test_not_apart_every_host_is_one_batch() -> None:
    assert deployment_batches(GROUPS, GROUPS["sparks"], apart=False) == [4]
    assert deployment_batches(GROUPS, ["lab-tp1@spark-1"], apart=False) == [1]


def test_a_plain_inventory_of_one_deployment_is_one_batch() -> None:
    groups = {"all": ["spark-1", "spark-2"], "sparks": ["spark-1", "spark-2"], "head": ["spark-1"]}
    assert deployment_batches(groups, groups["sparks"]) == [2]


def test_no_host_is_one_empty_batch_rather_than_none() -> None:
    assert deployment_batches(GROUPS, []) == [1]
    assert deployment_batches(GROUPS, [], apart=False) == [1]
