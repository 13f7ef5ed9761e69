"""Tests for the sparkserve.deploy.spark_cluster inventory plugin, through Ansible's own inventory CLI.

Each test writes a real cluster file and parses it with `ansible-inventory`
from the repository root (the project's ansible.cfg, so the collection is
found as Ansible finds it), in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster import validate_cluster
from ansible_collections.sparkserve.deploy.plugins.module_utils.cluster_hostvars import cluster_from_hostvars

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "inventory/example"
PLUGIN = "sparkserve.deploy.spark_cluster"
# The inventory plugins ansible.cfg enables, in its order.
PROJECT_PLUGINS = f"{PLUGIN},ansible.builtin.yaml,ansible.builtin.ini,ansible.builtin.host_list"
TOP_KEYS = {"plugin", "recipe", "deployments", "user", "management_subnet", "fabric", "nodes", "vars",
            "memory_reserve_gib", "recipes_dir"}

TWINS = textwrap.dedent("""\
    fabric:
      mtu: 9000
      twins:
        - {interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 192.168.100.0/24}
        - {interface: enP2p1s0f1np1, rdma_device: roceP2p1s0f1, subnet: 192.168.101.0/24}
    """)


def env(tmp_path: Path, enabled: str) -> dict[str, str]:
    venv_bin = REPO / ".venv/bin"
    bin_dir = venv_bin if venv_bin.is_dir() else Path(sys.executable).parent
    result = dict(os.environ)
    result.update({
        "PATH": f"{bin_dir}{os.pathsep}{result.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_INVENTORY_ENABLED": enabled,
        "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "true",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),  # no facts of the lab's hosts in the answers
    })
    return result


def ansible_inventory(tmp_path: Path, source: Path,
                      enabled: str = f"{PLUGIN},ansible.builtin.yaml") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ansible-inventory", "-i", str(source), "--list"], cwd=REPO, env=env(tmp_path, enabled),
                          capture_output=True, text=True, timeout=120, check=False)


def inventory_of(tmp_path: Path, source: Path, enabled: str = f"{PLUGIN},ansible.builtin.yaml") -> dict[str, Any]:
    done = ansible_inventory(tmp_path, source, enabled)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def write(tmp_path: Path, text: str, name: str = "cluster.sparks.yml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def cluster_file(tmp_path: Path, nodes: str, head: str = "", name: str = "cluster.sparks.yml") -> Path:
    """A cluster file: `head` (top-level keys) + the two Spark twins + `nodes`."""
    text = f"plugin: {PLUGIN}\nrecipe: glm53-fp4local-mtp-tp2\n" + textwrap.dedent(head) + TWINS
    return write(tmp_path, text + "nodes:\n" + textwrap.indent(textwrap.dedent(nodes), "  "), name)


def refusal(tmp_path: Path, source: Path, enabled: str = PROJECT_PLUGINS) -> str:
    """The one error shown for a source that must not parse, checked to be alone and the last thing on the screen."""
    done = ansible_inventory(tmp_path, source, enabled)
    assert done.returncode != 0, done.stdout
    assert done.stdout == "", done.stdout
    assert done.stderr.startswith("[ERROR]: ") and done.stderr.count("[ERROR]") == 1, done.stderr
    assert "[WARNING]" not in done.stderr and "Completely failed" not in done.stderr, done.stderr
    return done.stderr.removeprefix("[ERROR]: ").strip()


def problems(tmp_path: Path, source: Path) -> list[str]:
    """The plugin's messages for a file that must not parse."""
    shown = refusal(tmp_path, source, PLUGIN)
    assert shown.startswith(f"{source}: "), shown
    return shown.splitlines()[1:]


def groups(inventory: dict[str, Any]) -> dict[str, list[str]]:
    return {name: inventory.get(name, {}).get("hosts", []) for name in ("sparks", "head", "workers")}


def hostvars(inventory: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return inventory["_meta"]["hostvars"]


# --- the examples -------------------------------------------------------------------


def test_two_sparks_example(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, EXAMPLES / "two-sparks.sparks.yml")
    assert groups(inventory) == {"sparks": ["spark-a", "spark-b"], "head": ["spark-a"], "workers": ["spark-b"]}
    assert set(inventory["sparks"]["children"]) == {"head", "workers"}
    a, b = hostvars(inventory)["spark-a"], hostvars(inventory)["spark-b"]
    assert (a["sparkserve_rank"], b["sparkserve_rank"]) == (0, 1)
    assert a["sparkserve_recipe"] == b["sparkserve_recipe"] == "glm53-fp4local-mtp-tp2"
    assert a["ansible_user"] == "nvidia"
    assert b["ansible_host"] == "192.168.1.22"
    assert b["sparkserve_fabric_ips"] == ["192.168.100.2", "192.168.101.2"]
    assert b["sparkserve_head_fabric_ip"] == "192.168.100.1"
    assert b["sparkserve_fabric_interfaces"] == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert b["sparkserve_rdma_devices"] == ["rocep1s0f1", "roceP2p1s0f1"]
    assert b["sparkserve_fabric_mtu"] == 9000


def test_four_sparks_example(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, EXAMPLES / "four-sparks.sparks.yml")
    assert groups(inventory) == {"sparks": ["node1", "node2", "node3", "node4"], "head": ["node1"],
                                 "workers": ["node2", "node3", "node4"]}
    node4 = hostvars(inventory)["node4"]
    assert node4["sparkserve_rank"] == 3
    assert node4["sparkserve_world_size"] == 4
    assert node4["ansible_host"] == "192.168.1.204"
    assert node4["sparkserve_fabric_ips"] == ["10.0.1.4", "10.0.2.4"]  # seed 000: RoCE 10.0.1.1-4
    assert node4["sparkserve_head_fabric_ip"] == "10.0.1.1"
    assert node4["sparkserve_recipe"] == "glm53-nvfp4-dflash2-tp4"


def contract_cluster(inventory: dict[str, Any]):
    names = inventory["sparks"]["hosts"]
    return cluster_from_hostvars(names, hostvars(inventory), inventory["head"]["hosts"])


@pytest.mark.parametrize("example", ["two-sparks.sparks.yml", "four-sparks.sparks.yml"])
def test_examples_meet_the_contract(tmp_path: Path, example: str) -> None:
    cluster = contract_cluster(inventory_of(tmp_path, EXAMPLES / example))
    assert validate_cluster(cluster) == []


def test_plain_yaml_example_is_the_same_cluster(tmp_path: Path) -> None:
    """hosts.yml (plain YAML) and two-sparks.sparks.yml describe one cluster with one contract."""
    plain = contract_cluster(inventory_of(tmp_path, EXAMPLES / "hosts.yml", "ansible.builtin.yaml"))
    plugin = contract_cluster(inventory_of(tmp_path, EXAMPLES / "two-sparks.sparks.yml"))
    assert validate_cluster(plain) == []
    assert plain == plugin


def test_plugin_examples_parse(tmp_path: Path) -> None:
    """The EXAMPLES of the plugin's documentation are a working cluster file, and every option is documented."""
    done = subprocess.run(["ansible-doc", "-t", "inventory", "--json", PLUGIN], cwd=REPO,
                          env=env(tmp_path, PLUGIN), capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(done.stdout)[PLUGIN]
    assert set(doc["doc"]["options"]) == TOP_KEYS
    inventory = inventory_of(tmp_path, write(tmp_path, doc["examples"], "doc.sparks.yml"))
    assert groups(inventory)["head"] == ["spark-b"]
    assert hostvars(inventory)["spark-b"]["ansible_port"] == 2222


# --- what the plugin computes ----------------------------------------------------------


def test_head_selection_ranks_and_default_addresses(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, cluster_file(tmp_path, """\
        - {name: w1, address: 192.168.1.21}
        - {name: w2, address: 192.168.1.22}
        - {name: boss, address: 192.168.1.23, head: true}
        - {name: w3, address: 192.168.1.24}
        """))
    assert groups(inventory) == {"sparks": ["boss", "w1", "w2", "w3"], "head": ["boss"], "workers": ["w1", "w2", "w3"]}
    variables = hostvars(inventory)
    assert {name: v["sparkserve_rank"] for name, v in variables.items()} == {"boss": 0, "w1": 1, "w2": 2, "w3": 3}
    # host number = place in the file + 1, the head included
    assert variables["boss"]["sparkserve_fabric_ips"] == ["192.168.100.3", "192.168.101.3"]
    assert variables["w3"]["sparkserve_fabric_ips"] == ["192.168.100.4", "192.168.101.4"]
    assert variables["w3"]["sparkserve_fabric_ip"] == "192.168.100.4"
    assert {v["sparkserve_head_fabric_ip"] for v in variables.values()} == {"192.168.100.3"}


def test_first_node_is_the_head_by_default(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, cluster_file(tmp_path, """\
        - {name: one, address: 192.168.1.21}
        - {name: two, address: 192.168.1.22}
        """))
    assert groups(inventory)["head"] == ["one"]
    assert hostvars(inventory)["one"]["sparkserve_rank"] == 0


def test_single_node_has_no_workers(tmp_path: Path) -> None:
    inventory = inventory_of(tmp_path, cluster_file(tmp_path, "- {name: solo, address: 192.168.1.21}\n"))
    assert groups(inventory) == {"sparks": ["solo"], "head": ["solo"], "workers": []}
    assert hostvars(inventory)["solo"]["sparkserve_world_size"] == 1


def test_explicit_fabric_addresses_win(tmp_path: Path) -> None:
    variables = hostvars(inventory_of(tmp_path, cluster_file(tmp_path, """\
        - {name: spark-a, address: 192.168.1.21}
        - {name: spark-b, address: 192.168.1.22, fabric_ips: [192.168.100.9, 192.168.101.9]}
        - {name: spark-c, address: 192.168.1.23}
        """)))
    assert variables["spark-b"]["sparkserve_fabric_ips"] == ["192.168.100.9", "192.168.101.9"]
    assert variables["spark-b"]["sparkserve_fabric_ip"] == "192.168.100.9"
    assert variables["spark-c"]["sparkserve_fabric_ips"] == ["192.168.100.3", "192.168.101.3"]


def test_head_with_explicit_addresses_is_the_head_fabric_ip(tmp_path: Path) -> None:
    variables = hostvars(inventory_of(tmp_path, cluster_file(tmp_path, """\
        - {name: spark-a, address: 192.168.1.21}
        - {name: spark-b, address: 192.168.1.22, head: true, fabric_ips: [192.168.100.50, 192.168.101.50]}
        """)))
    assert variables["spark-a"]["sparkserve_head_fabric_ip"] == "192.168.100.50"


def test_vars_user_and_per_node_overrides(tmp_path: Path) -> None:
    variables = hostvars(inventory_of(tmp_path, cluster_file(tmp_path, """\
        - {name: spark-a, address: 192.168.1.21}
        - name: spark-b
          address: 192.168.1.22
          vars: {ansible_port: 2222, ansible_user: root, site: lab-2}
        """, head="""\
        user: nvidia
        vars: {site: lab-1, ansible_become: true}
        """)))
    a, b = variables["spark-a"], variables["spark-b"]
    assert (a["ansible_user"], b["ansible_user"]) == ("nvidia", "root")
    assert (a["site"], b["site"]) == ("lab-1", "lab-2")
    assert a["ansible_become"] is True and b["ansible_become"] is True
    assert b["ansible_port"] == 2222 and "ansible_port" not in a


def test_defaults_and_optional_fields(tmp_path: Path) -> None:
    path = write(tmp_path, f"""\
        plugin: {PLUGIN}
        recipe: r1
        fabric:
          twins:
            - {{interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 10.77.1.0/24}}
        nodes:
          - {{name: spark-1, address: 172.30.77.11}}
        """)
    variables = hostvars(inventory_of(tmp_path, path))["spark-1"]
    assert variables["sparkserve_fabric_mtu"] == 9000
    assert variables["sparkserve_rdma_sysfs_root"] == "/sys/class/infiniband"
    assert variables["sparkserve_fabric_ips"] == ["10.77.1.1"]
    assert "sparkserve_management_subnet" not in variables
    assert "ansible_user" not in variables


def test_management_subnet_and_sysfs_root_are_carried(tmp_path: Path) -> None:
    path = write(tmp_path, f"""\
        plugin: {PLUGIN}
        recipe: r1
        management_subnet: 172.30.77.0/24
        fabric:
          mtu: 1500
          rdma_sysfs_root: /run/sparkserve-lab/sys/class/infiniband
          twins:
            - {{interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 10.77.1.0/24}}
        nodes:
          - {{name: spark-1, address: 172.30.77.11}}
        """)
    variables = hostvars(inventory_of(tmp_path, path))["spark-1"]
    assert variables["sparkserve_management_subnet"] == "172.30.77.0/24"
    assert variables["sparkserve_rdma_sysfs_root"] == "/run/sparkserve-lab/sys/class/infiniband"
    assert variables["sparkserve_fabric_mtu"] == 1500


def test_only_sparks_files_are_read(tmp_path: Path) -> None:
    assert inventory_of(tmp_path, cluster_file(tmp_path, "- {name: a, address: 192.168.1.21}\n",
                                               name="c.sparks.yaml"), "auto")["head"]["hosts"] == ["a"]
    plain = write(tmp_path, "sparks:\n  hosts:\n    a: {ansible_host: 192.168.1.21}\n", name="plain.yml")
    assert inventory_of(tmp_path, plain, PROJECT_PLUGINS)["sparks"]["hosts"] == ["a"]  # the yaml plugin's


@pytest.mark.parametrize("enabled", [PROJECT_PLUGINS, "auto"])
def test_a_cluster_file_under_another_name_is_told_to_rename(tmp_path: Path, enabled: str) -> None:
    path = write(tmp_path, "---\n# my cluster\n" + cluster_file(tmp_path, "- {name: a, address: 192.168.1.21}\n")
                 .read_text(encoding="utf-8"), name="cluster.yml")
    assert refusal(tmp_path, path, enabled) == (
        f"{path}:3: plugin: {PLUGIN} makes this a Spark cluster file, but the spark_cluster inventory plugin reads "
        f"only files whose name ends in .sparks.yml, so no plugin reads it; rename it to {tmp_path}/cluster.sparks.yml."
    )


def test_a_missing_inventory_says_it_does_not_exist(tmp_path: Path) -> None:
    cluster_file(tmp_path, "- {name: a, address: 192.168.1.21}\n", name="mycluster.sparks.yml")
    missing = tmp_path / "mycluster.yml"
    assert refusal(tmp_path, missing) == (
        f"inventory {missing} does not exist (is it {tmp_path}/mycluster.sparks.yml?); give -i the path of your "
        "inventory: a cluster file whose name ends in .sparks.yml (inventory/example/two-sparks.sparks.yml) or a "
        "YAML inventory (inventory/example/hosts.yml)."
    )
    assert refusal(tmp_path, tmp_path / "nowhere" / "c.sparks.yml").startswith(
        f"inventory {tmp_path}/nowhere/c.sparks.yml does not exist (nor does its folder {tmp_path}/nowhere); ")


def test_a_yaml_error_names_the_file_and_line(tmp_path: Path) -> None:
    text = cluster_file(tmp_path, "- {name: a, address: 192.168.1.21}\n").read_text(encoding="utf-8")
    path = write(tmp_path, text.replace("  mtu: 9000", "  mtu: [9000"))
    shown = refusal(tmp_path, path)
    assert shown.startswith(f"{path}:5:")
    assert shown.endswith("The cluster file is not valid YAML; fix it there "
                          "(inventory/example/two-sparks.sparks.yml shows the format).")


def test_a_refused_file_is_the_last_thing_on_the_screen(tmp_path: Path) -> None:
    """With every plugin ansible.cfg enables, the yaml and ini plugins' failures are not shown after it."""
    text = cluster_file(tmp_path, "- {name: a, address: 192.168.1.21}\n").read_text(encoding="utf-8")
    path = write(tmp_path, text.replace("mtu: 9000", "mtu: 90000"))
    assert refusal(tmp_path, path) == (
        f"{path}: 1 problem in the Spark cluster file:\n"
        "line 4: fabric MTU 90000 is outside 1280..9216; set sparkserve_fabric_mtu (fabric.mtu in a .sparks.yml) "
        "to a whole number in 1280..9216: 9000, the Spark community default, or 1500."
    )


def test_a_node_name_with_a_space_is_refused(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, """\
        - {name: spark-a, address: 192.168.1.21}
        - {name: spark b, address: 192.168.1.22}
        """)
    assert problems(tmp_path, path) == [
        "line 10: node name 'spark b' (name in a .sparks.yml, the host's name in a YAML inventory) has a space, "
        "so the nodes' ssh config would read it as 2 names (spark, b); rename the node with letters, digits, '.', "
        "'-' and '_' only, starting with a letter or digit, for example spark-b.",
    ]


# --- a bad file fails with every message ----------------------------------------------


def test_bad_file_lists_every_problem(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, """\
        - {name: spark-a, address: 192.168.1.21}
        - {name: spark-b, address: 192.168.1.22, head: true, fabric_ips: [10.0.0.5, 192.168.101.2]}
        - {name: spark-c, address: 192.168.1.23, head: true}
        - {name: spark-d, address: 192.168.1.23, fabric_ips: [192.168.100.4]}
        """, head="management_subnet: 192.168.1.0/24\n").read_text(encoding="utf-8")
    path = write(tmp_path, path.replace("mtu: 9000", "mtu: 20000"))
    assert problems(tmp_path, path) == [
        "line 5: fabric MTU 20000 is outside 1280..9216; set sparkserve_fabric_mtu (fabric.mtu in a .sparks.yml) "
        "to a whole number in 1280..9216: 9000, the Spark community default, or 1500.",
        "line 11: 2 nodes are marked head (spark-b, spark-c); mark exactly one "
        "(head: true on one node of a .sparks.yml, one host in the head group of a YAML inventory).",
        "line 12: management address 192.168.1.23 is used by spark-c and spark-d; "
        "give each Spark its own management address.",
        "line 11: spark-b: fabric address 10.0.0.5 of twin 1 (enp1s0f1np1) is outside its subnet 192.168.100.0/24; "
        "give it an address in that subnet.",
        "line 13: spark-d: has 1 fabric address (192.168.100.4) for 2 twins; give exactly one per twin, "
        "in twin order (fabric_ips in a .sparks.yml, sparkserve_fabric_ips in a YAML inventory).",
    ]


def test_unknown_keys_are_errors(tmp_path: Path) -> None:
    path = write(tmp_path, f"""\
        plugin: {PLUGIN}
        recipe: r1
        colour: blue
        fabric:
          speed: 200
          twins:
            - {{interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 192.168.100.0/24, vlan: 7}}
        nodes:
          - {{name: spark-a, address: 192.168.1.21, rank: 0}}
        """)
    assert problems(tmp_path, path) == [
        "line 3: the top level has unknown key 'colour'; "
        "the keys are plugin, recipe, deployments, user, management_subnet, fabric, nodes, vars, memory_reserve_gib, "
        "recipes_dir.",
        "line 5: fabric has unknown key 'speed'; the keys are mtu, rdma_sysfs_root, topology, twins, ports, "
        "link_range, link_prefix, links.",
        "line 7: fabric.twins[0] has unknown key 'vlan'; the keys are interface, rdma_device, subnet.",
        "line 9: nodes[0] has unknown key 'rank'; the keys are name, address, head, fabric_ips, memory_gib, vars.",
    ]


def test_missing_required_keys_are_listed_together(tmp_path: Path) -> None:
    path = write(tmp_path, f"plugin: {PLUGIN}\nfabric: {{twins: []}}\n")
    assert problems(tmp_path, path) == [
        "recipe is missing; name the recipe the cluster serves (recipe: glm53-fp4local-mtp-tp2), or list the "
        "deployments (deployments: [{recipe: ..., nodes: [spark-a]}]).",
        "nodes is missing; list the Sparks (nodes: [{name: spark-a, address: 192.168.1.21}]).",
    ]


def test_empty_cluster(tmp_path: Path) -> None:
    path = write(tmp_path, f"plugin: {PLUGIN}\nrecipe: r1\nfabric: {{twins: []}}\nnodes: []\n")
    assert problems(tmp_path, path) == [
        "line 3: the fabric has no twins; list each twin with its interface, RDMA device and subnet "
        "(a Spark's are enp1s0f1np1/rocep1s0f1 and enP2p1s0f1np1/roceP2p1s0f1, each on its own subnet).",
        "line 4: the cluster has no nodes; list at least one Spark "
        "(nodes in a .sparks.yml, hosts of the sparks group in a YAML inventory).",
    ]


def test_node_fields_are_checked(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, """\
        - {address: 192.168.1.20}
        - {name: spark-a}
        - {name: spark-b, address: 192.168.1.22, head: maybe, fabric_ips: 192.168.100.2}
        """)
    assert problems(tmp_path, path) == [
        "line 9: nodes[0] has no name; give it the node's inventory name (name: spark-a).",
        "line 11: spark-b: head is 'maybe'; write true or false.",
        "line 10: spark-a: management address (ansible_host, address in a .sparks.yml) is empty; "
        "set it to the address Ansible reaches the node on (enP7s7).",
        "line 11: spark-b: fabric addresses '192.168.100.2' are not a list of addresses; give one per twin, "
        "in twin order (fabric_ips in a .sparks.yml, sparkserve_fabric_ips in a YAML inventory).",
    ]


def test_shapeless_entries_stop_before_the_rules(tmp_path: Path) -> None:
    path = write(tmp_path, f"""\
        plugin: {PLUGIN}
        recipe: r1
        fabric:
          mtu: 100
          twins: [enp1s0f1np1, {{interface: 7, rdma_device: roceP2p1s0f1, subnet: 192.168.101.0/24}}]
        nodes: [spark-a, {{name: spark-b, address: 192.168.1.22}}]
        """)
    assert problems(tmp_path, path) == [
        "line 5: fabric.twins[0] is 'enp1s0f1np1'; write it as {interface: ..., rdma_device: ..., subnet: ...}.",
        "line 6: nodes[0] is 'spark-a'; write each node as a mapping with name and address.",
    ]
    path = write(tmp_path, f"""\
        plugin: {PLUGIN}
        recipe: r1
        fabric:
          twins: [{{interface: 7, rdma_device: rocep1s0f1, subnet: 192.168.100.0/24}}]
        nodes: [spark-a, {{name: spark-b, address: 192.168.1.22}}]
        """)
    assert problems(tmp_path, path) == [
        "line 5: nodes[0] is 'spark-a'; write each node as a mapping with name and address.",
    ]
    path = write(tmp_path, f"""\
        plugin: {PLUGIN}
        recipe: r1
        fabric:
          twins: [{{interface: 7, rdma_device: rocep1s0f1, subnet: 192.168.100.0/24}}]
        nodes: [{{name: spark-b, address: 192.168.1.22}}]
        """)
    assert problems(tmp_path, path) == [
        "line 4: twin 1 has interface 7, not a name; set it to the twin's Ethernet interface "
        "(enp1s0f1np1 or enP2p1s0f1np1 on a Spark).",
    ]


def test_computed_variables_cannot_be_overridden(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, """\
        - name: spark-a
          address: 192.168.1.21
          vars: {sparkserve_rank: 3, ansible_host: 10.9.9.9}
        """, head="vars: {sparkserve_recipe: other}\n")
    assert problems(tmp_path, path) == [
        "line 3: vars sets sparkserve_recipe, which the plugin computes; remove it and use the cluster fields "
        "(recipe, fabric, nodes with name, address, head, fabric_ips) instead.",
        "line 10: spark-a: vars sets ansible_host, sparkserve_rank, which the plugin computes; remove them and use "
        "the cluster fields (recipe, fabric, nodes with name, address, head, fabric_ips) instead.",
    ]


def test_subnet_too_small_for_the_default_addresses(tmp_path: Path) -> None:
    text = cluster_file(tmp_path, """\
        - {name: spark-a, address: 192.168.1.21}
        - {name: spark-b, address: 192.168.1.22}
        - {name: spark-c, address: 192.168.1.23}
        """).read_text(encoding="utf-8").replace("192.168.100.0/24", "192.168.100.0/30")
    assert problems(tmp_path, write(tmp_path, text)) == [
        "line 11: spark-c: subnet 192.168.100.0/30 of twin 1 (enp1s0f1np1) has no host number 3 (the node's place "
        "in the file); use a larger subnet or give the node explicit fabric_ips.",
        "line 11: spark-c: twin 1 (enp1s0f1np1) has no fabric address; give it one in 192.168.100.0/30 "
        "(fabric_ips in a .sparks.yml, sparkserve_fabric_ips in a YAML inventory).",
    ]


def test_bad_subnet_is_reported_once(tmp_path: Path) -> None:
    text = cluster_file(tmp_path, """\
        - {name: spark-a, address: 192.168.1.21}
        - {name: spark-b, address: 192.168.1.22}
        """).read_text(encoding="utf-8").replace("192.168.101.0/24", "192.168.101.0/33")
    assert problems(tmp_path, write(tmp_path, text)) == [
        "line 7: subnet '192.168.101.0/33' of twin 2 (enP2p1s0f1np1) is not a valid CIDR; "
        "write it as network/prefix, for example 192.168.101.0/24.",
    ]


def test_bad_file_fails_without_the_strict_setting(tmp_path: Path) -> None:
    """Even where unparsed inventory is only a warning, the messages reach the user."""
    path = cluster_file(tmp_path, "- {name: a, address: 192.168.1.21, fabric_ips: [10.0.0.1, 10.0.0.2]}\n")
    environment = env(tmp_path, PLUGIN)
    environment["ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED"] = "false"
    done = subprocess.run(["ansible-inventory", "-i", str(path), "--list"], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=120, check=False)
    assert "a: fabric address 10.0.0.1 of twin 1 (enp1s0f1np1) is outside its subnet 192.168.100.0/24" in done.stderr
    assert "a" not in json.loads(done.stdout)["_meta"]["hostvars"]


def test_example_files_are_commented_yaml() -> None:
    for name in ("two-sparks.sparks.yml", "four-sparks.sparks.yml"):
        text = (EXAMPLES / name).read_text(encoding="utf-8")
        assert text.startswith("---\n#")
        assert yaml.safe_load(text)["plugin"] == PLUGIN
