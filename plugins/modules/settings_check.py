"""Check the inventory's settings against every role's argument spec, before any host changes."""

from __future__ import annotations

DOCUMENTATION = r"""
module: settings_check
short_description: Checks the inventory's settings against every role's argument spec, before any host changes
version_added: "0.3.0"
author:
  - sparkserve
description:
  - Every variable the inventory (or C(-e)) sets for a Spark that is an option of a role's entry point is checked
    with that option's type, elements and choices, on the controller, by the context play every entry playbook
    starts with. A role would otherwise refuse it only when the run reaches it, after earlier stages changed the
    hosts.
  - Fails with one sentence per problem (host, variable, value, what the role takes); changes nothing.
  - Its action plugin reads the settings from the inventory itself; as a module it checks the O(settings) given.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  roles_dir:
    description: The folder of the project's roles, each with its meta/argument_specs.yml.
    type: path
    required: true
  settings:
    description: Per host, the variables to check and their values (the action plugin fills it from the inventory).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Check every setting the inventory gives
  sparkserve.deploy.settings_check:
    roles_dir: "{{ playbook_dir | dirname }}/roles"
  run_once: true
"""

RETURN = r"""
checked:
  description: How many settings were checked.
  type: int
  returned: success
problems:
  description: One sentence per setting refused.
  type: list
  elements: str
  returned: failure
"""

from ansible_collections.sparkserve.deploy.plugins.module_utils.controller_module import run_module
from ansible_collections.sparkserve.deploy.plugins.module_utils.settings import run

ARGUMENT_SPEC = {
    "roles_dir": {"type": "path", "required": True},
    "settings": {"type": "dict", "default": {}},
}


def main() -> None:
    run_module(ARGUMENT_SPEC, run)


if __name__ == "__main__":
    main()
