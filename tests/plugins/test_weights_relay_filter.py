"""The weights_relay filter: the role's relay plan comes from plan_relay."""

from __future__ import annotations

import pytest

from ansible_collections.sparkserve.deploy.plugins.filter import weights_relay as wr


def test_chain_from_the_seeder_in_inventory_order() -> None:
    plan = wr.FilterModule().filters()["weights_relay"](["spark-1", "spark-2", "spark-3", "spark-4"], "spark-1")
    assert plan == {"spark-1": None, "spark-2": "spark-1", "spark-3": "spark-2", "spark-4": "spark-3"}


def test_tree_and_a_seeder_that_is_not_first() -> None:
    plan = wr.weights_relay(["spark-1", "spark-2", "spark-3", "spark-4"], "spark-3", "2")
    assert plan == {"spark-3": None, "spark-1": "spark-3", "spark-2": "spark-3", "spark-4": "spark-1"}


def test_an_unknown_seeder_is_refused() -> None:
    with pytest.raises(ValueError, match="seeder spark-9 is not among the nodes"):
        wr.weights_relay(["spark-1", "spark-2"], "spark-9")
