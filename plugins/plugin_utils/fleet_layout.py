"""Where a cluster file's deployments run: each one's nodes, ranks, ports and memory, as inventory hosts.

The spark_cluster inventory plugin calls ``lay_out`` once the cluster (nodes, fabric) is valid. Each
deployment's memory need per node comes from its recipe (``fleet.memory``), the deployments are placed on
the nodes by memory (``fleet.placement``) and given ports (``fleet.ports``), all on the controller before
any host is contacted; an inventory that does not fit is refused with the fit table.

Each rank is one inventory host: a deployment's rank on a node. With one deployment the hosts are the nodes
themselves; with several, ``DEPLOYMENT@NODE`` (``fleet.deployments.host_name``), each with the node's
address, so that a play over ``sparks`` runs every deployment's ranks at once and a node serving two
deployments is reached twice, once per rank. Group ``nodes`` holds one host per node (the first rank placed
there) for what is done once per node (peer ssh, node protection, the fabric).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES
from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.deployments import (
    Deployment,
    group_name,
    host_name,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.memory import (
    Need,
    SizeUnknown,
    docker_size_bytes,
    estimate,
    hub_revision_bytes,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.placement import (
    DoNotFit,
    NodeBudget,
    Request,
    place,
    placement_table,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.ports import (
    PortCollision,
    PortRequest,
    assign_ports,
)

# About 121 GiB of a Spark's 128 GB are usable (FIELD_NOTES, "Hardware").
DEFAULT_NODE_MEMORY_GIB = 121.0
# What the system itself keeps (the OS, sshd, dockerd, the node programs) beyond the guard's floor.
DEFAULT_SYSTEM_RESERVE_GIB = 2.0
# The recipe schema's default guard floor (memory.guard.floor_gib).
DEFAULT_GUARD_FLOOR_GIB = 8.0
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
_PREFIX = "inventory: "
GIB = 1024 ** 3


@dataclass
class Layout:
    """The inventory the deployments make: host -> its variables, group -> its hosts, and what to show."""

    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    table: str = ""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def read_recipe(recipes_dir: str, name: str) -> Mapping[str, Any] | None:
    """The recipe's raw mapping, or None when it cannot be read (the recipe role says why, later)."""
    try:
        with open(os.path.join(recipes_dir, f"{name}.yml"), encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (OSError, ValueError, yaml.YAMLError):  # the recipe role reports it, with its line
        return None
    return data if isinstance(data, Mapping) else None


def recipe_nodes(recipe: Mapping[str, Any] | None) -> int:
    """How many nodes the recipe's parallel sizes ask (tensor x pipeline / GPUs per node), 1 when unknown."""
    parallel = _mapping(_mapping(recipe).get("parallel"))
    try:
        ranks = int(parallel.get("tensor", 1)) * int(parallel.get("pipeline", 1))
        per_node = int(parallel.get("gpus_per_node", 1)) or 1
    except (TypeError, ValueError):
        return 1
    return max(1, ranks // per_node)


def _floor(recipe: Mapping[str, Any] | None) -> float:
    guard = _mapping(_mapping(_mapping(recipe).get("memory")).get("guard"))
    value = guard.get("floor_gib", DEFAULT_GUARD_FLOOR_GIB)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else DEFAULT_GUARD_FLOOR_GIB


def _stated_ports(recipe: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    launch = _mapping(_mapping(recipe).get("launch"))
    api, master = launch.get("api_port"), launch.get("master_port")
    return (api if isinstance(api, int) else None, master if isinstance(master, int) else None)


def _weights_bytes(recipe: Mapping[str, Any], variables: Mapping[str, Any],
                   template: Callable[[Any], Any]) -> int:
    """The bytes of the model and its draft at their pinned revisions, from the hub's file sizes."""
    endpoint = str(template(variables.get("sparkserve_hf_endpoint", DEFAULT_HF_ENDPOINT)) or DEFAULT_HF_ENDPOINT)
    token = template(variables.get("weights_hf_token")) or os.environ.get("HF_TOKEN") or None
    total = 0
    for key in ("model", "draft_model"):
        model = _mapping(recipe.get(key))
        if not model:
            continue
        repo = model.get("repo")
        revision = model.get("revision")
        if revision is None and model.get("revision_from") is not None:
            revision = template(variables.get(str(model["revision_from"])))
        if not isinstance(repo, str) or not isinstance(revision, str):
            raise SizeUnknown(f"{key} has no repo and pinned revision to size")
        total += hub_revision_bytes(endpoint, repo, revision, str(token) if token else None)
    return total


def _need(deployment: Deployment, recipe: Mapping[str, Any] | None, memory_gib: float,
          variables: Mapping[str, Any], template: Callable[[Any], Any]) -> Need | str:
    """The deployment's need per node, or the sentence saying why it cannot be sized."""
    if recipe is None:
        return Need(gib=0.0, basis="recipe unreadable (the recipe check says why)")
    try:
        return estimate(recipe, memory_gib, None)
    except SizeUnknown:
        pass
    try:
        return estimate(recipe, memory_gib, _weights_bytes(recipe, variables, template))
    except SizeUnknown as error:
        limit = docker_size_bytes(_mapping(recipe.get("launch")).get("memory_limit"))
        if limit:  # the container cannot use more than its cap
            return Need(gib=limit / GIB, basis=f"launch.memory_limit (the weights' size is unknown: {error})")
        return (f"deployment {deployment.name}: its memory need cannot be sized: {error}; state it in the recipe "
                f"(memory.budget_gib: GiB per node), or make the hub reachable from the controller")


def lay_out(deployments: Sequence[Deployment], nodes: Sequence[tuple[str, dict[str, Any]]],
            node_memory: Mapping[str, float], reserve_gib: float, recipes_dir: str,
            variables: Mapping[str, Any], template: Callable[[Any], Any]) -> Layout:
    """Place the deployments on the nodes and make their hosts.

    ``nodes`` are (name, the node's own host variables: address, fabric) in file order; ``variables`` the
    cluster file's ``vars`` (the hub endpoint and token, ``*_from`` values); ``template`` resolves a value that
    may hold a template (a token read from a file).
    """
    layout = Layout()
    node_names = [name for name, _ in nodes]
    present = [d for d in deployments if d.state == "present"]
    recipes = {d.name: read_recipe(recipes_dir, d.recipe) for d in deployments}

    needs: dict[str, Need] = {}
    requests: list[Request] = []
    for deployment in present:
        recipe = recipes[deployment.name]
        count = len(deployment.nodes) if deployment.nodes else (deployment.count or recipe_nodes(recipe))
        # A deployment's need depends on the node's memory only through a memory fraction; the placement
        # compares it with every candidate node's budget, so it is sized on the smallest node.
        smallest = min((node_memory[name] for name in (deployment.nodes or node_names)), default=0.0)
        need = _need(deployment, recipe, smallest, variables, template)
        if isinstance(need, str):
            if deployment.nodes is None:
                layout.problems.append(_PREFIX + need + ", or place it with nodes: [...].")
                continue
            layout.warnings.append(need + "; its memory is not checked.")
            need = Need(gib=0.0, basis="unknown")
        needs[deployment.name] = need
        requests.append(Request(name=deployment.name, need=need, count=count, nodes=deployment.nodes,
                                priority=deployment.priority))
    if layout.problems:
        return layout
    floors = {name: DEFAULT_GUARD_FLOOR_GIB for name in node_names}
    budgets = []
    for name in node_names:
        # The guard keeps the highest floor of the deployments that may run on the node.
        floors[name] = max((_floor(recipes[d.name]) for d in present
                            if d.nodes is None or name in d.nodes), default=DEFAULT_GUARD_FLOOR_GIB)
        budgets.append(NodeBudget(name=name, memory_gib=node_memory[name], floor_gib=floors[name],
                                  reserve_gib=reserve_gib))
    try:
        placed = place(requests, budgets)
    except DoNotFit as error:
        layout.problems.append(f"{_PREFIX}{error}")
        return layout
    layout.table = placement_table(placed, needs, budgets)

    def port_request(deployment: Deployment, where: Sequence[str]) -> PortRequest:
        recipe = recipes[deployment.name]
        api, master = _stated_ports(recipe)
        engine = ENGINES.get(str(_mapping(recipe).get("engine")))
        extra = _mapping(_mapping(recipe).get("launch")).get("extra_ports") or []
        return PortRequest(
            name=deployment.name, nodes=tuple(where), api_port=deployment.api_port or api,
            master_port=deployment.master_port or master, master_span=engine.master_port_span if engine else 1,
            extra_ports=tuple(port for port in extra if isinstance(port, int)))

    port_requests = [port_request(deployment, placed[deployment.name]) for deployment in present]
    try:
        ports = assign_ports(port_requests)
    except PortCollision as error:
        layout.problems.append(f"{_PREFIX}{error}")
        return layout
    # A deployment marked absent gets the ports it had beside the others (its stop waits for them to close);
    # one that cannot is left the recipe's.
    for deployment in deployments:
        if deployment.state == "absent":
            try:
                ports[deployment.name] = assign_ports(
                    port_requests + [port_request(deployment, deployment.nodes or node_names)])[deployment.name]
            except PortCollision:
                pass

    single = len(deployments) == 1
    node_vars = dict(nodes)
    layout.groups = {"sparks": [], "head": [], "workers": [], "nodes": [], "absent": []}
    for deployment in deployments:
        if deployment.state == "absent":
            # Stopped wherever it ran: on every node (its containers and units are named after it).
            where = list(deployment.nodes or node_names)
        else:
            where = placed[deployment.name]
        names = [host_name(deployment.name, node, single) for node in where]
        group = group_name(deployment.name)
        layout.groups[group] = names
        head_ips = node_vars[where[0]].get("sparkserve_fabric_ips") or []
        for rank, (node, host) in enumerate(zip(where, names, strict=True)):
            variables_of_host = dict(node_vars[node])
            variables_of_host.update({
                "sparkserve_recipe": deployment.recipe,
                "sparkserve_deployment_hosts": names,
                "sparkserve_deployment_priority": deployment.priority,
                "sparkserve_node": node,
                "sparkserve_rank": rank,
                "sparkserve_world_size": len(names),
                "sparkserve_head_fabric_ip": head_ips[0] if head_ips and len(names) > 1 else None,
            })
            # One deployment named after its recipe leaves the name to the recipe (-e sparkserve_recipe=OTHER
            # serves OTHER under its own name, as before several deployments).
            if not single or deployment.name != deployment.recipe:
                variables_of_host["sparkserve_deployment"] = deployment.name
            if deployment.name in ports:
                stated = _stated_ports(recipes[deployment.name])
                assigned = ports[deployment.name]
                # Only a port that differs from the recipe's is an inventory variable (the render applies it).
                if assigned["api_port"] != stated[0]:
                    variables_of_host["sparkserve_api_port"] = assigned["api_port"]
                if assigned["master_port"] != stated[1]:
                    variables_of_host["sparkserve_master_port"] = assigned["master_port"]
                if deployment.name in needs:
                    variables_of_host["sparkserve_memory_need_gib"] = round(needs[deployment.name].gib, 2)
            layout.hosts[host] = variables_of_host
            if deployment.state == "absent":
                layout.groups["absent"].append(host)
                continue
            layout.groups["sparks"].append(host)
            layout.groups["head" if rank == 0 else "workers"].append(host)
            if not any(layout.hosts[h]["sparkserve_node"] == node for h in layout.groups["nodes"]):
                layout.groups["nodes"].append(host)
    return layout
