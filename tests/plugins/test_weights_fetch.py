"""Tests for weights_fetch: the plan and the rsync command, then real transfers from a real rsync daemon."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.module_utils import weights as w
from ansible_collections.sparkserve.deploy.plugins.modules import weights_fetch as wf

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

REVISION = "00112233445566778899aabbccddeeff00112233"
CONTENTS = {
    "config.json": b'{"hidden_size": 64}',
    "model-00001-of-00002.safetensors": os.urandom(3_000_000),
    "model-00002-of-00002.safetensors": os.urandom(500_000),
    "sub/tokenizer.json": b'{"vocab": {}}',
}
SOURCE = "rsync://10.77.1.11:8730/weights/org/name/" + REVISION + "/"


def manifest_of(contents: dict[str, bytes]) -> dict[str, Any]:
    files = {p: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest(), "source": "computed"}
             for p, d in contents.items()}
    return {"format": 1, "repo": "org/name", "revision": REVISION, "files": files}


def write_tree(root: Path, contents: dict[str, bytes]) -> None:
    for relpath, data in contents.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)


# Pure functions

def test_plan_takes_missing_and_wrong_sized_files_in_manifest_order() -> None:
    files = manifest_of(CONTENTS)["files"]
    sizes = {"config.json": len(CONTENTS["config.json"]), "model-00001-of-00002.safetensors": 10,
             "model-00002-of-00002.safetensors": None}
    assert wf.plan_fetch(files, sizes) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "sub/tokenizer.json"]
    assert wf.plan_fetch(files, sizes, ["sub/tokenizer.json", "model-00001-of-00002.safetensors", "config.json"]) == [
        "model-00001-of-00002.safetensors", "sub/tokenizer.json"]
    assert wf.plan_fetch(files, {p: len(d) for p, d in CONTENTS.items()}) == []


def test_plan_refuses_files_not_in_the_manifest() -> None:
    with pytest.raises(ValueError, match="files not in the manifest: x.bin, y.bin"):
        wf.plan_fetch(manifest_of(CONTENTS)["files"], {}, ["config.json", "x.bin", "y.bin"])


def test_rsync_argv() -> None:
    assert wf.rsync_argv("rsync", SOURCE, "sub/tokenizer.json", "/srv/m/rev") == [
        "rsync", "--times", "--inplace", "--timeout=300", "--contimeout=30", "--",
        f"rsync://10.77.1.11:8730/weights/org/name/{REVISION}/sub/tokenizer.json",
        "/srv/m/rev/sub/.sparkserve-partial/tokenizer.json"]
    argv = wf.rsync_argv("/usr/bin/rsync", SOURCE.rstrip("/"), "config.json", "/d", bwlimit_kib=1024, io_timeout_s=60)
    assert argv[0] == "/usr/bin/rsync" and "--bwlimit=1024" in argv and "--timeout=60" in argv
    assert argv[-2:] == [f"rsync://10.77.1.11:8730/weights/org/name/{REVISION}/config.json",
                         "/d/.sparkserve-partial/config.json"]


def test_not_there_yet() -> None:
    assert wf.not_there_yet(23, 'rsync: [sender] link_stat "x" (in weights) failed: No such file or directory (2)')
    assert wf.not_there_yet(23, 'rsync: [sender] change_dir "org" (in weights) failed: No such file or directory (2)')
    assert not wf.not_there_yet(23, 'rsync: [Receiver] mkstemp "x" failed: Permission denied (13)')
    assert not wf.not_there_yet(10, "failed to connect to 10.77.1.11: Connection refused (111)")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waits_then_gives_up_naming_the_file(tmp_path: Path) -> None:
    clock = FakeClock()
    calls: list[list[str]] = []

    def runner(argv: Sequence[str]) -> tuple[int, str]:
        calls.append(list(argv))
        return 23, 'rsync: [sender] link_stat "config.json" (in weights) failed: No such file or directory (2)'

    files = manifest_of(CONTENTS)["files"]
    with pytest.raises(wf.FetchError, match=r"config.json did not appear upstream within 10 s") as caught:
        wf.fetch(SOURCE, str(tmp_path), files, ["config.json"], wait_timeout_s=10, poll_s=0.5, runner=runner,
                 clock=clock, sleep=clock.sleep)
    assert len(calls) == 21 and caught.value.fetched == []


def test_retries_a_dropped_connection_then_fails_on_other_errors(tmp_path: Path) -> None:
    clock = FakeClock()
    answers = [(10, "Connection refused"), (12, "protocol data stream"), (0, "")]

    def runner(argv: Sequence[str]) -> tuple[int, str]:
        rc, text = answers.pop(0)
        if rc == 0:
            Path(argv[-1]).write_bytes(CONTENTS["config.json"])
        return rc, text

    files = manifest_of(CONTENTS)["files"]
    done = wf.fetch(SOURCE, str(tmp_path), files, ["config.json"], retries=2, runner=runner, clock=clock,
                    sleep=clock.sleep)
    assert done.fetched == ["config.json"] and done.bytes_fetched == len(CONTENTS["config.json"])

    with pytest.raises(wf.FetchError, match=r"failed \(exit 5\): @ERROR: Unknown module 'weights'"):
        wf.fetch(SOURCE, str(tmp_path), files, ["sub/tokenizer.json"],
                 runner=lambda argv: (5, "@ERROR: Unknown module 'weights'\n"), clock=clock, sleep=clock.sleep)


def test_a_wrong_size_from_upstream_fails(tmp_path: Path) -> None:
    def runner(argv: Sequence[str]) -> tuple[int, str]:
        Path(argv[-1]).write_bytes(b"not the right size")
        return 0, ""

    with pytest.raises(wf.FetchError, match="config.json came from .* with size 18, the manifest says 19"):
        wf.fetch(SOURCE, str(tmp_path), manifest_of(CONTENTS)["files"], ["config.json"], runner=runner)


# A real rsync daemon

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


DaemonFactory = Callable[[Path], str]


@pytest.fixture
def rsync_daemon(tmp_path: Path) -> Iterator[DaemonFactory]:
    """Start read-only rsync daemons on 127.0.0.1, module 'weights' over a given folder; each gives its URL.

    The daemons are ended when the test ends.
    """
    if shutil.which("rsync") is None:
        pytest.fail("rsync is not installed (apt-get install rsync)")
    daemons: list[subprocess.Popen[bytes]] = []

    def start(served: Path) -> str:
        n = len(daemons)
        conf = tmp_path / f"rsyncd-{n}.conf"
        log = tmp_path / f"rsyncd-{n}.log"
        conf.write_text(
            "use chroot = no\n"
            f"log file = {log}\n"
            "[weights]\n"
            f"  path = {served}\n"
            "  read only = yes\n"
            "  exclude = .sparkserve-*\n"
            f"  uid = {os.getuid()}\n"
            f"  gid = {os.getgid()}\n", encoding="utf-8")
        port = free_port()
        daemons.append(subprocess.Popen(
            ["rsync", "--daemon", "--no-detach", f"--port={port}", "--address=127.0.0.1", f"--config={conf}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 5
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return f"rsync://127.0.0.1:{port}/weights/"
            except OSError as err:
                if daemons[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the rsync daemon did not start: {log.read_text() if log.exists() else ''}") from err
                time.sleep(0.05)

    try:
        yield start
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=5)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


@pytest.fixture
def upstream(tmp_path: Path, rsync_daemon: DaemonFactory) -> tuple[Path, str]:
    """A daemon serving tmp_path/up; (the upstream's revision folder, its source URL)."""
    folder = tmp_path / "up" / "org" / "name" / REVISION
    folder.mkdir(parents=True)
    return folder, rsync_daemon(tmp_path / "up") + f"org/name/{REVISION}/"


def local_copy(tmp_path: Path, contents: dict[str, bytes]) -> Path:
    """The downstream revision folder, holding only the manifest (as the role leaves it)."""
    down = tmp_path / "down" / REVISION
    down.mkdir(parents=True)
    (down / w.MANIFEST_NAME).write_text(json.dumps(manifest_of(contents)), encoding="utf-8")
    return down


def fetch_with_stats(source: str, down: Path, relpath: str) -> tuple[wf.Outcome, int]:
    """Fetch one file with rsync's --stats; the outcome and the bytes rsync matched in what was already there."""
    outputs: list[str] = []

    def with_stats(argv: Sequence[str]) -> tuple[int, str]:
        rc, output = wf.run([argv[0], "--stats", *argv[1:]])
        outputs.append(output)
        return rc, output

    done = wf.fetch(source, str(down), manifest_of(CONTENTS)["files"], [relpath], runner=with_stats)
    matched = re.search(r"Matched data: ([\d,.]+) bytes", outputs[-1])
    assert matched, outputs[-1]
    return done, int(re.sub(r"\D", "", matched.group(1)))


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        wf.main()
    return json.loads(capsys.readouterr().out)


def test_fetches_every_file_byte_for_byte(tmp_path: Path, upstream: tuple[Path, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    folder, source = upstream
    write_tree(folder, CONTENTS)
    (folder / ".sparkserve-verify-cache.json").write_text("{}")
    down = local_copy(tmp_path, CONTENTS)
    (down / "config.json").write_bytes(CONTENTS["config.json"])  # already here: not fetched again
    out = run_main({"source": source, "path": str(down), "poll_s": 0.05}, capsys)
    assert "failed" not in out, out
    assert out["changed"] is True
    assert out["fetched"] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "sub/tokenizer.json"]
    assert out["bytes_fetched"] == 3_500_000 + len(CONTENTS["sub/tokenizer.json"])
    for relpath, data in CONTENTS.items():
        assert (down / relpath).read_bytes() == data
    assert (down / "model-00002-of-00002.safetensors").stat().st_mtime_ns // 10**9 == \
        (folder / "model-00002-of-00002.safetensors").stat().st_mtime_ns // 10**9  # --times
    assert not (down / ".sparkserve-verify-cache.json").exists()
    verified = w.verify(str(down), manifest_of(CONTENTS))
    assert (verified["missing"], verified["corrupt"], verified["unexpected"]) == ([], [], [])

    again = run_main({"source": source, "path": str(down)}, capsys)
    assert (again["changed"], again["fetched"], again["bytes_fetched"]) == (False, [], 0)


def test_a_file_that_appears_later_is_waited_for(tmp_path: Path, upstream: tuple[Path, str]) -> None:
    folder, source = upstream
    write_tree(folder, {"config.json": CONTENTS["config.json"]})
    late = CONTENTS["model-00002-of-00002.safetensors"]
    asked_before_there = threading.Event()
    answers: list[int] = []

    def runner(argv: Sequence[str]) -> tuple[int, str]:
        rc, output = wf.run(argv)
        answers.append(rc)
        if wf.not_there_yet(rc, output):
            asked_before_there.set()
        return rc, output

    def arrive() -> None:
        asked_before_there.wait(timeout=60)  # the file appears only once the fetch has asked for it in vain
        (folder / ".model-00002-of-00002.safetensors.tmp").write_bytes(late)
        os.rename(folder / ".model-00002-of-00002.safetensors.tmp", folder / "model-00002-of-00002.safetensors")

    contents = {"config.json": CONTENTS["config.json"], "model-00002-of-00002.safetensors": late}
    down = local_copy(tmp_path, contents)
    writer = threading.Thread(target=arrive)
    writer.start()
    try:
        done = wf.fetch(source, str(down), manifest_of(contents)["files"], list(contents), wait_timeout_s=120,
                        poll_s=0.1, runner=runner)
    finally:
        writer.join()
    assert done.fetched == list(contents)
    assert asked_before_there.is_set() and wf.RSYNC_PARTIAL in answers and answers[-1] == 0
    assert (down / "model-00002-of-00002.safetensors").read_bytes() == late


def test_a_file_that_never_appears_times_out(tmp_path: Path, upstream: tuple[Path, str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    folder, source = upstream
    write_tree(folder, {"config.json": CONTENTS["config.json"]})
    down = local_copy(tmp_path, CONTENTS)
    out = run_main({"source": source, "path": str(down), "wait_timeout_s": 0, "poll_s": 0.05}, capsys)
    assert out["failed"] is True
    assert out["msg"].startswith(f"{source}model-00001-of-00002.safetensors did not appear upstream within 0 s")
    assert out["fetched"] == ["config.json"] and out["changed"] is True


def test_check_mode_fetches_nothing(tmp_path: Path, upstream: tuple[Path, str],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    folder, source = upstream
    write_tree(folder, CONTENTS)
    down = local_copy(tmp_path, CONTENTS)
    out = run_main({"source": source, "path": str(down), "files": ["config.json", "sub/tokenizer.json"],
                    "_ansible_check_mode": True}, capsys)
    assert out["changed"] is True and out["fetched"] == ["config.json", "sub/tokenizer.json"]
    assert sorted(p.name for p in down.iterdir()) == [w.MANIFEST_NAME]


def test_a_disk_without_room_fetches_nothing_and_says_how_much_is_missing(
        tmp_path: Path, upstream: tuple[Path, str], small_disk: Any, capsys: pytest.CaptureFixture[str]) -> None:
    folder, source = upstream
    write_tree(folder, CONTENTS)
    down = local_copy(small_disk(1024), CONTENTS)  # 1 MiB; the shards are 3.5 MB
    partial = Path(wf.partial_path(str(down), "model-00001-of-00002.safetensors"))
    partial.parent.mkdir()
    partial.write_bytes(CONTENTS["model-00001-of-00002.safetensors"][:500_000])  # counts as already written
    out = run_main({"source": source, "path": str(down), "poll_s": 0.05}, capsys)
    missing = 3_500_000 - 500_000 + len(CONTENTS["config.json"]) + len(CONTENTS["sub/tokenizer.json"])
    assert out["failed"] is True and out["fetched"] == [] and out["changed"] is False, out
    assert out["msg"].startswith("no room for 4 file(s) of this revision under %s: %.1f MiB still to write, "
                                 % (down, missing / 2**20)), out["msg"]
    assert "free on its file system; free " in out["msg"]
    assert sorted(p.name for p in down.iterdir()) == sorted([w.MANIFEST_NAME, wf.FETCH_LOCK_NAME, w.PARTIAL_DIR])


def test_an_interrupted_transfer_resumes_from_the_partial_file(tmp_path: Path, upstream: tuple[Path, str]) -> None:
    folder, source = upstream
    write_tree(folder, CONTENTS)
    big = "model-00001-of-00002.safetensors"
    down = local_copy(tmp_path, CONTENTS)
    (down / w.PARTIAL_DIR).mkdir()
    (down / w.PARTIAL_DIR / big).write_bytes(CONTENTS[big][:1_000_000])  # what a broken-off transfer leaves
    done, matched = fetch_with_stats(source, down, big)
    assert done.fetched == [big]
    assert (down / big).read_bytes() == CONTENTS[big]
    assert matched == 1_000_000  # the partial file was used
    assert not (down / w.PARTIAL_DIR).exists()  # and cleared away


def test_a_killed_transfer_keeps_every_byte_it_wrote_under_the_partial_name(
        tmp_path: Path, upstream: tuple[Path, str]) -> None:
    """rsync killed outright (as a lost node or a Ctrl-C would) leaves its bytes in .sparkserve-partial/."""
    folder, source = upstream
    write_tree(folder, CONTENTS)
    big = "model-00001-of-00002.safetensors"
    down = local_copy(tmp_path, CONTENTS)
    partial = down / w.PARTIAL_DIR / big
    seen: list[int] = []

    def killed_midway(argv: Sequence[str]) -> tuple[int, str]:
        # rsync forks its receiver: kill the whole group, as a lost node or a Ctrl-C would.
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size >= 262_144):  # an observable byte count
            assert proc.poll() is None and time.monotonic() < deadline, "rsync wrote no 256 KiB"
            time.sleep(0.01)
        seen.append(partial.stat().st_size)
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        while True:  # until no process of the group is left (the receiver goes with its parent)
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "rsync's receiver outlived the kill"
            time.sleep(0.01)
        return rc, "killed"

    with pytest.raises(wf.FetchError, match=r"failed \(exit -9\)"):
        wf.fetch(source, str(down), manifest_of(CONTENTS)["files"], [big], bwlimit_kib=256, runner=killed_midway)
    kept = partial.read_bytes()
    assert len(kept) >= seen[0] and kept == CONTENTS[big][:len(kept)]
    assert not (down / big).exists()

    assert stat.S_IMODE(partial.stat().st_mode) == 0o600  # as rsync left it while receiving
    done, matched = fetch_with_stats(source, down, big)
    assert done.fetched == [big]
    assert (down / big).read_bytes() == CONTENTS[big] and not (down / w.PARTIAL_DIR).exists()
    assert stat.S_IMODE((down / big).stat().st_mode) == 0o644  # the node's daemon serves it downstream
    assert matched >= seen[0] // 2  # resumed, not started again


def test_a_wrong_sized_file_in_place_is_the_basis_of_its_transfer(tmp_path: Path, upstream: tuple[Path, str]) -> None:
    folder, source = upstream
    write_tree(folder, CONTENTS)
    big = "model-00001-of-00002.safetensors"
    down = local_copy(tmp_path, CONTENTS)
    (down / big).write_bytes(CONTENTS[big][:2_000_000])  # a truncated copy
    _, matched = fetch_with_stats(source, down, big)
    assert (down / big).read_bytes() == CONTENTS[big]
    assert matched >= 1_990_000  # all but the last block


def test_a_partial_file_larger_than_the_file_is_dropped(tmp_path: Path, upstream: tuple[Path, str]) -> None:
    folder, source = upstream
    write_tree(folder, CONTENTS)
    small = "model-00002-of-00002.safetensors"
    down = local_copy(tmp_path, CONTENTS)
    (down / w.PARTIAL_DIR).mkdir()
    (down / w.PARTIAL_DIR / small).write_bytes(CONTENTS[small] + b"trailing bytes")
    wf.fetch(source, str(down), manifest_of(CONTENTS)["files"], [small])
    assert (down / small).read_bytes() == CONTENTS[small]


def test_a_wrong_partial_file_still_gives_the_right_result(tmp_path: Path, upstream: tuple[Path, str]) -> None:
    folder, source = upstream
    write_tree(folder, CONTENTS)
    big = "model-00001-of-00002.safetensors"
    down = local_copy(tmp_path, CONTENTS)
    (down / w.PARTIAL_DIR).mkdir()
    (down / w.PARTIAL_DIR / big).write_bytes(os.urandom(700_000))
    wf.fetch(source, str(down), manifest_of(CONTENTS)["files"], [big])
    assert (down / big).read_bytes() == CONTENTS[big]


def test_the_daemon_does_not_serve_bookkeeping(tmp_path: Path, upstream: tuple[Path, str]) -> None:
    folder, source = upstream
    (folder / w.MANIFEST_NAME).write_text("{}")
    rc, output = wf.run(wf.rsync_argv("rsync", source, w.MANIFEST_NAME, str(tmp_path)))
    assert wf.not_there_yet(rc, output)


def test_main_refuses_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    down = local_copy(tmp_path, CONTENTS)
    assert "is not an rsync daemon address" in run_main({"source": "/tmp/x", "path": str(down)}, capsys)["msg"]
    out = run_main({"source": SOURCE, "path": str(down), "files": ["nope.bin"]}, capsys)
    assert out["msg"] == "files not in the manifest: nope.bin"
    assert "poll_s and io_timeout_s" in run_main({"source": SOURCE, "path": str(down), "poll_s": 0}, capsys)["msg"]
    missing = run_main({"source": SOURCE, "path": str(tmp_path / "elsewhere")}, capsys)
    assert missing["msg"] == f"manifest {tmp_path / 'elsewhere' / w.MANIFEST_NAME} does not exist"


def test_a_relay_chain_passes_files_on_while_receiving(tmp_path: Path, rsync_daemon: DaemonFactory) -> None:
    """seeder -> b -> c, fetching at once: c gets each file from b as soon as b has it, while b goes on."""
    contents = {f"model-0000{n}-of-00003.safetensors": os.urandom(1_000_000) for n in (1, 2, 3)}
    seeder = tmp_path / "seeder"
    write_tree(seeder, contents)
    b, c = tmp_path / "b", tmp_path / "c"
    b.mkdir()
    c.mkdir()
    plan = w.plan_relay(["seeder", "b", "c"], "seeder")
    urls = {"seeder": rsync_daemon(seeder), "b": rsync_daemon(b)}
    files = manifest_of(contents)["files"]
    got: dict[str, dict[str, float]] = {"b": {}, "c": {}}
    errors: list[BaseException] = []

    c_has_first = threading.Event()
    first, last = "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"

    def node(name: str, folder: Path, bwlimit_kib: int) -> None:
        def runner(argv: Sequence[str]) -> tuple[int, str]:
            if name == "b" and Path(argv[-1]).name == last:
                c_has_first.wait(timeout=30)  # b holds its last shard back until c has the first from it
            rc, output = wf.run(argv)
            if rc == 0:
                got[name][Path(argv[-1]).name] = time.monotonic()
                if name == "c" and Path(argv[-1]).name == first:
                    c_has_first.set()
            return rc, output

        try:
            wf.fetch(urls[plan[name]], str(folder), files, list(files), wait_timeout_s=10, poll_s=0.05,
                     bwlimit_kib=bwlimit_kib, runner=runner)
        except BaseException as err:  # noqa: BLE001 - the test reports it
            errors.append(err)

    threads = [threading.Thread(target=node, args=("b", b, 4096)), threading.Thread(target=node, args=("c", c, 0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for relpath, data in contents.items():
        assert (c / relpath).read_bytes() == data
    assert c_has_first.is_set()
    assert got["c"][first] < got["b"][last]  # c had the first shard while b was still receiving


def test_a_fetch_waits_for_the_one_still_running_in_its_folder(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    root = tmp_path / "rev"
    root.mkdir()
    contents = {"a.bin": b"a" * 10}
    (root / w.MANIFEST_NAME).write_text(json.dumps(manifest_of(contents)))
    (root / "a.bin").write_bytes(contents["a.bin"])
    args = {"source": SOURCE, "path": str(root)}
    with open(root / wf.FETCH_LOCK_NAME, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = threading.Event()

        def fetch_now() -> None:
            with patch_module_args(args), pytest.raises(SystemExit):
                wf.main()
            done.set()

        worker = threading.Thread(target=fetch_now)
        worker.start()
        assert not done.wait(0.5), "the fetch went on while another held the folder"
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(30)
    assert done.is_set()
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] is False and result["fetched"] == []
