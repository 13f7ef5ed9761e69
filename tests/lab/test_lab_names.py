"""Which containers, networks and volumes a lab takes as its own (roles/lab/vars/main.yml).

Two labs run side by side in make test; each must find and remove only what it
made, including what a lab made before the name label existed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

VARS = Path(__file__).resolve().parents[2] / "roles" / "lab" / "vars" / "main.yml"
PATTERNS = ("__lab_node_pattern", "__lab_container_pattern", "__lab_network_pattern", "__lab_volume_pattern")


def rendered(lab_name: str, *names: str) -> list[str]:
    """Variables of the lab role's vars file, rendered by Ansible's own templating for one lab name."""
    variables = dict(yaml.safe_load(VARS.read_text(encoding="utf-8")), lab_name=lab_name)
    templar = Templar(loader=DataLoader(), variables=variables)
    return [str(templar.template(trust_as_template(variables[name]))) for name in names]


def patterns(lab_name: str) -> dict[str, str]:
    return dict(zip(PATTERNS, rendered(lab_name, *PATTERNS), strict=True))


def owned(pattern: str, names: list[str]) -> list[str]:
    return [name for name in names if re.match(pattern, name)]


EVERY_CONTAINER = ["sparkserve-lab-spark-1", "sparkserve-lab-spark-12", "sparkserve-lab-registry", "sparkserve-lab-hub",
                   "sparkserve-faults-spark-1", "sparkserve-faults-registry", "sparkserve-faults-hub",
                   "sparkserve-lab-x-spark-1", "lab-tp2-rank0"]


def test_the_default_lab_owns_its_containers_and_no_other_lab_s() -> None:
    own = patterns("sparkserve-lab")
    assert owned(own["__lab_container_pattern"], EVERY_CONTAINER) == [
        "sparkserve-lab-spark-1", "sparkserve-lab-spark-12", "sparkserve-lab-registry", "sparkserve-lab-hub"]
    assert owned(own["__lab_node_pattern"], EVERY_CONTAINER) == ["sparkserve-lab-spark-1", "sparkserve-lab-spark-12"]


def test_a_second_lab_owns_only_its_own() -> None:
    own = patterns("sparkserve-faults")
    assert owned(own["__lab_container_pattern"], EVERY_CONTAINER) == [
        "sparkserve-faults-spark-1", "sparkserve-faults-registry", "sparkserve-faults-hub"]
    networks = ["sparkserve-lab-mgmt", "sparkserve-lab-fabric0", "sparkserve-faults-mgmt", "sparkserve-faults-fabric1",
                "bridge"]
    assert owned(own["__lab_network_pattern"], networks) == ["sparkserve-faults-mgmt", "sparkserve-faults-fabric1"]
    volumes = ["sparkserve-lab-registry", "sparkserve-lab-spark-1-docker", "sparkserve-faults-registry",
               "sparkserve-faults-spark-2-docker", "sparkserve-faults-spark-2-models", "sparkserve-faults-other"]
    assert owned(own["__lab_volume_pattern"], volumes) == [
        "sparkserve-faults-registry", "sparkserve-faults-spark-2-docker", "sparkserve-faults-spark-2-models"]


@pytest.mark.parametrize("lab_name", ["sparkserve-lab", "sparkserve-faults"])
def test_what_a_lab_names_it_owns(lab_name: str) -> None:
    own = patterns(lab_name)
    registry, hub, prefix, network, fabric = rendered(lab_name, "__lab_registry_container", "__lab_hub_container",
                                                      "__lab_node_prefix", "__lab_mgmt_network",
                                                      "__lab_fabric_network_prefix")
    made = [registry, hub, f"{prefix}spark-1", f"{prefix}spark-2"]
    assert all(name.startswith(f"{lab_name}-") for name in made)
    assert owned(own["__lab_container_pattern"], made) == made
    assert owned(own["__lab_network_pattern"], [network, f"{fabric}0"]) == [network, f"{fabric}0"]
