"""What a rendered deployment looks like on the nodes, for the engine role (module_utils/recipe/layout.py)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe import layout

DOCUMENTATION = r"""
name: engine_layout
short_description: A rendered deployment's volumes, watched containers, start order, endpoint and fingerprint inputs
version_added: "0.3.0"
description:
  - From the rendered recipe, its ranks and the engine adapter's facts (the recipe role's), with the node folders
    and names the engine role takes as options, on the controller.
  - Returns C(volumes) (every rank container's, HOST:CONTAINER[:ro]), C(cache_dirs), C(overlay_set_dir),
    C(watched) (each rank's container as the readiness wait watches it), C(start_order), C(endpoint) (where a user
    reaches the API, what serves there) and C(fingerprint_inputs) (all a rank container is made from but the
    nodes' fabric environment).
options:
  _input:
    description: The rendered recipe (the engine role's C(engine_recipe)).
    type: dict
    required: true
  ranks:
    description: Each rank's render by rank number (C(engine_ranks)).
    type: dict
    required: true
  adapter:
    description: The engine adapter's facts (C(engine_adapter)).
    type: dict
    required: true
  deployment:
    description: The deployment's name.
    type: str
    required: true
  dirs:
    description: The node folders, C(models), C(overlays), C(overrides) and C(cache).
    type: dict
    required: true
  host_of_rank:
    description: The node of each rank.
    type: dict
    required: true
  nodes:
    description: The Sparks, in inventory order.
    type: list
    elements: str
    required: true
  head:
    description: The head's inventory name.
    type: str
    required: true
  head_address:
    description: The head's management address (its C(ansible_host)).
    type: str
    required: true
  ssh_user:
    description: The user the controller reaches the head as.
    type: str
    required: true
  gpus:
    description: The GPUs each rank container gets (C(engine_gpus)).
    type: raw
    required: true
  loopback_hosts:
    description: The addresses that mean the node itself (C(sparkserve_loopback_hosts)).
    type: list
    elements: str
    required: true
  wildcard_hosts:
    description: The addresses that mean every interface (C(sparkserve_wildcard_hosts)).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
__engine_layout: >-
  {{ engine_recipe | sparkserve.deploy.engine_layout(engine_ranks, engine_adapter, engine_deployment, dirs,
     host_of_rank, sparkserve_deployment_hosts, sparkserve_head, head_address, 'root', engine_gpus,
     sparkserve_loopback_hosts, sparkserve_wildcard_hosts) }}
"""

RETURN = r"""
_value:
  description: The layout (see the description).
  type: dict
"""


def engine_layout(recipe: Mapping[str, Any], ranks: Mapping[Any, Any], adapter: Mapping[str, Any], deployment: str,
                  dirs: Mapping[str, str], host_of_rank: Mapping[Any, str], nodes: Sequence[str], head: str,
                  head_address: str, ssh_user: str, gpus: Any, loopback_hosts: Sequence[str],
                  wildcard_hosts: Sequence[str]) -> dict[str, Any]:
    try:
        return layout.engine_layout(recipe, ranks, adapter, deployment, dirs, host_of_rank, nodes, head,
                                    head_address, ssh_user, gpus, loopback_hosts, wildcard_hosts)
    except (KeyError, TypeError, ValueError) as error:
        raise AnsibleFilterError(f"engine_layout: the render lacks {error}; render the recipe again") from error


class FilterModule:
    """sparkserve.deploy.engine_layout."""

    def filters(self) -> dict[str, Any]:
        return {"engine_layout": engine_layout}
