#!/usr/bin/python3
"""Take or give back the launch lock of a deployment, so two launches of it cannot run at once."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployment_lock
short_description: Take or give back the launch lock of a deployment
version_added: "0.1.0"
description:
  - Two launches of the same deployment must not run at once (one would tear down the ranks the other
    starts). The lock is the file C(LOCK_DIR/NAME.lock) on the node this runs on (the head), holding
    JSON with the keys C(owner), C(since) (epoch seconds) and C(pid).
  - O(state=present) creates it atomically (C(O_CREAT|O_EXCL)). When another owner holds it and it is
    younger than O(stale_after_s), the module fails, naming the holder. An older lock is taken over,
    with a warning. Taking a lock this same owner holds changes nothing.
  - O(state=absent) removes the lock only when this owner holds it, and fails naming the holder
    otherwise. A missing lock changes nothing.
  - Runs of this module on one node are serialised by C(flock) on C(LOCK_DIR/.NAME.lock.guard), so a
    stale lock is taken over by one run only.
  - In check mode reports what would change and changes nothing.
options:
  name:
    description: Name of the deployment (letters, digits, C(.), C(_), C(-)).
    type: str
    required: true
  state:
    description: C(present) takes the lock, C(absent) gives it back.
    type: str
    choices: [present, absent]
    default: present
  owner:
    description:
      - Who takes or gives back the lock; the same string must be given for both.
      - Make it name the run, for example C(controller-host pid 1234 at 2026-11-29T23:00Z).
    type: str
    required: true
  lock_dir:
    description: Directory of the lock files; created when missing.
    type: path
    default: /run/sparkserve/locks
  stale_after_s:
    description: A lock older than this many seconds is taken over (its run is taken to be gone).
    type: int
    default: 7200
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Name this run
  ansible.builtin.set_fact:
    __launch_owner: "{{ lookup('ansible.builtin.pipe', 'hostname') }} at {{ now(utc=true, fmt='%Y-%m-%dT%H:%M:%SZ') }}"

- name: Take the launch lock of the deployment
  sparkserve.deploy.deployment_lock:
    name: glm53-tp2
    owner: "{{ __launch_owner }}"

- name: Give the launch lock back
  sparkserve.deploy.deployment_lock:
    name: glm53-tp2
    owner: "{{ __launch_owner }}"
    state: absent
"""

RETURN = r"""
path:
  description: The lock file.
  returned: always
  type: str
  sample: /run/sparkserve/locks/glm53-tp2.lock
holder:
  description: Who holds the lock after this run (in check mode, would hold it); null when nobody does.
  returned: always
  type: dict
  sample: {"owner": "controller-host pid 1234 at 2026-11-29T23:00Z", "since": 1795993200, "pid": 4711}
taken_over:
  description: The stale holder whose lock this run took over; null when none was.
  returned: when state is present
  type: dict
"""

import contextlib
import fcntl
import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ansible.module_utils.basic import AnsibleModule

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

Holder = dict[str, Any]


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
    return os.path.join(lock_dir, f"{name}.lock")


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def age_text(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def read_holder(path: str) -> Holder | None:
    """The holder recorded in a lock file, None when there is none.

    A file that is empty or not JSON (a run that died while writing it, or one made by hand) is
    held by an unknown owner since the file's modification time.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        since = data["since"]
        if isinstance(since, bool) or not isinstance(since, (int, float)):
            raise ValueError("since is not a number")
        return {"owner": str(data["owner"]), "since": since, "pid": data.get("pid")}
    except (ValueError, KeyError, TypeError):
        return {"owner": "an unknown run (the lock file is empty or not JSON)", "since": mtime, "pid": None}


def create_exclusive(path: str, holder: Holder) -> bool:
    """Create the lock file holding this holder; False when it exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, (json.dumps(holder, sort_keys=True) + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def guard(lock_dir: str, name: str, check_mode: bool) -> Iterator[None]:
    """Hold an flock that serialises runs of this module on this deployment (none in check mode)."""
    if check_mode:
        yield
        return
    fd = os.open(os.path.join(lock_dir, f".{name}.lock.guard"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def held_message(name: str, holder: Holder, path: str, now: float) -> str:
    return (f"deployment {name} is being launched by {holder['owner']} since {when(holder['since'])} "
            f"({age_text(now - holder['since'])} ago); wait for it to finish, or if that run is gone "
            f"remove {path} on {socket.gethostname()}")


def acquire(lock_dir: str, name: str, owner: str, stale_after_s: int, check_mode: bool = False,
            clock: Callable[[], float] = time.time) -> Outcome:
    """Take the lock for owner; raise LockError when another owner holds a lock that is not stale."""
    path = lock_path(lock_dir, name)
    if not check_mode:
        os.makedirs(lock_dir, mode=0o755, exist_ok=True)
    with guard(lock_dir, name, check_mode):
        before = read_holder(path)
        now = clock()
        mine: Holder = {"owner": owner, "since": int(now), "pid": os.getpid()}
        if before is not None and before["owner"] == owner:
            return Outcome(path, False, before, before)
        warnings: list[str] = []
        if before is not None:
            age = now - before["since"]
            if age < stale_after_s:
                raise LockError(held_message(name, before, path, now), before)
            warnings.append(
                f"took over the lock of deployment {name} from {before['owner']}, held since "
                f"{when(before['since'])} ({age_text(age)} ago, longer than stale_after_s={stale_after_s}); "
                "that run is taken to be gone")
            if not check_mode:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if not check_mode and not create_exclusive(path, mine):
            # Only a writer outside this module (no guard) gets here.
            other = read_holder(path) or {"owner": "an unknown run", "since": now, "pid": None}
            raise LockError(held_message(name, other, path, now), other)
        return Outcome(path, True, before, mine, warnings, before)


def release(lock_dir: str, name: str, owner: str, check_mode: bool = False,
            clock: Callable[[], float] = time.time) -> Outcome:
    """Give the lock back; raise LockError when another owner holds it."""
    path = lock_path(lock_dir, name)
    if not os.path.isdir(lock_dir):
        return Outcome(path, False, None, None)
    with guard(lock_dir, name, check_mode):
        before = read_holder(path)
        if before is None:
            return Outcome(path, False, None, None)
        if before["owner"] != owner:
            raise LockError(
                f"deployment {name}'s lock is held by {before['owner']} since {when(before['since'])} "
                f"({age_text(clock() - before['since'])} ago), not by {owner}; not released. If that run is "
                f"gone, remove {path} on {socket.gethostname()}", before)
        if not check_mode:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return Outcome(path, True, before, None)


def describe(holder: Holder | None) -> str:
    if holder is None:
        return "not held\n"
    return f"held by {holder['owner']} since {when(holder['since'])} (pid {holder.get('pid')})\n"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "owner": {"type": "str", "required": True},
            "lock_dir": {"type": "path", "default": "/run/sparkserve/locks"},
            "stale_after_s": {"type": "int", "default": 7200},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["state"] == "present":
            outcome = acquire(p["lock_dir"], p["name"], p["owner"], p["stale_after_s"], module.check_mode)
        else:
            outcome = release(p["lock_dir"], p["name"], p["owner"], module.check_mode)
    except LockError as err:
        module.fail_json(msg=err.msg, changed=False, path=lock_path(p["lock_dir"], p["name"]), holder=err.holder)
    except ValueError as err:
        module.fail_json(msg=str(err), changed=False)
    except OSError as err:
        module.fail_json(msg=f"could not use the lock of deployment {p['name']} in {p['lock_dir']}: {err}",
                         changed=False)
    for warning in outcome.warnings:
        module.warn(warning)
    extra = {"taken_over": outcome.taken_over} if p["state"] == "present" else {}
    module.exit_json(
        changed=outcome.changed, path=outcome.path, holder=outcome.after,
        diff={"before_header": outcome.path, "after_header": outcome.path,
              "before": describe(outcome.before), "after": describe(outcome.after)},
        **extra)


if __name__ == "__main__":
    main()
