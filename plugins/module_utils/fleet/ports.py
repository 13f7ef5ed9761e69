"""The API and rendezvous ports of several deployments that share nodes.

A port a deployment states (in its recipe, or the cluster file's deployment entry) is its own; one left out
is assigned: the lowest port from 8000 up for the API, from 29501 up for the rendezvous (master) port, free
on every node the deployment runs on. Free means that no other deployment on any of those nodes uses it:
the stated ports are taken first, then the assigned ones, deployment by deployment in the order given. A
port is counted on every node of its deployment, head or worker: a conservative reading, since a rank is free
to become the head on a relaunch elsewhere. Two deployments that share a node and state the same port, or
one deployment whose API and rendezvous ports meet, raise ``PortCollision``.

Standard library only, no Ansible: this runs anywhere the controller runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

API_PORT_FROM = 8000
MASTER_PORT_FROM = 29501
PORT_MAX = 65535


@dataclass(frozen=True)
class PortRequest:
    """A deployment's nodes and the ports it states (None: left out, to be assigned).

    ``master_span`` is how many ports the engine takes from the master port up (``Engine.master_port_span``:
    SGLang's head listens on PORT to PORT+6); ``extra_ports`` are the recipe's ``launch.extra_ports``, which
    are stated ports too.
    """

    name: str
    nodes: tuple[str, ...]
    api_port: int | None
    master_port: int | None
    master_span: int = 1
    extra_ports: tuple[int, ...] = ()


class PortCollision(ValueError):  # noqa: N818 (the name is the sentence the caller reports)
    """Two deployments on one node state the same port, or one deployment's ports meet."""


# What holds a port: (deployment, the field that gives it, as a phrase).
_Holder = tuple[str, str]


def _span(request: PortRequest) -> int:
    return max(1, request.master_span)


def _master_phrase(request: PortRequest, port: int) -> str:
    if _span(request) == 1:
        return "master_port"
    return f"master_port (its engine takes {port} to {port + _span(request) - 1})"


def _fix(kinds: set[str]) -> str:
    fields = sorted({kind.split(" ")[0] for kind in kinds if kind.split(" ")[0] in ("api_port", "master_port")})
    if not fields:
        return "change launch.extra_ports in one of the recipes"
    named = " or ".join(fields)
    return (f"set {named} on one deployment in the cluster file, or leave it out of one recipe to have it "
            "assigned")


def _stated(request: PortRequest) -> list[tuple[int, str]]:
    """The ports the request states, each with the phrase of its field."""
    ports: list[tuple[int, str]] = []
    if request.api_port is not None:
        ports.append((request.api_port, "api_port"))
    if request.master_port is not None:
        ports += [(request.master_port + offset, _master_phrase(request, request.master_port))
                  for offset in range(_span(request))]
    ports += [(port, "launch.extra_ports") for port in request.extra_ports]
    return ports


def _own_collision(request: PortRequest, ports: list[tuple[int, str]]) -> None:
    held: dict[int, str] = {}
    for port, kind in ports:
        if port in held and held[port] != kind:
            fields = sorted({k.split(" ")[0] for k in (held[port], kind)} & {"api_port", "master_port"})
            fix = (f"set {' or '.join(fields)} on it in the cluster file, or leave it out of its recipe to have "
                   "it assigned") if fields else "change launch.extra_ports in its recipe"
            raise PortCollision(
                f"deployment {request.name} uses port {port} twice ({held[port]} and {kind}); a deployment's "
                f"ports must differ, its API and rendezvous ports too: {fix}.")
        held[port] = kind


def assign_ports(deployments: Sequence[PortRequest]) -> dict[str, dict[str, int]]:
    """Each deployment's ``api_port`` and ``master_port``: its own where it states them, else assigned.

    Raises ``PortCollision`` naming both deployments, the node, the port and the fix when two deployments on
    one node state the same port, or when a deployment's API and rendezvous ports meet; and when no port is
    left below 65536.
    """
    used: dict[str, dict[int, _Holder]] = {}

    def take(request: PortRequest, port: int, kind: str) -> None:
        for node in request.nodes:
            holder = used.setdefault(node, {}).get(port)
            if holder is not None and holder[0] != request.name:
                other, other_kind = holder
                raise PortCollision(
                    f"deployments {other} and {request.name} both use port {port} on {node} ({other}'s "
                    f"{other_kind}, {request.name}'s {kind}): {_fix({other_kind, kind})}.")
            used[node][port] = (request.name, kind)

    def free(request: PortRequest, port: int) -> bool:
        return all(port not in used.get(node, {}) for node in request.nodes)

    # The stated ports first, every deployment's, then the assigned ones.
    for request in deployments:
        stated = _stated(request)
        _own_collision(request, stated)
        for port, kind in stated:
            take(request, port, kind)
    # A deployment without nodes still gets ports distinct from its own others.
    own: dict[str, set[int]] = {request.name: {port for port, _ in _stated(request)} for request in deployments}
    result: dict[str, dict[str, int]] = {}
    for request in deployments:
        api, master = request.api_port, request.master_port
        if api is None:
            api = API_PORT_FROM
            while api in own[request.name] or not free(request, api):
                api += 1
            if api > PORT_MAX:
                raise PortCollision(f"deployment {request.name} finds no free API port from {API_PORT_FROM} up; "
                                    "set api_port on it in the cluster file.")
            take(request, api, "api_port")
            own[request.name].add(api)
        if master is None:
            master = MASTER_PORT_FROM
            while any(port in own[request.name] or not free(request, port)
                      for port in range(master, master + _span(request))):
                master += 1
            if master + _span(request) - 1 > PORT_MAX:
                raise PortCollision(f"deployment {request.name} finds no free master port from "
                                    f"{MASTER_PORT_FROM} up; set master_port on it in the cluster file.")
            for offset in range(_span(request)):
                take(request, master + offset, _master_phrase(request, master))
            own[request.name].update(range(master, master + _span(request)))
        result[request.name] = {"api_port": api, "master_port": master}
    return result
