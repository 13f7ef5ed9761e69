"""Tests for the page-cache flusher (roles/flusher/files/sparkserve-flusher.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Mapping

import pytest
from sparkserve_node.meminfo import parse_meminfo

from tests.roles import exposition, node_layout
from tests.scripts import load_script

PROGRAM = "roles/flusher/files/sparkserve-flusher.py"
GIB = 1024**3


def load_module() -> ModuleType:
    return load_script(PROGRAM, "sparkserve_flusher")


def installed(tmp_path: Path) -> str:
    """The flusher as a node has it, with the node library in a folder of its own (run it with
    env=node_layout.env(tmp_path / "node")); its path."""
    return str(node_layout.install(tmp_path / "node", PROGRAM))


flusher = load_module()


def meminfo_text(cached: int, available: int) -> str:
    return (
        f"MemTotal:       {128 * GIB // 1024} kB\n"
        f"MemFree:        {2 * GIB // 1024} kB\n"
        f"MemAvailable:   {available // 1024} kB\n"
        f"Cached:         {cached // 1024} kB\n"
    )


class FakeMeminfo:
    """A reader whose every call returns the next sample (Cached, MemAvailable)."""

    def __init__(self, samples: list[tuple[int, int]]) -> None:
        self.samples: Iterator[tuple[int, int]] = iter(samples)
        self.paths: list[str] = []

    def __call__(self, path: str) -> Mapping[str, int]:
        self.paths.append(path)
        cached, available = next(self.samples)
        return parse_meminfo(meminfo_text(cached, available))


def options(tmp_path: Path, *args: str) -> Any:
    return flusher.parse_args(["--drop-caches-path", str(tmp_path / "drop_caches"),
                               "--meminfo-path", str(tmp_path / "meminfo"),
                               "--interval-s", "0.01", *args])


class DropCachesWatcher:
    """os.sync double that empties the fake drop-caches file, to see each write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.syncs = 0
        self.writes: list[str] = []

    def sync(self) -> None:
        if self.path.exists():
            self.writes.append(self.path.read_text(encoding="ascii"))
        self.path.write_text("", encoding="ascii")
        self.syncs += 1

    def finish(self) -> list[str]:
        """Every write, the last one included."""
        self.sync()
        return self.writes


def no_sleep(seconds: float) -> None:
    assert seconds >= 0


def test_each_pass_writes_3_and_logs_the_page_cache_it_freed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reader = FakeMeminfo([(30 * GIB, 60 * GIB), (10 * GIB, 80 * GIB),
                          (12 * GIB, 78 * GIB), (int(11.5 * GIB), int(78.75 * GIB))])
    watcher = DropCachesWatcher(tmp_path / "drop_caches")
    code = flusher.run(options(tmp_path, "--passes", "2"), read=reader, sync=watcher.sync, sleep=no_sleep)
    assert code == 0
    assert watcher.finish() == ["3", "3"]
    assert reader.paths == [str(tmp_path / "meminfo")] * 4
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "flusher: pass 1 freed 20.00 GiB of page cache (Cached 30.00 GiB -> 10.00 GiB); "
        "MemAvailable 80.00 GiB",
        "flusher: pass 2 freed 0.50 GiB of page cache (Cached 12.00 GiB -> 11.50 GiB); "
        "MemAvailable 78.75 GiB",
        "flusher: stopping after 2 passes: 2 passes are done",
    ]


def test_a_pass_that_frees_nothing_logs_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reader = FakeMeminfo([(5 * GIB, 60 * GIB), (6 * GIB, 59 * GIB)])
    flusher.run(options(tmp_path, "--passes", "1"), read=reader, sync=lambda: None, sleep=no_sleep)
    assert "pass 1 freed 0.00 GiB of page cache" in capsys.readouterr().out


def test_the_real_reader_parses_the_meminfo_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "meminfo").write_text(meminfo_text(3 * GIB, 90 * GIB), encoding="ascii")
    assert flusher.main([*map(str, ["--drop-caches-path", tmp_path / "drop_caches",
                                     "--meminfo-path", tmp_path / "meminfo", "--passes", "1"])]) == 0
    assert (tmp_path / "drop_caches").read_text(encoding="ascii") == "3"
    assert "(Cached 3.00 GiB -> 3.00 GiB); MemAvailable 90.00 GiB" in capsys.readouterr().out


def test_threshold_mode_flushes_only_above_the_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    threshold = 16 * GIB
    reader = FakeMeminfo([(threshold, 60 * GIB),  # at the threshold: skipped
                          (20 * GIB, 60 * GIB), (4 * GIB, 76 * GIB),  # above: flushed
                          (2 * GIB, 70 * GIB)])  # below: skipped
    watcher = DropCachesWatcher(tmp_path / "drop_caches")
    code = flusher.run(options(tmp_path, "--mode", "threshold", "--threshold-bytes", str(threshold),
                               "--passes", "3"),
                       read=reader, sync=watcher.sync, sleep=no_sleep)
    assert code == 0
    assert watcher.syncs == 1
    assert watcher.finish() == ["3"]
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if "freed" in line] == [
        "flusher: pass 2 freed 16.00 GiB of page cache (Cached 20.00 GiB -> 4.00 GiB); "
        "MemAvailable 76.00 GiB"]
    assert out[-1] == "flusher: stopping after 3 passes: 3 passes are done"


def test_the_until_file_stops_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    until = tmp_path / "loaded"
    reader = FakeMeminfo([(GIB, GIB)] * 100)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            until.touch()

    code = flusher.run(options(tmp_path, "--until-file", str(until)), read=reader,
                       sync=lambda: None, sleep=sleep)
    assert code == 0
    assert sleeps == [0.01] * 3
    assert capsys.readouterr().out.splitlines()[-1] == f"flusher: stopping after 3 passes: {until} exists"


def test_the_timeout_stops_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = [100.0]

    def clock() -> float:
        return now[0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    reader = FakeMeminfo([(GIB, GIB)] * 100)
    code = flusher.run(options(tmp_path, "--interval-s", "2", "--timeout-s", "5"), read=reader,
                       sync=lambda: None, sleep=sleep, clock=clock)
    assert code == 0
    assert now[0] == 105.0  # passes at 0, 2 and 4 s; the last sleep is cut to the timeout
    assert capsys.readouterr().out.splitlines()[-1] == (
        "flusher: stopping after 3 passes: the timeout of 5 s is reached")


def test_an_unwritable_drop_caches_path_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "drop_caches").mkdir()
    reader = FakeMeminfo([(GIB, GIB)] * 2)
    assert flusher.run(options(tmp_path, "--passes", "5"), read=reader, sync=lambda: None,
                       sleep=no_sleep) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"flusher: cannot write 3 to {tmp_path / 'drop_caches'}: Is a directory; "
        "check --drop-caches-path")


def test_no_permission_exits_1_and_says_to_run_as_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(path: str, mode: str, encoding: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(flusher, "open", refuse, raising=False)
    reader = FakeMeminfo([(GIB, GIB)] * 2)
    assert flusher.run(options(tmp_path), read=reader, sync=lambda: None, sleep=no_sleep) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"flusher: cannot write 3 to {tmp_path / 'drop_caches'}: Permission denied; "
        "run the flusher as root")


def test_the_program_exits_1_on_an_unwritable_path(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(meminfo_text(GIB, GIB), encoding="ascii")
    done = subprocess.run([sys.executable, installed(tmp_path), "--meminfo-path", str(tmp_path / "meminfo"),
                           "--drop-caches-path", str(tmp_path / "absent" / "drop_caches")],
                          capture_output=True, text=True, timeout=30, env=node_layout.env(tmp_path / "node"))
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        f"flusher: cannot write 3 to {tmp_path / 'absent' / 'drop_caches'}: No such file or directory; "
        "check --drop-caches-path")


def test_a_meminfo_without_cached_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable: 50 kB\n", encoding="ascii")
    assert flusher.main(["--meminfo-path", str(tmp_path / "meminfo"),
                         "--drop-caches-path", str(tmp_path / "drop_caches")]) == 1
    assert f"{tmp_path / 'meminfo'} has no Cached value" in capsys.readouterr().out
    assert not (tmp_path / "drop_caches").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "threshold"], "--mode threshold needs --threshold-bytes"),
        (["--threshold-bytes", "5"], "--threshold-bytes applies only to --mode threshold"),
        (["--mode", "sometimes"], "invalid choice: 'sometimes'"),
        (["--interval-s", "0"], "argument --interval-s: '0' is not above 0"),
        (["--timeout-s", "soon"], "argument --timeout-s: 'soon' is not a number"),
        (["--passes", "0"], "argument --passes: '0' is below 1"),
        (["--mode", "threshold", "--threshold-bytes", "-1"], "argument --threshold-bytes: '-1' is below 0"),
    ],
)
def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        flusher.parse_args(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_defaults(tmp_path: Path) -> None:
    parsed = flusher.parse_args([])
    assert parsed == flusher.Options(
        mode="unconditional", interval_s=2.0, threshold_bytes=None,
        drop_caches_path="/proc/sys/vm/drop_caches", meminfo_path="/proc/meminfo",
        until_file=None, timeout_s=3600.0, passes=None)


def run_program(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    (tmp_path / "meminfo").write_text(meminfo_text(GIB, GIB), encoding="ascii")
    return subprocess.Popen(
        [sys.executable, installed(tmp_path), "--meminfo-path", str(tmp_path / "meminfo"),
         "--drop-caches-path", str(tmp_path / "drop_caches"), "--interval-s", "0.02", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node_layout.env(tmp_path / "node"))


def finish(program: subprocess.Popen[str], action: Callable[[], None]) -> tuple[str, str]:
    try:
        assert program.stdout is not None
        assert program.stdout.readline().startswith("flusher: flushing at every pass")
        assert "pass 1 freed" in program.stdout.readline()
        action()
        out, err = program.communicate(timeout=30)
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
    return out, err


def test_the_program_exits_0_on_sigterm(tmp_path: Path) -> None:
    program = run_program(tmp_path)
    out, err = finish(program, lambda: program.send_signal(signal.SIGTERM))
    assert program.returncode == 0
    assert err == ""
    assert out.splitlines()[-1].startswith("flusher: terminated after ")
    assert (tmp_path / "drop_caches").read_text(encoding="ascii") == "3"


def test_the_program_stops_on_the_until_file(tmp_path: Path) -> None:
    until = tmp_path / "loaded"
    program = run_program(tmp_path, "--until-file", str(until))
    out, _ = finish(program, until.touch)
    assert program.returncode == 0
    assert out.splitlines()[-1].endswith(f": {until} exists")


def test_the_program_stops_on_its_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    program = run_program(tmp_path, "--timeout-s", "0.2")
    out, _ = finish(program, lambda: None)  # within finish's 30 s, far below the default timeout of 3600 s
    assert program.returncode == 0
    assert time.monotonic() - started >= 0.2  # not before its timeout
    last = out.splitlines()[-1]
    assert last.startswith("flusher: stopping after ") and last.endswith(": the timeout of 0.2 s is reached")
    # Passes come at least an interval (0.02 s) apart: at most 10 fit in 0.2 s, however slow the machine.
    assert 1 <= int(last.split()[3]) <= 10, last


# --- metrics (a node-exporter textfile) ---------------------------------------------

FLUSHER_FAMILIES = {
    "sparkserve_flusher_passes_total": "counter",
    "sparkserve_flusher_freed_bytes_total": "counter",
    "sparkserve_flusher_running": "gauge",
    "sparkserve_flusher_last_pass_timestamp_seconds": "gauge",
}
DEP = {"deployment": "glm53"}
EPOCH = 1_800_000_000.0


def metrics_file(tmp_path: Path) -> Path:
    folder = tmp_path / "textfile"
    folder.mkdir(exist_ok=True)
    return folder / "sparkserve-flusher-glm53.prom"


def figures(path: Path) -> tuple[float, float, float, float]:
    """passes, freed bytes, running, last pass: the file's four values."""
    families = exposition.read(path)
    assert {name: family.kind for name, family in families.items()} == FLUSHER_FAMILIES
    assert all(len(family.samples) == 1 for family in families.values())
    return tuple(families[name].value(**DEP) for name in FLUSHER_FAMILIES)  # type: ignore[return-value]


class FakeTime:
    """The unix time: each call one second later."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return EPOCH + self.calls


def test_the_file_at_start_after_each_pass_and_at_exit(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    reader = FakeMeminfo([(30 * GIB, 60 * GIB), (10 * GIB, 80 * GIB),
                          (12 * GIB, 78 * GIB), (int(11.5 * GIB), int(78.75 * GIB))])
    seen: list[tuple[float, float, float, float]] = []

    def sync() -> None:  # in a pass, before its drop: the file as the previous write left it
        seen.append(figures(path))

    def sleep(seconds: float) -> None:
        seen.append(figures(path))

    code = flusher.run(options(tmp_path, "--passes", "2", "--metrics-path", str(path), "--deployment", "glm53"),
                       read=reader, sync=sync, sleep=sleep, now=FakeTime())
    assert code == 0
    seen.append(figures(path))
    assert seen == [
        (0, 0, 1, 0),  # at start: nothing done yet
        (1, 20 * GIB, 1, EPOCH + 1),  # after pass 1
        (1, 20 * GIB, 1, EPOCH + 1),  # in pass 2
        (2, int(20.5 * GIB), 0, EPOCH + 2),  # after pass 2 the flusher exits: running 0, the file stays
    ]
    text = path.read_text(encoding="utf-8")
    assert text == (
        "# HELP sparkserve_flusher_passes_total Passes the flusher made since it started, those the threshold "
        "skipped included.\n"
        "# TYPE sparkserve_flusher_passes_total counter\n"
        'sparkserve_flusher_passes_total{deployment="glm53"} 2\n'
        "# HELP sparkserve_flusher_freed_bytes_total Bytes of page cache the flusher's passes freed since it "
        "started.\n"
        "# TYPE sparkserve_flusher_freed_bytes_total counter\n"
        f'sparkserve_flusher_freed_bytes_total{{deployment="glm53"}} {int(20.5 * GIB)}\n'
        "# HELP sparkserve_flusher_running 1 while the flusher runs, 0 once it exited.\n"
        "# TYPE sparkserve_flusher_running gauge\n"
        'sparkserve_flusher_running{deployment="glm53"} 0\n'
        "# HELP sparkserve_flusher_last_pass_timestamp_seconds Unix time the flusher's last pass ended; 0 before "
        "the first pass.\n"
        "# TYPE sparkserve_flusher_last_pass_timestamp_seconds gauge\n"
        f'sparkserve_flusher_last_pass_timestamp_seconds{{deployment="glm53"}} {int(EPOCH + 2)}\n')


def test_skipped_passes_count_and_a_growing_cache_frees_nothing(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    threshold = 16 * GIB
    reader = FakeMeminfo([(2 * GIB, 70 * GIB),  # below the threshold: skipped
                          (20 * GIB, 60 * GIB), (24 * GIB, 56 * GIB),  # flushed, yet the cache grew: 0 freed
                          (30 * GIB, 50 * GIB), (10 * GIB, 70 * GIB)])  # flushed: 20 GiB freed
    code = flusher.run(options(tmp_path, "--mode", "threshold", "--threshold-bytes", str(threshold),
                               "--passes", "3", "--metrics-path", str(path), "--deployment", "glm53"),
                       read=reader, sync=lambda: None, sleep=no_sleep, now=FakeTime())
    assert code == 0
    assert figures(path) == (3, 20 * GIB, 0, EPOCH + 3)


def test_the_timeout_leaves_the_file_with_running_0(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    now = [100.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    reader = FakeMeminfo([(GIB, GIB)] * 100)
    code = flusher.run(options(tmp_path, "--interval-s", "2", "--timeout-s", "5", "--metrics-path", str(path),
                               "--deployment", "glm53"),
                       read=reader, sync=lambda: None, sleep=sleep, clock=lambda: now[0], now=lambda: EPOCH + now[0])
    assert code == 0
    assert figures(path) == (3, 0, 0, EPOCH + 104)


def test_an_error_exit_leaves_the_file_with_running_0(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    (tmp_path / "drop_caches").mkdir()
    reader = FakeMeminfo([(GIB, GIB)] * 2)
    assert flusher.run(options(tmp_path, "--metrics-path", str(path), "--deployment", "glm53"), read=reader,
                       sync=lambda: None, sleep=no_sleep) == 1
    assert figures(path) == (0, 0, 0, 0)


def test_a_missing_folder_is_said_once_on_stderr_and_the_flusher_carries_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "absent" / "flusher.prom"
    reader = FakeMeminfo([(GIB, GIB)] * 6)
    watcher = DropCachesWatcher(tmp_path / "drop_caches")
    assert flusher.run(options(tmp_path, "--passes", "3", "--metrics-path", str(path), "--deployment", "glm53"),
                       read=reader, sync=watcher.sync, sleep=no_sleep) == 0
    assert watcher.finish() == ["3", "3", "3"]
    captured = capsys.readouterr()
    assert captured.err == (f"flusher: cannot write the metrics file {path}: No such file or directory; "
                            "carrying on without it\n")
    assert captured.out.splitlines()[-1] == "flusher: stopping after 3 passes: 3 passes are done"
    assert not (tmp_path / "absent").exists()


def test_without_metrics_path_nothing_is_written(tmp_path: Path) -> None:
    reader = FakeMeminfo([(GIB, GIB)] * 2)
    assert flusher.run(options(tmp_path, "--passes", "1", "--deployment", "glm53"), read=reader,
                       sync=lambda: None, sleep=no_sleep) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drop_caches"]


def test_the_metrics_options(tmp_path: Path) -> None:
    parsed = flusher.parse_args(["--metrics-path", "f.prom", "--deployment", "glm53"])
    assert (parsed.metrics_path, parsed.deployment) == ("f.prom", "glm53")
    assert (flusher.parse_args([]).metrics_path, flusher.parse_args([]).deployment) == (None, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-path", "f.prom"], "--metrics-path needs --deployment NAME (the metrics' deployment label)"),
        (["--metrics-path", "", "--deployment", "glm53"], "argument --metrics-path: '' is not a file path"),
        (["--metrics-path", "f.prom", "--deployment", "a b"],
         "argument --deployment: 'a b' is not a name of letters, digits, '_', '.' and '-' that starts with a letter "
         "or digit"),
        (["--deployment", "-x"], "argument --deployment: expected one argument"),
    ],
)
def test_bad_metrics_arguments_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        flusher.parse_args(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_program_refuses_metrics_path_without_deployment(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    done = subprocess.run([sys.executable, installed(tmp_path), "--metrics-path", str(path)],
                          capture_output=True, text=True, timeout=30, env=node_layout.env(tmp_path / "node"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith(
        "error: --metrics-path needs --deployment NAME (the metrics' deployment label)")
    assert not path.exists()


def test_the_program_keeps_its_file_with_running_0_after_sigterm(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    before = time.time()
    program = run_program(tmp_path, "--metrics-path", str(path), "--deployment", "glm53")
    out, err = finish(program, lambda: program.send_signal(signal.SIGTERM))
    assert program.returncode == 0
    assert err == ""
    assert out.splitlines()[-1].startswith("flusher: terminated after ")
    passes, freed, running, last_pass = figures(path)
    assert passes >= 1
    assert freed == 0  # the fake meminfo does not change
    assert running == 0
    assert before <= last_pass <= time.time()
    assert exposition.leftovers(path) == []
