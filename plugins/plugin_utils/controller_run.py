"""Who this ansible-playbook run is on its controller, and whether a run recorded earlier still runs.

The deployment lock (plugins/action/deployment_lock.py) records the run that holds it as a small dict:

- ``controller``: a keyed hash of the controller's ``/etc/machine-id`` (of its host name where there is
  none); the machine id itself is meant to stay on its machine, so only the hash is written down;
- ``controller_name``: the controller's host name, for people;
- ``pid``: the ansible-playbook main process (the workers that run tasks are forks of it);
- ``pid_start``: that process's start time in clock ticks since boot (field 22 of ``/proc/PID/stat``), so a
  pid taken by another process later is told apart;
- ``boot_id``: ``/proc/sys/kernel/random/boot_id``, which changes at every boot;
- ``label``: ``HOST pid N at TIME``, TIME being when that process started.

Every function takes the root of ``/proc`` (and the path of the machine id) as parameters, so tests can
give a made-up tree.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time
from typing import Any, Callable, Literal

PROC = "/proc"
MACHINE_ID = "/etc/machine-id"
# The key of the controller id's hash: the same machine gets another id in any other application.
_CONTROLLER_KEY = b"sparkserve.deploy deployment lock controller"
# Fields of /proc/PID/stat counted from 1; the list after the command name starts at field 3 (state).
_FIRST_FIELD_AFTER_COMM = 3
_PPID_FIELD = 4
_STARTTIME_FIELD = 22

RunState = Literal["gone", "alive", "unknown"]


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def stat_fields(pid: int, proc_root: str = PROC) -> list[str] | None:
    """The fields of /proc/PID/stat from the state (field 3) on; None when there is no such process.

    The command name (field 2) sits in parentheses and may hold spaces and parentheses itself, so the
    fields are read after its last closing parenthesis.
    """
    data = _read(os.path.join(proc_root, str(pid), "stat"))
    if data is None:
        return None
    text = data.decode("utf-8", "replace")
    close = text.rfind(")")
    if close < 0:
        return None
    fields = text[close + 1:].split()
    return fields if len(fields) > _STARTTIME_FIELD - _FIRST_FIELD_AFTER_COMM else None


def _field(fields: list[str], number: int) -> int | None:
    try:
        return int(fields[number - _FIRST_FIELD_AFTER_COMM])
    except (IndexError, ValueError):
        return None


def parent_of(pid: int, proc_root: str = PROC) -> int | None:
    """The parent pid of a process; None when it cannot be read."""
    fields = stat_fields(pid, proc_root)
    return None if fields is None else _field(fields, _PPID_FIELD)


def start_ticks(pid: int, proc_root: str = PROC) -> int | None:
    """When a running process started, in clock ticks since boot; None when none runs under that pid.

    A zombie (state Z) or a dead task (X) has stopped running and counts as none.
    """
    fields = stat_fields(pid, proc_root)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return _field(fields, _STARTTIME_FIELD)


def cmdline_of(pid: int, proc_root: str = PROC) -> bytes | None:
    """The raw command line of a process; None when it cannot be read."""
    return _read(os.path.join(proc_root, str(pid), "cmdline"))


def main_process(pid: int, proc_root: str = PROC) -> int | None:
    """The topmost ancestor of pid, pid included, all of whose command line is that of pid.

    Ansible's workers are forks of the ansible-playbook process, so from a worker this is the main
    process of the run. None when /proc cannot tell (no /proc on this system).
    """
    cmdline = cmdline_of(pid, proc_root)
    if cmdline is None:
        return None
    current, seen = pid, {pid}
    while True:
        parent = parent_of(current, proc_root)
        if parent is None or parent <= 0 or parent in seen or cmdline_of(parent, proc_root) != cmdline:
            return current
        seen.add(parent)
        current = parent


def controller_id(machine_id_path: str = MACHINE_ID, hostname: str | None = None) -> str:
    """A stable id of this controller: a keyed hash of its machine id, or of its host name without one."""
    data = _read(machine_id_path)
    machine_id = data.decode("ascii", "replace").strip() if data is not None else ""
    source = f"machine-id:{machine_id}" if machine_id else f"hostname:{hostname or socket.gethostname()}"
    return hmac.new(_CONTROLLER_KEY, source.encode("utf-8"), hashlib.sha256).hexdigest()[:32]


def boot_id(proc_root: str = PROC) -> str | None:
    """The id of this boot of the controller; None when it cannot be read."""
    data = _read(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"))
    text = data.decode("ascii", "replace").strip() if data is not None else ""
    return text or None


def boot_time(proc_root: str = PROC) -> int | None:
    """When the controller booted (epoch seconds, the btime line of /proc/stat); None when unknown."""
    data = _read(os.path.join(proc_root, "stat"))
    for line in (data or b"").decode("ascii", "replace").splitlines():
        name, _, value = line.partition(" ")
        if name == "btime":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


def iso_time(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _ticks_per_second() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


def run_identity(pid: int | None = None, parent_pid: int | None = None, proc_root: str = PROC,
                 machine_id_path: str = MACHINE_ID, hostname: str | None = None,
                 ticks_per_s: int | None = None, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """The identity of the ansible-playbook run this process belongs to (see the module docstring).

    pid is this process (default: os.getpid()). Where /proc cannot tell the main process, the parent
    (default: os.getppid()) is taken, the one a worker of Ansible was forked from; its start time and the
    boot id are then None, and the run cannot be found gone, only outlived by its lease.
    """
    pid = os.getpid() if pid is None else pid
    name = hostname or socket.gethostname()
    main = main_process(pid, proc_root)
    if main is None:
        main = os.getppid() if parent_pid is None else parent_pid
    started = start_ticks(main, proc_root)
    booted = boot_time(proc_root)
    if started is not None and booted is not None:
        began = booted + started / (ticks_per_s or _ticks_per_second())
    else:
        began = clock()
    return {
        "controller": controller_id(machine_id_path, name),
        "controller_name": name,
        "pid": main,
        "pid_start": started,
        "boot_id": boot_id(proc_root) if started is not None else None,
        "label": f"{name} pid {main} at {iso_time(began)}",
    }


def pid_exists(pid: int) -> bool:
    """Whether some process has this pid, whether or not /proc shows it (hidepid) to this user."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def judge_run(recorded: Any, here: dict[str, Any], proc_root: str = PROC,
              exists: Callable[[int], bool] | None = None) -> tuple[RunState, str]:
    """Whether the run recorded in a lock is gone, still runs, or cannot be told from this controller.

    here is this run's identity (run_identity()). Only a run of this same controller can be judged:
    gone when the controller has booted since, when its pid no longer runs, or when the pid now belongs
    to a process that started at another time. exists, where given, is asked about a pid /proc does
    not show, in case /proc hides other users' processes. The text says why, for a message.
    """
    if not isinstance(recorded, dict) or not recorded.get("controller"):
        return "unknown", "the lock does not say which run holds it"
    if recorded.get("controller") != here.get("controller"):
        return "unknown", "that run is on another controller"
    pid, pid_start = _number(recorded.get("pid")), _number(recorded.get("pid_start"))
    name = str(recorded.get("controller_name") or here.get("controller_name"))
    if pid is None or pid_start is None or not recorded.get("boot_id") or not here.get("boot_id"):
        return "unknown", f"{name} cannot tell whether pid {recorded.get('pid')} is that run"
    if recorded["boot_id"] != here["boot_id"]:
        return "gone", f"pid {pid} no longer runs on {name}; {name} has restarted since"
    if stat_fields(pid, proc_root) is None and exists is not None and exists(pid):
        return "unknown", f"pid {pid} runs on {name} but /proc does not show this user which process it is"
    started = start_ticks(pid, proc_root)
    if started is None:
        return "gone", f"pid {pid} no longer runs on {name}"
    if started != pid_start:
        return "gone", f"pid {pid} no longer runs on {name}; that pid now belongs to another process"
    return "alive", f"that run still goes on: pid {pid} runs on {name}"
