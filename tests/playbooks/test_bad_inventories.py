"""Bad inventories through the real playbooks: each is refused before any task runs on a Spark.

Every run here fails before a play reaches a host: the inventory guard stops
it as the inventory is read (no play starts at all), or the recipe role's
checks, which run on the controller, stop the first play before any other
role. The tests assert that, so no host needs to exist; the management
addresses are on loopback all the same.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ("put every Spark in the sparks group (all.children.sparks.hosts), the head also in its child group head and "
       "the others in workers, as inventory/example/hosts.yml does; or describe the cluster in a cluster file named "
       "NAME.sparks.yml (inventory/example/two-sparks.sparks.yml)")
# The stage playbooks a person runs alone, and site.yml, which imports them.
PLAYBOOKS = ["site.yml", "playbooks/render.yml", "playbooks/preflight.yml", "playbooks/access.yml",
             "playbooks/status.yml", "playbooks/stop.yml", "playbooks/bench.yml", "playbooks/rollback.yml"]


def tool(name: str) -> str:
    """An Ansible command beside the running interpreter (the project's venv)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed"
    return found


def ansible(tmp_path: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_TIMEOUT="5")  # were a host contacted after all, the run would fail, not hang
    return subprocess.run([tool(command), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def playbook(tmp_path: Path, inventory: Path, name: str = "playbooks/render.yml",
             *extra: str) -> subprocess.CompletedProcess[str]:
    return ansible(tmp_path, "ansible-playbook", "-i", str(inventory), str(ROOT / name), *extra)


def write(tmp_path: Path, text: str, name: str = "hosts.yml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def refused_as_read(done: subprocess.CompletedProcess[str]) -> str:
    """The one error of a run the guard stopped as the inventory was read: no play started, nothing else shown."""
    assert done.returncode != 0, done.stdout
    assert "PLAY [" not in done.stdout and "TASK [" not in done.stdout, done.stdout
    assert done.stderr.startswith("[ERROR]: ") and done.stderr.count("[ERROR]") == 1, done.stderr
    assert "[WARNING]" not in done.stderr, done.stderr
    return done.stderr.removeprefix("[ERROR]: ").strip()


def refused_by_the_recipe_role(done: subprocess.CompletedProcess[str]) -> str:
    """The error of a run the recipe role stopped: every task that ran is one of its controller checks."""
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    tasks = re.findall(r"^TASK \[([^\]]+)\]", done.stdout, re.MULTILINE)
    assert tasks and all(task.startswith("recipe : ") for task in tasks), tasks
    assert "unreachable=0" in done.stdout and "changed=0" in done.stdout
    errors = re.findall(r"^\[ERROR\]: Task failed: Action failed: (.*?)\nOrigin:", out, re.MULTILINE | re.DOTALL)
    assert len(errors) == 1, out
    return errors[0]


# --- 1. an inventory with no Spark in it ---------------------------------------------------


@pytest.mark.parametrize("name", PLAYBOOKS)
def test_an_empty_sparks_group_is_refused_by_every_playbook(tmp_path: Path, name: str) -> None:
    inventory = write(tmp_path, """\
        all:
          children:
            sparks:
              hosts: {}
          vars:
            sparkserve_recipe: lab-tp2
        """)
    assert refused_as_read(playbook(tmp_path, inventory, name)) == (
        f"inventory {inventory}: the sparks group has no hosts, so sparkserve has no Spark to run on and every "
        f"play would be skipped; the inventory has no host at all. Fix: {FIX}."
    )


def test_hosts_under_all_without_a_sparks_group_are_refused(tmp_path: Path) -> None:
    inventory = write(tmp_path, """\
        all:
          hosts:
            spark-a: {ansible_host: 127.0.0.11, sparkserve_rank: 0}
            spark-b: {ansible_host: 127.0.0.12, sparkserve_rank: 1}
          vars:
            sparkserve_recipe: lab-tp2
        """)
    assert refused_as_read(playbook(tmp_path, inventory, "site.yml")) == (
        f"inventory {inventory}: there is no sparks group, so sparkserve has no Spark to run on and every play "
        f"would be skipped; its hosts (spark-a, spark-b) sit directly under all. Fix: {FIX}."
    )


@pytest.mark.parametrize("extra", [[], ["-e", "sparkserve_recipe=lab-tp2"]])
def test_a_plain_inventory_given_to_a_sparkserve_playbook_is_refused(tmp_path: Path, extra: list[str]) -> None:
    """No sparks group and no sparkserve_* variable: the playbook says what the inventory is for."""
    inventory = write(tmp_path, """\
        all:
          hosts:
            spark-a: {ansible_host: 127.0.0.11}
            spark-b: {ansible_host: 127.0.0.12}
        """)
    for name in ("site.yml", "playbooks/render.yml", "playbooks/stop.yml"):
        assert refused_as_read(playbook(tmp_path, inventory, name, *extra)) == (
            f"inventory {inventory}: there is no sparks group, so sparkserve has no Spark to run on and every play "
            f"would be skipped; its hosts (spark-a, spark-b) sit directly under all. Fix: {FIX}."
        )


def test_an_inventory_whose_every_deployment_is_absent_goes_to_site_yml_alone(tmp_path: Path) -> None:
    """site.yml stops the deployments marked absent, which is all there is to do; the other playbooks say so."""
    inventory = write(tmp_path, """\
        plugin: sparkserve.deploy.spark_cluster
        management_subnet: 127.0.0.0/24
        deployments:
          - {name: old-model, recipe: lab-tp1, state: absent}
        nodes:
          - {name: spark-1, address: 127.0.0.11}
        """, "one.sparks.yml")
    for name in ("playbooks/status.yml", "playbooks/render.yml", "playbooks/bench.yml", "playbooks/stop.yml"):
        assert refused_as_read(playbook(tmp_path, inventory, name)) == (
            f"inventory {inventory}: every deployment it names is marked state: absent, so there is nothing here to "
            "serve or ask. site.yml (sparkserve up) stops them; mark one present to serve it again."
        )
    listed = playbook(tmp_path, inventory, "site.yml", "--list-hosts")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    stop = listed.stdout.split("Stop the engine", 1)[1]
    assert re.match(r"\s+TAGS: \[\]\s+pattern: \['absent'\]\s+hosts \(1\):\s+spark-1\n", stop), stop
    # The play that refuses an inventory with no Spark (for the inventories the guard does not see) lets it by.
    assert re.search(r"Check the inventory has a Spark\s+TAGS: \[\]\s+pattern: \[\]\s+hosts \(0\)", listed.stdout)


def test_an_inventory_given_as_a_host_list_stops_the_run(tmp_path: Path) -> None:
    """-i a,b, is no file, so the guard never sees it; the context play refuses it with the guard's sentence."""
    done = ansible(tmp_path, "ansible-playbook", "-i", "spark-a,spark-b,", str(ROOT / "site.yml"))
    assert done.returncode != 0, done.stdout
    # Nothing ran on a host: the first play, on the controller, stopped the run.
    assert "PLAY [Check the inventory has a Spark]" in done.stdout
    assert "spark-a " not in done.stdout.split("PLAY RECAP")[-1], done.stdout
    # The run's stop reason (the stop_reason callback) is the last thing shown.
    assert done.stderr.strip().splitlines()[-1] == (
        "inventory spark-a,spark-b,: there is no sparks group, so sparkserve has no Spark to run on and every play "
        "would be skipped; its hosts (spark-a, spark-b) sit directly under all. Fix: %s." % FIX)


def test_a_misspelt_sparks_group_given_to_a_playbook_is_pointed_at(tmp_path: Path) -> None:
    inventory = write(tmp_path, "spark:\n  hosts:\n    spark-a: {ansible_host: 127.0.0.11}\n")
    assert refused_as_read(playbook(tmp_path, inventory, "site.yml")).endswith(
        "its hosts (spark-a) are in spark, not in sparks (is the group spark meant to be sparks?). Fix: %s." % FIX)


def test_a_misspelt_sparks_group_is_pointed_at(tmp_path: Path) -> None:
    inventory = write(tmp_path, """\
        spark:
          hosts:
            spark-a: {ansible_host: 127.0.0.11, sparkserve_rank: 0}
        """)
    done = ansible(tmp_path, "ansible-inventory", "-i", str(inventory), "--graph")
    assert refused_as_read(done) == (
        f"inventory {inventory}: there is no sparks group, so sparkserve has no Spark to run on and every play "
        f"would be skipped; its hosts (spark-a) are in spark, not in sparks (is the group spark meant to be sparks?). "
        f"Fix: {FIX}."
    )


def test_an_inventory_not_meant_for_sparkserve_is_left_alone(tmp_path: Path) -> None:
    """No sparks group and no sparkserve_* variable: the lab's and molecule's own inventories."""
    inventory = write(tmp_path, "all:\n  hosts:\n    builder: {ansible_host: 127.0.0.1}\n")
    done = ansible(tmp_path, "ansible-inventory", "-i", str(inventory), "--graph")
    assert done.returncode == 0, done.stderr
    assert "builder" in done.stdout
    # The lab's own playbooks run on the controller with whatever inventory they are given.
    done = playbook(tmp_path, inventory, "playbooks/lab-destroy.yml", "--syntax-check")
    assert done.returncode == 0, done.stderr


# --- 3. values that would fail later on the nodes ---------------------------------------------


def test_a_node_name_with_a_space_is_refused_before_any_task_on_a_spark(tmp_path: Path) -> None:
    text = (ROOT / "inventory/example/hosts.yml").read_text(encoding="utf-8")
    text = text.replace("spark-b", "spark b").replace("192.168.1.", "127.0.0.")
    inventory = write(tmp_path, text)
    message = refused_by_the_recipe_role(playbook(tmp_path, inventory, "site.yml"))
    assert message == (
        f"inventory {inventory}: node name 'spark b' (name in a .sparks.yml, the host's name in a YAML inventory) "
        "has a space, so the nodes' ssh config would read it as 2 names (spark, b); rename the node with letters, "
        "digits, '.', '-' and '_' only, starting with a letter or digit, for example spark-b."
    )


def cluster_of_models(tmp_path: Path, models: int, monitoring: bool = False, absent_on_spark_2: bool = False) -> Path:
    """Deployments of lab-tp1 on spark-1, each host DEPLOYMENT@NODE, with the gateway (on by default), monitoring
    when asked, and one more deployment marked absent alone on spark-2 when asked."""
    deployments = "\n".join(f"  - {{name: m{n}, recipe: lab-tp1, nodes: [spark-1], api_port: {8000 + n}, "
                             f"master_port: {29500 + n}}}" for n in range(models))
    if absent_on_spark_2:
        deployments += "\n  - {name: gone, recipe: lab-tp1, nodes: [spark-2], state: absent}"
    return write(tmp_path, f"""\
plugin: sparkserve.deploy.spark_cluster
management_subnet: 127.0.0.0/24
nodes:
  - {{name: spark-1, address: 127.0.0.11}}
  - {{name: spark-2, address: 127.0.0.12}}
deployments:
{deployments}
vars:
  sparkserve_monitoring: {str(monitoring).lower()}
  lab_engine_image: registry.lab/engine@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  lab_model_revision: 0123456789abcdef0123456789abcdef01234567
  weights_hf_token: a-token-for-the-gated-lab-model
""", "models.sparks.yml")


def test_a_gateway_host_that_names_no_node_is_refused_before_any_task_on_a_spark(tmp_path: Path) -> None:
    """It would leave no gateway anywhere and bind every API to its fabric address."""
    inventory = cluster_of_models(tmp_path, 2)
    message = refused_by_the_recipe_role(playbook(tmp_path, inventory, "site.yml", "-e", "gateway_host=spark-9"))
    assert message == (
        "the gateway's node spark-9 (gateway_host) is no node of the inventory (spark-1); name one of them, or leave "
        "gateway_host out (the first deployment's head node)."
    )


def test_a_gateway_host_on_a_node_where_every_deployment_is_absent_is_refused(tmp_path: Path) -> None:
    """No gateway runs on a node that serves nothing: naming one would leave no gateway anywhere."""
    inventory = cluster_of_models(tmp_path, 1, absent_on_spark_2=True)
    message = refused_by_the_recipe_role(playbook(tmp_path, inventory, "site.yml", "-e", "gateway_host=spark-2"))
    assert message == (
        "the gateway's node spark-2 (gateway_host) runs no deployment (each one there is marked absent), so no "
        "gateway would run; name a node that serves (spark-1), or leave gateway_host out (the first deployment's "
        "head node)."
    )


def refused_by_monitoring(done: subprocess.CompletedProcess[str]) -> str:
    """The stop reason of a run the monitoring role's checks stopped in the context play, with nothing changed."""
    assert done.returncode != 0 and not re.search(r"changed=[1-9]", done.stdout), done.stdout
    assert "monitoring : Check" in done.stdout.split("PLAY RECAP")[0].rsplit("TASK [", 1)[1], done.stdout
    return done.stderr.strip().splitlines()[-1]


def test_monitoring_checks_the_gateway_node_among_the_nodes_that_serve(tmp_path: Path) -> None:
    """Each host of a cluster file with deployments is DEPLOYMENT@NODE: the gateway's node is a node, and one where
    a deployment is present (spark-2 holds only one marked absent)."""
    inventory = cluster_of_models(tmp_path, 1, monitoring=True, absent_on_spark_2=True)
    done = playbook(tmp_path, inventory)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "monitoring : Check the gateway node, whose metrics Prometheus scrapes" in done.stdout
    for node in ("spark-7", "spark-2"):
        assert refused_by_monitoring(playbook(tmp_path, inventory, "playbooks/render.yml", "-e",
                                              f"monitoring_gateway_node={node}")) == (
            f"the gateway runs on {node} (monitoring_gateway_node), which is no node of the inventory that serves "
            "(spark-1); name one of them, or turn the gateway off (sparkserve_gateway: false)"
        )


def test_monitoring_several_deployments_passes_the_context_checks(tmp_path: Path) -> None:
    """Two deployments on one Spark, monitored: every check of the context play passes (nothing is refused)."""
    done = playbook(tmp_path, cluster_of_models(tmp_path, 2, monitoring=True))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "monitoring : Check the monitoring server is one of the Sparks" in done.stdout


# --- 4. cluster-file errors, a missing inventory, a recipe saved as .yaml -------------------------


def cluster_file(tmp_path: Path, name: str = "lab.sparks.yml", mtu: int = 9000) -> Path:
    return write(tmp_path, f"""\
        plugin: sparkserve.deploy.spark_cluster
        recipe: lab-tp2
        fabric:
          mtu: {mtu}
          twins:
            - {{interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 10.77.1.0/24}}
        nodes:
          - {{name: spark-1, address: 127.0.0.11}}
          - {{name: spark-2, address: 127.0.0.12}}
        """, name)


def test_a_bad_cluster_file_is_the_one_error_shown(tmp_path: Path) -> None:
    inventory = cluster_file(tmp_path, mtu=90000)
    assert refused_as_read(playbook(tmp_path, inventory, "site.yml")) == (
        f"{inventory}: 1 problem in the Spark cluster file:\n"
        "line 4: fabric MTU 90000 is outside 1280..9216; set sparkserve_fabric_mtu (fabric.mtu in a .sparks.yml) "
        "to a whole number in 1280..9216: 9000, the Spark community default, or 1500."
    )


def test_a_missing_inventory_file_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "mycluster.sparks.yml"
    assert refused_as_read(playbook(tmp_path, missing, "site.yml")) == (
        f"inventory {missing} does not exist; give -i the path of your inventory: a cluster file whose name ends in "
        ".sparks.yml (inventory/example/two-sparks.sparks.yml) or a YAML inventory (inventory/example/hosts.yml)."
    )


def test_a_cluster_file_not_named_sparks_yml_is_told_to_rename(tmp_path: Path) -> None:
    inventory = cluster_file(tmp_path, name="lab.yml")
    assert refused_as_read(playbook(tmp_path, inventory)) == (
        f"{inventory}:1: plugin: sparkserve.deploy.spark_cluster makes this a Spark cluster file, but the "
        "spark_cluster inventory plugin reads only files whose name ends in .sparks.yml, so no plugin reads it; "
        f"rename it to {tmp_path}/lab.sparks.yml."
    )


def test_a_recipe_saved_as_yaml_is_told_to_rename(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    shutil.copy(ROOT / "recipes/lab-tp2.yml", recipes / "lab-tp2.yml")
    shutil.copy(ROOT / "recipes/lab-tp2.yml", recipes / "mine.yaml")
    inventory = cluster_file(tmp_path)
    message = refused_by_the_recipe_role(playbook(tmp_path, inventory, "site.yml", "-e", f"recipe_dir={recipes}",
                                                  "-e", "sparkserve_recipe=mine"))
    assert message == (
        f'inventory {inventory}: recipe "mine" is {recipes}/mine.yaml, but sparkserve reads recipes from files '
        f"named NAME.yml only; rename it to {recipes}/mine.yml (sparkserve_recipe stays mine)."
    )


# --- 5. one node is "1 node" ----------------------------------------------------------------


def test_one_node_is_one_node(tmp_path: Path) -> None:
    inventory = write(tmp_path, """\
        sparks:
          children:
            head:
              hosts:
                spark-a:
          hosts:
            spark-a:
              ansible_host: 127.0.0.11
              sparkserve_rank: 1
              sparkserve_fabric_ip: 10.77.1.1
              sparkserve_fabric_ips: [10.77.1.1]
          vars:
            sparkserve_recipe: lab-tp2
            sparkserve_world_size: 1
            sparkserve_head_fabric_ip: 10.77.1.1
            sparkserve_fabric_mtu: 9000
            sparkserve_fabric_interfaces: [enp1s0f1np1]
            sparkserve_rdma_devices: [rocep1s0f1, roceP2p1s0f1]
            sparkserve_fabric_subnets: [10.77.1.0/24]
        """)
    message = refused_by_the_recipe_role(playbook(tmp_path, inventory))
    assert message == (
        f"inventory {inventory}: the twin lists differ in length: 1 interface, 2 RDMA devices, 1 subnet; "
        "give sparkserve_fabric_interfaces, sparkserve_rdma_devices and sparkserve_fabric_subnets one entry per twin."
    )
    inventory.write_text(inventory.read_text(encoding="utf-8").replace("rocep1s0f1, roceP2p1s0f1", "rocep1s0f1"),
                         encoding="utf-8")
    message = refused_by_the_recipe_role(playbook(tmp_path, inventory))
    assert message == (
        f"inventory {inventory}: rank (sparkserve_rank) is 1 but 1 node needs rank 0; give the node rank 0.\n"
        f"inventory {inventory}: spark-a: the head has rank 1; the head must be rank 0, give it rank 0 and the "
        "workers 1 and up."
    )
    assert "1 nodes" not in message
