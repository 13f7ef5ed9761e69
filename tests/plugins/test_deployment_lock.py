"""Tests for the deployment_lock module and action plugin: take, renew, refuse, take over, give back, races.

Clocks are injected and /proc trees made up, so nothing here depends on how fast it runs (but the race
tests, which only count winners).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.action import deployment_lock as action
from ansible_collections.sparkserve.deploy.plugins.module_utils.node import lock
from ansible_collections.sparkserve.deploy.plugins.modules import deployment_lock as dl
from ansible_collections.sparkserve.deploy.plugins.plugin_utils import controller_run as cr

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

COLLECTIONS = str(Path(__file__).resolve().parents[2] / "collections")
ALICE = "controller-a pid 1234 at 2026-11-29T23:00Z"
BOB = "controller-b pid 99 at 2026-11-29T23:05Z"
T0 = 1_795_993_200.0
PLAYBOOK = b"/usr/bin/python3\0/usr/bin/ansible-playbook\0site.yml\0"
HEAD = socket.gethostname()


class Clock:
    """A clock that stays where a test puts it."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeProc:
    """A made-up /proc: processes (stat, cmdline), the boot id and the boot time."""

    def __init__(self, root: Path, boot_id: str = "boot-1", btime: int = 1_795_900_000) -> None:
        self.root = root
        (root / "sys" / "kernel" / "random").mkdir(parents=True)
        (root / "sys" / "kernel" / "random" / "boot_id").write_text(f"{boot_id}\n", encoding="ascii")
        (root / "stat").write_text(f"cpu  1 2 3\nbtime {btime}\nprocesses 7\n", encoding="ascii")

    def add(self, pid: int, ppid: int, start: int, cmdline: bytes = PLAYBOOK, state: str = "S",
            comm: str = "ansible-playb") -> None:
        folder = self.root / str(pid)
        folder.mkdir(exist_ok=True)
        # Fields 5 to 21 are zeros; 22 is the start time.
        (folder / "stat").write_text(f"{pid} ({comm}) {state} {ppid} " + "0 " * 17 + f"{start} 0 0\n",
                                     encoding="ascii")
        (folder / "cmdline").write_bytes(cmdline)

    def remove(self, pid: int) -> None:
        for child in (self.root / str(pid)).iterdir():
            child.unlink()
        (self.root / str(pid)).rmdir()

    @property
    def path(self) -> str:
        return str(self.root)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    """Controller A: this run is ansible-playbook pid 1000 (started at tick 9000) and its worker 1001."""
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, 1, b"/sbin/init\0", comm="systemd")
    fake.add(500, 1, 4000, b"-bash\0", comm="bash")
    fake.add(1000, 500, 9000)
    fake.add(1001, 1000, 9100)
    return fake


def identity(proc: FakeProc, tmp_path: Path, hostname: str = "controller-a", pid: int = 1001) -> dict[str, Any]:
    machine_id = tmp_path / f"machine-id-{hostname}"
    machine_id.write_text(f"{hostname}-0123456789abcdef\n", encoding="ascii")
    return cr.run_identity(pid, proc_root=proc.path, machine_id_path=str(machine_id), hostname=hostname,
                           ticks_per_s=100)


def earlier(here: dict[str, Any], pid: int = 900, pid_start: int = 5000, **changes: Any) -> dict[str, Any]:
    """Another run of here's controller."""
    return dict(here, pid=pid, pid_start=pid_start, label=f"{here['controller_name']} pid {pid} at earlier",
                **changes)


def module_call(clock: Clock, check_mode: bool = False, calls: list[dict[str, Any]] | None = None
                ) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The module as the action plugin calls it: arguments checked against its spec, then run here."""

    def call(args: dict[str, Any]) -> dict[str, Any]:
        if calls is not None:
            calls.append(args)
        checked = ArgumentSpecValidator(dl.ARGUMENT_SPEC, required_one_of=dl.REQUIRED_ONE_OF).validate(args)
        assert not checked.error_messages, checked.error_messages
        return dl.run_lock(checked.validated_parameters, check_mode, clock)

    return call


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        dl.main()
    return json.loads(capsys.readouterr().out)


def read_lock(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def write_old_lock(path: Path, owner: str, since: float) -> None:
    """A lock as earlier versions of the module wrote it (no token, no lease)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"owner": owner, "since": since, "pid": 1}), encoding="utf-8")
    os.utime(path, (since, since))


def race(worker: Callable[[int], bool], count: int) -> list[bool]:
    """Run worker(i) in count threads released together; return who won."""
    barrier = threading.Barrier(count)
    won = [False] * count

    def run(i: int) -> None:
        barrier.wait()
        won[i] = worker(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won


# The module on its own: owners, leases, tokens.

def test_acquire_writes_the_holder(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    outcome = dl.acquire(str(lock_dir), "lab", ALICE, 1800, clock=Clock())
    path = lock_dir / "lab.lock"
    assert outcome.changed is True and outcome.path == str(path) and outcome.before is None
    held = read_lock(path)
    assert held == outcome.after
    assert held["owner"] == ALICE and held["since"] == held["renewed"] == int(T0) and held["lease_s"] == 1800
    assert held["expires"] == int(T0) + 1800 and held["run"] is None and len(held["token"]) == 16


def test_a_second_owner_is_refused_with_who_since_when_and_what_to_do(tmp_path: Path) -> None:
    dl.acquire(str(tmp_path), "lab", ALICE, 1800, clock=Clock())
    with pytest.raises(dl.LockError) as err:
        dl.acquire(str(tmp_path), "lab", BOB, 1800, clock=Clock(T0 + 600))
    assert err.value.msg == (
        f"deployment lab is being launched by {ALICE} since {dl.when(T0)} (10 min ago), its lease until "
        f"{dl.when(T0 + 1800)}: wait for that run to finish; or, if that run is gone on another machine, launch "
        f"again after its lease runs out at {dl.when(T0 + 1800)} (in 20 min); or remove {tmp_path / 'lab.lock'} "
        f"on {HEAD}")
    assert err.value.holder is not None and err.value.holder["owner"] == ALICE


def test_the_same_owner_renews_the_lease_without_a_change(tmp_path: Path) -> None:
    first = dl.acquire(str(tmp_path), "lab", ALICE, 1800, clock=Clock())
    again = dl.acquire(str(tmp_path), "lab", ALICE, 600, clock=Clock(T0 + 1000))
    assert again.changed is False and again.taken_over is None and not again.warnings
    assert first.after is not None and again.after is not None
    assert again.after == dict(first.after, renewed=int(T0) + 1000, lease_s=600, expires=int(T0) + 1600)
    assert read_lock(tmp_path / "lab.lock") == again.after
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lab.lock.guard", "lab.lock"]
    assert dl.describe(again.before) == dl.describe(again.after)


def test_the_same_run_renews_the_lease_whatever_its_label(tmp_path: Path, proc: FakeProc) -> None:
    here = identity(proc, tmp_path)
    first = dl.acquire(str(tmp_path), "lab", here["label"], 1800, run=here, clock=Clock())
    again = dl.acquire(str(tmp_path), "lab", "renamed", 1800, run=dict(here, label="renamed"),
                       clock=Clock(T0 + 1700))
    assert again.changed is False and again.after is not None and first.after is not None
    assert again.after["token"] == first.after["token"] and again.after["owner"] == here["label"]
    assert again.after["expires"] == int(T0) + 1700 + 1800
    with pytest.raises(dl.LockError):  # the same pid after a reboot is another run
        dl.acquire(str(tmp_path), "lab", "x", 1800, run=dict(here, boot_id="boot-2"), clock=Clock(T0 + 1800))


def test_a_lock_whose_lease_ran_out_is_taken_over_with_a_warning(tmp_path: Path) -> None:
    dl.acquire(str(tmp_path), "lab", ALICE, 1800, clock=Clock())
    with pytest.raises(dl.LockError):
        dl.acquire(str(tmp_path), "lab", BOB, 1800, clock=Clock(T0 + 1799))
    outcome = dl.acquire(str(tmp_path), "lab", BOB, 1800, clock=Clock(T0 + 1800 + 3 * 3600))
    assert outcome.changed is True and outcome.after is not None and outcome.after["owner"] == BOB
    assert outcome.taken_over is not None and outcome.taken_over["owner"] == ALICE
    (warning,) = outcome.warnings
    assert warning == (f"took over the lock of deployment lab from {ALICE}: its lease ran out at "
                       f"{dl.when(T0 + 1800)} (3.0 h ago; it held the lock since {dl.when(T0)})")
    assert read_lock(tmp_path / "lab.lock")["owner"] == BOB


def test_a_renewed_lease_keeps_the_lock(tmp_path: Path) -> None:
    dl.acquire(str(tmp_path), "lab", ALICE, 1800, clock=Clock())
    dl.acquire(str(tmp_path), "lab", ALICE, 1800, clock=Clock(T0 + 1500))
    with pytest.raises(dl.LockError, match=f"its lease until {dl.when(T0 + 3300)}"):
        dl.acquire(str(tmp_path), "lab", BOB, 1800, clock=Clock(T0 + 3000))


def test_an_unreadable_lock_is_held_for_the_default_lease_from_its_mtime(tmp_path: Path) -> None:
    path = tmp_path / "lab.lock"
    path.write_text("", encoding="utf-8")
    os.utime(path, (T0, T0))
    with pytest.raises(dl.LockError, match="being launched by an unknown run") as err:
        dl.acquire(str(tmp_path), "lab", BOB, 60, clock=Clock(T0 + 1799))
    assert err.value.holder is not None and err.value.holder["token"] is None
    assert err.value.holder["expires"] == T0 + dl.DEFAULT_LEASE_S
    assert dl.acquire(str(tmp_path), "lab", BOB, 60, clock=Clock(T0 + 1800)).changed is True


def test_a_lock_of_an_older_version_names_its_owner_and_cannot_be_renewed_by_it(tmp_path: Path) -> None:
    write_old_lock(tmp_path / "lab.lock", ALICE, T0)
    with pytest.raises(dl.LockError, match=f"being launched by {ALICE} since"):
        dl.acquire(str(tmp_path), "lab", ALICE, 1800, clock=Clock(T0 + 100))
    outcome = dl.acquire(str(tmp_path), "lab", BOB, 1800, clock=Clock(T0 + 1800))
    assert outcome.taken_over is not None and outcome.taken_over["owner"] == ALICE


def test_take_over_replaces_exactly_the_named_lock(tmp_path: Path) -> None:
    first = dl.acquire(str(tmp_path), "lab", ALICE, 1800, clock=Clock())
    assert first.after is not None
    with pytest.raises(dl.LockError) as err:
        dl.acquire(str(tmp_path), "lab", BOB, 1800, take_over="0123456789abcdef", clock=Clock(T0 + 10))
    assert err.value.msg.startswith(
        f"deployment lab's lock was not taken over: it changed after its holder was found gone, and is now held "
        f"by {ALICE} since {dl.when(T0)} (10 s ago)")
    assert read_lock(tmp_path / "lab.lock") == first.after
    outcome = dl.acquire(str(tmp_path), "lab", BOB, 1800, take_over=first.after["token"], clock=Clock(T0 + 10))
    assert outcome.changed is True and outcome.taken_over == first.after and not outcome.warnings
    assert read_lock(tmp_path / "lab.lock")["owner"] == BOB


def test_release_by_another_owner_fails_naming_the_holder(tmp_path: Path) -> None:
    dl.acquire(str(tmp_path), "lab", ALICE, 1800, clock=Clock())
    with pytest.raises(dl.LockError) as err:
        dl.release(str(tmp_path), "lab", BOB, clock=Clock(T0 + 60))
    assert err.value.msg == (
        f"deployment lab's lock is held by {ALICE} since {dl.when(T0)} (60 s ago), its lease until "
        f"{dl.when(T0 + 1800)}, not by {BOB}; not released. If that run is gone, its lock is taken over after "
        f"{dl.when(T0 + 1800)}, or remove {tmp_path / 'lab.lock'} on {HEAD}")
    assert (tmp_path / "lab.lock").exists()


def test_release_by_another_run_of_the_same_controller_is_refused(tmp_path: Path, proc: FakeProc) -> None:
    here = identity(proc, tmp_path)
    dl.acquire(str(tmp_path), "lab", here["label"], 1800, run=here, clock=Clock())
    for other in (earlier(here, pid=1000, pid_start=1), earlier(here), dict(here, controller="another")):
        with pytest.raises(dl.LockError, match="not released"):
            dl.release(str(tmp_path), "lab", other["label"], run=other, clock=Clock())
    with pytest.raises(dl.LockError, match="not released"):  # an owner string is not a run
        dl.release(str(tmp_path), "lab", here["label"], clock=Clock())
    assert dl.release(str(tmp_path), "lab", "any label", run=dict(here, label="any label")).changed is True


def test_release_removes_the_lock_and_a_missing_one_is_fine(tmp_path: Path) -> None:
    dl.acquire(str(tmp_path), "lab", ALICE, 1800)
    outcome = dl.release(str(tmp_path), "lab", ALICE)
    assert outcome.changed is True and outcome.after is None and outcome.before is not None
    assert not (tmp_path / "lab.lock").exists()
    assert dl.release(str(tmp_path), "lab", ALICE).changed is False
    assert dl.release(str(tmp_path / "never-made"), "lab", ALICE).changed is False
    assert dl.acquire(str(tmp_path), "lab", BOB, 1800).changed is True


def test_check_mode_changes_nothing(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    outcome = dl.acquire(str(lock_dir), "lab", ALICE, 1800, check_mode=True, clock=Clock())
    assert outcome.changed is True and outcome.after is not None and outcome.after["owner"] == ALICE
    assert not lock_dir.exists()

    taken = dl.acquire(str(lock_dir), "lab", ALICE, 1800, clock=Clock())
    assert taken.after is not None
    text = (lock_dir / "lab.lock").read_text(encoding="utf-8")
    renewed = dl.acquire(str(lock_dir), "lab", ALICE, 1800, check_mode=True, clock=Clock(T0 + 100))
    assert renewed.changed is False and renewed.after is not None and renewed.after["renewed"] == int(T0) + 100
    outcome = dl.acquire(str(lock_dir), "lab", BOB, 1800, check_mode=True, clock=Clock(T0 + 4000))
    assert outcome.changed is True and outcome.warnings
    outcome = dl.acquire(str(lock_dir), "lab", BOB, 1800, take_over=taken.after["token"], check_mode=True,
                         clock=Clock(T0 + 10))
    assert outcome.changed is True and outcome.taken_over == taken.after
    assert dl.release(str(lock_dir), "lab", ALICE, check_mode=True).changed is True
    assert (lock_dir / "lab.lock").read_text(encoding="utf-8") == text
    assert sorted(p.name for p in lock_dir.iterdir()) == [".lab.lock.guard", "lab.lock"]


def test_a_name_that_is_not_a_file_name_or_a_lease_that_is_not_positive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot name a lock file"):
        dl.acquire(str(tmp_path), "../etc/passwd", ALICE, 1800)
    with pytest.raises(ValueError, match="lease_s must be a positive"):
        dl.acquire(str(tmp_path), "lab", ALICE, 0)


def test_threads_racing_to_acquire_one_wins(tmp_path: Path) -> None:
    def take(i: int) -> bool:
        try:
            dl.acquire(str(tmp_path), "lab", f"run {i}", 1800)
        except dl.LockError:
            return False
        return True

    assert sum(race(take, 16)) == 1


def test_threads_racing_on_a_lock_past_its_lease_one_takes_it_over(tmp_path: Path) -> None:
    write_old_lock(tmp_path / "lab.lock", ALICE, time.time() - 8000)

    def take(i: int) -> bool:
        try:
            dl.acquire(str(tmp_path), "lab", f"run {i}", 1800)
        except dl.LockError:
            return False
        return True

    won = race(take, 12)
    assert sum(won) == 1
    assert read_lock(tmp_path / "lab.lock")["owner"] == f"run {won.index(True)}"


def test_exclusive_create_alone_lets_one_racer_in(tmp_path: Path) -> None:
    path = str(tmp_path / "lab.lock")
    assert sum(race(lambda i: lock.create_holder(path, {"owner": f"run {i}", "since": 0}), 16)) == 1


def test_processes_racing_to_acquire_one_wins(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from ansible_collections.sparkserve.deploy.plugins.modules import deployment_lock as dl\n"
        "time.sleep(max(float(sys.argv[2]) - time.time(), 0))\n"
        "try:\n"
        "    dl.acquire(sys.argv[1], 'lab', sys.argv[3], 1800)\n"
        "except dl.LockError:\n"
        "    sys.exit(3)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [COLLECTIONS, os.environ.get("PYTHONPATH")])))
    start = str(time.time() + 1.5)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), start, f"process {i}"], env=env)
             for i in range(6)]
    codes = sorted(proc.wait(timeout=30) for proc in procs)
    assert codes == [0, 3, 3, 3, 3, 3]


def test_main_acquires_with_a_diff_and_releases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = {"name": "lab", "owner": ALICE, "lock_dir": str(tmp_path)}
    result = run_main(args, capsys)
    assert result["changed"] is True and not result.get("failed")
    assert result["path"] == str(tmp_path / "lab.lock") and result["holder"]["owner"] == ALICE
    assert result["diff"]["before"] == "not held\n" and result["diff"]["after"].startswith(f"held by {ALICE} since ")
    assert result["taken_over"] is None

    renewed = run_main(args, capsys)
    assert renewed["changed"] is False and renewed["holder"]["token"] == result["holder"]["token"]

    refused = run_main(dict(args, owner=BOB), capsys)
    assert refused["failed"] is True and refused["msg"].startswith(f"deployment lab is being launched by {ALICE}")
    assert refused["holder"]["owner"] == ALICE and refused["path"] == str(tmp_path / "lab.lock")

    released = run_main(dict(args, state="absent"), capsys)
    assert released["changed"] is True and released["holder"] is None and released["diff"]["after"] == "not held\n"
    assert "taken_over" not in released
    assert not (tmp_path / "lab.lock").exists()


def test_main_takes_a_run_and_warns_on_a_takeover(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  proc: FakeProc) -> None:
    here = identity(proc, tmp_path)
    write_old_lock(tmp_path / "lab.lock", ALICE, time.time() - 8000)
    args = {"name": "lab", "run": here, "lock_dir": str(tmp_path), "lease_s": 900}
    checked = run_main(dict(args, _ansible_check_mode=True), capsys)
    assert checked["changed"] is True and checked["holder"]["owner"] == here["label"]
    assert read_lock(tmp_path / "lab.lock")["owner"] == ALICE
    result = run_main(args, capsys)
    assert result["changed"] is True and result["taken_over"]["owner"] == ALICE
    assert f"took over the lock of deployment lab from {ALICE}: its lease ran out" in json.dumps(result["warnings"])
    assert read_lock(tmp_path / "lab.lock")["run"] == here and result["holder"]["lease_s"] == 900


def test_main_needs_run_or_owner_and_take_over_only_with_present(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    refused = run_main({"name": "lab", "lock_dir": str(tmp_path)}, capsys)
    assert refused["failed"] is True and "run, owner" in refused["msg"]
    refused = run_main({"name": "lab", "lock_dir": str(tmp_path), "owner": ALICE, "state": "absent",
                        "take_over": "00"}, capsys)
    assert refused["failed"] is True and refused["msg"] == "take_over goes with state=present or vacant"


# This run's identity and whether another run is gone.

def test_the_main_process_is_the_topmost_with_the_same_command_line(tmp_path: Path, proc: FakeProc) -> None:
    assert cr.main_process(1001, proc.path) == 1000
    assert cr.main_process(1000, proc.path) == 1000
    proc.add(1002, 1001, 9200)  # a fork of a fork
    assert cr.main_process(1002, proc.path) == 1000
    proc.add(400, 1, 3000)  # an ansible-playbook that started this shell's parent: the shell stops the walk
    assert cr.main_process(1002, proc.path) == 1000
    proc.add(1003, 1001, 9300, b"/bin/sh\0-c\0hostname\0")  # a command a worker runs is its own main process
    assert cr.main_process(1003, proc.path) == 1003
    assert cr.main_process(1001, str(tmp_path / "no-proc")) is None


def test_the_stat_line_is_read_after_the_command_name(tmp_path: Path, proc: FakeProc) -> None:
    proc.add(1004, 1000, 9400, comm="odd ) name (")
    assert cr.parent_of(1004, proc.path) == 1000 and cr.start_ticks(1004, proc.path) == 9400


def test_the_run_identity(tmp_path: Path, proc: FakeProc) -> None:
    here = identity(proc, tmp_path)
    assert here == {
        "controller": here["controller"], "controller_name": "controller-a", "pid": 1000, "pid_start": 9000,
        "boot_id": "boot-1", "label": f"controller-a pid 1000 at {cr.iso_time(1_795_900_000 + 90)}"}
    assert len(here["controller"]) == 32 and "0123456789abcdef" not in here["controller"]
    assert identity(proc, tmp_path)["controller"] == here["controller"]
    assert identity(proc, tmp_path, hostname="controller-b")["controller"] != here["controller"]
    without = cr.run_identity(1001, proc_root=proc.path, machine_id_path=str(tmp_path / "none"),
                              hostname="controller-a")
    assert without["controller"] == cr.controller_id(str(tmp_path / "none"), "controller-a") != here["controller"]


def test_without_proc_the_parent_is_the_run_and_cannot_be_found_gone(tmp_path: Path) -> None:
    run = cr.run_identity(1001, parent_pid=1000, proc_root=str(tmp_path / "none"), hostname="mac",
                          clock=Clock())
    assert run["pid"] == 1000 and run["pid_start"] is None and run["boot_id"] is None
    assert run["label"] == f"mac pid 1000 at {cr.iso_time(T0)}"
    assert cr.judge_run(run, run, str(tmp_path / "none"))[0] == "unknown"


def test_judging_a_recorded_run(tmp_path: Path, proc: FakeProc) -> None:
    here = identity(proc, tmp_path)
    other = earlier(here)
    assert cr.judge_run(other, here, proc.path) == ("gone", "pid 900 no longer runs on controller-a")
    proc.add(900, 500, 5000)
    assert cr.judge_run(other, here, proc.path) == ("alive", "that run still goes on: pid 900 runs on controller-a")
    proc.add(900, 500, 5001)
    assert cr.judge_run(other, here, proc.path)[0] == "gone"
    proc.add(900, 500, 5000, state="Z")
    assert cr.judge_run(other, here, proc.path, lambda pid: True)[0] == "gone"
    proc.remove(900)
    assert cr.judge_run(other, here, proc.path, lambda pid: True)[0] == "unknown"  # hidden by hidepid
    assert cr.judge_run(dict(other, boot_id="boot-0"), here, proc.path)[0] == "gone"
    assert cr.judge_run(dict(other, controller="elsewhere"), here, proc.path)[0] == "unknown"
    assert cr.judge_run(None, here, proc.path)[0] == "unknown"
    assert cr.judge_run(dict(other, pid_start=None), here, proc.path)[0] == "unknown"


# The action plugin's part: this run's identity, and taking over the lock of a run that is gone.

def lock_of(run: dict[str, Any], lock_dir: Path, clock: Clock) -> dict[str, Any]:
    outcome = dl.acquire(str(lock_dir), "lab", run["label"], 1800, run=run, clock=clock)
    assert outcome.after is not None
    return outcome.after


def test_the_action_takes_and_renews_the_lock_for_this_run(tmp_path: Path, proc: FakeProc) -> None:
    here, clock, calls = identity(proc, tmp_path), Clock(), []
    args = {"name": "lab", "lock_dir": str(tmp_path / "locks"), "lease_s": 1800}
    result = action.take_lock(module_call(clock, calls=calls), args, here, proc.path)
    assert result["changed"] is True and result["holder"]["run"] == here and result["holder"]["owner"] == here["label"]
    clock.now += 600
    renewed = action.take_lock(module_call(clock, calls=calls), args, here, proc.path)
    assert renewed["changed"] is False and renewed["holder"]["renewed"] == int(T0) + 600
    released = action.take_lock(module_call(clock, calls=calls), dict(args, state="absent"), here, proc.path)
    assert released["changed"] is True and not (tmp_path / "locks" / "lab.lock").exists()
    assert len(calls) == 3 and "take_over" not in str(calls) and args == {
        "name": "lab", "lock_dir": str(tmp_path / "locks"), "lease_s": 1800}
    named = action.with_run({"name": "lab", "owner": "nightly"}, here)
    assert named["run"] == dict(here, label="nightly")


def test_the_action_refuses_while_the_holder_still_runs_here(tmp_path: Path, proc: FakeProc) -> None:
    here, clock = identity(proc, tmp_path), Clock()
    other = earlier(here)
    proc.add(900, 500, 5000)
    held = lock_of(other, tmp_path, clock)
    clock.now += 60
    result = action.take_lock(module_call(clock), {"name": "lab", "lock_dir": str(tmp_path)}, here, proc.path)
    assert result["failed"] is True and result["holder"] == held
    assert result["msg"].startswith(f"deployment lab is being launched by {other['label']} since ")
    assert result["msg"].endswith(f"on {HEAD} (that run still goes on: pid 900 runs on controller-a)")
    assert read_lock(tmp_path / "lab.lock") == held


@pytest.mark.parametrize(("change", "why"), [
    ("dead", "pid 900 no longer runs on controller-a"),
    ("reused", "pid 900 no longer runs on controller-a; that pid now belongs to another process"),
    ("rebooted", "pid 900 no longer runs on controller-a; controller-a has restarted since"),
])
def test_the_action_takes_over_the_lock_of_a_run_that_is_gone(tmp_path: Path, proc: FakeProc, change: str,
                                                              why: str) -> None:
    here, clock, calls = identity(proc, tmp_path), Clock(), []
    other = earlier(here, boot_id="boot-0" if change == "rebooted" else here["boot_id"])
    if change in ("reused", "rebooted"):
        proc.add(900, 500, 7777 if change == "reused" else 5000)
    held = lock_of(other, tmp_path, clock)
    clock.now += 60
    result = action.take_lock(module_call(clock, calls=calls), {"name": "lab", "lock_dir": str(tmp_path)},
                              here, proc.path)
    assert not result.get("failed") and result["changed"] is True and result["taken_over"] == held
    assert result["warnings"] == [f"took over the lock of deployment lab from {other['label']}: that run is gone "
                                  f"({why})"]
    assert [call.get("take_over") for call in calls] == [None, held["token"]]
    assert read_lock(tmp_path / "lab.lock")["run"] == here


def test_a_run_of_another_controller_keeps_the_lock_until_its_lease_runs_out(tmp_path: Path,
                                                                              proc: FakeProc) -> None:
    here, clock, calls = identity(proc, tmp_path), Clock(), []
    other = dict(identity(proc, tmp_path, hostname="controller-b"), pid=900, pid_start=5000,
                 label="controller-b pid 900 at earlier")
    held = lock_of(other, tmp_path, clock)  # pid 900 runs on no controller this test knows: no matter
    clock.now += 1799
    args = {"name": "lab", "lock_dir": str(tmp_path)}
    refused = action.take_lock(module_call(clock, calls=calls), args, here, proc.path)
    assert refused["failed"] is True and refused["holder"] == held and len(calls) == 1
    assert f"launch again after its lease runs out at {dl.when(T0 + 1800)} (in 1 s)" in refused["msg"]
    clock.now += 1
    result = action.take_lock(module_call(clock), args, here, proc.path)
    assert result["changed"] is True and result["taken_over"] == held
    assert result["warnings"] == [f"took over the lock of deployment lab from {other['label']}: its lease ran out "
                                  f"at {dl.when(T0 + 1800)} (0 s ago; it held the lock since {dl.when(T0)})"]


def test_the_action_does_not_take_over_a_lock_that_changed_meanwhile(tmp_path: Path, proc: FakeProc) -> None:
    here, clock = identity(proc, tmp_path), Clock()
    gone = earlier(here)
    lock_of(gone, tmp_path, clock)
    newcomer = earlier(here, pid=950, pid_start=5500)
    proc.add(950, 500, 5500)
    call = module_call(clock)

    def call_after_a_newcomer(args: dict[str, Any]) -> dict[str, Any]:
        if args.get("take_over"):  # between the refusal and the take-over another run came and went
            (tmp_path / "lab.lock").unlink()
            lock_of(newcomer, tmp_path, clock)
        return call(args)

    result = action.take_lock(call_after_a_newcomer, {"name": "lab", "lock_dir": str(tmp_path)}, here, proc.path)
    assert result["failed"] is True and result["holder"]["run"] == newcomer
    assert result["msg"].startswith(f"deployment lab's lock was not taken over: it changed after its holder was "
                                    f"found gone, and is now held by {newcomer['label']}")
    assert read_lock(tmp_path / "lab.lock")["run"] == newcomer


def test_the_action_releases_only_this_runs_lock(tmp_path: Path, proc: FakeProc) -> None:
    here, clock = identity(proc, tmp_path), Clock()
    other = earlier(here)
    held = lock_of(other, tmp_path, clock)  # its pid runs no more, but a release takes over nothing
    result = action.take_lock(module_call(clock), {"name": "lab", "lock_dir": str(tmp_path), "state": "absent"},
                              here, proc.path)
    assert result["failed"] is True and result["holder"] == held and "not released" in result["msg"]
    assert read_lock(tmp_path / "lab.lock") == held


def test_the_action_in_check_mode_changes_nothing(tmp_path: Path, proc: FakeProc) -> None:
    here, clock = identity(proc, tmp_path), Clock()
    held = lock_of(earlier(here), tmp_path, clock)
    text = (tmp_path / "lab.lock").read_text(encoding="utf-8")
    result = action.take_lock(module_call(clock, check_mode=True), {"name": "lab", "lock_dir": str(tmp_path)},
                              here, proc.path)
    assert result["changed"] is True and result["taken_over"] == held and result["holder"]["run"] == here
    assert (tmp_path / "lab.lock").read_text(encoding="utf-8") == text
    released = action.take_lock(module_call(clock, check_mode=True),
                                {"name": "lab", "lock_dir": str(tmp_path), "state": "absent", "run": earlier(here)},
                                here, proc.path)
    assert released["changed"] is True and released["holder"] is None
    assert (tmp_path / "lab.lock").read_text(encoding="utf-8") == text


# state=vacant: every run frees the lock of a run that is gone, and leaves any other.

def test_vacant_frees_a_gone_runs_lock_and_leaves_a_live_one_and_another_controllers(tmp_path: Path,
                                                                                    proc: FakeProc) -> None:
    here, clock, calls = identity(proc, tmp_path), Clock(), []
    args = {"name": "lab", "lock_dir": str(tmp_path), "state": "vacant"}
    assert action.take_lock(module_call(clock), args, here, proc.path)["changed"] is False  # no lock: nothing

    live = earlier(here)
    proc.add(900, 500, 5000)
    held = lock_of(live, tmp_path, clock)
    kept = action.take_lock(module_call(clock, calls=calls), args, here, proc.path)
    assert kept["changed"] is False and not kept.get("failed") and kept["holder"] == held and len(calls) == 1
    other = dict(identity(proc, tmp_path, hostname="controller-b"), pid=900, pid_start=5000, label="b pid 900")
    (tmp_path / "lab.lock").unlink()
    held = lock_of(other, tmp_path, clock)
    assert action.take_lock(module_call(clock), args, here, proc.path)["holder"] == held  # cannot be judged here

    proc.remove(900)  # the run of this controller that held the lock was killed
    (tmp_path / "lab.lock").unlink()
    held = lock_of(live, tmp_path, clock)
    calls.clear()
    freed = action.take_lock(module_call(clock, calls=calls), args, here, proc.path)
    assert freed["changed"] is True and freed["holder"] is None and freed["taken_over"] == held
    assert freed["warnings"] == [f"took over the lock of deployment lab from {live['label']}: that run is gone "
                                 f"(pid 900 no longer runs on controller-a); gave it back"]
    assert [call.get("take_over") for call in calls] == [None, held["token"]]
    assert not (tmp_path / "lab.lock").exists()
    again = action.take_lock(module_call(clock), args, here, proc.path)
    assert again["changed"] is False and again["holder"] is None


def test_vacant_frees_a_lock_whose_lease_ran_out_and_in_check_mode_nothing(tmp_path: Path, proc: FakeProc) -> None:
    here, clock = identity(proc, tmp_path), Clock()
    other = dict(identity(proc, tmp_path, hostname="controller-b"), pid=900, pid_start=5000, label="b pid 900")
    held = lock_of(other, tmp_path, clock)
    args = {"name": "lab", "lock_dir": str(tmp_path), "state": "vacant"}
    clock.now += 1800
    text = (tmp_path / "lab.lock").read_text(encoding="utf-8")
    would = action.take_lock(module_call(clock, check_mode=True), args, here, proc.path)
    assert would["changed"] is True and would["holder"] is None
    assert (tmp_path / "lab.lock").read_text(encoding="utf-8") == text
    freed = action.take_lock(module_call(clock), args, here, proc.path)
    assert freed["changed"] is True and freed["taken_over"] == held and not (tmp_path / "lab.lock").exists()
    assert freed["warnings"] == [f"gave back the lock of deployment lab held by b pid 900: its lease ran out at "
                                 f"{dl.when(T0 + 1800)} (0 s ago)"]
