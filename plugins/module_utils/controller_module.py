"""The main() of a module whose work is a plain function of its arguments (``run(params) -> result``).

Such a module also has an action plugin that calls the same ``run`` in the
playbook's process (plugins/plugin_utils/in_process.py); as a module it gives
the same result.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from ansible.module_utils.basic import AnsibleModule


def run_module(argument_spec: Dict[str, Any], run: Callable[[Dict[str, Any]], Dict[str, Any]]) -> None:
    """Check the arguments, run, and exit with the result (failing when it says so)."""
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    result = run(module.params)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)
