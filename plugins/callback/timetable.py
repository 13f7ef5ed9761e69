"""Record each play's wall time in the test suite's time table."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: timetable
type: aggregate
short_description: Records each play's wall time in the test suite's time table
version_added: "0.1.0"
description:
  - Appends one line per play (C(PREFIX / play name), seconds, outcome) to the time table that
    C(tools/timetable.py) prints at the end of C(make test). The faults scenario enables it, so each fault
    shows with its own time.
  - Only the outermost playbook records. On load the plugin takes C(SPARKSERVE_TIMETABLE) out of its own
    process's environment, so playbooks that its tasks start (a fault runs C(site.yml) several times) do not
    add their plays to the table.
  - Does nothing when C(SPARKSERVE_TIMETABLE) is not set.
options:
  table:
    description: The time table file (tab-separated lines).
    type: path
    env:
      - name: SPARKSERVE_TIMETABLE
  prefix:
    description: Put before each play's name in the table, for example the scenario's name.
    type: str
    default: playbook
    env:
      - name: SPARKSERVE_TIMETABLE_PREFIX
requirements:
  - enabled in callbacks_enabled (the scenarios set C(ANSIBLE_CALLBACKS_ENABLED), with stop_reason, the one
    ansible.cfg enables)
author:
  - sparkserve
"""

import os
import time
from typing import Any, Optional

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    """Times each play from its start to the next play's start (or the end of the playbook)."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkserve.deploy.timetable"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._table: Optional[str] = os.environ.pop("SPARKSERVE_TIMETABLE", None) or None
        self._prefix = os.environ.get("SPARKSERVE_TIMETABLE_PREFIX") or "playbook"
        self._play: Optional[str] = None
        self._started = 0.0
        self._failed = False

    def _close_play(self) -> None:
        if self._table is None or self._play is None:
            return
        seconds = time.monotonic() - self._started
        with open(self._table, "a", encoding="utf-8") as out:
            out.write(f"{self._prefix} / {self._play}\t{seconds:.1f}\t{'FAILED' if self._failed else 'ok'}\n")
        self._play = None

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._close_play()
        self._play = " ".join(str(play.get_name()).split()).replace("\t", " ")
        self._started = time.monotonic()
        self._failed = False

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if not ignore_errors:
            self._failed = True

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._failed = True

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close_play()
