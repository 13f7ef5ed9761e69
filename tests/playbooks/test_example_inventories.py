"""Every example inventory works as shipped with playbooks/render.yml, used as the README shows.

Each one renders, or, where its seed recipe needs values only its user has
(an image digest, a model commit: the recipe's ``*_from`` keys), stops with
just the list of those values. render.yml touches no host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "inventory/example").iterdir())
# What the user supplies besides the *_from values: a file the recipe names that only its user has.
SUPPLIED_FILE = "which is not in the recipes folder"


def render(inventory: Path) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    assert found, "ansible-playbook is not installed"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CACHE_PLUGIN="memory")
    env.pop("HF_TOKEN", None)
    return subprocess.run([found, "-i", str(inventory.relative_to(ROOT)), "playbooks/render.yml"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def from_variables(node: Any) -> set[str]:
    """The inventory variables a recipe takes values from (the values of its *_from keys)."""
    if isinstance(node, dict):
        found = {str(value) for key, value in node.items() if str(key).endswith("_from")}
        return found.union(*(from_variables(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(from_variables(item) for item in node))
    return set()


def recipes_and_variables(inventory: Path) -> tuple[list[str], set[str]]:
    """The recipes an example serves (its recipe, or each deployment's), and the variables it sets for every node."""
    data = yaml.safe_load(inventory.read_text(encoding="utf-8"))
    if "plugin" in data:
        recipes = [data["recipe"]] if "recipe" in data else [
            entry["recipe"] for entry in data["deployments"] if entry.get("state", "present") == "present"]
        return recipes, set(data.get("vars") or {})
    variables = data["sparks"]["vars"]
    return [variables["sparkserve_recipe"]], set(variables)


def test_every_example_is_tried() -> None:
    assert {path.name for path in EXAMPLES} >= {"hosts.yml", "two-sparks.sparks.yml", "four-sparks.sparks.yml"}


@pytest.mark.parametrize("inventory", EXAMPLES, ids=lambda path: path.name)
def test_example_renders_or_lists_only_what_its_user_supplies(inventory: Path) -> None:
    done = render(inventory)
    out = done.stdout + done.stderr
    recipes, given = recipes_and_variables(inventory)
    recipe = recipes[0]
    wanted = from_variables(yaml.safe_load((ROOT / "recipes" / f"{recipe}.yml").read_text(encoding="utf-8"))) - given
    if done.returncode == 0:
        # Every deployment's head shows its container and command line.
        assert len(re.findall(r"rank 0 on \S+: container \S+-rank0", done.stdout)) == len(recipes), out
        assert "command: vllm serve" in done.stdout or "command: python3 -m sglang" in done.stdout, out
        return
    assert "is undefined" not in out and "Traceback" not in out, out
    errors = re.findall(r"^\[ERROR\]: Task failed: Action failed: (.*?)\nOrigin: .*?roles/recipe/tasks/(?:render|read)"
                        r"\.yml", out, re.MULTILINE | re.DOTALL)
    assert len(errors) == 1, out  # the recipe check is the one that stops it
    lines = errors[0].splitlines()
    assert all(line.startswith(f"recipe {recipe}") for line in lines), lines
    unset = {name for line in lines for name in re.findall(r"names the inventory variable (\w+), which is not set",
                                                           line)}
    assert unset == wanted, (unset, wanted)  # each value the user supplies, and only those
    others = [line for line in lines if "names the inventory variable" not in line and SUPPLIED_FILE not in line]
    assert others == [], others


def test_a_setting_of_the_wrong_type_is_refused_before_any_host_changes(tmp_path: Path) -> None:
    """A monitoring server that is no Spark, or an MTU that is no number, stops the context play on the controller."""
    inventory = ROOT / "inventory/example/two-sparks.sparks.yml"
    beside = Path(sys.executable).parent / "ansible-playbook"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory")
    for extra, said in (
            (["-e", "fabric_mtu=jumbo"], "fabric_mtu is 'jumbo', but the fabric role takes an int"),
            (["-e", "monitoring_server=laptop"],
             "monitoring_server is laptop, which is not one of the Sparks")):
        done = subprocess.run([str(beside), "-i", str(inventory.relative_to(ROOT)), "site.yml", *extra], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode != 0
        assert said in done.stderr, done.stdout[-3000:] + done.stderr
        # Only the context play ran: preflight, the first stage that reaches a host, never started.
        assert "PLAY [Preflight the Sparks]" not in done.stdout, done.stdout[-3000:]
