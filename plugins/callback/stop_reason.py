"""Say again, after the play recap, why a failed run stopped."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: stop_reason
type: aggregate
short_description: Repeats, after the play recap, why the run stopped
version_added: "0.2.0"
description:
  - A failed task's message (a recipe's mistake, with its file, field and fix; a node that refused a stage) is shown
    where the task fails, and the play recap then pushes it off the screen. This plugin prints it again after the
    recap, once per message with the hosts it came from, so the last thing on the screen is what to fix.
  - Only failures that ended a host's run count (not one a block rescued, not one ignored), and unreachable hosts.
  - Prints nothing for a run that succeeded.
requirements:
  - enabled in callbacks_enabled (ansible.cfg has it)
author:
  - sparkserve
"""

from typing import Any, Dict, List

from ansible.plugins.callback import CallbackBase


def _message(result: Dict[str, Any]) -> str:
    """The reason a task result gives: its msg, else the end of its stderr, else its return code."""
    msg = result.get("msg")
    if isinstance(msg, str) and msg.strip():
        return msg.strip()
    stderr = str(result.get("stderr") or "").strip()
    if stderr:
        return stderr.splitlines()[-1]
    return "the task failed (rc=%s)" % result.get("rc", "?")


class CallbackModule(CallbackBase):
    """Keeps each host's last failure and shows the ones that ended a host's run after the recap."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkserve.deploy.stop_reason"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last: Dict[str, str] = {}

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if not ignore_errors:
            self._last[result._host.get_name()] = 'at "%s":\n%s' % (result._task.get_name(), _message(result._result))

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._last[result._host.get_name()] = "unreachable:\n%s" % _message(result._result)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        ended = [host for host in sorted(self._last)
                 if stats.failures.get(host, 0) > 0 or stats.dark.get(host, 0) > 0]
        by_message: Dict[str, List[str]] = {}
        for host in ended:
            by_message.setdefault(self._last[host], []).append(host)
        for message, hosts in by_message.items():
            self._display.display("The run stopped on %s, %s" % (", ".join(hosts), message), stderr=True)
