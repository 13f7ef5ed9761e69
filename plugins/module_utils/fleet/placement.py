"""Which nodes each deployment runs on, so that the needs placed on every node fit its memory budget.

A node's budget is its memory less the memory guard's floor and a reserve for the system
(``NodeBudget.budget_gib``). ``place`` puts the deployments that name their nodes first, in the order given,
then the others, in the order given, each on the ``count`` nodes that have room, preferring the node with the
fewest deployments, then the most free budget, then the earlier node: the same input always gives the same
placement. What does not fit raises ``DoNotFit``, whose message is one sentence and the fit table
(``fit_table``): a row per node, a column per deployment with its GiB there, the total and the budget, the
rows over budget marked. ``placement_table`` is the same table for a placement that fits.

Standard library only, no Ansible: this runs anywhere the controller runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.memory import Need

# Sums of GiB compared with a budget: equal fits, and float noise (0.1 + 0.2) does not make it over.
EPSILON = 1e-9

_SENTENCE = ("the deployments do not fit the nodes' memory (budget = memory - guard floor - system reserve); "
             "free memory by moving a deployment, lowering its KV cache or memory fraction, or state "
             "memory.budget_gib in its recipe:")


@dataclass(frozen=True)
class NodeBudget:
    """A node's memory, the memory guard's floor on it and the system's reserve, in GiB."""

    name: str
    memory_gib: float
    floor_gib: float
    reserve_gib: float

    @property
    def budget_gib(self) -> float:
        """What the deployments placed on the node may take together."""
        return self.memory_gib - self.floor_gib - self.reserve_gib


@dataclass(frozen=True)
class Request:
    """A deployment to place: its need per node and on how many nodes it runs.

    ``nodes`` given: placed there, in that order (its first node is its head), ``count`` being their number.
    ``nodes`` None: placed automatically on ``count`` nodes. ``priority`` is carried for the caller (the memory
    guard acts on the lowest first); it does not change the placement.
    """

    name: str
    need: Need
    count: int
    nodes: tuple[str, ...] | None = None
    priority: int = 0


class DoNotFit(ValueError):  # noqa: N818 (the name is the sentence the caller reports)
    """The deployments cannot be placed; the message is one sentence and the fit table.

    ``placement`` holds what was placed before the refusal, ``unplaced`` the automatic deployments that found no
    room.
    """

    def __init__(self, message: str, placement: Mapping[str, list[str]] | None = None,
                 unplaced: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.placement = dict(placement or {})
        self.unplaced = list(unplaced)


def _gib(value: float) -> str:
    """A table cell: one decimal (90.8), two where one would hide the difference (109.01)."""
    return f"{value:.1f}" if abs(round(value, 1) - value) < 5e-7 else f"{value:.2f}"


def _need_gib(need: Need | float) -> float:
    return need.gib if isinstance(need, Need) else float(need)


def _loads(placement: Mapping[str, Sequence[str]], needs: Mapping[str, Need | float]) -> dict[str, float]:
    loads: dict[str, float] = {}
    for name, where in placement.items():
        for node in where:
            loads[node] = loads.get(node, 0.0) + _need_gib(needs[name])
    return loads


def fit_table(placement: Mapping[str, Sequence[str]], needs: Mapping[str, Need | float],
              nodes: Sequence[NodeBudget], unplaced: Iterable[tuple[str, float, int]] = ()) -> str:
    """The fit table: a row per node with each deployment's GiB there, the total and the budget.

    The columns are the deployments of PLACEMENT in its order, blank where a deployment is not on the node; a
    row whose total is over the budget ends with ``over``. Each of UNPLACED, (name, GiB per node, node count),
    adds a last line saying it found no node with room.
    """
    columns = list(placement)
    loads = _loads(placement, needs)
    header = ["node"] + columns + ["total", "budget"]
    rows: list[tuple[list[str], bool]] = []
    for node in nodes:
        cells = [node.name]
        cells += [_gib(_need_gib(needs[name])) if node.name in placement[name] else "" for name in columns]
        total = loads.get(node.name, 0.0)
        cells += [_gib(total), _gib(node.budget_gib)]
        rows.append((cells, total > node.budget_gib + EPSILON))
    widths = [max(len(row[i]) for row in [header] + [cells for cells, _ in rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    lines = [line(header)] + [line(cells) + ("  over" if over else "") for cells, over in rows]
    for name, gib, count in unplaced:
        if count == 1:
            lines.append(f"{name}: {_gib(gib)} GiB on 1 node, found no node with room")
        else:
            lines.append(f"{name}: {_gib(gib)} GiB on each of {count} nodes, found no {count} nodes with room")
    return "\n".join(lines)


def placement_table(placement: Mapping[str, Sequence[str]], needs: Mapping[str, Need | float],
                    nodes: Sequence[NodeBudget]) -> str:
    """The fit table of a placement (``place``'s result), to show where each deployment runs."""
    return fit_table(placement, needs, nodes)


def _refuse(sentence: str, placement: Mapping[str, list[str]], requests: Sequence[Request],
            nodes: Sequence[NodeBudget], unplaced: Sequence[Request] = ()) -> DoNotFit:
    needs = {request.name: request.need for request in requests}
    table = fit_table(placement, needs, nodes, [(r.name, r.need.gib, r.count) for r in unplaced])
    return DoNotFit(f"{sentence}\n{table}", placement, [r.name for r in unplaced])


def _check(requests: Sequence[Request], nodes: Sequence[NodeBudget]) -> None:
    """Refuse what no placement can satisfy: a name twice, an unknown or repeated node, a count out of range."""
    names = [node.name for node in nodes]
    known = ", ".join(names) or "none"
    seen: set[str] = set()
    for request in requests:
        problem = ""
        if request.name in seen:
            problem = f"deployment {request.name} is listed twice; give each deployment its own name"
        elif request.nodes is not None:
            unknown = [node for node in request.nodes if node not in names]
            twice = sorted({node for node in request.nodes if request.nodes.count(node) > 1})
            if not request.nodes:
                problem = f"deployment {request.name} names no node; list its nodes, or leave nodes out"
            elif unknown:
                problem = (f"deployment {request.name} names {', '.join(unknown)}, not among the nodes "
                           f"({known}); name nodes of the cluster")
            elif twice:
                problem = (f"deployment {request.name} names {', '.join(twice)} twice; a deployment runs one rank "
                           "per node")
            elif request.count != len(request.nodes):
                problem = (f"deployment {request.name} runs on {request.count} nodes but names "
                           f"{len(request.nodes)}; give the count of the nodes it names")
        elif request.count < 1 or request.count > len(nodes):
            problem = (f"deployment {request.name} asks for {request.count} nodes and the cluster has "
                       f"{len(nodes)}; ask for 1 to {len(nodes)}, or add nodes")
        if problem:
            raise _refuse(problem + ":", {}, requests, nodes)
        seen.add(request.name)


def place(requests: Sequence[Request], nodes: Sequence[NodeBudget]) -> dict[str, list[str]]:
    """Each deployment's nodes: deployment name -> node names (see the module's docstring).

    A deployment that names its nodes keeps their order (its first node is its head); one placed
    automatically gets its nodes in the order of NODES. The result lists the deployments in the order of
    REQUESTS. Raises ``DoNotFit`` (one sentence and the fit table) when a node is over its budget, when an
    automatic deployment finds too few nodes with room, or when a request is impossible (a node unknown or
    named twice, a count larger than the nodes).
    """
    _check(requests, nodes)
    position = {node.name: index for index, node in enumerate(nodes)}
    budget = {node.name: node.budget_gib for node in nodes}
    load = {node.name: 0.0 for node in nodes}
    count = {node.name: 0 for node in nodes}
    chosen: dict[str, list[str]] = {}
    unplaced: list[Request] = []

    def put(request: Request, where: Sequence[str]) -> None:
        chosen[request.name] = list(where)
        for node in where:
            load[node] += request.need.gib
            count[node] += 1

    for request in requests:
        if request.nodes is not None:
            put(request, request.nodes)
    for request in requests:
        if request.nodes is not None:
            continue
        room = [name for name in position if load[name] + request.need.gib <= budget[name] + EPSILON]
        room.sort(key=lambda name: (count[name], -(budget[name] - load[name]), position[name]))
        if len(room) < request.count:
            unplaced.append(request)
            continue
        put(request, sorted(room[:request.count], key=position.__getitem__))
    placement = {request.name: chosen[request.name] for request in requests if request.name in chosen}
    over = [name for name in position if load[name] > budget[name] + EPSILON]
    if over or unplaced:
        raise _refuse(_SENTENCE, placement, requests, nodes, unplaced)
    return placement
