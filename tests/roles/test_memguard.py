"""Tests for the memory guard (roles/memguard/files/sparkserve-memguard.py)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "roles/memguard/files/sparkserve-memguard.py"
GIB = 1024**3
FLOOR = 8 * GIB
HIGH = 20 * GIB
LOW = 4 * GIB


def load_module() -> ModuleType:
    return load_script("roles/memguard/files/sparkserve-memguard.py", "sparkserve_memguard")


memguard = load_module()


def meminfo_text(available: int, free: int) -> str:
    return (
        f"MemTotal:       {128 * GIB // 1024} kB\n"
        f"MemFree:        {free // 1024} kB\n"
        f"MemAvailable:   {available // 1024} kB\n"
        f"Cached:         {30 * GIB // 1024} kB\n"
        "HugePages_Total:       0\n"
    )


def write_meminfo(path: Path, available: int, free: int) -> None:
    """Replace the file at once, so that the guard never reads half of it."""
    scratch = path.with_name(path.name + ".new")
    scratch.write_text(meminfo_text(available, free), encoding="ascii")
    os.replace(scratch, path)


def recorder(log: Path) -> list[str]:
    """A stop command that appends its arguments, as JSON, to a file."""
    code = "import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')"
    return [sys.executable, "-c", code, str(log), "stop", "{container}"]


def recorded(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def base_config(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "deployment": "glm53",
        "container": "glm53-r0",
        "floor_bytes": FLOOR,
        "samples": 3,
        "watch": "both",
        "interval_s": 0.05,
        "meminfo_path": str(tmp_path / "meminfo"),
        "events_path": str(tmp_path / "state" / "memguard" / "glm53.events.jsonl"),
        "stop_command": recorder(tmp_path / "stops.log"),
    }
    config.update(changes)
    return config


def write_config(tmp_path: Path, config: object) -> Path:
    path = tmp_path / "memguard.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def events(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "memguard" / "glm53.events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def sample(available: int, free: int) -> dict[str, int]:
    return {"MemTotal": 128 * GIB, "MemAvailable": available, "MemFree": free}


# --- pure logic ---------------------------------------------------------------


def test_parse_meminfo_gives_bytes() -> None:
    values = memguard.parse_meminfo(meminfo_text(HIGH, LOW))
    assert values["MemAvailable"] == HIGH
    assert values["MemFree"] == LOW
    assert values["HugePages_Total"] == 0


def test_acts_after_the_given_number_of_consecutive_low_samples() -> None:
    guard = memguard.Guard(FLOOR, 3, "both")
    low = sample(LOW, LOW)
    assert guard.observe(low) is None
    assert guard.observe(low) is None
    assert guard.observe(low) is memguard.Action.STOP


def test_one_sample_means_the_first_low_sample_acts() -> None:
    guard = memguard.Guard(FLOOR, 1, "MemAvailable")
    assert guard.observe(sample(LOW, HIGH)) is memguard.Action.STOP


def test_a_sample_at_or_above_the_floor_resets_the_count() -> None:
    guard = memguard.Guard(FLOOR, 3, "both")
    low = sample(LOW, LOW)
    assert guard.observe(low) is None
    assert guard.observe(low) is None
    assert guard.observe(sample(FLOOR, FLOOR)) is None  # exactly at the floor is not low
    assert guard.low_count == 0
    assert guard.observe(low) is None
    assert guard.observe(low) is None
    assert guard.observe(low) is memguard.Action.STOP


@pytest.mark.parametrize(
    ("watch", "acts"),
    [("both", True), ("MemFree", True), ("MemAvailable", False)],
)
def test_memfree_low_while_memavailable_is_high(watch: str, acts: bool) -> None:
    guard = memguard.Guard(FLOOR, 2, watch)
    actions = [guard.observe(sample(HIGH, LOW)) for _ in range(4)]
    assert (memguard.Action.STOP in actions) is acts


@pytest.mark.parametrize(
    ("watch", "acts"),
    [("both", True), ("MemAvailable", True), ("MemFree", False)],
)
def test_memavailable_low_while_memfree_is_high(watch: str, acts: bool) -> None:
    guard = memguard.Guard(FLOOR, 2, watch)
    actions = [guard.observe(sample(LOW, HIGH)) for _ in range(4)]
    assert (memguard.Action.STOP in actions) is acts


def test_acts_once_then_again_only_after_recovery() -> None:
    guard = memguard.Guard(FLOOR, 2, "both")
    low = sample(LOW, LOW)
    actions = [guard.observe(low) for _ in range(10)]
    assert actions.count(memguard.Action.STOP) == 1
    assert actions[1] is memguard.Action.STOP
    assert guard.observe(sample(HIGH, HIGH)) is None
    assert guard.observe(low) is None
    assert guard.observe(low) is memguard.Action.STOP


def test_a_sample_without_a_watched_value_is_an_error() -> None:
    guard = memguard.Guard(FLOOR, 2, "both")
    with pytest.raises(memguard.MeminfoError, match="MemAvailable"):
        guard.observe({"MemFree": HIGH})


# --- config -------------------------------------------------------------------


def test_defaults_fill_in_the_optional_keys(tmp_path: Path) -> None:
    raw = {key: base_config(tmp_path)[key] for key in memguard.REQUIRED_KEYS}
    config = memguard.parse_config(raw)
    assert config.interval_s == 1.0
    assert config.meminfo_path == "/proc/meminfo"
    assert config.events_path == "/var/lib/sparkserve/memguard/glm53.events.jsonl"
    assert config.stop_command == ("docker", "stop", "--time", "10", "glm53-r0")


BAD_CONFIGS: list[tuple[dict[str, Any], list[str], str]] = [
    ({}, ["deployment"], "deployment is missing"),
    ({}, ["container"], "container is missing"),
    ({}, ["floor_bytes"], "floor_bytes is missing"),
    ({}, ["samples"], "samples is missing"),
    ({}, ["watch"], "watch is missing"),
    ({"floor_bytes": 0}, [], "floor_bytes is 0"),
    ({"floor_bytes": -1}, [], "floor_bytes is -1"),
    ({"floor_bytes": "8G"}, [], 'floor_bytes is "8G"'),
    ({"floor_bytes": 8.5}, [], "floor_bytes is 8.5"),
    ({"floor_bytes": True}, [], "floor_bytes is true"),
    ({"samples": 0}, [], "samples is 0"),
    ({"samples": 1.5}, [], "samples is 1.5"),
    ({"watch": "Cached"}, [], 'watch is "Cached"; set one of MemAvailable, MemFree, both'),
    ({"watch": ["MemFree"]}, [], "watch is [\"MemFree\"]"),
    ({"flor_bytes": FLOOR}, [], "unknown key flor_bytes"),
    ({"interval_s": 0}, [], "interval_s is 0"),
    ({"interval_s": "1"}, [], 'interval_s is "1"'),
    ({"container": ""}, [], 'container is ""'),
    ({"container": "a b"}, [], 'container is "a b"'),
    ({"deployment": "../x"}, [], 'deployment is "../x"'),
    ({"deployment": 3}, [], "deployment is 3"),
    ({"meminfo_path": ""}, [], 'meminfo_path is ""'),
    ({"events_path": None}, [], "events_path is null"),
    ({"stop_command": "docker stop glm53-r0"}, [], "stop_command is"),
    ({"stop_command": []}, [], "stop_command is []"),
    ({"stop_command": ["docker", "stop", 3]}, [], "stop_command is"),
    ({"stop_command": ["docker", "stop", "other"]}, [], "does not name the container"),
]


@pytest.mark.parametrize(("changes", "drop", "message"), BAD_CONFIGS)
def test_a_bad_config_is_refused_with_status_2_before_anything_happens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
    changes: dict[str, Any], drop: list[str], message: str,
) -> None:
    config = base_config(tmp_path, **{"samples": 1, **changes})
    for key in drop:
        del config[key]
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, config)
    assert memguard.main(["--config", str(path), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memguard config {path}: ")
    assert message in err
    assert err.count("\n") == 1
    assert recorded(tmp_path / "stops.log") == []
    assert events(tmp_path) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [("[1, 2]", "not a JSON object"), ("{", "not valid JSON")],
)
def test_a_config_that_is_no_json_object_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "memguard.json"
    path.write_text(text, encoding="utf-8")
    assert memguard.main(["--config", str(path), "--check-config"]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_config_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert memguard.main(["--config", str(tmp_path / "absent.json"), "--check-config"]) == 2
    assert "cannot read it: No such file or directory" in capsys.readouterr().err


def test_check_config_prints_ok_and_does_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1))
    assert memguard.main(["--config", str(path), "--check-config"]) == 0
    assert capsys.readouterr().out == "OK\n"
    assert recorded(tmp_path / "stops.log") == []


def test_a_bad_config_exits_2_as_a_program(tmp_path: Path) -> None:
    path = write_config(tmp_path, base_config(tmp_path, watch="Cached"))
    done = subprocess.run([sys.executable, str(SCRIPT), "--config", str(path), "--check-config"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (f'memguard config {path}: watch is "Cached"; '
                           "set one of MemAvailable, MemFree, both\n")


# --- acting -------------------------------------------------------------------


def test_once_with_one_low_sample_stops_exactly_the_configured_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_meminfo(tmp_path / "meminfo", HIGH, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    assert recorded(tmp_path / "stops.log") == [["stop", "glm53-r0"]]
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == ("memguard glm53: MemAvailable 20.00 GiB, MemFree 4.00 GiB; "
                                    "below the floor of 8.00 GiB (1/1); stopped container glm53-r0")


def test_the_event_line_records_the_stop(tmp_path: Path) -> None:
    write_meminfo(tmp_path / "meminfo", HIGH, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    [event] = events(tmp_path)
    assert set(event) == {"time", "deployment", "container", "watched", "values",
                          "floor_bytes", "samples", "action", "stop_rc"}
    assert event["deployment"] == "glm53"
    assert event["container"] == "glm53-r0"
    assert event["watched"] == "both"
    assert event["values"] == {"MemAvailable": HIGH, "MemFree": LOW}
    assert event["floor_bytes"] == FLOOR
    assert event["samples"] == 1
    assert event["action"] == "stopped"
    assert event["stop_rc"] == 0
    assert event["time"].endswith("+00:00")


def test_once_with_a_single_low_sample_of_three_does_nothing(tmp_path: Path) -> None:
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=3))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    assert recorded(tmp_path / "stops.log") == []
    assert events(tmp_path) == []


def test_a_container_that_is_gone_is_recorded_as_stop_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = ["sh", "-c", "echo 'Error response from daemon: No such container: {container}' >&2; exit 1"]
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1, stop_command=gone))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    [event] = events(tmp_path)
    assert event["action"] == "stop-failed"
    assert event["stop_rc"] == 1
    out = capsys.readouterr().out
    assert "stopping container glm53-r0 failed with status 1" in out
    assert "No such container: glm53-r0" in out


def test_a_stop_command_that_cannot_start_is_recorded_with_127(tmp_path: Path) -> None:
    missing = [str(tmp_path / "no-docker"), "stop", "{container}"]
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1, stop_command=missing))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    [event] = events(tmp_path)
    assert (event["action"], event["stop_rc"]) == ("stop-failed", 127)


def test_a_meminfo_without_the_watched_value_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 10 kB\n", encoding="ascii")
    path = write_config(tmp_path, base_config(tmp_path, samples=1))
    assert memguard.main(["--config", str(path), "--once"]) == 1
    assert f"{tmp_path / 'meminfo'} has no MemAvailable value; exiting" in capsys.readouterr().out
    assert recorded(tmp_path / "stops.log") == []


def test_the_loop_stops_once_and_again_only_after_recovery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meminfo = tmp_path / "meminfo"
    config = memguard.parse_config(base_config(tmp_path, samples=2))
    # The memory each sample sees; the fake sleep moves on to the next.
    script = [LOW, LOW, LOW, LOW, HIGH, LOW, LOW, LOW]
    write_meminfo(meminfo, script[0], script[0])
    taken = iter(script[1:])

    def fake_sleep(seconds: float) -> None:
        assert seconds == 0.05
        value = next(taken, None)
        if value is None:
            raise memguard.Terminated()
        write_meminfo(meminfo, value, value)

    assert memguard.run(config, once=False, sleep=fake_sleep) == 0
    assert recorded(tmp_path / "stops.log") == [["stop", "glm53-r0"], ["stop", "glm53-r0"]]
    assert [event["action"] for event in events(tmp_path)] == ["stopped", "stopped"]
    out = capsys.readouterr().out.splitlines()
    assert sum("back at or above the floor" in line for line in out) == 1
    assert sum("(1/2)" in line for line in out) == 2
    assert out[-1] == "memguard glm53: terminated; exiting"


# --- as a program -------------------------------------------------------------


class MeminfoFeed:
    """meminfo_path as a FIFO: the guard gets one sample from the test for each read, when it reads.

    ``wait_for_read`` returns once the guard is taking its next sample, so everything it did with the
    samples before is done; the test counts samples, not seconds. Each sample is read from a fresh FIFO,
    put in place before the guard can look again, so two samples never run together.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.made = 0
        self.guard: subprocess.Popen[str] | None = None
        self.install()

    def install(self) -> None:
        self.made += 1
        fresh = self.path.with_name(f"{self.path.name}.{self.made}")
        os.mkfifo(fresh)
        os.replace(fresh, self.path)

    def wait_for_read(self, timeout: float = 60) -> int:
        """The write end of the FIFO the guard has opened for its next sample."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until the guard opens it
                break
            except OSError as err:
                if err.errno != errno.ENXIO:
                    raise
            assert self.guard is None or self.guard.poll() is None, "the guard exited"
            assert time.monotonic() < deadline, "the guard never took its next sample"
            time.sleep(0.002)
        self.install()  # the sample after this one comes from a new FIFO
        return fd

    def give(self, fd: int, available: int, free: int) -> None:
        try:
            os.write(fd, meminfo_text(available, free).encode("ascii"))
        finally:
            os.close(fd)

    def sample(self, available: int, free: int) -> None:
        """Wait for the guard's next sample and hand it these values."""
        self.give(self.wait_for_read(), available, free)


def test_the_program_stops_within_samples_plus_one_intervals_and_exits_0_on_sigterm(
    tmp_path: Path,
) -> None:
    """Samples, not seconds: the first sample after memory drops sees it (the guard reads meminfo afresh at
    every sample, an interval apart), and the third low one in a row stops the container."""
    feed = MeminfoFeed(tmp_path / "meminfo")
    stops = tmp_path / "stops.log"
    config = base_config(tmp_path, samples=3, interval_s=0.05,
                         stop_command=["sh", "-c", f"echo {{container}} >> {stops}"])
    path = write_config(tmp_path, config)
    guard = subprocess.Popen([sys.executable, str(SCRIPT), "--config", str(path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    feed.guard = guard
    try:
        assert guard.stdout is not None
        assert "watching MemAvailable and MemFree" in guard.stdout.readline()
        for _ in range(3):
            feed.sample(HIGH, HIGH)  # a few samples above the floor
        feed.sample(HIGH, LOW)
        feed.sample(HIGH, LOW)
        fd = feed.wait_for_read()  # two low samples are done: no stop yet
        assert not stops.exists()
        feed.give(fd, HIGH, LOW)  # the third
        fd = feed.wait_for_read()  # and the guard is on to the next: it stopped the container on that one
        assert stops.read_text(encoding="utf-8") == "glm53-r0\n"
        feed.give(fd, HIGH, LOW)
        feed.sample(HIGH, LOW)  # memory stays low
        waiting = feed.wait_for_read()  # SIGTERM while the guard waits for a sample
        try:
            guard.send_signal(signal.SIGTERM)
            out, err = guard.communicate(timeout=30)
        finally:
            os.close(waiting)
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait()
    assert guard.returncode == 0
    assert err == ""
    lines = out.splitlines()
    assert [line.split("; ")[-1] for line in lines if "below the floor" in line] == [
        "below the floor of 8.00 GiB (1/3)", "below the floor of 8.00 GiB (2/3)", "stopped container glm53-r0"]
    assert "(3/3); stopped container glm53-r0" in out
    assert out.endswith("memguard glm53: terminated; exiting\n")
    assert stops.read_text(encoding="utf-8") == "glm53-r0\n"  # once, while memory stays low
    [event] = events(tmp_path)
    assert event["values"] == {"MemAvailable": HIGH, "MemFree": LOW}
