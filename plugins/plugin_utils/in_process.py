"""Action plugins that run a module of this collection on the controller, in the playbook's own process.

A module that only reads what the controller already has (the inventory, a
recipe) gains nothing from being packed, sent to localhost and started as a
second Python; its action plugin calls the module's ``run(params)`` directly,
after the same argument checks (the module's ``ARGUMENT_SPEC``). The module
keeps its documentation and a ``main()`` that gives the same result.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from ansible.plugins.action import ActionBase

Run = Callable[[Dict[str, Any]], Dict[str, Any]]


def in_process_action(argument_spec: Dict[str, Any], run: Run) -> type[ActionBase]:
    """The ActionModule class of a module with this argument spec and run function."""

    class ActionModule(ActionBase):
        TRANSFERS_FILES = False
        _requires_connection = False

        def run(self, tmp: Any = None, task_vars: Dict[str, Any] | None = None) -> Dict[str, Any]:
            result = super().run(tmp, task_vars)
            _, args = self.validate_argument_spec(argument_spec=argument_spec)
            result.update(run(args))
            return result

    return ActionModule
