"""The URL at which the head reaches a deployment's API, from the recipe's launch section."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.api import head_api_base

DOCUMENTATION = r"""
name: head_api_url
short_description: The URL at which the head reaches a deployment's API
version_added: "0.2.0"
description:
  - C(http://HOST:PORT) from a recipe's C(launch) section, as the head itself reaches the API. An API bound to
    every interface (one of O(wildcard_hosts)) is reached at C(127.0.0.1), any other address as it is (an IPv6
    one in brackets).
  - What the launch's readiness wait, the release swap, the upgrade's probe of the serving release and the
    supervisor ask.
options:
  _input:
    description: The recipe's C(launch) section (C(api_host), C(api_port)).
    type: dict
    required: true
  wildcard_hosts:
    description: The addresses that mean every interface (C(sparkserve_wildcard_hosts)).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
url: "{{ recipe_config.launch | sparkserve.deploy.head_api_url(sparkserve_wildcard_hosts) }}"
# http://127.0.0.1:8000 for api_host 0.0.0.0, http://[fd00::1]:8000 for api_host fd00::1
"""

RETURN = r"""
_value:
  description: The API's base URL, without a path.
  type: str
"""


def head_api_url(launch: Mapping[str, Any], wildcard_hosts: Sequence[str]) -> str:
    try:
        host, port = str(launch["api_host"]), int(launch["api_port"])
    except (KeyError, TypeError, ValueError) as error:
        raise AnsibleFilterError("head_api_url needs a launch section with api_host and api_port: %s"
                                 % error) from error
    return head_api_base(host, port, wildcard_hosts)


class FilterModule:
    """The head's URL of a deployment's API."""

    def filters(self) -> dict[str, Any]:
        return {"head_api_url": head_api_url}
