"""The gateway's nginx files (nginx.conf, routes.js) for the inventory's deployments and keys."""

from __future__ import annotations

from typing import Any, Dict, List

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.module_utils.gateway import config

DOCUMENTATION = r"""
name: gateway_files
short_description: The gateway's nginx configuration and routes, rendered from its settings
version_added: "0.5.0"
description:
  - Checks the gateway's settings (every problem at once, never a key in a message) and renders the two files of
    its folder that differ per inventory, by name; the role's static gateway.js sits beside them.
  - Keys are hashed here (SHA-256); neither file holds a key.
  - Its companion C(gateway_config_digest) takes these files and returns the digest the configuration's
    C(/health) answers with, in its C(X-Sparkserve-Config) header; a run that changed the configuration asks
    for it to know the new one serves.
  - Its companion C(gateway_listen_lines) takes the text of an nginx.conf (rendered here, or the one in place)
    and returns its listen lines; where they differ, nginx must restart to bind them.
options:
  _input:
    description: The deployments behind the gateway, each C(deployment), C(models), C(host) and C(port).
    type: list
    elements: dict
    required: true
  keys:
    description: gateway_keys.
    type: list
    elements: dict
    required: true
  settings:
    description: listen, port, tls, timeout_s, max_body_mib, retry_after_s, log_dir, state_dir, pid_file, user.
    type: dict
    required: true
"""

EXAMPLES = r"""
files: "{{ routes | sparkserve.deploy.gateway_files(gateway_keys, settings) }}"
"""

RETURN = r"""
_value:
  description: File name to content (nginx.conf, routes.js).
  type: dict
"""


def gateway_files(deployments: List[Dict[str, Any]], keys: List[Dict[str, Any]],
                  settings: Dict[str, Any]) -> Dict[str, str]:
    paths = config.Paths(log_dir=settings["log_dir"], state_dir=settings["state_dir"],
                         pid_file=settings["pid_file"], user=settings.get("user") or None)
    try:
        gateway = config.build(deployments, keys, listen=str(settings["listen"]), port=int(settings["port"]),
                               tls=bool(settings["tls"]), timeout_s=int(settings["timeout_s"]),
                               max_body_mib=int(settings["max_body_mib"]),
                               retry_after_s=int(settings["retry_after_s"]), paths=paths)
    except config.GatewayError as error:
        raise AnsibleFilterError("the gateway's settings: " + " ".join(error.problems)) from None
    return config.render(gateway)


def gateway_config_digest(files: Dict[str, str]) -> str:
    """The digest /health answers with when these files (gateway_files' output) serve."""
    digest = config.served_digest(files.get(config.CONFIG_FILE, ""))
    if not digest:
        raise AnsibleFilterError("gateway_config_digest: the files hold no nginx.conf that gateway_files rendered")
    return digest


def gateway_listen_lines(nginx_conf: str) -> List[str]:
    """The listen lines of an nginx.conf's text (gateway_files' own, or the one in place), sorted."""
    return config.listen_lines(nginx_conf)


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"gateway_files": gateway_files, "gateway_config_digest": gateway_config_digest,
                "gateway_listen_lines": gateway_listen_lines}
