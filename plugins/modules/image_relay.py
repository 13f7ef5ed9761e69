#!/usr/bin/python
"""Send an image from this node to its peers over the fabric, in parallel, each checked by image ID."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_relay
short_description: Relay an image to peer nodes over the fabric (docker save into docker load over ssh)
version_added: "0.6.0"
description:
  - For each peer at once, streams C(docker save IMAGE_ID) into C(docker load) on the peer over the peer ssh that
    the access stage sets up (each peer's name goes to its fabric address), then names the image O(local_name)
    there and reads the name back, which must be O(image_id). docker load checks each layer's
    content against the image's config, whose digest is the image ID.
  - Nothing is kept half-way. A relay cut in the middle (the peer, the link or this node lost) leaves the
    peer without the name, fails naming it with what ssh or docker said, and the next run sends it again.
  - The image stage gives only the peers that lack the image under its name.
  - Check mode sends nothing; RV(changed) says whether it would.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  image_id:
    description: The image to send, by ID (C(sha256:<64 hex>)).
    type: str
    required: true
  local_name:
    description: The name the peers hold it under (C(REPO:sha256-<hex>)).
    type: str
    required: true
  peers:
    description: The peers' names (as this node's ssh knows them).
    type: list
    elements: str
    required: true
  ssh:
    description: The ssh command that reaches a peer (its name follows).
    type: list
    elements: str
    default: [ssh, -o, BatchMode=yes, -o, ConnectTimeout=10]
  docker:
    description: The docker client, here and on the peers.
    type: str
    default: docker
  timeout_s:
    description: How long one peer's relay may take, in seconds.
    type: int
    default: 3600
notes:
  - Standard library only; runs with the node's python3.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Send the image to the other nodes over the fabric
  sparkserve.deploy.image_relay:
    image_id: "{{ __image_source_id }}"
    local_name: "{{ image_local_name }}"
    peers: [spark-2, spark-3]
"""

RETURN = r"""
sent:
  description: The peers that received the image (would receive, in check mode).
  returned: always
  type: list
  elements: str
unreached:
  description: Each peer the image did not reach, C(node) and C(error) (not C(failed), which Ansible sets to true
    on failure).
  returned: always
  type: list
  elements: dict
kind:
  description: C(image_relay_failed) when a peer was not reached.
  returned: failure
  type: str
"""

import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Dict, List, Sequence, Tuple, cast

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.images import image_id_of, tag_image
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import (
    one_line,
    remote_argv,
    run_command,
)

ARGUMENT_SPEC: Dict[str, Any] = {
    "image_id": {"type": "str", "required": True},
    "local_name": {"type": "str", "required": True},
    "peers": {"type": "list", "elements": "str", "required": True},
    "ssh": {"type": "list", "elements": "str", "default": ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]},
    "docker": {"type": "str", "default": "docker"},
    "timeout_s": {"type": "int", "default": 3600},
}
KIND = "image_relay_failed"


def send(image_id: str, local_name: str, peer: str, ssh: Sequence[str], docker: str, timeout_s: float) -> str:
    """Relay the image to one peer; empty when it holds the image under its name after, else what went wrong."""
    with subprocess.Popen([docker, "save", image_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as saver:
        with subprocess.Popen(remote_argv(ssh, peer, [docker, "load"]), stdin=saver.stdout,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as loader:
            # the loader holds it (a pipe: stdout=PIPE); docker save sees a broken pipe when the loader ends
            cast(IO[bytes], saver.stdout).close()
            try:
                _, loader_err = loader.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                loader.kill()
                saver.kill()
                return f"no end after {timeout_s:.0f} s"
        saver_err = saver.stderr.read() if saver.stderr is not None else b""
        saver.wait()
    if loader.returncode != 0:
        said = loader_err.decode("utf-8", "replace").strip() or f"exit {loader.returncode}"
        return f"docker load there stopped: {one_line(said, 300)}"
    if saver.returncode != 0:
        return f"docker save here stopped: {one_line(saver_err.decode('utf-8', 'replace'), 300)}"
    def there(argv: Sequence[str], timeout: float) -> Tuple[int, str, str]:
        return run_command(remote_argv(ssh, peer, argv), timeout)

    tag_err = tag_image(docker, image_id, local_name, there)
    if tag_err:
        return tag_err
    held = image_id_of(docker, local_name, there)
    return "" if held == image_id else f"{local_name} there is {held or 'nothing'} after the relay, not {image_id}"


def failure_message(failed: List[Dict[str, str]], image_id: str) -> str:
    """One sentence per peer the image did not reach."""
    return "; ".join(f"the image {image_id[:19]} did not reach {f['node']} over the fabric: {f['error']} "
                     "(run again to send it)" for f in failed)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    peers = list(dict.fromkeys(p["peers"]))
    if module.check_mode or not peers:
        module.exit_json(changed=bool(peers), sent=peers, unreached=[])
    with ThreadPoolExecutor(max_workers=len(peers)) as pool:
        errors = list(pool.map(lambda peer: send(p["image_id"], p["local_name"], peer, p["ssh"], p["docker"],
                                                 float(p["timeout_s"])), peers))
    sent = [peer for peer, error in zip(peers, errors, strict=True) if not error]
    failed = [{"node": peer, "error": error} for peer, error in zip(peers, errors, strict=True) if error]
    if failed:
        module.fail_json(msg=failure_message(failed, p["image_id"]), kind=KIND, sent=sent, unreached=failed,
                         changed=bool(sent))
    module.exit_json(changed=True, sent=sent, unreached=[])


if __name__ == "__main__":
    main()
