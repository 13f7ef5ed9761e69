"""sparkserve.deploy.settings_check on the controller: the settings are read from the inventory of every Spark."""

from __future__ import annotations

from typing import Any, Dict

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.sparkserve.deploy.plugins.module_utils.settings import load_options, outcome
from ansible_collections.sparkserve.deploy.plugins.modules.settings_check import ARGUMENT_SPEC


class ActionModule(ActionBase):
    """Reads, for every host of the sparks group, the variables set that are options of a role, and checks them."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: Dict[str, Any] | None = None) -> Dict[str, Any]:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        variables = task_vars or {}
        options = load_options(args["roles_dir"])
        settings: Dict[str, Dict[str, Any]] = dict(args["settings"])
        hostvars = variables.get("hostvars", {})
        for host in variables.get("groups", {}).get("sparks", []):
            known = hostvars[host]
            given = settings.setdefault(host, {})
            for name in options:
                if name in known and name not in given:
                    try:
                        given[name] = known[name]
                    except AnsibleError as err:
                        given[name] = f"(a value that cannot be read: {err.message})"
        result.update(outcome(options, settings))
        return result
