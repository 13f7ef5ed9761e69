"""Keeping a systemd unit running: started when it is not, enabled or disabled at boot as asked.

What M(ansible.builtin.systemd_service) does for C(state: started) and C(enabled), as a few ``systemctl``
commands inside a module that already runs on the node, instead of a round trip of its own. A unit whose
files changed is not for this helper: its caller reloads systemd and restarts it.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from .process import Runner, one_line, run_command

SYSTEMCTL = "systemctl"
TIMEOUT_S = 90.0
# systemd_service's own reading: a unit on its way up, or reloading, runs.
RUNNING_STATES = ("active", "activating", "reloading")
# ``is-enabled`` exits 0 for these too, but nothing starts them at boot.
NOT_ENABLED_OUTPUTS = ("indirect", "alias")


class UnitError(Exception):
    """A systemctl command failed; the message names the unit and what systemctl said."""


def _systemctl(runner: Runner, *args: str) -> tuple[int, str, str]:
    return runner([SYSTEMCTL, *args], TIMEOUT_S)


def systemctl(runner: Runner, *args: str) -> str:
    """What ``systemctl ARGS`` printed; UnitError naming the command and what it said when it failed."""
    rc, out, err = _systemctl(runner, *args)
    if rc != 0:
        raise UnitError(f"{SYSTEMCTL} {' '.join(args)} exited {rc}: {one_line(err or out or 'no message', 300)}")
    return out


def is_running(name: str, runner: Runner = run_command) -> bool:
    rc, out, err = _systemctl(runner, "show", "--property=ActiveState", "--value", name)
    if rc != 0:
        raise UnitError(f"cannot read the state of {name}: {one_line(err or out or f'exit {rc}')}")
    return out.strip() in RUNNING_STATES


def is_enabled(name: str, runner: Runner = run_command) -> bool:
    rc, out, _ = _systemctl(runner, "is-enabled", name)
    return rc == 0 and out.strip() not in NOT_ENABLED_OUTPUTS


def unit_commands(name: str, enabled: Optional[bool], runner: Runner = run_command) -> List[List[str]]:
    """The systemctl commands that bring the unit to running and, unless enabled is None, to that boot
    state; none when it already is so."""
    commands: List[List[str]] = []
    if enabled is not None and is_enabled(name, runner) != enabled:
        commands.append([SYSTEMCTL, "enable" if enabled else "disable", name])
    if not is_running(name, runner):
        commands.append([SYSTEMCTL, "start", name])
    return commands


def run_unit_commands(commands: Sequence[Sequence[str]], runner: Runner = run_command) -> None:
    """Run them in order; UnitError at the first that fails."""
    for argv in commands:
        try:
            systemctl(runner, *argv[1:])
        except UnitError as err:
            raise UnitError(f"{err} (journalctl -u {argv[-1]} says why)") from None


def keep_running(name: str, enabled: Optional[bool], check_mode: bool, runner: Runner = run_command) -> bool:
    """Bring the unit to running and, unless enabled is None, to that boot state (in check mode, only say
    so); whether it needed it. UnitError."""
    commands = unit_commands(name, enabled, runner)
    if commands and not check_mode:
        run_unit_commands(commands, runner)
    return bool(commands)
