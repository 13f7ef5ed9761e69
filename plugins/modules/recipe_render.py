#!/usr/bin/python
"""Validate a recipe for a cluster and render every rank's engine command line."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: recipe_render
short_description: Validate a recipe and render each rank's container name, command line, environment and ports
version_added: "0.1.0"
description:
  - Reads the recipe C(recipes/NAME.yml) (or takes it loaded, O(recipe)), checks it against the recipe schema,
    fills its defaults, and checks it against the cluster (parallel sizes against the node count, load format,
    Hugging Face token of a gated model).
  - Fails with every problem found, one per line, each naming the field, the bad value and the fix; when the
    module read the file, each also names the file and the line of the field. A file that is not valid YAML,
    is empty, is not a mapping or gives a key twice is refused with the file, line and column.
  - Otherwise returns the recipe with its defaults and, for each rank given, the container name, the engine's
    argument vector, the container environment and the ports the rank listens on.
  - Changes nothing and runs the same in check mode. Runs on the controller, in the playbook's own process
    (its action plugin).
  - The schema is documented field by field in C(recipes/README.md).
options:
  recipe:
    description:
      - The recipe, as loaded from its YAML file, for a caller that loads it itself. Anything but a mapping is
        refused with what the recipe must be.
      - Left out (or null), the module reads O(recipe_dir)/O(name).yml itself, with PyYAML's safe loader. The
        action plugin does so on the controller, which has PyYAML; run as a module on a host without PyYAML,
        give O(recipe).
    type: raw
  name:
    description: The recipe's name (its file name without C(.yml)); it must equal the recipe's C(name).
    type: str
    required: true
  deployment:
    description: Name of the deployment; container names are made from it.
    type: str
    required: true
  world_size:
    description: Number of nodes the deployment runs on.
    type: int
    required: true
  ranks:
    description: The ranks to render.
    type: list
    elements: dict
    required: true
    suboptions:
      rank:
        description: The node's rank, from 0 (the head) to O(world_size) - 1.
        type: int
        required: true
      head_fabric_ip:
        description: The head's fabric address, where the ranks meet; a deployment on one node needs none.
        type: str
  hf_token_present:
    description: Whether a Hugging Face token is configured (C(weights_hf_token) or C(HF_TOKEN)).
    type: bool
    default: false
  variables:
    description:
      - Values of the variables the recipe's C(*_from) fields name (C(image_from), C(model.revision_from),
        C(overlays_from), C(model.file_overrides[].sha256_from), ...), by variable name.
      - A named variable missing here is an error, reported with what to set it to and where to find it (the
        recipe's C(supply)); every missing one is reported at once.
    type: dict
    default: {}
  ports:
    description:
      - The deployment's ports where the inventory sets them (C(api_port), C(master_port)); they replace the
        recipe's C(launch) values, as the inventory plugin assigned them for deployments that share a node.
      - C(api_host) likewise, where the engine API binds while the gateway runs (loopback or the fabric address).
    type: dict
    default: {}
  recipe_dir:
    description:
      - The recipes folder. When given, every file the recipe names there (C(overlays[].patch),
        C(file_overrides[].source)) must exist, and each override must have its C(sha256) and hold the values
        its C(expect) names (read here, on the controller, before any node is touched).
      - Without O(recipe), the recipe is read from here; one of the two must be given.
    type: path
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    description: Changes nothing in any mode.
  diff_mode:
    support: none
    description: There is nothing to compare.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Render both ranks of a two-node deployment (the module reads recipes/glm53-fp4local-mtp-tp2.yml)
  sparkserve.deploy.recipe_render:
    recipe_dir: "{{ playbook_dir }}/../recipes"
    name: glm53-fp4local-mtp-tp2
    deployment: glm53
    world_size: 2
    ranks:
      - rank: 0
        head_fabric_ip: 192.168.100.1
      - rank: 1
        head_fabric_ip: 192.168.100.1
    hf_token_present: "{{ weights_hf_token is defined }}"
  delegate_to: localhost
  run_once: true
  register: __recipe

- name: Render one rank with the lab's image and model revision
  sparkserve.deploy.recipe_render:
    recipe: "{{ lookup('ansible.builtin.file', 'recipes/lab-tp2.yml') | from_yaml }}"
    name: lab-tp2
    deployment: lab
    world_size: 2
    ranks:
      - rank: "{{ sparkserve_rank }}"
        head_fabric_ip: "{{ sparkserve_head_fabric_ip }}"
    variables:
      lab_engine_image: "{{ lab_engine_image }}"
      lab_model_revision: "{{ lab_model_revision }}"
    recipe_dir: "{{ playbook_dir }}/../recipes"
  delegate_to: localhost
  register: __recipe_rank
"""

RETURN = r"""
recipe:
  description: The recipe with every default filled and C(image) and C(revision) resolved from their variables.
  returned: success
  type: dict
ranks:
  description: One entry per rank given, in the same order.
  returned: success
  type: list
  elements: dict
  contains:
    rank:
      description: The rank.
      type: int
    container_name:
      description: The rank's container name.
      type: str
    argv:
      description: The engine's command line, one word per item.
      type: list
      elements: str
    env:
      description:
        - The container environment, the engine's own then the recipe's C(env). Each node adds its fabric
          environment from its own file (C(/etc/sparkserve/fabric.env), the fabric stage writes it).
      type: dict
    ports:
      description: TCP ports the rank listens on (rank 0 the API, master and extra ports; others the extra ports).
      type: list
      elements: int
    mounts:
      description:
        - Read-only file mounts of the rank, one per C(file_overrides) entry of the model and the draft model,
          each C(source_rel) (relative to the recipes folder), C(target) (path in the container) and C(sha256).
      type: list
      elements: dict
    endpoints:
      description:
        - On rank 0, the head's HTTP paths C(health), C(models), C(completions) and C(metrics) (null where the
          engine serves no metrics, SGLang without C(enable-metrics)); empty on the other ranks.
      type: dict
engine:
  description:
    - What the roles and modules need of the recipe's engine, from its adapter (C(module_utils/engines)),
      C(name), C(host_ip_variable), C(endpoints), C(dead_health_pattern), C(fatal_log_patterns),
      C(cache_mounts) (each C(name) under the node's cache folder and C(container_path)) and C(metric_names).
  returned: success
  type: dict
errors:
  description: Every problem found, one message each; the failure message joins them with newlines.
  returned: failure
  type: list
  elements: str
"""

import os
from typing import Any, Dict, List

from ansible_collections.sparkserve.deploy.plugins.module_utils.controller_module import run_module
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.load import load_recipe_file, locate
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.render import engine_facts, render_rank
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import (
    validate_for_cluster,
    validate_recipe,
)

ARGUMENT_SPEC: Dict[str, Any] = {
    "recipe": {"type": "raw"},
    "name": {"type": "str", "required": True},
    "deployment": {"type": "str", "required": True},
    "world_size": {"type": "int", "required": True},
    "ranks": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "rank": {"type": "int", "required": True},
            "head_fabric_ip": {"type": "str"},
        },
    },
    "hf_token_present": {"type": "bool", "default": False},
    "variables": {"type": "dict", "default": {}},
    "ports": {"type": "dict", "default": {}},
    "recipe_dir": {"type": "path"},
}


def run(params: Dict[str, Any]) -> Dict[str, Any]:
    """The module's result for these arguments (``failed``, ``msg`` and ``errors`` when refused).

    The action plugin of the same name calls it on the controller, in process.
    """
    name = params["name"]
    world_size = params["world_size"]
    data, path = params["recipe"], None
    lines: Dict[str, int] = {}
    if data is None:
        if not params["recipe_dir"]:
            return _failed(["recipe %s: neither recipe nor recipe_dir is given; give the recipes folder "
                            "(recipe_dir), or the loaded recipe." % name])
        path = os.path.join(params["recipe_dir"], name + ".yml")
        data, lines, errors = load_recipe_file(path, name)
        if errors:
            return _failed(errors)

    ports = {key: value for key, value in params["ports"].items() if value is not None}
    if ports and isinstance(data, dict):
        launch = data.get("launch")
        data = dict(data, launch=dict(launch if isinstance(launch, dict) else {}, **ports))
    recipe, errors = validate_recipe(data, name, variables=params["variables"], recipes_dir=params["recipe_dir"])
    errors += validate_for_cluster(recipe, name, world_size, params["hf_token_present"])
    seen = set()
    for entry in params["ranks"]:
        rank = entry["rank"]
        if rank in seen:
            errors.append("recipe %s: rank %d is given twice in ranks; give each rank once." % (name, rank))
        seen.add(rank)
        if not 0 <= rank < max(world_size, 1):
            errors.append("recipe %s: rank %d is outside the cluster of %d node%s; ranks go from 0 to %d."
                          % (name, rank, world_size, "" if world_size == 1 else "s", world_size - 1))
    if errors:
        return _failed(locate(errors, name, path, lines) if path else errors)

    rendered = []
    for entry in params["ranks"]:
        try:
            one = render_rank(recipe, params["deployment"], entry["rank"], world_size, entry["head_fabric_ip"] or "")
        except ValueError as exc:
            errors.append("recipe %s: rank %d: %s." % (name, entry["rank"], exc))
            continue
        rendered.append(dict(rank=entry["rank"], **one))
    if errors:
        return _failed(errors)
    return {"changed": False, "recipe": recipe, "ranks": rendered, "engine": engine_facts(recipe)}


def _failed(errors: List[str]) -> Dict[str, Any]:
    return {"failed": True, "msg": "\n".join(errors), "errors": errors, "changed": False}


def main() -> None:
    run_module(ARGUMENT_SPEC, run)


if __name__ == "__main__":
    main()
