#!/usr/bin/python
"""Take, renew or give back the launch lock of a deployment, so two launches of it cannot run at once."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployment_lock
short_description: Take, renew or give back the launch lock of a deployment
version_added: "0.1.0"
description:
  - Two launches of the same deployment must not run at once (one would tear down the ranks the other
    starts). The lock is the file C(LOCK_DIR/NAME.lock) on the node this runs on (the head), holding
    JSON with the keys C(owner) (the holder's label), C(since) (epoch seconds it was taken),
    C(renewed) and C(lease_s) (its lease runs out at C(renewed + lease_s), kept as C(expires)),
    C(token) (random hex naming this taking of the lock) and C(run) (the holder's run, see O(run)).
  - The action plugin of the same name runs on the controller. It gives the module this
    ansible-playbook run's identity as O(run). When another run of the same controller holds the lock
    and that run is gone (the controller booted since, or its ansible-playbook process no longer runs,
    its pid now naming another process or none), it calls the module again with O(take_over) set to
    that lock's token, and warns that it took over the lock from that run, which is gone, saying why.
    A run on another controller cannot be checked; its lock is taken over once its lease runs out.
  - O(state=present) creates the lock atomically (C(O_CREAT|O_EXCL)). When this same run holds it, the
    module renews its lease (C(renewed) becomes now, C(lease_s) the given one; the file is replaced
    atomically) and reports no change, since who holds the lock did not change. When another run holds
    it and its lease has not run out, the module fails, naming the holder, since when it holds the lock
    and when its lease runs out, and what to do. A lock whose lease has run out is taken over, with a
    warning.
  - A lock file that is not JSON, or one written by an older version of this module (no C(token)), is
    held by a run that cannot be checked, renewed at the file's modification time, with the default
    lease of 1800 seconds.
  - O(state=absent) removes the lock only when this run holds it, and fails naming the holder
    otherwise. A missing lock changes nothing.
  - O(state=vacant) frees the lock of a run that is gone and leaves any other as it is, failing for none. A
    lock whose lease has run out is removed, with a warning; the action plugin judges a lock held by
    another run of this same controller and, when that run is gone, calls the module again with
    O(take_over) set to its token, which removes it. Every run does this on each deployment's head before
    it reads what runs, so a run killed while it held the lock (SIGKILL, a lost controller) does not keep
    the deployment's supervisor paused until the lease runs out.
  - This run is matched by O(run) (C(controller), C(boot_id), C(pid) and C(pid_start) all equal) or,
    when neither this call nor the lock has a run, by O(owner).
  - Runs of this module on one node are serialised by C(flock) on C(LOCK_DIR/.NAME.lock.guard), so a
    lock is taken over by one run only.
  - In check mode reports what would change and changes nothing. With diff, shows who holds the lock
    before and after.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  diff_mode:
    support: full
options:
  name:
    description: Name of the deployment (letters, digits, C(.), C(_), C(-)).
    type: str
    required: true
  state:
    description: C(present) takes (or renews) the lock, C(absent) gives it back, C(vacant) frees the lock of a
      run that is gone.
    type: str
    choices: [present, absent, vacant]
    default: present
  run:
    description:
      - The identity of the ansible-playbook run that takes or gives back the lock. The action plugin
        fills it in; give it only to stand for another run.
      - When given, its C(label) names the holder and O(owner) is not used.
    type: dict
    suboptions:
      controller:
        description: Id of the controller (a keyed hash of its C(/etc/machine-id), or of its host name).
        type: str
        required: true
      controller_name:
        description: Host name of the controller.
        type: str
        required: true
      pid:
        description: Pid of the ansible-playbook main process on the controller.
        type: int
        required: true
      pid_start:
        description: Start time of that process in clock ticks since boot (field 22 of C(/proc/PID/stat)).
        type: int
      boot_id:
        description: C(/proc/sys/kernel/random/boot_id) of the controller.
        type: str
      label:
        description: How messages name the run, for example C(controller-host pid 1234 at 2026-11-29T23:00:00Z).
        type: str
        required: true
  owner:
    description:
      - Who takes or gives back the lock, when O(run) is not given; the same string must be given for both.
      - With the action plugin, the label of this run instead of C(HOST pid N at TIME).
    type: str
  lock_dir:
    description: Directory of the lock files; created when missing.
    type: path
    default: /run/sparkserve/locks
  lease_s:
    description:
      - Seconds the lock stays this run's without a renewal; after that another run takes it over.
      - Renew it during a launch longer than this by taking the lock again (O(state=present)).
    type: int
    default: 1800
  take_over:
    description:
      - The C(token) of a lock whose run is known to be gone; that lock is replaced (O(state=present)) or
        removed (O(state=vacant)) whatever its lease. With O(state=present), when the lock holds another
        token (it changed meanwhile), the module fails; with O(state=vacant) it leaves that lock as it is.
      - The action plugin sets it; not with O(state=absent).
    type: str
notes:
  - C(stale_after_s) of earlier versions is gone; O(lease_s) replaces it.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Take the launch lock of the deployment (the action plugin names this run)
  sparkserve.deploy.deployment_lock:
    name: glm53-tp2
    lease_s: 1800

- name: Renew the lease in the middle of a long launch (reports no change)
  sparkserve.deploy.deployment_lock:
    name: glm53-tp2
    lease_s: 1800

- name: Give the launch lock back
  sparkserve.deploy.deployment_lock:
    name: glm53-tp2
    state: absent

- name: Free the launch lock of a run that is gone (a killed run's), leaving a live run's
  sparkserve.deploy.deployment_lock:
    name: glm53-tp2
    state: vacant
"""

RETURN = r"""
path:
  description: The lock file.
  returned: always
  type: str
  sample: /run/sparkserve/locks/glm53-tp2.lock
holder:
  description:
    - Who holds the lock after this run (in check mode, would hold it); null when nobody does.
    - When the module fails because another run holds the lock, that run.
  returned: always
  type: dict
  sample:
    owner: controller-host pid 1234 at 2026-11-29T23:00:00Z
    since: 1795993200
    renewed: 1795993500
    lease_s: 1800
    expires: 1795995300
    token: 3f9c0a7d5e21b864
    run:
      controller: 6a1f0c2d9e8b7a6f5e4d3c2b1a0f9e8d
      controller_name: controller-host
      pid: 1234
      pid_start: 2260825
      boot_id: 0b6c1f0e-8a52-4c1e-9d3b-7f2a4e6d8c10
      label: controller-host pid 1234 at 2026-11-29T23:00:00Z
taken_over:
  description:
    - The holder whose lock this run took over (its lease ran out, or O(take_over) named it); with
      O(state=vacant), the holder whose lock it freed.
    - Null when none was.
  returned: when state is present or vacant
  type: dict
"""

import contextlib
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import lock
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.lock import (
    DEFAULT_LEASE_S,
    UNREADABLE_OWNER,
    Holder,
    read_holder,
    unchecked_holder,
)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# The fields of a run identity that say it is the same run (see plugins/plugin_utils/controller_run.py).
RUN_KEYS = ("controller", "boot_id", "pid", "pid_start")

RUN_SPEC: dict[str, Any] = {
    "controller": {"type": "str", "required": True},
    "controller_name": {"type": "str", "required": True},
    "pid": {"type": "int", "required": True},
    "pid_start": {"type": "int"},
    "boot_id": {"type": "str"},
    "label": {"type": "str", "required": True},
}
ARGUMENT_SPEC: dict[str, Any] = {
    "name": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["present", "absent", "vacant"], "default": "present"},
    "run": {"type": "dict", "options": RUN_SPEC},
    "owner": {"type": "str"},
    "lock_dir": {"type": "path", "default": "/run/sparkserve/locks"},
    "lease_s": {"type": "int", "default": DEFAULT_LEASE_S},
    "take_over": {"type": "str"},
}
REQUIRED_ONE_OF = [["run", "owner"]]

Run = dict[str, Any]


class LockError(Exception):
    """The lock cannot be taken or given back; the message says by whom it is held and what to do."""

    def __init__(self, msg: str, holder: Holder | None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.holder = holder


@dataclass
class Outcome:
    path: str
    changed: bool
    before: Holder | None
    after: Holder | None
    warnings: list[str] = field(default_factory=list)
    taken_over: Holder | None = None


def lock_path(lock_dir: str, name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ValueError(f"deployment name {name!r} cannot name a lock file; use letters, digits, '.', '_' and '-'")
    return lock.lock_file(lock_dir, name)


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def age_text(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def new_holder(owner: str, run: Run | None, now: float, lease_s: int) -> Holder:
    """The record of a lock taken now by this owner (or run)."""
    return lock.make_holder(owner, now, now, lease_s, lock.new_token(), run)


def is_mine(holder: Holder, owner: str, run: Run | None) -> bool:
    """Whether the lock is held by this run: the same run identity, or the same owner where neither has one."""
    if holder.get("token") is None:
        return False
    recorded = holder.get("run")
    if run is not None:
        return isinstance(recorded, dict) and all(recorded.get(key) == run.get(key) for key in RUN_KEYS)
    return recorded is None and holder["owner"] == owner


@contextlib.contextmanager
def guard(lock_dir: str, name: str, check_mode: bool) -> Iterator[None]:
    """Hold an flock that serialises runs of this module on this deployment (none in check mode)."""
    if check_mode:
        yield
        return
    with lock.guard(lock_dir, name):
        yield


def holding_text(holder: Holder, now: float) -> str:
    """'LABEL since TIME (AGE ago), its lease until TIME': who holds the lock, for messages."""
    return (f"{holder['owner']} since {when(holder['since'])} ({age_text(now - holder['since'])} ago), "
            f"its lease until {when(holder['expires'])}")


def advice(holder: Holder, path: str, now: float) -> str:
    """What to do about a lock held by another run."""
    return (f"wait for that run to finish; or, if that run is gone on another machine, launch again after its "
            f"lease runs out at {when(holder['expires'])} (in {age_text(holder['expires'] - now)}); "
            f"or remove {path} on {socket.gethostname()}")


def held_message(name: str, holder: Holder, path: str, now: float) -> str:
    return f"deployment {name} is being launched by {holding_text(holder, now)}: {advice(holder, path, now)}"


def acquire(lock_dir: str, name: str, owner: str, lease_s: int, run: Run | None = None,
            take_over: str | None = None, check_mode: bool = False,
            clock: Callable[[], float] = time.time) -> Outcome:
    """Take or renew the lock for this run; raise LockError when another run holds it.

    Another run's lock is replaced when its lease has run out, or when take_over names its token.
    """
    if lease_s <= 0:
        raise ValueError(f"lease_s must be a positive number of seconds, not {lease_s}")
    path = lock_path(lock_dir, name)
    if not check_mode:
        os.makedirs(lock_dir, mode=0o755, exist_ok=True)
    with guard(lock_dir, name, check_mode):
        before = read_holder(path)
        now = clock()
        if before is None:
            mine = new_holder(owner, run, now, lease_s)
            if not check_mode and not lock.create_holder(path, mine):
                # Only a writer outside this module (no guard) gets here.
                other = read_holder(path) or unchecked_holder(UNREADABLE_OWNER, now, now)
                raise LockError(held_message(name, other, path, now), other)
            return Outcome(path, True, None, mine)
        if is_mine(before, owner, run):
            renewed = dict(before, renewed=int(now), lease_s=lease_s, expires=int(now) + lease_s)
            if not check_mode:
                lock.replace_holder(path, renewed)
            return Outcome(path, False, before, renewed)
        warnings: list[str] = []
        if take_over is not None:
            if before["token"] != take_over:
                raise LockError(
                    f"deployment {name}'s lock was not taken over: it changed after its holder was found gone, "
                    f"and is now held by {holding_text(before, now)}: {advice(before, path, now)}", before)
        elif now < before["expires"]:
            raise LockError(held_message(name, before, path, now), before)
        else:
            warnings.append(
                f"took over the lock of deployment {name} from {before['owner']}: its lease ran out at "
                f"{when(before['expires'])} ({age_text(now - before['expires'])} ago; it held the lock since "
                f"{when(before['since'])})")
        mine = new_holder(owner, run, now, lease_s)
        if not check_mode:
            lock.replace_holder(path, mine)
        return Outcome(path, True, before, mine, warnings, before)


@contextlib.contextmanager
def current_holder(lock_dir: str, name: str, check_mode: bool) -> Iterator[tuple[str, Holder | None]]:
    """The lock file and its holder, read under the guard, which is held until the block ends; no holder (and no
    guard) when the lock folder does not exist, as nothing holds a lock there."""
    path = lock_path(lock_dir, name)
    if not os.path.isdir(lock_dir):
        yield path, None
        return
    with guard(lock_dir, name, check_mode):
        yield path, read_holder(path)


def release(lock_dir: str, name: str, owner: str, run: Run | None = None, check_mode: bool = False,
            clock: Callable[[], float] = time.time) -> Outcome:
    """Give the lock back; raise LockError when another run holds it."""
    with current_holder(lock_dir, name, check_mode) as (path, before):
        if before is None:
            return Outcome(path, False, None, None)
        if not is_mine(before, owner, run):
            now = clock()
            raise LockError(
                f"deployment {name}'s lock is held by {holding_text(before, now)}, not by {owner}; not released. "
                f"If that run is gone, its lock is taken over after {when(before['expires'])}, or remove {path} "
                f"on {socket.gethostname()}", before)
        if not check_mode:
            lock.remove_holder(path)
        return Outcome(path, True, before, None)


def vacate(lock_dir: str, name: str, take_over: str | None = None, check_mode: bool = False,
           clock: Callable[[], float] = time.time) -> Outcome:
    """Free the lock of a run that is gone: the one whose token take_over names (its run found gone), or one whose
    lease has run out. A lock held by a live run, or none, is left as it is."""
    with current_holder(lock_dir, name, check_mode) as (path, before):
        if before is None:
            return Outcome(path, False, None, None)
        now = clock()
        warnings: list[str] = []
        if take_over is None or before["token"] != take_over:
            if now < before["expires"]:
                return Outcome(path, False, before, before)
            warnings.append(
                f"gave back the lock of deployment {name} held by {before['owner']}: its lease ran out at "
                f"{when(before['expires'])} ({age_text(now - before['expires'])} ago)")
        if not check_mode:
            lock.remove_holder(path)
        return Outcome(path, True, before, None, warnings, before)


def describe(holder: Holder | None) -> str:
    """The lock's holder for a diff; a renewal leaves it as it was."""
    if holder is None:
        return "not held\n"
    return f"held by {holder['owner']} since {when(holder['since'])}\n"


def run_lock(params: dict[str, Any], check_mode: bool = False,
             clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """The module's result for these (validated) parameters: warnings in 'warnings', a failure in 'failed'."""
    run: Run | None = params.get("run")
    owner = run["label"] if run is not None else params.get("owner")
    state = params["state"]
    if not owner:
        return {"failed": True, "changed": False, "msg": "give run or owner: who takes or gives back the lock"}
    if state == "absent" and params.get("take_over") is not None:
        return {"failed": True, "changed": False, "msg": "take_over goes with state=present or vacant"}
    try:
        if state == "present":
            outcome = acquire(params["lock_dir"], params["name"], owner, params["lease_s"], run,
                              params.get("take_over"), check_mode, clock)
        elif state == "vacant":
            outcome = vacate(params["lock_dir"], params["name"], params.get("take_over"), check_mode, clock)
        else:
            outcome = release(params["lock_dir"], params["name"], owner, run, check_mode, clock)
    except LockError as err:
        return {"failed": True, "changed": False, "msg": err.msg,
                "path": lock_path(params["lock_dir"], params["name"]), "holder": err.holder}
    except ValueError as err:
        return {"failed": True, "changed": False, "msg": str(err)}
    except OSError as err:
        return {"failed": True, "changed": False,
                "msg": f"could not use the lock of deployment {params['name']} in {params['lock_dir']}: {err}"}
    result: dict[str, Any] = {
        "changed": outcome.changed, "path": outcome.path, "holder": outcome.after, "warnings": outcome.warnings,
        "diff": {"before_header": outcome.path, "after_header": outcome.path,
                 "before": describe(outcome.before), "after": describe(outcome.after)},
    }
    if state in ("present", "vacant"):
        result["taken_over"] = outcome.taken_over
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_one_of=REQUIRED_ONE_OF, supports_check_mode=True)
    result = run_lock(module.params, module.check_mode)
    for warning in result.pop("warnings", []):
        module.warn(warning)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
