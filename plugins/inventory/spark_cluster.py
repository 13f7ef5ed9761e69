"""Inventory plugin: a cluster of DGX Sparks from one compact file."""

from __future__ import annotations

DOCUMENTATION = r"""
name: spark_cluster
short_description: A cluster of DGX Sparks from one compact cluster file
version_added: "0.1.0"
author:
  - sparkserve
description:
  - Reads a C(*.sparks.yml) or C(*.sparks.yaml) file describing the Sparks of one
    deployment, their fabric twins and the recipe they serve, and turns it into the
    inventory every sparkserve playbook expects.
  - Groups C(sparks) (every node), C(head) (one node) and C(workers) (the rest).
  - The head gets rank 0 and the other nodes ranks 1 and up in file order.
  - A node's fabric address on each twin defaults to its host number inside the
    twin's subnet, the host number being the node's place in the file plus one
    (the head included); explicit O(nodes[].fabric_ips) win.
  - Every host gets C(ansible_host), C(sparkserve_rank), C(sparkserve_world_size),
    C(sparkserve_fabric_ip), C(sparkserve_fabric_ips), C(sparkserve_head_fabric_ip),
    C(sparkserve_fabric_mtu), C(sparkserve_fabric_interfaces), C(sparkserve_rdma_devices),
    C(sparkserve_fabric_subnets), C(sparkserve_rdma_sysfs_root), C(sparkserve_recipe),
    and C(sparkserve_management_subnet) and C(ansible_user) when given; the same
    variables a plain YAML inventory of Sparks carries.
  - The file is checked as a whole (unknown keys, then every topology rule of
    sparkserve's cluster model); any problem fails the parse with every message,
    one per line.
  - Two sources no inventory plugin can read are claimed, to say why and how to fix it
    (a path that does not exist, and a YAML file whose C(plugin) is this plugin but
    whose name does not end in C(.sparks.yml)).
  - Where the C(sparkserve.deploy.inventory_guard) vars plugin is enabled and
    C(any_unparsed_is_failed) is set (as sparkserve's ansible.cfg has them), the
    report is left to the guard, which raises it once every source is read, as the
    one error shown; elsewhere the source fails as usual.
  - Needs C(netaddr) on the controller.
requirements:
  - netaddr
options:
  plugin:
    description: Marks the file as this plugin's.
    type: str
    required: true
    choices: [sparkserve.deploy.spark_cluster]
  recipe:
    description:
      - Name of the recipe the cluster serves (a file of C(recipes/)) on every node, the head first; set as
        C(sparkserve_recipe) on every host.
      - The shorthand for one deployment; give O(deployments) instead to serve several. One of the two is
        required.
    type: str
  deployments:
    description:
      - The deployments the Sparks serve, each a recipe and where it runs. Each deployment's memory need per node
        is estimated from its recipe and the deployments are placed on the nodes by memory before any host is
        contacted; an inventory that does not fit is refused with a table (node, each deployment's GiB, total,
        budget). C(render.yml) shows the placement.
      - With one deployment the hosts are the nodes; with several, each rank is a host named
        C(DEPLOYMENT@NODE), in group C(deployment_DEPLOYMENT) (C(-) and C(.) as C(_)); group C(nodes) holds one
        host per node.
    type: list
    elements: dict
    suboptions:
      name:
        description: The deployment's name (containers, units, records); by default the recipe's. Give one to run
          the same recipe twice.
        type: str
      recipe:
        description: The recipe it serves (a file of C(recipes/)).
        type: str
        required: true
      nodes:
        description: The nodes it runs on, its head first. Left out, it is placed automatically on
          O(deployments[].count) nodes.
        type: list
        elements: str
      count:
        description: How many nodes an automatically placed deployment runs on; by default what the recipe's
          parallel sizes ask (tensor x pipeline / GPUs per node). Placement is deterministic, on the nodes with
          the fewest deployments, then the most free memory budget, then file order.
        type: int
      priority:
        description: When a node's memory runs out, the memory guard acts on the deployment of the lowest
          priority first (C(sparkserve_deployment_priority)).
        type: int
        default: 0
      state:
        description: C(absent) stops the deployment on every node and removes its supervisor, guard and metrics.
        type: str
        choices: [present, absent]
        default: present
      api_port:
        description: The API port, instead of the recipe's; left out of both, a free one is assigned from 8000 up
          (C(sparkserve_api_port)). Two deployments may not share a port on a node.
        type: int
      master_port:
        description: The rendezvous port, instead of the recipe's; left out of both, a free one is assigned from
          29501 up (C(sparkserve_master_port)).
        type: int
  memory_reserve_gib:
    description: Memory each node keeps for the system beyond the guard's floor; a node's budget for the
      deployments is its memory less the guard's floor and this reserve.
    type: float
    default: 2
  recipes_dir:
    description: Where the recipes are read for placement; by default the project's C(recipes/).
    type: path
  user:
    description: Account Ansible logs in with on every node (C(ansible_user)); a node's O(nodes[].vars) may override it.
    type: str
  management_subnet:
    description:
      - CIDR of the management network (the C(enP7s7) side), set as C(sparkserve_management_subnet).
      - When given, every management address must be inside it and no fabric address or twin subnet may touch it.
    type: str
  fabric:
    description:
      - The fabric joining the Sparks. Needed only when a deployment runs on more than one node; without it no
        fabric variable is set and the fabric stage has nothing to do (one Spark, or one deployment per Spark).
    type: dict
    suboptions:
      mtu:
        description: MTU of the fabric interfaces, 1280 to 9216 (C(sparkserve_fabric_mtu)).
        type: int
        default: 9000
      rdma_sysfs_root:
        description: Where the RDMA devices appear in sysfs (C(sparkserve_rdma_sysfs_root)).
        type: str
        default: /sys/class/infiniband
      topology:
        description:
          - How the Sparks are cabled (C(sparkserve_fabric_topology)).
          - V(switch) - every node's port on a switch; V(direct) - two Sparks back to back. Both give each twin
            of the port in use one subnet that every node is on (O(fabric.twins)).
          - V(ring) - three Sparks with no switch, port 0 of each cabled to port 1 of the next (O(fabric.links)
            or the node order). Each half of a link (one twin at each end) is its own small subnet of
            O(fabric.link_range) or given; a node has an address on each of its four twins, and a route to
            each peer's first address through the link they share.
        type: str
        choices: [switch, direct, ring]
        default: switch
      twins:
        description:
          - The twins of the QSFP port in use, in order; twin 1 carries C(sparkserve_fabric_ip).
          - Each twin needs its own subnet. Required with O(fabric.topology=switch) and V(direct); a ring takes
            O(fabric.ports).
        type: list
        elements: dict
        suboptions:
          interface:
            description: Ethernet interface of the twin, for example C(enp1s0f1np1).
            type: str
            required: true
          rdma_device:
            description: RoCE device of the twin, for example C(rocep1s0f1).
            type: str
            required: true
          subnet:
            description: CIDR of the twin's own subnet, for example C(192.168.100.0/24).
            type: str
            required: true
      ports:
        description:
          - A ring's two ports, each a list of its twins (C(interface), C(rdma_device)); port 0 of a node is
            cabled to port 1 of the next.
          - By default a Spark's own - port 0 V(enp1s0f0np0)/V(rocep1s0f0) and V(enP2p1s0f0np0)/V(roceP2p1s0f0),
            port 1 V(enp1s0f1np1)/V(rocep1s0f1) and V(enP2p1s0f1np1)/V(roceP2p1s0f1).
        type: list
        elements: list
      link_range:
        description: Where a ring's link subnets are carved from, in order (link 1's twins first); needed unless
          every entry of O(fabric.links) gives its subnets.
        type: str
      link_prefix:
        description: The prefix length of each half of a ring link carved from O(fabric.link_range).
        type: int
        default: 30
      links:
        description:
          - A ring's cabling when it does not follow the node order - each C(from) node's port 0 to the C(to)
            node's port 1, each node once at each end - and, optionally, each link's C(subnets) (one per twin).
          - At port 0's end a link half takes its subnet's first host address, at port 1's end the second.
        type: list
        elements: dict
  nodes:
    description: The Sparks, in order; the order sets worker ranks and default fabric addresses.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Inventory name of the node.
        type: str
        required: true
      address:
        description: Management address Ansible reaches the node on (C(ansible_host)).
        type: str
        required: true
      head:
        description: This node is the head (rank 0) of the O(recipe) shorthand's deployment. At most one node;
          without any, the first node is the head.
        type: bool
        default: false
      memory_gib:
        description: The node's usable memory in GiB, for placement (C(sparkserve_node_memory_gib)); preflight
          checks the node has it.
        type: float
        default: 121
      fabric_ips:
        description: The node's fabric addresses, one per twin in twin order; replace the computed ones.
        type: list
        elements: str
      vars:
        description:
          - Extra host variables of this node; they win over O(vars) and O(user).
          - The variables the plugin computes (the cluster contract and C(sparkserve_recipe)) cannot be set here.
        type: dict
        default: {}
  vars:
    description:
      - Extra host variables of every node.
      - The variables the plugin computes (the cluster contract and C(sparkserve_recipe)) cannot be set here.
    type: dict
    default: {}
"""

EXAMPLES = r"""
# inventory/mycluster.sparks.yml, then:
#   ansible-inventory -i inventory/mycluster.sparks.yml --graph
#   ansible-playbook -i inventory/mycluster.sparks.yml site.yml
plugin: sparkserve.deploy.spark_cluster
recipe: glm53-fp4local-mtp-tp2
user: nvidia
management_subnet: 192.168.1.0/24
fabric:
  mtu: 9000
  rdma_sysfs_root: /sys/class/infiniband
  twins:
    - {interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 192.168.100.0/24}
    - {interface: enP2p1s0f1np1, rdma_device: roceP2p1s0f1, subnet: 192.168.101.0/24}
nodes:
  - name: spark-a
    address: 192.168.1.21                       # fabric 192.168.100.1, 192.168.101.1; rank 1
  - name: spark-b
    address: 192.168.1.22
    head: true                                  # rank 0
    fabric_ips: [192.168.100.9, 192.168.101.9]  # instead of .2
    vars: {ansible_port: 2222}
vars:
  ansible_python_interpreter: /usr/bin/python3
"""

import difflib
import os
import re
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleError, AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster import (
    CONTRACT_VARS,
    DEFAULT_RDMA_SYSFS_ROOT,
    Cluster,
    Node,
    validate_cluster,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster_hostvars import cluster_hostvars
from ansible_collections.sparkserve.deploy.plugins.module_utils.fabric_links import (
    TOPOLOGY_RING,
    TOPOLOGY_SWITCH,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.deployments import (
    RECIPE_MISSING,
    Deployment,
    read_deployments,
)
from ansible_collections.sparkserve.deploy.plugins.plugin_utils.cluster_file_fabric import (
    RING_KEYS,
    fabric_ips,
    lay_out_ring,
    read_twins,
    unknown_keys,
)
from ansible_collections.sparkserve.deploy.plugins.plugin_utils.cluster_file_lines import field_lines, locate
from ansible_collections.sparkserve.deploy.plugins.plugin_utils.fleet_layout import (
    DEFAULT_NODE_MEMORY_GIB,
    DEFAULT_SYSTEM_RESERVE_GIB,
    Layout,
    lay_out,
    read_recipe,
    recipe_nodes,
)
from ansible_collections.sparkserve.deploy.plugins.plugin_utils.inventory_refusal import guard_speaks, leave

try:
    import netaddr
except ImportError:  # reported in parse(), where it matters
    netaddr = None

TOP_KEYS = ("plugin", "recipe", "deployments", "user", "management_subnet", "fabric", "nodes", "vars",
            "memory_reserve_gib", "recipes_dir")
NODE_KEYS = ("name", "address", "head", "fabric_ips", "memory_gib", "vars")
REQUIRED = {
    "nodes": "list the Sparks (nodes: [{name: spark-a, address: 192.168.1.21}]).",
}
FABRIC_FIX = "describe the fabric (fabric: {mtu: 9000, twins: [{interface: ..., rdma_device: ..., subnet: ...}]})"
COMPUTED_VARS = frozenset(CONTRACT_VARS) | {
    "sparkserve_recipe", "sparkserve_deployment", "sparkserve_deployment_hosts", "sparkserve_deployment_priority",
    "sparkserve_node", "sparkserve_api_port", "sparkserve_master_port", "sparkserve_memory_need_gib",
    "sparkserve_node_memory_gib"}
# The project's recipes, beside plugins/ (the collection's plugins folder is the project's).
PROJECT_RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))),
                               "recipes")
DEFAULT_MTU = 9000
PREFIX = "inventory: "
# Ansible's own default source, absent on most controllers and never an error (InventoryManager.parse_source).
DEFAULT_SOURCE = "/etc/ansible/hosts"
SUFFIXES = (".sparks.yml", ".sparks.yaml")
PLUGIN_LINE = re.compile(r"""^plugin:[ \t]*["']?sparkserve\.deploy\.spark_cluster["']?[ \t]*(#.*)?$""", re.MULTILINE)


class InventoryModule(BaseInventoryPlugin):
    """Turn a .sparks.yml cluster file into the sparks/head/workers inventory."""

    NAME = "sparkserve.deploy.spark_cluster"
    # The file is the user's own inventory, trusted like a YAML inventory.
    trusted_by_default = True

    def verify_file(self, path: str) -> bool:
        # Two sources no inventory plugin can read are claimed too, so that parse() says why: a path that does
        # not exist, and a cluster file under a name that does not end in .sparks.yml.
        if _missing(path):
            return True
        if path.endswith(SUFFIXES):
            return super().verify_file(path)
        return _misnamed(path) is not None

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        report = self._read(path)
        if report is None:
            return
        if guard_speaks():
            leave(self.inventory, report)  # the guard raises it once every source is read (plugin_utils)
        else:
            raise AnsibleParserError(report)

    def _read(self, path: str) -> str | None:
        """Populate the inventory from the file; or, when it cannot be used, the report saying why."""
        if _missing(path):
            return _missing_report(path)
        line = _misnamed(path)
        if line is not None:
            stem = path[: -len(os.path.splitext(path)[1]) or None]
            return (f"{path}:{line}: plugin: {self.NAME} makes this a Spark cluster file, but the spark_cluster "
                    "inventory plugin reads only files whose name ends in .sparks.yml, so no plugin reads it; "
                    f"rename it to {stem}.sparks.yml.")
        if netaddr is None:
            return (f"{path}: the spark_cluster inventory plugin needs netaddr on the controller; "
                    "install it (pip install netaddr) in Ansible's Python.")
        try:
            raw = self.loader.load_from_file(path, cache="none", trusted_as_template=True)
        except AnsibleError as error:
            if not getattr(error.obj, "line_num", None):  # not a YAML error: the file could not be read
                return f"{path}: {error.message}"
            tabs = " Indent with spaces: replace each tab with spaces." if "Tabs" in error.message else ""
            return (f"{error.obj}: {error.message}{tabs} The cluster file is not valid YAML; fix it there "
                    "(inventory/example/two-sparks.sparks.yml shows the format).")
        problems: list[str] = []
        if isinstance(raw, Mapping):
            problems += unknown_keys(raw, TOP_KEYS, "the top level")
            if raw.get("recipe") is None and raw.get("deployments") is None:
                problems.append(f"{PREFIX}{RECIPE_MISSING}")
            problems += [f"{PREFIX}{key} is missing; {REQUIRED[key]}" for key in REQUIRED if raw.get(key) is None]
            if any(raw.get(key) is None for key in REQUIRED) or (raw.get("recipe") is None
                                                                 and raw.get("deployments") is None):
                return _report(path, problems)
        try:
            self._read_config_data(path)
        except AnsibleError as error:
            problems.append(f"{PREFIX}{error.message}")
            return _report(path, problems)

        extra = _host_vars(self.get_option("vars"), "vars", problems)
        cluster, node_vars, unnamed = self._cluster(problems)
        misspelt = any("has unknown key" in problem for problem in problems)
        deployments: list[Deployment] = []
        if cluster is not None and not misspelt:  # a misspelt key's follow-on problems would bury it
            head = next((node.name for node in cluster.nodes if node.head), None)
            deployments, found = read_deployments(self.get_option("deployments"), self.get_option("recipe"),
                                                   [node.name for node in cluster.nodes], head)
            problems += found
            spread = [d.name for d in deployments if d.state == "present" and self._node_count(d) > 1]
            if not cluster.fabric and spread:
                problems.append(f"{PREFIX}fabric is missing; {', '.join(spread)} "
                                f"run{'s' if len(spread) == 1 else ''} on more than one node, which needs the "
                                f"fabric: {FABRIC_FIX}. A deployment on one node needs none.")
            # A node without a name was reported as such; its stand-in name (nodes[N]) is not one to rename.
            problems += [problem for problem in validate_cluster(cluster)
                         if not any(problem.startswith(f"{PREFIX}node name {name!r}") for name in unnamed)]
        if problems or cluster is None:  # a cluster of None always comes with its problems
            return _report(path, problems)
        layout = self._lay_out(cluster, deployments, extra, node_vars, problems)
        if problems:
            return _report(path, problems)
        self._populate(layout, extra, node_vars)
        return None

    def _recipes_dir(self) -> str:
        return self.get_option("recipes_dir") or PROJECT_RECIPES

    def _node_count(self, deployment: Deployment) -> int:
        if deployment.nodes:
            return len(deployment.nodes)
        return deployment.count or recipe_nodes(read_recipe(self._recipes_dir(), deployment.recipe))

    def _lay_out(self, cluster: Cluster, deployments: list[Deployment], extra: dict, node_vars: dict[str, dict],
                 problems: list[str]) -> Layout:
        """Place the deployments on the nodes by memory and make each rank's host."""
        memory: dict[str, float] = {}
        for node in cluster.nodes:
            value = node_vars[node.name].pop("__memory_gib", DEFAULT_NODE_MEMORY_GIB)
            memory[node.name] = float(value)
        reserve = self.get_option("memory_reserve_gib")
        hostvars = cluster_hostvars(cluster)
        for node in cluster.nodes:
            hostvars[node.name]["sparkserve_node_memory_gib"] = memory[node.name]

        def template(value: Any) -> Any:
            if isinstance(value, str) and "{{" in value:
                try:
                    self.templar.available_variables = dict(extra)
                    return self.templar.template(value)
                except AnsibleError:
                    return None
            return value

        layout = lay_out(deployments, [(node.name, hostvars[node.name]) for node in cluster.nodes], memory,
                         DEFAULT_SYSTEM_RESERVE_GIB if reserve is None else float(reserve), self._recipes_dir(),
                         extra, template)
        problems += layout.problems
        for warning in layout.warnings:
            self.display.warning(f"{self.get_option('plugin')}: {warning}")
        return layout

    # --- reading the file ---

    def _cluster(self, problems: list[str]) -> tuple[Cluster | None, dict[str, dict], set[str]]:
        """The cluster the file describes (None where its shape is too broken to check the rules), each node's
        extra variables, and the stand-in names of the nodes without one."""
        fabric = self.get_option("fabric")
        has_fabric = fabric is not None
        if fabric is not None and not isinstance(fabric, Mapping):
            problems.append(f"{PREFIX}fabric is {fabric!r}; {FABRIC_FIX}.")
            return None, {}, set()
        fabric = fabric or {}
        topology = fabric.get("topology", TOPOLOGY_SWITCH)
        ring = topology == TOPOLOGY_RING
        if ring and "twins" in fabric:
            problems.append(f"{PREFIX}fabric.twins is for a switch or two Sparks back to back; a ring takes "
                            "fabric.ports (each Spark's two ports; a Spark's own by default) and its links.")
        misplaced = [key for key in RING_KEYS if key in fabric] if not ring else []
        if misplaced:
            one = len(misplaced) == 1
            problems.append(f"{PREFIX}fabric.{', fabric.'.join(misplaced)} describe{'s' if one else ''} a ring; "
                            f"write fabric.topology: ring, or remove {'it' if one else 'them'}.")
        twins = read_twins(fabric, problems) if has_fabric and not ring else []
        nodes_in = self.get_option("nodes")
        if not isinstance(nodes_in, list):
            problems.append(f"{PREFIX}nodes is {nodes_in!r}; list the Sparks, each with name and address.")
            return None, {}, set()
        shapeless = [index for index, entry in enumerate(nodes_in) if not isinstance(entry, Mapping)]
        for index in shapeless:
            problems.append(f"{PREFIX}nodes[{index}] is {nodes_in[index]!r}; write each node as a mapping with "
                            "name and address.")
        if twins is None or shapeless:
            return None, {}, set()

        heads = [index for index, entry in enumerate(nodes_in) if entry.get("head") is True]
        head_index = heads[0] if heads else 0
        nodes: list[Node] = []
        node_vars: dict[str, dict] = {}
        unnamed: set[str] = set()
        worker_rank = 1
        for index, entry in enumerate(nodes_in):
            problems += unknown_keys(entry, NODE_KEYS, f"nodes[{index}]")
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                problems.append(f"{PREFIX}nodes[{index}] has no name; "
                                "give it the node's inventory name (name: spark-a).")
                name = f"nodes[{index}]"
                unnamed.add(name)
            head = entry.get("head", False)
            if not isinstance(head, bool):
                problems.append(f"{PREFIX}{name}: head is {head!r}; write true or false.")
                head = False
            if index == head_index:
                rank, head = 0, True
            else:
                rank, worker_rank = worker_rank, worker_rank + 1
            address = entry.get("address")  # a missing one is reported by validate_cluster as empty
            node_vars[name] = _host_vars(entry.get("vars"), f"{name}: vars", problems)
            memory_gib = entry.get("memory_gib", DEFAULT_NODE_MEMORY_GIB)
            if isinstance(memory_gib, bool) or not isinstance(memory_gib, (int, float)) or memory_gib <= 0:
                problems.append(f"{PREFIX}{name}: memory_gib is {memory_gib!r}; write the node's usable memory in "
                                f"GiB (a Spark has about {DEFAULT_NODE_MEMORY_GIB:g}).")
                memory_gib = DEFAULT_NODE_MEMORY_GIB
            node_vars[name]["__memory_gib"] = memory_gib
            if "fabric_ips" in entry and not has_fabric:
                problems.append(f"{PREFIX}{name}: fabric_ips is set but the file has no fabric; {FABRIC_FIX}, or "
                                "remove fabric_ips.")
            if "fabric_ips" in entry and ring:
                problems.append(f"{PREFIX}{name}: fabric_ips is set, but in a ring each address comes from its "
                                "link's subnet; remove it, and give fabric.links subnets to choose them.")
            nodes.append(Node(name=name, address="" if address is None else str(address), rank=rank,
                              fabric_ips=fabric_ips(entry, index, name, twins, problems)
                              if has_fabric and not ring else [],
                              head=head))
        if ring and not lay_out_ring(fabric, nodes, problems):
            return None, {}, set()
        cluster = Cluster(nodes=nodes, twins=twins, mtu=fabric.get("mtu", DEFAULT_MTU),
                          management_subnet=self.get_option("management_subnet"),
                          rdma_sysfs_root=fabric.get("rdma_sysfs_root", DEFAULT_RDMA_SYSFS_ROOT), fabric=has_fabric,
                          topology=topology if isinstance(topology, str) else repr(topology))
        return cluster, node_vars, unnamed

    # --- writing the inventory ---

    def _populate(self, layout: Layout, extra: dict, node_vars: dict[str, dict]) -> None:
        for group in layout.groups:
            self.inventory.add_group(group)
        for child in ("head", "workers"):
            self.inventory.add_child("sparks", child)
        user = self.get_option("user")
        for group, hosts in layout.groups.items():
            for host in hosts:
                self.inventory.add_host(host, group=group)
        for host, host_vars in layout.hosts.items():
            variables: dict[str, Any] = dict(extra)
            if user is not None:
                variables["ansible_user"] = user
            variables.update(host_vars)
            variables.update(node_vars.get(host_vars["sparkserve_node"], {}))
            for key, value in variables.items():
                self.inventory.set_variable(host, key, value)
        if layout.table:
            self.inventory.set_variable("all", "sparkserve_placement_table", layout.table)


def _missing(path: str) -> bool:
    """A source that names a file that is not there (not a host list, not Ansible's default)."""
    return "," not in path and path != DEFAULT_SOURCE and not os.path.lexists(path)


def _missing_report(path: str) -> str:
    folder, name = os.path.split(path)
    if folder and not os.path.isdir(folder):
        found = f" (nor does its folder {folder})"
    else:
        try:
            siblings = sorted(os.listdir(folder or "."))
        except OSError:
            siblings = []
        stem = name.removesuffix(os.path.splitext(name)[1]).removesuffix(".sparks")
        same = [f"{stem}{end}" for end in SUFFIXES + (".yml", ".yaml") if f"{stem}{end}" in siblings]
        near = same or difflib.get_close_matches(name, siblings, n=1, cutoff=0.85)
        found = f" (is it {os.path.join(folder, near[0])}?)" if near else ""
    return (f"inventory {path} does not exist{found}; give -i the path of your inventory: a cluster file whose "
            "name ends in .sparks.yml (inventory/example/two-sparks.sparks.yml) or a YAML inventory "
            "(inventory/example/hosts.yml).")


def _misnamed(path: str) -> int | None:
    """The line of `plugin: sparkserve.deploy.spark_cluster` in a YAML file not named *.sparks.yml, or None."""
    if path.endswith(SUFFIXES) or os.path.splitext(path)[1] not in (".yml", ".yaml", "") or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
    except OSError:
        return None
    match = PLUGIN_LINE.search(text)
    return text.count("\n", 0, match.start()) + 1 if match else None


def _report(path: str, problems: list[str]) -> str:
    """The file's problems, one a line, each with the line of the field it is about where there is one."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = field_lines(handle.read(1 << 20))
    except OSError:
        lines = {}
    shown = []
    for problem in problems:
        message = problem.removeprefix(PREFIX)
        line = locate(message, lines)
        shown.append(f"line {line}: {message}" if line else message)
    count = len(problems)
    return f"{path}: {count} problem{'s' if count != 1 else ''} in the Spark cluster file:\n" + "\n".join(shown)


def _host_vars(value: Any, where: str, problems: list[str]) -> dict:
    """Extra host variables, less any the plugin computes (those are reported)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"{PREFIX}{where} is {value!r}; write it as a mapping of host variables.")
        return {}
    computed = sorted(set(value) & COMPUTED_VARS)
    if computed:
        problems.append(f"{PREFIX}{where} sets {', '.join(computed)}, which the plugin computes; remove "
                        f"{'it' if len(computed) == 1 else 'them'} and use the cluster fields (recipe, fabric, "
                        "nodes with name, address, head, fabric_ips) instead.")
    return {key: item for key, item in value.items() if key not in COMPUTED_VARS}
