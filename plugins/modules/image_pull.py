#!/usr/bin/python
"""Pull the recipe's image by digest on one node and name it by its digest there."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_pull
short_description: Pull an image by digest once, with the registry's credentials, and give it its local name
version_added: "0.6.0"
description:
  - Pulls O(image) (C(REPO@sha256:<64 hex>)) through dockerd's API when the node does not hold it, then makes
    O(local_name) name the pulled image (C(docker tag)). Docker checks the pulled manifest against the digest.
  - The image stage runs it on one node per deployment (the head, or a node that already holds the digest) and
    relays the image to the others over the fabric (M(sparkserve.deploy.image_relay)).
  - O(auth) travels in the request's C(X-Registry-Auth) header, never written to disk; its password is never
    logged.
  - A digest the registry does not have, or credentials it refuses, fail with one sentence naming the
    registry, the repository, the digest and the recipe field, not Docker's API error.
  - Check mode pulls and tags nothing; RV(changed) says whether it would.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  diff_mode:
    support: full
options:
  image:
    description: The recipe's image, C(REPO@sha256:<64 hex>) (a C(REPO:TAG@sha256:...) keeps only the digest).
    type: str
    required: true
  local_name:
    description: The name every node holds the image under; C(REPO:sha256-<hex>) when not given.
    type: str
  auth:
    description: The registry's credentials, C(username) and C(password) (and C(registry) when it is not the
      image's); from Ansible Vault. Unset for a registry that needs none.
      Only the password is no_log, since Ansible masks a no_log value wherever it appears in the output
      (a username or registry that is part of the image's name would be masked in every message).
    type: dict
    suboptions:
      username:
        description: The registry user; without it, no credentials are sent.
        type: str
      password:
        description: Its password or token (no_log).
        type: str
      registry:
        description: The registry they are for, when it is not the image's.
        type: str
  socket:
    description: dockerd's API socket.
    type: path
    default: /var/run/docker.sock
  docker:
    description: The docker client, for reading and naming images.
    type: str
    default: docker
  timeout_s:
    description: How long the pull may take, in seconds.
    type: int
    default: 3600
notes:
  - Standard library only; runs with the node's python3.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Pull the recipe's image on the head
  sparkserve.deploy.image_pull:
    image: "{{ recipe_config.image }}"
    auth: "{{ image_registry_auth | default(omit, true) }}"
"""

RETURN = r"""
image_id:
  description: The image's ID (the digest of its config); null in check mode when it would be pulled.
  returned: always
  type: str
pulled:
  description: Whether the image was pulled (would be, in check mode).
  returned: always
  type: bool
tagged:
  description: Whether the local name was made or moved to the image.
  returned: always
  type: bool
"""

from typing import Any, Dict

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.images import (
    ImageError,
    image_id_of,
    local_ref,
    pull,
    tag_diff,
    tag_image,
)

ARGUMENT_SPEC: Dict[str, Any] = {
    "image": {"type": "str", "required": True},
    "local_name": {"type": "str"},
    # Only the password is no_log: Ansible masks a no_log value wherever it appears in the output, and the username
    # or the registry is often part of the image's name, which the failures name.
    "auth": {"type": "dict", "options": {"username": {"type": "str"}, "password": {"type": "str", "no_log": True},
                                         "registry": {"type": "str"}}},
    "socket": {"type": "path", "default": "/var/run/docker.sock"},
    "docker": {"type": "str", "default": "docker"},
    "timeout_s": {"type": "int", "default": 3600},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    try:
        local = p["local_name"] or local_ref(p["image"])
    except ImageError as err:
        module.fail_json(msg=str(err), kind="image_refused")
    found = image_id_of(p["docker"], p["image"])
    pulled = found is None
    if pulled and module.check_mode:
        module.exit_json(changed=True, image_id=None, pulled=True, tagged=True)
    if pulled:
        try:
            pull(p["image"], p["auth"], p["socket"], float(p["timeout_s"]))
        except ImageError as err:
            module.fail_json(msg=str(err), kind="image_pull_failed", image_id=None, pulled=False, tagged=False)
        found = image_id_of(p["docker"], p["image"])
        if found is None:
            module.fail_json(msg=f"dockerd pulled {p['image']} but does not find it", kind="image_pull_failed")
    named = image_id_of(p["docker"], local)
    tagged = named != found
    if tagged and not module.check_mode:
        tag_err = tag_image(p["docker"], str(found), local)
        if tag_err:
            module.fail_json(msg=tag_err, kind="image_tag_failed")
    module.exit_json(changed=pulled or tagged, image_id=found, pulled=pulled, tagged=tagged,
                     diff=tag_diff(local, named, found) if tagged else {})


if __name__ == "__main__":
    main()
