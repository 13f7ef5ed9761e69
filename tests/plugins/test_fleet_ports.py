"""fleet.ports: stated ports kept, the others assigned from 8000 and 29501 up, collisions refused."""

from __future__ import annotations

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES
from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.ports import (
    PortCollision,
    PortRequest,
    assign_ports,
)


def request(name: str, *nodes: str, api: int | None = None, master: int | None = None, span: int = 1,
            extra: tuple[int, ...] = ()) -> PortRequest:
    return PortRequest(name=name, nodes=tuple(nodes), api_port=api, master_port=master, master_span=span,
                       extra_ports=extra)


def test_assigned_from_the_lowest_free_port() -> None:
    got = assign_ports([request("a", "n1", "n2"), request("b", "n2", "n3"), request("c", "n4")])
    assert got == {"a": {"api_port": 8000, "master_port": 29501},
                   "b": {"api_port": 8001, "master_port": 29502},  # shares n2 with a
                   "c": {"api_port": 8000, "master_port": 29501}}  # shares no node


def test_stated_ports_are_taken_before_any_is_assigned() -> None:
    # b states 8000 and 29501; a comes first in the list but gets the next free ones on the node they share.
    got = assign_ports([request("a", "n1"), request("b", "n1", api=8000, master=29501)])
    assert got == {"a": {"api_port": 8001, "master_port": 29502}, "b": {"api_port": 8000, "master_port": 29501}}
    # A stated port of another kind is taken too: c's API on 29501 pushes d's master port.
    got = assign_ports([request("c", "n1", api=29501), request("d", "n1")])
    assert got == {"c": {"api_port": 29501, "master_port": 29502}, "d": {"api_port": 8000, "master_port": 29503}}


def test_one_stated_one_assigned_port() -> None:
    got = assign_ports([request("a", "n1", api=30000), request("b", "n1", master=29501)])
    assert got == {"a": {"api_port": 30000, "master_port": 29502}, "b": {"api_port": 8000, "master_port": 29501}}


def test_same_stated_port_on_a_shared_node_is_a_collision() -> None:
    with pytest.raises(PortCollision) as raised:
        assign_ports([request("big", "spark-a", "spark-b", api=8000), request("coder", "spark-b", api=8000)])
    assert isinstance(raised.value, ValueError)
    assert str(raised.value) == (
        "deployments big and coder both use port 8000 on spark-b (big's api_port, coder's api_port): set api_port "
        "on one deployment in the cluster file, or leave it out of one recipe to have it assigned.")
    # On nodes they do not share, the same port is fine.
    assert assign_ports([request("big", "spark-a", api=8000), request("coder", "spark-b", api=8000)]) == {
        "big": {"api_port": 8000, "master_port": 29501}, "coder": {"api_port": 8000, "master_port": 29501}}


def test_api_port_of_one_and_master_port_of_another() -> None:
    with pytest.raises(PortCollision) as raised:
        assign_ports([request("a", "n1", api=29501), request("b", "n1", master=29501)])
    text = str(raised.value)
    assert "deployments a and b both use port 29501 on n1 (a's api_port, b's master_port)" in text
    assert "set api_port or master_port on one deployment in the cluster file" in text


def test_a_deployments_api_and_master_port_must_differ() -> None:
    with pytest.raises(PortCollision) as raised:
        assign_ports([request("solo", "n1", api=29501, master=29501)])
    assert str(raised.value) == (
        "deployment solo uses port 29501 twice (api_port and master_port); a deployment's ports must differ, "
        "its API and rendezvous ports too: set api_port or master_port on it in the cluster file, or leave it out "
        "of its recipe to have it assigned.")


def test_an_assigned_port_avoids_the_deployments_own() -> None:
    # The API stated at 29501: the master port assigned is the next one, not the same.
    assert assign_ports([request("a", "n1", api=29501)]) == {"a": {"api_port": 29501, "master_port": 29502}}
    assert assign_ports([request("a", api=8000)]) == {"a": {"api_port": 8000, "master_port": 29501}}


def test_sglang_master_port_range() -> None:
    span = ENGINES["sglang"].master_port_span
    assert span == 7 and ENGINES["vllm"].master_port_span == 1
    # SGLang's head listens on its master port and the six above it: the next deployment starts after them.
    got = assign_ports([request("s", "n1", span=span), request("v", "n1")])
    assert got == {"s": {"api_port": 8000, "master_port": 29501}, "v": {"api_port": 8001, "master_port": 29508}}
    with pytest.raises(PortCollision) as raised:
        assign_ports([request("s", "n1", master=29501, span=span), request("v", "n1", master=29505)])
    assert "deployments s and v both use port 29505 on n1 (s's master_port (its engine takes 29501 to 29507), " \
           "v's master_port)" in str(raised.value)


def test_extra_ports_are_stated_ports() -> None:
    got = assign_ports([request("a", "n1", extra=(8000, 8001)), request("b", "n1")])
    assert got == {"a": {"api_port": 8002, "master_port": 29501}, "b": {"api_port": 8003, "master_port": 29502}}
    with pytest.raises(PortCollision, match="change launch.extra_ports in one of the recipes"):
        assign_ports([request("a", "n1", extra=(9000,)), request("b", "n1", extra=(9000,))])
