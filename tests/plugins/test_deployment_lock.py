"""Tests for the deployment_lock module: take, refuse, take over, give back, check mode and races."""

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
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import deployment_lock as dl

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

COLLECTIONS = str(Path(__file__).resolve().parents[2] / "collections")
ALICE = "controller-a pid 1234 at 2026-11-29T23:00Z"
BOB = "controller-b pid 99 at 2026-11-29T23:05Z"


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        dl.main()
    return json.loads(capsys.readouterr().out)


def write_lock(path: Path, owner: str, since: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"owner": owner, "since": since, "pid": 1}), encoding="utf-8")


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


def test_acquire_writes_the_holder(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    outcome = dl.acquire(str(lock_dir), "lab", ALICE, 7200)
    path = lock_dir / "lab.lock"
    assert outcome.changed is True and outcome.path == str(path) and outcome.before is None
    held = json.loads(path.read_text(encoding="utf-8"))
    assert held == outcome.after
    assert held["owner"] == ALICE and held["pid"] == os.getpid() and abs(held["since"] - time.time()) < 5


def test_a_second_owner_is_refused_with_who_and_how(tmp_path: Path) -> None:
    dl.acquire(str(tmp_path), "lab", ALICE, 7200)
    with pytest.raises(dl.LockError) as err:
        dl.acquire(str(tmp_path), "lab", BOB, 7200)
    since = json.loads((tmp_path / "lab.lock").read_text(encoding="utf-8"))["since"]
    assert err.value.msg == (
        f"deployment lab is being launched by {ALICE} since {dl.when(since)} (0 s ago); wait for it to "
        f"finish, or if that run is gone remove {tmp_path / 'lab.lock'} on {socket.gethostname()}")
    assert err.value.holder is not None and err.value.holder["owner"] == ALICE


def test_the_same_owner_acquires_again_without_change(tmp_path: Path) -> None:
    first = dl.acquire(str(tmp_path), "lab", ALICE, 7200)
    text = (tmp_path / "lab.lock").read_text(encoding="utf-8")
    again = dl.acquire(str(tmp_path), "lab", ALICE, 7200)
    assert again.changed is False and again.after == first.after
    assert (tmp_path / "lab.lock").read_text(encoding="utf-8") == text


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path: Path) -> None:
    write_lock(tmp_path / "lab.lock", ALICE, time.time() - 3 * 3600)
    outcome = dl.acquire(str(tmp_path), "lab", BOB, 7200)
    assert outcome.changed is True and outcome.after is not None and outcome.after["owner"] == BOB
    assert outcome.taken_over is not None and outcome.taken_over["owner"] == ALICE
    (warning,) = outcome.warnings
    assert f"took over the lock of deployment lab from {ALICE}" in warning and "(3.0 h ago" in warning
    assert json.loads((tmp_path / "lab.lock").read_text(encoding="utf-8"))["owner"] == BOB


def test_an_unreadable_lock_is_held_until_it_is_stale(tmp_path: Path) -> None:
    path = tmp_path / "lab.lock"
    path.write_text("", encoding="utf-8")
    with pytest.raises(dl.LockError, match="being launched by an unknown run"):
        dl.acquire(str(tmp_path), "lab", BOB, 7200)
    old = time.time() - 8000
    os.utime(path, (old, old))
    assert dl.acquire(str(tmp_path), "lab", BOB, 7200).changed is True


def test_release_by_another_owner_fails_naming_the_holder(tmp_path: Path) -> None:
    dl.acquire(str(tmp_path), "lab", ALICE, 7200)
    with pytest.raises(dl.LockError) as err:
        dl.release(str(tmp_path), "lab", BOB)
    assert err.value.msg.startswith(f"deployment lab's lock is held by {ALICE} since ")
    assert f"not by {BOB}; not released" in err.value.msg
    assert (tmp_path / "lab.lock").exists()


def test_release_removes_the_lock_and_a_missing_one_is_fine(tmp_path: Path) -> None:
    dl.acquire(str(tmp_path), "lab", ALICE, 7200)
    outcome = dl.release(str(tmp_path), "lab", ALICE)
    assert outcome.changed is True and outcome.after is None and outcome.before is not None
    assert not (tmp_path / "lab.lock").exists()
    assert dl.release(str(tmp_path), "lab", ALICE).changed is False
    assert dl.release(str(tmp_path / "never-made"), "lab", ALICE).changed is False
    assert dl.acquire(str(tmp_path), "lab", BOB, 7200).changed is True


def test_check_mode_changes_nothing(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    outcome = dl.acquire(str(lock_dir), "lab", ALICE, 7200, check_mode=True)
    assert outcome.changed is True and outcome.after is not None and outcome.after["owner"] == ALICE
    assert not lock_dir.exists()

    write_lock(lock_dir / "lab.lock", ALICE, time.time() - 8000)
    text = (lock_dir / "lab.lock").read_text(encoding="utf-8")
    outcome = dl.acquire(str(lock_dir), "lab", BOB, 7200, check_mode=True)
    assert outcome.changed is True and outcome.warnings
    assert dl.release(str(lock_dir), "lab", ALICE, check_mode=True).changed is True
    assert (lock_dir / "lab.lock").read_text(encoding="utf-8") == text
    assert sorted(p.name for p in lock_dir.iterdir()) == ["lab.lock"]


def test_a_name_that_is_not_a_file_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot name a lock file"):
        dl.acquire(str(tmp_path), "../etc/passwd", ALICE, 7200)


def test_threads_racing_to_acquire_one_wins(tmp_path: Path) -> None:
    def take(i: int) -> bool:
        try:
            dl.acquire(str(tmp_path), "lab", f"run {i}", 7200)
        except dl.LockError:
            return False
        return True

    assert sum(race(take, 16)) == 1


def test_threads_racing_on_a_stale_lock_one_takes_it_over(tmp_path: Path) -> None:
    write_lock(tmp_path / "lab.lock", ALICE, time.time() - 8000)

    def take(i: int) -> bool:
        try:
            dl.acquire(str(tmp_path), "lab", f"run {i}", 7200)
        except dl.LockError:
            return False
        return True

    won = race(take, 12)
    assert sum(won) == 1
    held = json.loads((tmp_path / "lab.lock").read_text(encoding="utf-8"))
    assert held["owner"] == f"run {won.index(True)}"


def test_exclusive_create_alone_lets_one_racer_in(tmp_path: Path) -> None:
    path = str(tmp_path / "lab.lock")
    assert sum(race(lambda i: dl.create_exclusive(path, {"owner": f"run {i}", "since": 0, "pid": i}), 16)) == 1


def test_processes_racing_to_acquire_one_wins(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from ansible_collections.sparkserve.deploy.plugins.modules import deployment_lock as dl\n"
        "time.sleep(max(float(sys.argv[2]) - time.time(), 0))\n"
        "try:\n"
        "    dl.acquire(sys.argv[1], 'lab', sys.argv[3], 7200)\n"
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

    refused = run_main(dict(args, owner=BOB), capsys)
    assert refused["failed"] is True and refused["msg"].startswith(f"deployment lab is being launched by {ALICE}")
    assert refused["holder"]["owner"] == ALICE

    released = run_main(dict(args, state="absent"), capsys)
    assert released["changed"] is True and released["holder"] is None and released["diff"]["after"] == "not held\n"
    assert not (tmp_path / "lab.lock").exists()


def test_main_warns_on_a_takeover_and_honours_check_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_lock(tmp_path / "lab.lock", ALICE, time.time() - 8000)
    args = {"name": "lab", "owner": BOB, "lock_dir": str(tmp_path), "stale_after_s": 3600}
    checked = run_main(dict(args, _ansible_check_mode=True), capsys)
    assert checked["changed"] is True and checked["holder"]["owner"] == BOB
    assert json.loads((tmp_path / "lab.lock").read_text(encoding="utf-8"))["owner"] == ALICE
    result = run_main(args, capsys)
    assert result["changed"] is True and result["taken_over"]["owner"] == ALICE
    assert f"took over the lock of deployment lab from {ALICE}" in json.dumps(result["warnings"])
    assert json.loads((tmp_path / "lab.lock").read_text(encoding="utf-8"))["owner"] == BOB
