"""fleet.placement: deployments on nodes by memory, deterministic, exact at the budget, refused with a table."""

from __future__ import annotations

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.memory import Need
from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.placement import (
    DoNotFit,
    NodeBudget,
    Request,
    fit_table,
    place,
    placement_table,
)

SENTENCE = ("the deployments do not fit the nodes' memory (budget = memory - guard floor - system reserve); "
            "free memory by moving a deployment, lowering its KV cache or memory fraction, or state "
            "memory.budget_gib in its recipe:")


def spark(name: str, memory: float = 119.0, floor: float = 8.0, reserve: float = 2.0) -> NodeBudget:
    return NodeBudget(name=name, memory_gib=memory, floor_gib=floor, reserve_gib=reserve)


def auto(name: str, gib: float, count: int = 1) -> Request:
    return Request(name=name, need=Need(gib, "test"), count=count, nodes=None, priority=0)


def pinned(name: str, gib: float, *nodes: str) -> Request:
    return Request(name=name, need=Need(gib, "test"), count=len(nodes), nodes=tuple(nodes), priority=0)


def test_budget_is_memory_less_floor_and_reserve() -> None:
    assert spark("a").budget_gib == pytest.approx(109.0)
    assert NodeBudget("b", 121.0, 8.0, 2.5).budget_gib == pytest.approx(110.5)


def test_automatic_placement_spreads_then_prefers_free_budget_then_order() -> None:
    nodes = [spark("n1"), spark("n2"), spark("n3")]
    # Fewest deployments first: one on each node, in node order when all else ties.
    assert place([auto("a", 10), auto("b", 10), auto("c", 10)], nodes) == {"a": ["n1"], "b": ["n2"], "c": ["n3"]}
    # Every node has one deployment: the most free budget wins (n2's neighbour took only 5).
    got = place([auto("a", 10), auto("b", 5), auto("c", 20), auto("d", 1)], nodes)
    assert got == {"a": ["n1"], "b": ["n2"], "c": ["n3"], "d": ["n2"]}
    # A bigger node is preferred while it has the most room.
    nodes = [spark("small", memory=60.0), spark("big", memory=119.0)]
    assert place([auto("a", 10)], nodes) == {"a": ["big"]}


def test_same_input_same_output() -> None:
    nodes = [spark(f"spark-{c}") for c in "abcd"]
    requests = [auto("big", 45.5, count=2), pinned("coder", 40.0, "spark-c"), auto("small", 12.0),
                auto("embed", 6.0, count=3)]
    first = place(requests, nodes)
    for _ in range(5):
        assert place(list(requests), list(nodes)) == first
    assert list(first) == ["big", "coder", "small", "embed"]  # the order of the requests
    # coder (explicit) first on spark-c; big on the two empty nodes with the most room, the first two (a, b);
    # small on the one node still empty (d); embed on three nodes with one deployment each, by most free
    # budget: d (97), c (69), then a before b (63.5 each, a comes first); listed in the nodes' order.
    assert first == {"big": ["spark-a", "spark-b"], "coder": ["spark-c"], "small": ["spark-d"],
                     "embed": ["spark-a", "spark-c", "spark-d"]}


def test_explicit_first_then_automatic_in_order() -> None:
    nodes = [spark("a"), spark("b")]
    # The automatic one comes first in the list, yet the explicit one is placed first: b is full for it.
    got = place([auto("auto", 60), pinned("fixed", 100, "a")], nodes)
    assert got == {"auto": ["b"], "fixed": ["a"]}


def test_explicit_nodes_keep_their_order_the_head_first() -> None:
    nodes = [spark("a"), spark("b"), spark("c")]
    assert place([pinned("d", 10, "c", "a")], nodes) == {"d": ["c", "a"]}
    # An automatic deployment's nodes are in the nodes' order.
    assert place([pinned("x", 50, "a"), auto("y", 10, count=3)], nodes) == {"x": ["a"], "y": ["a", "b", "c"]}


def test_refusal_shows_the_table() -> None:
    nodes = [spark("spark-a"), spark("spark-b")]
    with pytest.raises(DoNotFit) as raised:
        place([pinned("big", 90.8, "spark-a", "spark-b"), pinned("coder", 40.0, "spark-a")], nodes)
    assert isinstance(raised.value, ValueError)
    assert str(raised.value).splitlines() == [
        SENTENCE,
        "node     big   coder  total  budget",
        "spark-a  90.8  40.0   130.8  109.0  over",
        "spark-b  90.8         90.8   109.0",
    ]
    assert raised.value.placement == {"big": ["spark-a", "spark-b"], "coder": ["spark-a"]}
    assert raised.value.unplaced == []


def test_an_automatic_deployment_without_room_is_a_last_line() -> None:
    nodes = [spark("spark-a"), spark("spark-b")]
    with pytest.raises(DoNotFit) as raised:
        place([auto("big", 90.75, count=2), auto("coder", 40.0), auto("pair", 5.0, count=2)], nodes)
    lines = str(raised.value).splitlines()
    assert lines == [
        SENTENCE,
        "node     big    pair  total  budget",
        "spark-a  90.75  5.0   95.75  109.0",
        "spark-b  90.75  5.0   95.75  109.0",
        "coder: 40.0 GiB on 1 node, found no node with room",
    ]
    assert raised.value.unplaced == ["coder"]
    with pytest.raises(DoNotFit) as raised:
        place([pinned("big", 100.0, "spark-a"), auto("pair", 10.0, count=2)], nodes)
    assert str(raised.value).splitlines()[-1] == "pair: 10.0 GiB on each of 2 nodes, found no 2 nodes with room"


def test_exact_at_the_boundary() -> None:
    nodes = [spark("a")]  # budget 109.0
    assert place([auto("x", 109.0)], nodes) == {"x": ["a"]}
    assert place([pinned("x", 109.0, "a")], nodes) == {"x": ["a"]}
    with pytest.raises(DoNotFit) as raised:
        place([auto("x", 109.01)], nodes)
    assert "x: 109.01 GiB on 1 node, found no node with room" in str(raised.value)
    with pytest.raises(DoNotFit) as raised:
        place([pinned("x", 109.01, "a")], nodes)
    assert str(raised.value).splitlines()[-1] == "a     109.01  109.01  109.0  over"
    # Float noise: 0.1 + 0.2 is 0.30000000000000004, and still fits a budget of 0.3.
    tiny = [NodeBudget("t", 10.3, 8.0, 2.0)]
    assert place([pinned("p", 0.1, "t"), auto("q", 0.2)], tiny) == {"p": ["t"], "q": ["t"]}


@pytest.mark.parametrize(("request_", "message"), [
    (pinned("x", 1.0, "spark-z"), "deployment x names spark-z, not among the nodes (a, b); name nodes of the cluster:"),
    (pinned("x", 1.0, "a", "a"), "deployment x names a twice; a deployment runs one rank per node:"),
    (Request("x", Need(1.0, "t"), 3, ("a", "b"), 0), "deployment x runs on 3 nodes but names 2; give the count of "
                                                      "the nodes it names:"),
    (auto("x", 1.0, count=3), "deployment x asks for 3 nodes and the cluster has 2; ask for 1 to 2, or add nodes:"),
    (auto("x", 1.0, count=0), "deployment x asks for 0 nodes and the cluster has 2; ask for 1 to 2, or add nodes:"),
])
def test_impossible_requests(request_: Request, message: str) -> None:
    with pytest.raises(DoNotFit) as raised:
        place([request_], [spark("a"), spark("b")])
    lines = str(raised.value).splitlines()
    assert lines[0] == message
    assert lines[1:] == ["node  total  budget", "a     0.0    109.0", "b     0.0    109.0"]


def test_a_name_twice_is_refused() -> None:
    with pytest.raises(DoNotFit, match="deployment x is listed twice"):
        place([auto("x", 1.0), auto("x", 2.0)], [spark("a")])


def test_priority_does_not_change_the_placement() -> None:
    nodes = [spark("a"), spark("b")]
    low = Request("low", Need(10.0, "t"), 1, None, priority=-5)
    high = Request("high", Need(10.0, "t"), 1, None, priority=100)
    assert place([low, high], nodes) == {"low": ["a"], "high": ["b"]}


def test_placement_table_of_a_fitting_placement() -> None:
    nodes = [spark("spark-a"), spark("spark-b", memory=121.0)]
    requests = [auto("big", 90.75), auto("coder", 40.0)]
    placed = place(requests, nodes)
    needs = {r.name: r.need for r in requests}
    assert placed == {"big": ["spark-b"], "coder": ["spark-a"]}
    assert placement_table(placed, needs, nodes).splitlines() == [
        "node     big    coder  total  budget",
        "spark-a         40.0   40.0   109.0",
        "spark-b  90.75         90.75  111.0",
    ]
    assert fit_table(placed, {"big": 90.75, "coder": 40.0}, nodes) == placement_table(placed, needs, nodes)
