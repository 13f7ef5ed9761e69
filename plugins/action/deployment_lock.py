"""sparkserve.deploy.deployment_lock: the module on the head, told which ansible-playbook run asks.

The module (plugins/modules/deployment_lock.py) runs on the remote host as usual. This plugin, on the
controller, gives it this run's identity (plugins/plugin_utils/controller_run.py) as ``run``. When the
module refuses because another run of this same controller holds the lock (state=present), or leaves such a
run's lock in place (state=vacant), the plugin checks that run: when it is gone (the controller booted since,
or its pid runs no more or names another process now), the plugin calls the module again with ``take_over``
set to that lock's token, which takes the lock over (present) or frees it (vacant), and warns.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from ansible.plugins.action import ActionBase

from ansible_collections.sparkserve.deploy.plugins.plugin_utils import controller_run

MODULE = "sparkserve.deploy.deployment_lock"

CallModule = Callable[[Dict[str, Any]], Dict[str, Any]]


def with_run(args: Dict[str, Any], here: Dict[str, Any]) -> Dict[str, Any]:
    """The task's arguments with this run's identity as run, unless the task gives one.

    An owner the task gives becomes the run's label.
    """
    args = dict(args)
    if args.get("run") is None:
        run = dict(here)
        if args.get("owner"):
            run["label"] = str(args["owner"])
        args["run"] = run
    return args


def take_lock(call: CallModule, task_args: Dict[str, Any], here: Dict[str, Any],
              proc_root: str = controller_run.PROC, exists: Callable[[int], bool] | None = None) -> Dict[str, Any]:
    """Run the module through call, taking over the lock of a run of this controller that is gone.

    here is this run's identity; proc_root and exists are for controller_run.judge_run.
    """
    args = with_run(task_args, here)
    result = call(args)
    if args.get("state") == "vacant":
        return vacate_gone(call, args, result, here, proc_root, exists)
    holder = result.get("holder")
    if (not result.get("failed") or args.get("state", "present") != "present" or args.get("take_over")
            or not isinstance(holder, dict) or not holder.get("token")):
        return result
    state, why = controller_run.judge_run(holder.get("run"), here, proc_root, exists)
    if state == "alive":
        result["msg"] = f"{result.get('msg', '')} ({why})"
        return result
    if state != "gone":
        return result
    again = call(dict(args, take_over=holder["token"]))
    if not again.get("failed"):
        warnings = list(again.get("warnings") or [])
        warnings.append(f"took over the lock of deployment {args.get('name')} from {holder.get('owner')}: "
                        f"that run is gone ({why})")
        again["warnings"] = warnings
    return again


def vacate_gone(call: CallModule, args: Dict[str, Any], result: Dict[str, Any], here: Dict[str, Any],
                proc_root: str = controller_run.PROC, exists: Callable[[int], bool] | None = None) -> Dict[str, Any]:
    """After the module left a lock as it is (state=vacant): free it when it is held by a run of this controller
    that is gone, and warn."""
    holder = result.get("holder")
    if (result.get("failed") or result.get("changed") or args.get("take_over")
            or not isinstance(holder, dict) or not holder.get("token")):
        return result
    state, why = controller_run.judge_run(holder.get("run"), here, proc_root, exists)
    if state != "gone":
        return result
    again = call(dict(args, take_over=holder["token"]))
    if again.get("changed") and not again.get("failed"):
        warnings = list(again.get("warnings") or [])
        warnings.append(f"took over the lock of deployment {args.get('name')} from {holder.get('owner')}: "
                        f"that run is gone ({why}); gave it back")
        again["warnings"] = warnings
    return again


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: Any = None, task_vars: Dict[str, Any] | None = None) -> Dict[str, Any]:
        result = super().run(tmp, task_vars)
        del tmp

        def call(module_args: Dict[str, Any]) -> Dict[str, Any]:
            # _execute_module adds its own keys to the arguments it is given: give it a copy.
            answer: Dict[str, Any] = self._execute_module(
                module_name=MODULE, module_args=dict(module_args), task_vars=task_vars)
            return answer

        try:
            result.update(take_lock(call, dict(self._task.args), controller_run.run_identity(),
                                    exists=controller_run.pid_exists))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
