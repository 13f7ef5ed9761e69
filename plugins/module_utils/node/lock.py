"""The deployments' launch-lock files: the format and protocol the deployment_lock module and the supervisor share.

A deployment's lock is the file ``LOCK_DIR/NAME.lock`` holding one JSON object, its *holder*::

    {"owner": "controller-a pid 1234 at ...", "since": 1795993200, "renewed": 1795993500, "lease_s": 1800,
     "expires": 1795995300, "token": "0123456789abcdef", "run": {...} or null}

The lock is held while its lease runs (``renewed + lease_s`` is later than now); a holder whose lease ran out
may be replaced by anyone. A file that is empty or not JSON (a run died while writing it, or one made by hand)
is held by an unknown run, and one of an older format (no token) by its owner; both are renewed at the file's
modification time with the default lease. Every change is made under an flock on ``LOCK_DIR/.NAME.lock.guard``,
so two writers never both take the lock; a new lock is created with ``O_EXCL``, a held one replaced atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from typing import Any, Dict, Iterator, Optional

from .files import write_atomic

DEFAULT_LEASE_S = 1800
UNREADABLE_OWNER = "an unknown run (the lock file is empty or not JSON)"

Holder = Dict[str, Any]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def lock_file(lock_dir: str, name: str) -> str:
    """The lock file of deployment name (the name is not checked here)."""
    return os.path.join(lock_dir, f"{name}.lock")


def new_token() -> str:
    """A token that says which taking of the lock a holder is."""
    return secrets.token_hex(8)


def make_holder(owner: str, since: float, renewed: float, lease_s: int, token: str,
                run: Optional[Dict[str, Any]] = None) -> Holder:
    """The record of a lock held by owner since ``since``, renewed at ``renewed`` for lease_s seconds."""
    return {"owner": owner, "since": int(since), "renewed": int(renewed), "lease_s": lease_s,
            "expires": int(renewed) + lease_s, "token": token, "run": dict(run) if run is not None else None}


def unchecked_holder(owner: str, since: float, mtime: float) -> Holder:
    """A holder that cannot be matched or checked: renewed at the file's mtime, with the default lease."""
    return {"owner": owner, "since": since, "renewed": mtime, "lease_s": DEFAULT_LEASE_S,
            "expires": mtime + DEFAULT_LEASE_S, "token": None, "run": None}


def read_holder(path: str) -> Optional[Holder]:
    """The holder recorded in a lock file, None when there is none (see the module's docstring)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("owner"), str) or not _is_number(data.get("since")):
        return unchecked_holder(UNREADABLE_OWNER, mtime, mtime)
    token, renewed, lease_s, run = data.get("token"), data.get("renewed"), data.get("lease_s"), data.get("run")
    if (not isinstance(token, str) or not token or not isinstance(renewed, (int, float)) or isinstance(renewed, bool)
            or not isinstance(lease_s, int) or isinstance(lease_s, bool) or not (run is None or isinstance(run, dict))):
        return unchecked_holder(data["owner"], data["since"], mtime)
    return {"owner": data["owner"], "since": data["since"], "renewed": renewed, "lease_s": lease_s,
            "expires": renewed + lease_s, "token": token, "run": run}


def lease_runs(holder: Holder, now: float) -> bool:
    """Whether the holder's lease has not run out at now."""
    return now < float(holder["expires"])


def holder_text(holder: Holder) -> str:
    return json.dumps(holder, sort_keys=True) + "\n"


def create_holder(path: str, holder: Holder) -> bool:
    """Create the lock file holding this holder (``O_EXCL``, flushed to disk); False when it exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, holder_text(holder).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def replace_holder(path: str, holder: Holder) -> None:
    """Replace the lock file by one holding this holder, atomically."""
    write_atomic(path, holder_text(holder))


def remove_holder(path: str) -> None:
    """Remove the lock file; one already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def guard(lock_dir: str, name: str) -> Iterator[None]:
    """Hold the flock that serialises every change of deployment name's lock (the folder must exist)."""
    fd = os.open(os.path.join(lock_dir, f".{name}.lock.guard"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
