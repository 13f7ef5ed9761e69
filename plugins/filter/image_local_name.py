"""The name every node holds a recipe's image under."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.images import ImageError, local_ref

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


def image_local_name(image: str) -> str:
    try:
        return local_ref(image)
    except ImageError as err:
        raise AnsibleFilterError(str(err)) from None


class FilterModule:
    """sparkserve image filters."""

    def filters(self) -> dict[str, Any]:
        return {"image_local_name": image_local_name}
