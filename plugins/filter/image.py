"""The image stage's plan: the name every node holds the image under, the node it comes from, who lacks it."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.images import ImageError, cache_key, local_ref

DOCUMENTATION = r"""
name: image_local_name
short_description: The local name of a recipe's image, REPO:sha256-<hex> for REPO@sha256:<hex>
version_added: "0.6.0"
description:
  - A node that received the image over the fabric holds its image ID but not C(REPO@sha256:...), which Docker
    keeps only for pulls; the image stage names the image this way on every node, and every container of the
    deployment (the ranks, the weights download, the NCCL probe, the overlays' reads) runs it by this name.
options:
  _input:
    description: The recipe's image, C(REPO[:TAG]@sha256:<64 hex>).
    type: str
    required: true
"""

EXAMPLES = r"""
image: "{{ recipe_config.image | sparkserve.deploy.image_local_name }}"
"""

RETURN = r"""
_value:
  description: C(REPO:sha256-<64 hex>).
  type: str
"""


# What the image stage's probe says a node holds: [ID under the recipe's digest, ID under the local name], '-' for none.
NONE = "-"


def image_source(order: Sequence[str], held: Mapping[str, Sequence[str]], archive: bool = False) -> str:
    """The node the image comes from: with an archive, the first in order (the head, where it is loaded); else the
    first in order that holds the recipe's digest already (pulled before: Docker checked it), else the first."""
    if not order:
        raise AnsibleFilterError("image_source: the deployment has no host in this play")
    if not archive:
        for host in order:
            if (list(held.get(host) or []) + [NONE])[0] != NONE:
                return host
    return order[0]


def image_lacking(held: Mapping[str, Sequence[str]], source: str, image_id: str) -> list[str]:
    """The hosts, other than the source, whose local name does not hold image_id (in the order of held)."""
    return [host for host, ids in held.items()
            if host != source and (list(ids) + [NONE, NONE])[1] != image_id]


def image_held_everywhere(held: Mapping[str, Sequence[str]]) -> bool:
    """Whether nothing is to be pulled or relayed: a host holds the recipe's digest (a pull), and every host holds
    that image under the local name (the others received it over the fabric, which keeps no digest)."""
    pulled = {(list(ids) + [NONE])[0] for ids in held.values()} - {NONE}
    return len(pulled) == 1 and all((list(ids) + [NONE, NONE])[1] in pulled for ids in held.values())


def image_local_name(image: str) -> str:
    try:
        return local_ref(image)
    except ImageError as err:
        raise AnsibleFilterError(str(err)) from None


def image_cache_key(image: str) -> str:
    """The folder of the engine caches for the recipe's image, below the node's cache folder: sha256-<hex>."""
    try:
        return cache_key(image)
    except ImageError as err:
        raise AnsibleFilterError(str(err)) from None


class FilterModule:
    """sparkserve image filters."""

    def filters(self) -> dict[str, Any]:
        return {"image_local_name": image_local_name, "image_cache_key": image_cache_key, "image_source": image_source,
                "image_lacking": image_lacking, "image_held_everywhere": image_held_everywhere}
