"""The deployment's launch lock, taken by the supervisor for a heal (the format and protocol of ..lock)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from .. import lock
from ..lifecycle import log
from ..lock import Holder


class LockLost(Exception):  # noqa: N818 (an outcome of the heal, not an error of the program)
    """The deployment's lock stopped being this supervisor's during a heal."""

    def __init__(self, owner: str) -> None:
        super().__init__(owner)
        self.owner = owner


class DeploymentLock:
    """The deployment's launch lock, taken by the supervisor for a heal.

    Every change is made under the flock on ``LOCK_DIR/.NAME.lock.guard``, as
    the deployment_lock module makes its own, so a launch and a heal never
    both take the lock.
    """

    def __init__(self, lock_dir: str, name: str, owner: str) -> None:
        self.lock_dir = lock_dir
        self.name = name
        self.path = lock.lock_file(lock_dir, name)
        self.owner = owner
        self.token: str | None = None
        self.since = 0

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        os.makedirs(self.lock_dir, mode=0o755, exist_ok=True)
        with lock.guard(self.lock_dir, self.name):
            yield

    def other_holder(self, now: float) -> Holder | None:
        """Another run holding the lock with a lease that has not run out; None when nobody does.

        A lock this supervisor's owner left (an earlier run of it ended during a heal) is given back.
        """
        holder = lock.read_holder(self.path)
        if holder is None or not lock.lease_runs(holder, now):
            return None
        if holder["owner"] == self.owner and holder.get("token") and holder.get("token") != self.token:
            with self.guard():
                again = lock.read_holder(self.path)
                if again is not None and again.get("token") == holder["token"]:
                    os.unlink(self.path)
            log(f"gave back the lock {self.path} an earlier run of the supervisor left")
            return None
        return holder

    def _holder(self, now: float, lease_s: int) -> Holder:
        if self.token is None:
            raise RuntimeError("the supervisor's lock has no token yet: take it before renewing it")
        return lock.make_holder(self.owner, self.since, now, lease_s, self.token)

    def take(self, now: float, lease_s: int) -> Holder | None:
        """Take the lock for a heal; the other holder when it holds it (and nothing is taken)."""
        with self.guard():
            before = lock.read_holder(self.path)
            if before is not None and lock.lease_runs(before, now):
                return before
            self.token, self.since = lock.new_token(), int(now)
            mine = self._holder(now, lease_s)
            if before is None:
                if not lock.create_holder(self.path, mine):  # only a writer outside the guard gets here
                    self.token = None
                    return lock.read_holder(self.path) or {"owner": lock.UNREADABLE_OWNER}
            else:
                log(f"took over the lock {self.path} from {before['owner']}: its lease ran out")
                lock.replace_holder(self.path, mine)
            return None

    def renew(self, now: float, lease_s: int) -> None:
        """Renew the lease; LockLost when the lock is no longer this supervisor's."""
        with self.guard():
            holder = lock.read_holder(self.path)
            if holder is None or self.token is None or holder.get("token") != self.token:
                raise LockLost(holder["owner"] if holder else "nobody (the lock file was removed)")
            lock.replace_holder(self.path, self._holder(now, lease_s))

    def release(self) -> None:
        """Remove the lock file when it is still this supervisor's."""
        if self.token is None:
            return
        with self.guard():
            holder = lock.read_holder(self.path)
            if holder is not None and holder.get("token") == self.token:
                os.unlink(self.path)
        self.token = None
