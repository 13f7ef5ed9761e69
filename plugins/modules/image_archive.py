#!/usr/bin/python
"""Check an image archive against the recipe, before anything is loaded, and load it under its local name."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_archive
short_description: Check a docker save or OCI image archive against the recipe's image, then load it once
version_added: "0.6.0"
description:
  - Reads the archive's manifests and config, never its layers, and checks it holds the recipe's image before
    anything is loaded. An OCI archive copied from the registry (C(skopeo copy ... oci-archive:FILE)) holds the
    recipe's manifest, by O(image)'s digest, and its config; a C(docker save) archive does not keep the
    manifest, so its config must be O(image_id). The config's content is hashed; docker load checks every
    layer's content against it.
  - With O(load), makes O(local_name) name the image on this node. Nothing is done when it already does; a
    C(docker tag) when the node holds the image under another name; else C(docker load) (an OCI layout alone is
    given to docker load with a C(manifest.json) of its own, as Docker before 25 reads only that).
  - Without O(load) (on the controller, where the archive may lie), only checks it; RV(image_id) says which
    image the nodes must hold.
  - Check mode checks the archive and loads nothing.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  diff_mode:
    support: full
options:
  path:
    description: The archive (a tar, or a gzip or xz compressed tar).
    type: path
    required: true
  image:
    description: The recipe's image, C(REPO@sha256:<64 hex>).
    type: str
    required: true
  image_id:
    description: The image's ID (C(sha256:<64 hex>), the digest of its config), which a C(docker save) archive is
      checked against.
    type: str
    default: ""
  local_name:
    description: The name every node holds the image under; C(REPO:sha256-<hex>) when not given.
    type: str
  load:
    description: Load the image into this node's dockerd (else only check the archive).
    type: bool
    default: true
  platform:
    description: The platform chosen when the recipe's digest names an index of several (C(OS/ARCH)); this
      node's when not given.
    type: str
  docker:
    description: The docker client.
    type: str
    default: docker
notes:
  - Standard library only; runs with the node's python3 (or the controller's).
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Check the archive on the controller
  sparkserve.deploy.image_archive:
    path: images/vllm.tar
    image: "{{ recipe_config.image }}"
    image_id: "{{ recipe_config.image_id }}"
    load: false
  delegate_to: localhost
"""

RETURN = r"""
image_id:
  description: The archive's image ID.
  returned: success
  type: str
checked_by:
  description: C(digest) (the archive holds the recipe's manifest) or C(image_id).
  returned: success
  type: str
loaded:
  description: Whether docker load ran (would run, in check mode).
  returned: success
  type: bool
tagged:
  description: Whether the local name was made or moved to the image.
  returned: success
  type: bool
"""

import os
import subprocess
from typing import IO, Any, Dict, cast

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.images import (
    ImageError,
    docker_archive_stream,
    image_id_of,
    local_ref,
    read_archive,
    tag_diff,
    tag_image,
)

ARGUMENT_SPEC: Dict[str, Any] = {
    "path": {"type": "path", "required": True},
    "image": {"type": "str", "required": True},
    "image_id": {"type": "str", "default": ""},
    "local_name": {"type": "str"},
    "load": {"type": "bool", "default": True},
    "platform": {"type": "str"},
    "docker": {"type": "str", "default": "docker"},
}
ARCHES = {"aarch64": "arm64", "x86_64": "amd64"}


def this_platform() -> str:
    machine = os.uname().machine
    return f"linux/{ARCHES.get(machine, machine)}"


def docker_load(docker: str, path: str, checked: Any) -> str:
    """Give the archive to docker load; what it said on failure, else empty."""
    with subprocess.Popen([docker, "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as loader:
        try:
            docker_archive_stream(path, checked, cast(IO[bytes], loader.stdin))  # a pipe: stdin=PIPE
        except BrokenPipeError:
            pass  # docker load stopped reading; what it said tells why
        # communicate() flushes and closes stdin itself, ignoring a broken pipe (closed before, it raised ValueError)
        out, err = loader.communicate()
    if loader.returncode != 0:
        return (err or out).decode("utf-8", "replace").strip() or f"exit {loader.returncode}"
    return ""


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    try:
        local = p["local_name"] or local_ref(p["image"])
        digest = p["image"].rsplit("@", 1)[-1]
        checked = read_archive(p["path"], digest, p["image_id"], p["platform"] or this_platform())
    except ImageError as err:
        module.fail_json(msg=str(err), kind="archive_refused")
    out = {"image_id": checked.image_id, "checked_by": checked.checked_by, "loaded": False, "tagged": False}
    if not p["load"]:
        module.exit_json(changed=False, **out)
    named = image_id_of(p["docker"], local)
    if named == checked.image_id:
        module.exit_json(changed=False, **out)
    out["loaded"] = image_id_of(p["docker"], checked.image_id) is None
    out["tagged"] = True
    if module.check_mode:
        module.exit_json(changed=True, diff=tag_diff(local, named, checked.image_id), **out)
    if out["loaded"]:
        said = docker_load(p["docker"], p["path"], checked)
        if said or image_id_of(p["docker"], checked.image_id) is None:
            module.fail_json(msg=f"docker load of {p['path']} failed: {said or 'it did not load ' + checked.image_id}",
                             kind="archive_load_failed", **out)
    tag_err = tag_image(p["docker"], checked.image_id, local)
    if tag_err:
        module.fail_json(msg=tag_err, kind="image_tag_failed")
    module.exit_json(changed=True, diff=tag_diff(local, named, checked.image_id), **out)


if __name__ == "__main__":
    main()
