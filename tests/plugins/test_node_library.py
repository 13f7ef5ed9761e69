"""Unit tests for the node library (plugins/module_utils/node): what the node programs and the modules share."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import api, docker, files, lock, meminfo, process
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.config import ConfigError, read_json

MEMINFO = ("MemTotal:       131072000 kB\nMemFree:          2048000 kB\nMemAvailable:    65536000 kB\n"
           "Cached:          30000000 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\nbroken line\n"
           "NoValue:\nWords: many kB\n")


# --- meminfo ---------------------------------------------------------------------------------


def test_meminfo_values_are_bytes_where_the_line_says_kb_and_counts_stay_counts() -> None:
    values = meminfo.parse_meminfo(MEMINFO)
    assert values == {"MemTotal": 131072000 * 1024, "MemFree": 2048000 * 1024, "MemAvailable": 65536000 * 1024,
                      "Cached": 30000000 * 1024, "HugePages_Total": 0, "Hugepagesize": 2048 * 1024}
    assert meminfo.mem_available(MEMINFO) == 65536000 * 1024
    with pytest.raises(ValueError, match="no MemAvailable"):
        meminfo.mem_available("MemFree: 1 kB\n")


def test_reading_a_missing_meminfo_file_says_which_and_why(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO, encoding="ascii")
    assert meminfo.read_meminfo(str(tmp_path / "meminfo"))["Cached"] == 30000000 * 1024
    assert meminfo.read_mem_available(str(tmp_path / "meminfo")) == 65536000 * 1024
    with pytest.raises(meminfo.MeminfoError, match=f"cannot read {tmp_path}/absent: No such file or directory"):
        meminfo.read_meminfo(str(tmp_path / "absent"))


# --- files -----------------------------------------------------------------------------------


def test_an_atomic_write_replaces_the_file_with_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old", encoding="utf-8")
    umask = os.umask(0o077)
    try:
        files.write_atomic(str(path), "new ✓")
        files.write_atomic(str(tmp_path / "secret"), b"\x00\x01", mode=0o600, sync=False)
    finally:
        os.umask(umask)
    assert path.read_text(encoding="utf-8") == "new ✓" and path.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "secret").read_bytes() == b"\x00\x01" and (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret", "state.json"]  # no temporary file left


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    path = tmp_path / ".sparkserve-verify-cache.json"
    path.write_text("old", encoding="utf-8")
    seen: list[str] = []

    def fail(source: str, target: str) -> None:
        seen.append(os.path.basename(source))
        raise error

    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(type(error)):
        files.write_atomic(str(path), "new")
    assert path.read_text(encoding="utf-8") == "old"
    assert os.listdir(tmp_path) == [path.name]
    # The temporary file was hidden beside it and kept the name's own dot: still .sparkserve-*, never a model file.
    assert seen[0].startswith(".sparkserve-verify-cache.json.") and seen[0].endswith(".tmp")


def test_an_atomic_write_interrupted_as_its_temporary_file_is_made_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal can unwind at any bytecode: right after the temporary file exists, before its name is returned."""
    path = tmp_path / "sparkserve-flusher-lab.prom"
    real_open = os.open

    def open_then_interrupted(name: str, flags: int, mode: int = 0o777) -> int:
        os.close(real_open(name, flags, mode))
        raise KeyboardInterrupt()

    monkeypatch.setattr(files.os, "open", open_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(str(path), "x")
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(files.os, "open", real_open)
    # The name is this process's own: one an earlier process of the same pid left is replaced, not a failure.
    stale = tmp_path / f".{path.name}.{os.getpid()}.{next(files._SERIAL) + 1}.tmp"
    stale.write_text("stale", encoding="utf-8")
    files.write_atomic(str(path), "new")
    assert sorted(os.listdir(tmp_path)) == [path.name] and path.read_text(encoding="utf-8") == "new"


def test_an_atomic_write_into_a_missing_folder_fails_and_makes_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        files.write_atomic(str(tmp_path / "absent" / "x.prom"), "x")
    assert os.listdir(tmp_path) == []


def test_appended_lines_are_one_json_object_each_and_the_folder_is_made(tmp_path: Path) -> None:
    path = tmp_path / "memguard" / "glm53.events.jsonl"
    files.append_line(str(path), json.dumps({"event": "killed", "n": 1}))
    files.append_line(str(path), json.dumps({"event": "stopped", "n": 2}))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [{"event": "killed", "n": 1}, {"event": "stopped", "n": 2}]


# --- the lock-file protocol ------------------------------------------------------------------

T0 = 1_795_993_200.0


def test_a_lease_runs_until_renewed_plus_lease_and_no_longer(tmp_path: Path) -> None:
    path = lock.lock_file(str(tmp_path), "lab")
    holder = lock.make_holder("alice", T0, T0 + 100, 600, lock.new_token())
    assert lock.create_holder(path, holder) is True
    assert lock.create_holder(path, holder) is False  # O_EXCL: the second creator is refused
    read = lock.read_holder(path)
    assert read == holder and read is not None and read["expires"] == T0 + 700
    assert lock.lease_runs(read, T0 + 699) is True
    assert lock.lease_runs(read, T0 + 700) is False
    renewed = lock.make_holder("alice", T0, T0 + 650, 600, holder["token"])
    lock.replace_holder(path, renewed)
    assert lock.lease_runs(lock.read_holder(path) or {}, T0 + 1000) is True
    assert sorted(os.listdir(tmp_path)) == ["lab.lock"]
    lock.remove_holder(path)
    lock.remove_holder(path)  # already gone is fine
    assert lock.read_holder(path) is None


@pytest.mark.parametrize(("text", "owner"), [
    ("", lock.UNREADABLE_OWNER),
    ("not json", lock.UNREADABLE_OWNER),
    (json.dumps({"owner": "old release", "since": T0}), "old release"),  # no token: an older format
])
def test_an_unreadable_or_old_lock_is_held_from_its_mtime_with_the_default_lease(
    tmp_path: Path, text: str, owner: str
) -> None:
    path = tmp_path / "lab.lock"
    path.write_text(text, encoding="utf-8")
    os.utime(path, (T0, T0))
    holder = lock.read_holder(str(path))
    assert holder is not None and holder["owner"] == owner and holder["token"] is None
    assert holder["expires"] == T0 + lock.DEFAULT_LEASE_S
    assert lock.lease_runs(holder, T0 + lock.DEFAULT_LEASE_S - 1) and not lock.lease_runs(
        holder, T0 + lock.DEFAULT_LEASE_S)


def test_the_guard_lets_one_writer_in_at_a_time(tmp_path: Path) -> None:
    inside: list[int] = []
    most: list[int] = []

    def writer() -> None:
        for _ in range(20):
            with lock.guard(str(tmp_path), "lab"):
                inside.append(1)
                most.append(len(inside))
                inside.pop()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(most) == 1 and len(most) == 80
    assert (tmp_path / ".lab.lock.guard").exists()


# --- docker, processes, the API --------------------------------------------------------------


@pytest.mark.parametrize(("rc", "out", "err", "status", "exit_code"), [
    (0, '{"Running": true, "StartedAt": "2027-01-15T08:00:30.123456789Z"}\n', "", docker.RUNNING, None),
    (0, 'warning\n{"Running": false, "OOMKilled": false, "ExitCode": 137}\n', "", docker.EXITED, 137),
    (0, '{"Running": false, "OOMKilled": true, "ExitCode": 137}', "", docker.OOM, 137),
    (1, "", "Error: No such container: r1\n", docker.GONE, None),
    (1, "Error response from daemon: no such object: r1", "", docker.GONE, None),
    (255, "", "ssh: connect to host spark-2: No route to host", docker.FAILED, None),
    (0, "<no value>\n", "", docker.FAILED, None),
])
def test_docker_inspect_is_read_one_way(rc: int, out: str, err: str, status: str, exit_code: object) -> None:
    seen = docker.read_inspect(rc, out, err)
    assert (seen.status, seen.exit_code) == (status, exit_code)
    assert seen.stopped == (status in (docker.EXITED, docker.OOM, docker.GONE))
    if status == docker.RUNNING:
        assert seen.started_at == pytest.approx(1_800_000_030.123456)


def test_commands_report_their_status_and_timeouts_and_peers_get_one_quoted_command() -> None:
    assert process.run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], 10) == (3, "out\n", "err\n")
    assert process.run_command(["/nonexistent/program"], 10)[0] == process.RC_NOT_STARTED
    assert process.run_command(["sleep", "5"], 0.2) == (process.RC_TIMED_OUT, "", "no answer after 0 s")
    assert process.remote_argv(["ssh", "-l", "root"], None, ["docker", "logs", "a b"]) == ["docker", "logs", "a b"]
    assert process.remote_argv(["ssh", "-l", "root"], "10.0.0.2", ["docker", "logs", "a b"]) == [
        "ssh", "-l", "root", "10.0.0.2", "--", "docker logs 'a b'"]
    assert process.one_line("a\n  b\tc") == "a b c"
    assert process.one_line("x" * 10, 8) == "xxxxx..."


def test_the_answers_of_the_readiness_probe_are_read_one_way() -> None:
    assert api.model_ids('{"data": [{"id": "tiny"}, {"object": "model"}, {"id": 2}]}') == ["tiny", "2"]
    assert api.model_ids("<html>proxy</html>") is None
    assert api.model_ids('{"data": "tiny"}') is None
    assert api.completion_choices('{"choices": [{"text": " 4"}]}') == [{"text": " 4"}]
    assert api.completion_choices('{"choices": {}}') is None
    assert api.answer_text("GET /health", 503, "Engine\n  loading", 300) == (
        "GET /health: 503 Service Unavailable: Engine loading")
    assert api.answer_text("GET /x", 599, "", 300) == "GET /x: 599"


def test_a_config_file_that_cannot_be_read_or_is_not_json_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it: No such file or directory"):
        read_json(str(tmp_path / "absent.json"))
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_json(str(tmp_path / "bad.json"))


# ---------------------------------------------------------------- a daemon's loop

def test_the_loop_ends_on_a_signal_cleans_up_and_puts_the_handlers_back(capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    from sparkserve_node.lifecycle import Shutdown, Terminated, run_until_terminated

    before = signal.getsignal(signal.SIGTERM)
    done: list[str] = []
    slept: list[float] = []

    def step() -> float:
        done.append("step")
        if len(done) == 3:
            raise Terminated()
        return 2.5

    code = run_until_terminated("guard lab", Shutdown(), step, False, slept.append,
                                on_terminate=lambda: done.append("metrics gone"), fatal=(OSError,),
                                cleanup=lambda: done.append("lock given back"))
    assert code == 0 and slept == [2.5, 2.5]
    assert done == ["step", "step", "step", "metrics gone", "lock given back"]
    assert signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().out == "guard lab: terminated; exiting\n"


def test_the_loop_exits_1_on_a_fatal_error_and_0_after_one_step_when_once() -> None:
    from sparkserve_node.lifecycle import Shutdown, run_until_terminated

    def broken() -> float:
        raise OSError("state folder is read-only")

    assert run_until_terminated("sup", Shutdown(), broken, False, lambda s: None, lambda: None, (OSError,)) == 1
    steps: list[int] = []
    assert run_until_terminated("sup", Shutdown(), lambda: float(steps.append(1) or 1), True,
                                lambda s: steps.append(99), lambda: None, (OSError,)) == 0
    assert steps == [1]
