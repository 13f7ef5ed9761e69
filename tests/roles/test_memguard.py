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
from typing import Any, Sequence

import pytest
from sparkserve_node.meminfo import parse_meminfo

from tests.roles import exposition, node_layout
from tests.scripts import load_script

PROGRAM = "roles/memguard/files/sparkserve-memguard.py"
GIB = 1024**3
FLOOR = 8 * GIB
HIGH = 20 * GIB
LOW = 4 * GIB
MID = 12 * GIB
INSPECT = ["container", "inspect", "--format", "{{.State.Running}}", "glm53-r0"]


def load_module() -> ModuleType:
    return load_script(PROGRAM, "sparkserve_memguard")


def installed(tmp_path: Path) -> str:
    """The guard as a node has it, with the node library in a folder of its own (run it with
    env=node_layout.env(tmp_path / "node")); its path."""
    return str(node_layout.install(tmp_path / "node", PROGRAM))


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


# A docker client for the guard run as a program: it appends its arguments (as JSON) to docker.log and
# answers from the container's state in docker.state (running, exited; no file: no such container).
# docker.fail makes kill and stop fail as a daemon would.
FAKE_DOCKER = """
import json, pathlib, sys
here = pathlib.Path(sys.argv[0]).parent
args = sys.argv[1:]
with open(here / "docker.log", "a") as log:
    log.write(json.dumps(args) + "\\n")
state_file = here / "docker.state"
state = state_file.read_text().strip() if state_file.exists() else "absent"
name = args[-1]
if state == "absent":
    print(f"Error: No such container: {name}", file=sys.stderr)
    sys.exit(1)
if args[:2] == ["container", "inspect"]:
    print("true" if state == "running" else "false")
    sys.exit(0)
if (here / "docker.fail").exists():
    print(f"Error response from daemon: cannot {args[0]} container: {name}: permission denied", file=sys.stderr)
    sys.exit(1)
state_file.write_text("exited")
print(name)
"""


def fake_docker(tmp_path: Path, state: str | None = "running") -> list[str]:
    """Install the fake docker client in tmp_path with the container in this state; its command."""
    script = tmp_path / "docker.py"
    script.write_text(FAKE_DOCKER, encoding="utf-8")
    if state is not None:
        (tmp_path / "docker.state").write_text(state, encoding="utf-8")
    return [sys.executable, str(script)]


def docker_calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "docker.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def actions_taken(calls: list[list[str]]) -> list[list[str]]:
    """The calls that act on the container (kill or stop), without the inspections."""
    return [call for call in calls if call[:2] != ["container", "inspect"]]


class FakeDocker:
    """The guard's runner, in process: answers like docker from ``state`` and records every call."""

    def __init__(self, state: str = "running", action_rc: int = 0) -> None:
        self.state = state  # running | exited | absent
        self.action_rc = action_rc
        self.calls: list[list[str]] = []
        self.timeouts: list[float] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        assert argv[0] == "docker"
        args = list(argv[1:])
        self.calls.append(args)
        self.timeouts.append(timeout_s)
        name = args[-1]
        if self.state == "absent":
            return 1, "", f"Error: No such container: {name}\n"
        if args[:2] == ["container", "inspect"]:
            return 0, "true\n" if self.state == "running" else "false\n", ""
        if self.action_rc:
            return self.action_rc, "", f"Error response from daemon: cannot {args[0]} {name}\n"
        self.state = "exited"
        return 0, f"{name}\n", ""


def base_config(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "deployment": "glm53",
        "container": "glm53-r0",
        "floor_bytes": FLOOR,
        "samples": 3,
        "watch": "both",
        "action": "kill",
        "stop_grace_s": 10,
        "interval_s": 0.05,
        "meminfo_path": str(tmp_path / "meminfo"),
        "events_path": str(tmp_path / "state" / "memguard" / "glm53.events.jsonl"),
        "docker_command": ["docker"],
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


class MemoryScript:
    """A fake sleep for run(): each sleep puts the next sample of the script in meminfo, and the
    container's next state in the fake docker when the step gives one; after the last step it ends the
    guard as SIGTERM would."""

    def __init__(self, meminfo: Path, docker: FakeDocker, steps: list[tuple[int, str | None]]) -> None:
        self.meminfo = meminfo
        self.docker = docker
        self.steps = iter(steps[1:])
        self.apply(steps[0])

    def apply(self, step: tuple[int, str | None]) -> None:
        value, state = step
        write_meminfo(self.meminfo, value, value)
        if state is not None:
            self.docker.state = state

    def sleep(self, seconds: float) -> None:
        assert seconds == 0.05
        step = next(self.steps, None)
        if step is None:
            raise memguard.Terminated()
        self.apply(step)


# --- pure logic ---------------------------------------------------------------


def test_parse_meminfo_gives_bytes() -> None:
    values = parse_meminfo(meminfo_text(HIGH, LOW))
    assert values["MemAvailable"] == HIGH
    assert values["MemFree"] == LOW
    assert values["HugePages_Total"] == 0


def test_due_after_the_given_number_of_consecutive_low_samples() -> None:
    guard = memguard.Guard(FLOOR, 3, "both")
    low = sample(LOW, LOW)
    assert [guard.observe(low) for _ in range(3)] == [False, False, True]


def test_one_sample_means_the_first_low_sample_is_due() -> None:
    guard = memguard.Guard(FLOOR, 1, "MemAvailable")
    assert guard.observe(sample(LOW, HIGH)) is True


def test_a_sample_at_or_above_the_floor_resets_the_count() -> None:
    guard = memguard.Guard(FLOOR, 3, "both")
    low = sample(LOW, LOW)
    assert guard.observe(low) is False
    assert guard.observe(low) is False
    assert guard.observe(sample(FLOOR, FLOOR)) is False  # exactly at the floor is not low
    assert guard.low_count == 0
    assert [guard.observe(low) for _ in range(3)] == [False, False, True]


@pytest.mark.parametrize(
    ("watch", "acts"),
    [("both", True), ("MemFree", True), ("MemAvailable", False)],
)
def test_memfree_low_while_memavailable_is_high(watch: str, acts: bool) -> None:
    guard = memguard.Guard(FLOOR, 2, watch)
    assert any(guard.observe(sample(HIGH, LOW)) for _ in range(4)) is acts


@pytest.mark.parametrize(
    ("watch", "acts"),
    [("both", True), ("MemAvailable", True), ("MemFree", False)],
)
def test_memavailable_low_while_memfree_is_high(watch: str, acts: bool) -> None:
    guard = memguard.Guard(FLOOR, 2, watch)
    assert any(guard.observe(sample(LOW, HIGH)) for _ in range(4)) is acts


def test_due_until_it_acted_then_again_after_a_new_window_or_after_recovery() -> None:
    """After an action the next window needs its samples again (the node then acts on the next rank); a sample
    at or above the floor starts the count from zero."""
    guard = memguard.Guard(FLOOR, 2, "both")
    low = sample(LOW, LOW)
    assert [guard.observe(low) for _ in range(4)] == [False, True, True, True]  # due, nothing done yet
    guard.acted()
    assert guard.progress == 0
    assert [guard.observe(low) for _ in range(3)] == [False, True, True]  # the next window: two more
    assert guard.progress == 3
    guard.acted()
    assert guard.observe(low) is False
    assert guard.observe(sample(HIGH, HIGH)) is False
    assert (guard.low_count, guard.progress) == (0, 0)
    assert [guard.observe(low) for _ in range(2)] == [False, True]


def test_a_sample_without_a_watched_value_is_an_error() -> None:
    guard = memguard.Guard(FLOOR, 2, "both")
    with pytest.raises(memguard.MeminfoError, match="MemAvailable"):
        guard.observe({"MemFree": HIGH})


@pytest.mark.parametrize(
    ("rc", "out", "err", "state"),
    [
        (0, "true\n", "", memguard.ContainerState.RUNNING),
        (0, "false\n", "", memguard.ContainerState.NOT_RUNNING),
        (1, "", "Error: No such container: glm53-r0\n", memguard.ContainerState.ABSENT),
        (1, "", "Error response from daemon: No such container: glm53-r0\n", memguard.ContainerState.ABSENT),
        (1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n",
         memguard.ContainerState.UNKNOWN),
        (124, "", "no answer after 10 s", memguard.ContainerState.UNKNOWN),
        (0, "<no value>\n", "", memguard.ContainerState.UNKNOWN),
    ],
)
def test_the_container_state_from_docker_inspect(
    tmp_path: Path, rc: int, out: str, err: str, state: Any
) -> None:
    config = memguard.parse_config(base_config(tmp_path))
    asked: list[tuple[list[str], float]] = []

    def runner(argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        asked.append((list(argv), timeout_s))
        return rc, out, err

    assert memguard.container_state(config, runner)[0] is state
    assert asked == [(["docker", *INSPECT], memguard.INSPECT_TIMEOUT_S)]


# --- config -------------------------------------------------------------------


def test_defaults_fill_in_the_optional_keys(tmp_path: Path) -> None:
    raw = {key: base_config(tmp_path)[key] for key in memguard.REQUIRED_KEYS}
    config = memguard.parse_config(raw)
    assert config.action == "kill"
    assert config.stop_grace_s == 10
    assert config.interval_s == 1.0
    assert config.meminfo_path == "/proc/meminfo"
    assert config.events_path == "/var/lib/sparkserve/memguard/glm53.events.jsonl"
    assert config.docker_command == ("docker",)
    assert memguard.action_command(config) == ("docker", "kill", "glm53-r0")


def test_the_stop_command_carries_the_grace(tmp_path: Path) -> None:
    config = memguard.parse_config(base_config(tmp_path, action="stop", stop_grace_s=0))
    assert memguard.action_command(config) == ("docker", "stop", "-t", "0", "glm53-r0")


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
    ({"action": "restart"}, [], 'action is "restart"; set kill (docker kill, at once) or stop'),
    ({"action": "KILL"}, [], 'action is "KILL"'),
    ({"action": None}, [], "action is null"),
    ({"stop_grace_s": -1}, [], "stop_grace_s is -1; set a whole number of seconds, 0 or more"),
    ({"stop_grace_s": 1.5}, [], "stop_grace_s is 1.5"),
    ({"stop_grace_s": "10"}, [], 'stop_grace_s is "10"'),
    ({"stop_grace_s": False}, [], "stop_grace_s is false"),
    ({"flor_bytes": FLOOR}, [], "unknown key flor_bytes"),
    ({"stop_command": ["docker", "stop", "{container}"]}, [], "unknown key stop_command"),
    ({"interval_s": 0}, [], "interval_s is 0"),
    ({"interval_s": "1"}, [], 'interval_s is "1"'),
    ({"container": ""}, [], 'container is ""'),
    ({"container": "a b"}, [], 'container is "a b"'),
    ({"deployment": "../x"}, [], 'deployment is "../x"'),
    ({"deployment": 3}, [], "deployment is 3"),
    ({"meminfo_path": ""}, [], 'meminfo_path is ""'),
    ({"events_path": None}, [], "events_path is null"),
    ({"docker_command": "docker"}, [], 'docker_command is "docker"'),
    ({"docker_command": []}, [], "docker_command is []"),
    ({"docker_command": ["docker", 3]}, [], "docker_command is"),
]


@pytest.mark.parametrize(("changes", "drop", "message"), BAD_CONFIGS)
def test_a_bad_config_is_refused_with_status_2_before_anything_happens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
    changes: dict[str, Any], drop: list[str], message: str,
) -> None:
    config = base_config(tmp_path, **{"samples": 1, "docker_command": fake_docker(tmp_path), **changes})
    for key in drop:
        del config[key]
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, config)
    assert memguard.main(["--config", str(path), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memguard config {path}: ")
    assert message in err
    assert err.count("\n") == 1
    assert docker_calls(tmp_path) == []
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
    path = write_config(tmp_path, base_config(tmp_path, samples=1, docker_command=fake_docker(tmp_path)))
    assert memguard.main(["--config", str(path), "--check-config"]) == 0
    assert capsys.readouterr().out == "OK\n"
    assert docker_calls(tmp_path) == []


def test_a_bad_config_exits_2_as_a_program(tmp_path: Path) -> None:
    path = write_config(tmp_path, base_config(tmp_path, watch="Cached"))
    done = subprocess.run([sys.executable, installed(tmp_path), "--config", str(path), "--check-config"],
                          capture_output=True, text=True, timeout=30, env=node_layout.env(tmp_path / "node"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (f'memguard config {path}: watch is "Cached"; '
                           "set one of MemAvailable, MemFree, both\n")


def test_a_bad_action_is_refused_by_check_config_as_a_program(tmp_path: Path) -> None:
    path = write_config(tmp_path, base_config(tmp_path, action="terminate"))
    done = subprocess.run([sys.executable, installed(tmp_path), "--config", str(path), "--check-config"],
                          capture_output=True, text=True, timeout=30, env=node_layout.env(tmp_path / "node"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (f'memguard config {path}: action is "terminate"; '
                           "set kill (docker kill, at once) or stop (docker stop -t stop_grace_s)\n")


# --- acting -------------------------------------------------------------------


def test_once_with_one_low_sample_kills_exactly_the_configured_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_meminfo(tmp_path / "meminfo", HIGH, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1, docker_command=fake_docker(tmp_path)))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    assert docker_calls(tmp_path) == [INSPECT, ["kill", "glm53-r0"]]
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("1 samples of 0.05 s, then kill (docker kill)")
    assert out.splitlines()[-1] == ("memguard glm53: MemAvailable 20.00 GiB, MemFree 4.00 GiB; "
                                    "below the floor of 8.00 GiB (1/1); killed container glm53-r0")


def test_stop_uses_the_grace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    config = base_config(tmp_path, samples=1, action="stop", stop_grace_s=25, docker_command=fake_docker(tmp_path))
    assert memguard.main(["--config", str(write_config(tmp_path, config)), "--once"]) == 0
    assert docker_calls(tmp_path) == [INSPECT, ["stop", "-t", "25", "glm53-r0"]]
    [event] = events(tmp_path)
    assert (event["action"], event["stop_rc"]) == ("stopped", 0)
    assert capsys.readouterr().out.splitlines()[-1].endswith("(1/1); stopped container glm53-r0")


def test_a_stop_may_take_its_grace_on_top_of_the_command_timeout(tmp_path: Path) -> None:
    docker = FakeDocker()
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    config = memguard.parse_config(base_config(tmp_path, samples=1, action="stop", stop_grace_s=30))
    assert memguard.run(config, once=True, runner=docker) == 0
    assert docker.calls == [INSPECT, ["stop", "-t", "30", "glm53-r0"]]
    assert docker.timeouts == [memguard.INSPECT_TIMEOUT_S, memguard.ACTION_TIMEOUT_S + 30]


def test_the_event_line_records_the_kill(tmp_path: Path) -> None:
    write_meminfo(tmp_path / "meminfo", HIGH, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1, docker_command=fake_docker(tmp_path)))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    [event] = events(tmp_path)
    assert set(event) == {"time", "deployment", "container", "watched", "values",
                          "floor_bytes", "samples", "action", "stop_rc", "trigger", "priority"}
    assert event["deployment"] == "glm53"
    assert event["container"] == "glm53-r0"
    assert event["watched"] == "both"
    assert event["values"] == {"MemAvailable": HIGH, "MemFree": LOW}
    assert event["floor_bytes"] == FLOOR
    assert event["samples"] == 1
    assert event["action"] == "killed"
    assert event["stop_rc"] == 0
    assert event["time"].endswith("+00:00")
    assert (event["trigger"], event["priority"]) == ("glm53", 0)  # its own window; the default priority


def test_once_with_a_single_low_sample_of_three_does_nothing(tmp_path: Path) -> None:
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=3, docker_command=fake_docker(tmp_path)))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    assert docker_calls(tmp_path) == []
    assert events(tmp_path) == []


@pytest.mark.parametrize(("state", "words"), [(None, "is not there"), ("exited", "is there but not running")])
def test_a_container_that_is_not_there_or_not_running_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state: str | None, words: str
) -> None:
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1, docker_command=fake_docker(tmp_path, state)))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    assert docker_calls(tmp_path) == [INSPECT]
    assert events(tmp_path) == []
    assert capsys.readouterr().out.splitlines()[-1] == (
        "memguard glm53: MemAvailable 4.00 GiB, MemFree 4.00 GiB; below the floor of 8.00 GiB (1/1); "
        f"container glm53-r0 {words}: nothing to kill; still watching")


def test_a_kill_that_fails_is_recorded_as_kill_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    docker = fake_docker(tmp_path)
    (tmp_path / "docker.fail").write_text("", encoding="utf-8")
    path = write_config(tmp_path, base_config(tmp_path, samples=1, docker_command=docker))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    [event] = events(tmp_path)
    assert (event["action"], event["stop_rc"]) == ("kill-failed", 1)
    out = capsys.readouterr().out
    assert "killing container glm53-r0 failed with status 1" in out
    assert "cannot kill container: glm53-r0: permission denied" in out


def test_a_docker_that_cannot_start_is_still_tried_and_recorded_with_127(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docker's state unknown (here: no docker at all) is no reason to let the node run out of memory."""
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    path = write_config(tmp_path, base_config(tmp_path, samples=1, docker_command=[str(tmp_path / "no-docker")]))
    assert memguard.main(["--config", str(path), "--once"]) == 0
    [event] = events(tmp_path)
    assert (event["action"], event["stop_rc"]) == ("kill-failed", 127)
    out = capsys.readouterr().out
    assert "container glm53-r0 is of unknown state (docker container inspect failed with status 127" in out


def test_a_meminfo_without_the_watched_value_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 10 kB\n", encoding="ascii")
    path = write_config(tmp_path, base_config(tmp_path, samples=1, docker_command=fake_docker(tmp_path)))
    assert memguard.main(["--config", str(path), "--once"]) == 1
    assert f"{tmp_path / 'meminfo'} has no MemAvailable value; exiting" in capsys.readouterr().out
    assert docker_calls(tmp_path) == []


def test_the_loop_kills_once_and_again_only_after_recovery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docker = FakeDocker()
    config = memguard.parse_config(base_config(tmp_path, samples=2))
    steps: list[tuple[int, str | None]] = [
        (LOW, None), (LOW, None), (LOW, None), (LOW, None),
        (HIGH, "running"),  # restarted by hand while memory is back
        (LOW, None), (LOW, None), (LOW, None),
    ]
    script = MemoryScript(tmp_path / "meminfo", docker, steps)
    assert memguard.run(config, once=False, sleep=script.sleep, runner=docker) == 0
    assert docker.calls == [INSPECT, ["kill", "glm53-r0"], INSPECT, ["kill", "glm53-r0"]]
    assert [event["action"] for event in events(tmp_path)] == ["killed", "killed"]
    out = capsys.readouterr().out.splitlines()
    assert sum("back at or above the floor" in line for line in out) == 1
    assert sum("(1/2)" in line for line in out) == 2
    assert out[-1] == "memguard: terminated; exiting"


def test_armed_before_the_rank_exists_the_guard_waits_for_it_then_kills_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Started before the load: no container for a while (memory low or not), nothing done, one line;
    the container appears and memory stays low: the next sample kills it."""
    docker = FakeDocker(state="absent")
    config = memguard.parse_config(base_config(tmp_path, samples=3))
    steps: list[tuple[int, str | None]] = [
        (HIGH, None), (HIGH, None),  # memory fine: docker is not even asked
        (LOW, None), (LOW, None), (LOW, None),  # due, but no container: nothing to kill
        (LOW, None), (LOW, None), (LOW, None),  # still nothing: no more lines, no events
        (LOW, "running"),  # the rank is created and runs: killed at this sample
        (LOW, None), (LOW, None),  # killed once, while memory stays low
    ]
    script = MemoryScript(tmp_path / "meminfo", docker, steps)
    assert memguard.run(config, once=False, sleep=script.sleep, runner=docker) == 0
    assert docker.calls == [INSPECT] * 5 + [["kill", "glm53-r0"]]
    [event] = events(tmp_path)
    assert (event["action"], event["container"], event["stop_rc"]) == ("killed", "glm53-r0", 0)
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if "glm53-r0 is" in line] == [
        "memguard glm53: MemAvailable 4.00 GiB, MemFree 4.00 GiB; below the floor of 8.00 GiB (3/3); "
        "container glm53-r0 is not there: nothing to kill; still watching"]
    assert out[-2] == ("memguard glm53: MemAvailable 4.00 GiB, MemFree 4.00 GiB; below the floor of 8.00 GiB "
                       "(3/3); killed container glm53-r0")


def test_a_container_that_comes_and_goes_while_memory_is_low_is_one_line_each_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docker = FakeDocker(state="absent")
    config = memguard.parse_config(base_config(tmp_path, samples=1))
    steps: list[tuple[int, str | None]] = [
        (LOW, None), (LOW, "exited"), (LOW, None), (LOW, "absent"), (LOW, None),
    ]
    script = MemoryScript(tmp_path / "meminfo", docker, steps)
    assert memguard.run(config, once=False, sleep=script.sleep, runner=docker) == 0
    assert actions_taken(docker.calls) == []
    assert events(tmp_path) == []
    out = capsys.readouterr().out.splitlines()
    changes = [line for line in out if "glm53-r0 is" in line]
    assert [line.split("container glm53-r0 ")[1] for line in changes] == [
        "is not there: nothing to kill; still watching",
        "is there but not running: nothing to kill; still watching",
        "is not there: nothing to kill; still watching",
    ]


def test_a_container_removed_after_a_kill_is_left_alone_in_the_next_low_spell(
    tmp_path: Path,
) -> None:
    docker = FakeDocker()
    config = memguard.parse_config(base_config(tmp_path, samples=2, action="stop", stop_grace_s=5))
    steps: list[tuple[int, str | None]] = [
        (LOW, None), (LOW, None),  # stopped
        (HIGH, "absent"),  # the operator removes it
        (LOW, None), (LOW, None), (LOW, None),
    ]
    script = MemoryScript(tmp_path / "meminfo", docker, steps)
    assert memguard.run(config, once=False, sleep=script.sleep, runner=docker) == 0
    assert docker.calls == [INSPECT, ["stop", "-t", "5", "glm53-r0"], INSPECT, INSPECT]
    assert [event["action"] for event in events(tmp_path)] == ["stopped"]


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


def test_the_program_armed_before_its_rank_kills_it_within_one_sample_and_exits_0_on_sigterm(
    tmp_path: Path,
) -> None:
    """Samples, not seconds: the guard runs before its container exists and does nothing but say so once;
    the first sample after the container runs (memory still low) kills it, once."""
    feed = MeminfoFeed(tmp_path / "meminfo")
    config = base_config(tmp_path, samples=3, interval_s=0.05, docker_command=fake_docker(tmp_path, None))
    path = write_config(tmp_path, config)
    guard = subprocess.Popen([sys.executable, installed(tmp_path), "--config", str(path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=node_layout.env(tmp_path / "node"))
    feed.guard = guard
    try:
        assert guard.stdout is not None
        assert "watching MemAvailable and MemFree" in guard.stdout.readline()
        for _ in range(3):
            feed.sample(HIGH, HIGH)  # a few samples above the floor
        feed.sample(HIGH, LOW)
        feed.sample(HIGH, LOW)
        fd = feed.wait_for_read()  # two low samples are done: docker not even asked
        assert docker_calls(tmp_path) == []
        feed.give(fd, HIGH, LOW)  # the third: due, but there is no container
        feed.sample(HIGH, LOW)  # still none
        fd = feed.wait_for_read()
        assert docker_calls(tmp_path) == [INSPECT, INSPECT]
        (tmp_path / "docker.state").write_text("running", encoding="utf-8")  # the rank starts
        feed.give(fd, HIGH, LOW)
        fd = feed.wait_for_read()  # and the guard is on to the next: it killed the container on that one
        assert actions_taken(docker_calls(tmp_path)) == [["kill", "glm53-r0"]]
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
        "below the floor of 8.00 GiB (1/3)", "below the floor of 8.00 GiB (2/3)", "still watching",
        "killed container glm53-r0"]
    assert "(3/3); container glm53-r0 is not there: nothing to kill; still watching" in out
    assert "(3/3); killed container glm53-r0" in out
    assert out.endswith("memguard: terminated; exiting\n")
    assert docker_calls(tmp_path) == [INSPECT, INSPECT, INSPECT, ["kill", "glm53-r0"]]  # once, memory still low
    [event] = events(tmp_path)
    assert (event["action"], event["values"]) == ("killed", {"MemAvailable": HIGH, "MemFree": LOW})


# --- metrics (a node-exporter textfile) ---------------------------------------------

MEMGUARD_FAMILIES = {
    "sparkserve_memguard_floor_bytes": "gauge",
    "sparkserve_memguard_mem_available_bytes": "gauge",
    "sparkserve_memguard_mem_free_bytes": "gauge",
    "sparkserve_memguard_actions_total": "counter",
    "sparkserve_memguard_rank_running": "gauge",
    "sparkserve_memguard_last_sample_timestamp_seconds": "gauge",
}
SAMPLED_AT = 1_800_000_000.25
START_OF_TIME = 1_800_000_000.0
DEP = {"deployment": "glm53"}
RANK = {"deployment": "glm53", "container": "glm53-r0"}


def metrics_file(tmp_path: Path) -> Path:
    folder = tmp_path / "textfile"
    folder.mkdir(exist_ok=True)
    return folder / "sparkserve-memguard-glm53.prom"


class InspectAnswer(FakeDocker):
    """FakeDocker whose inspections answer (rc, stdout, stderr) as given: docker that cannot tell."""

    def __init__(self, answer: tuple[int, str, str]) -> None:
        super().__init__()
        self.answer = answer

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        if list(argv[1:3]) == ["container", "inspect"]:
            self.calls.append(list(argv[1:]))
            self.timeouts.append(timeout_s)
            return self.answer
        return super().__call__(argv, timeout_s)


def test_one_sample_writes_every_family_with_the_guard_s_figures(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    docker = FakeDocker()
    write_meminfo(tmp_path / "meminfo", HIGH, MID)
    config = memguard.parse_config(base_config(tmp_path, metrics_path=str(path)))
    assert memguard.run(config, once=True, runner=docker, now=lambda: SAMPLED_AT) == 0
    families = exposition.read(path)
    assert {name: family.kind for name, family in families.items()} == MEMGUARD_FAMILIES
    assert families["sparkserve_memguard_floor_bytes"].samples == [(DEP, FLOOR)]
    assert families["sparkserve_memguard_mem_available_bytes"].samples == [(DEP, HIGH)]
    assert families["sparkserve_memguard_mem_free_bytes"].samples == [(DEP, MID)]
    assert families["sparkserve_memguard_actions_total"].samples == [(DEP, 0)]
    assert families["sparkserve_memguard_rank_running"].samples == [(RANK, 1)]
    assert families["sparkserve_memguard_last_sample_timestamp_seconds"].samples == [(DEP, SAMPLED_AT)]
    # Above the floor: docker is asked only for the metrics, with the guard's timeout.
    assert docker.calls == [INSPECT]
    assert docker.timeouts == [memguard.INSPECT_TIMEOUT_S]
    assert path.read_text(encoding="utf-8").startswith(
        "# HELP sparkserve_memguard_floor_bytes The guard's floor in bytes: it acts when a watched value stays "
        "below it.\n# TYPE sparkserve_memguard_floor_bytes gauge\n"
        'sparkserve_memguard_floor_bytes{deployment="glm53"} 8589934592\n')


@pytest.mark.parametrize(
    ("docker", "samples"),
    [
        (FakeDocker("running"), [(RANK, 1.0)]),
        (FakeDocker("exited"), [(RANK, 0.0)]),
        (FakeDocker("absent"), [(RANK, 0.0)]),
        (InspectAnswer((1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n")), []),
        (InspectAnswer((124, "", "no answer after 10 s")), []),
        (InspectAnswer((0, "<no value>\n", "")), []),
    ],
    ids=["running", "not-running", "absent", "daemon-error", "timeout", "unknown-answer"],
)
def test_rank_running_is_1_0_or_left_out_when_docker_cannot_tell(
    tmp_path: Path, docker: FakeDocker, samples: list[tuple[dict[str, str], float]]
) -> None:
    path = metrics_file(tmp_path)
    write_meminfo(tmp_path / "meminfo", HIGH, HIGH)
    config = memguard.parse_config(base_config(tmp_path, metrics_path=str(path)))
    assert memguard.run(config, once=True, runner=docker) == 0
    families = exposition.read(path)
    assert families["sparkserve_memguard_rank_running"].samples == samples
    assert set(families) == set(MEMGUARD_FAMILIES)  # HELP and TYPE stay, with or without the sample
    assert families["sparkserve_memguard_mem_available_bytes"].value(**DEP) == HIGH


def test_below_the_floor_docker_is_not_asked_and_the_rank_s_state_is_left_out(tmp_path: Path) -> None:
    """While memory is low the guard's samples come first: the write makes no docker call (docker may be slow
    then), and every other figure is written."""
    path = metrics_file(tmp_path)
    docker = FakeDocker()
    write_meminfo(tmp_path / "meminfo", HIGH, LOW)
    config = memguard.parse_config(base_config(tmp_path, metrics_path=str(path)))
    assert memguard.run(config, once=True, runner=docker) == 0
    assert docker.calls == []
    families = exposition.read(path)
    assert families["sparkserve_memguard_rank_running"].samples == []
    assert families["sparkserve_memguard_mem_free_bytes"].samples == [(DEP, LOW)]


def test_actions_total_counts_the_kills(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    docker = FakeDocker()
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    config = memguard.parse_config(base_config(tmp_path, samples=1, metrics_path=str(path)))
    assert memguard.run(config, once=True, runner=docker) == 0
    assert docker.calls == [INSPECT, ["kill", "glm53-r0"]]
    families = exposition.read(path)
    assert families["sparkserve_memguard_actions_total"].value(**DEP) == 1
    assert families["sparkserve_memguard_rank_running"].samples == []


def test_a_failed_kill_counts_as_an_action(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    config = memguard.parse_config(base_config(tmp_path, samples=1, metrics_path=str(path)))
    assert memguard.run(config, once=True, runner=FakeDocker(action_rc=1)) == 0
    families = exposition.read(path)
    assert families["sparkserve_memguard_actions_total"].value(**DEP) == 1


def test_the_file_is_written_at_the_first_sample_then_every_metrics_interval_and_removed_on_sigterm(
    tmp_path: Path,
) -> None:
    """A sample every (fake) second, metrics every 2.5 s: written at samples 1, 4, 7 and 10 of 11, and the
    guard's kill (samples 6 and 7 low, two of two) shows at the next write; SIGTERM removes the file."""
    path = metrics_file(tmp_path)
    docker = FakeDocker()
    elapsed = [0.0]
    seen: list[tuple[float, float, float]] = []  # after each sample: timestamp, MemFree, actions
    values = [HIGH, HIGH, HIGH, HIGH, HIGH, LOW, LOW, LOW, HIGH, HIGH, HIGH]
    write_meminfo(tmp_path / "meminfo", values[0], values[0])

    def sleep(seconds: float) -> None:
        families = exposition.read(path)
        seen.append((families["sparkserve_memguard_last_sample_timestamp_seconds"].value(**DEP),
                     families["sparkserve_memguard_mem_free_bytes"].value(**DEP),
                     families["sparkserve_memguard_actions_total"].value(**DEP)))
        if len(seen) == len(values):
            os.kill(os.getpid(), signal.SIGTERM)  # as systemd stops the guard
            return
        elapsed[0] += 1
        write_meminfo(tmp_path / "meminfo", values[len(seen)], values[len(seen)])

    config = memguard.parse_config(base_config(tmp_path, samples=2, metrics_path=str(path),
                                               metrics_interval_s=2.5))
    previous = signal.getsignal(signal.SIGTERM)
    assert memguard.run(config, once=False, sleep=sleep, runner=docker, clock=lambda: elapsed[0],
                        now=lambda: START_OF_TIME + elapsed[0]) == 0
    assert signal.getsignal(signal.SIGTERM) == previous
    written_at = [0, 3, 6, 9]  # the samples of each write, from 0
    expected: list[tuple[float, float, float]] = []
    for index in range(len(values)):
        last = max(w for w in written_at if w <= index)
        expected.append((START_OF_TIME + last, values[last], 1 if last >= 6 else 0))
    assert seen == expected
    # The write at sample 6 (below the floor) asks docker nothing; the guard, due at sample 7, asks once.
    assert [call for call in docker.calls if call == INSPECT] == [INSPECT] * len(written_at)
    assert actions_taken(docker.calls) == [["kill", "glm53-r0"]]
    assert not path.exists()
    assert exposition.leftovers(path) == []


def test_without_metrics_path_nothing_is_written_and_docker_is_not_asked(tmp_path: Path) -> None:
    docker = FakeDocker()
    write_meminfo(tmp_path / "meminfo", HIGH, HIGH)
    config = memguard.parse_config(base_config(tmp_path))
    assert config.metrics_path is None
    assert memguard.run(config, once=True, runner=docker) == 0
    assert docker.calls == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meminfo"]


def test_a_missing_folder_is_said_once_on_stderr_and_the_guard_carries_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "absent" / "memguard.prom"
    docker = FakeDocker()
    config = memguard.parse_config(base_config(tmp_path, samples=3, metrics_path=str(path),
                                               metrics_interval_s=0.01))
    steps: list[tuple[int, str | None]] = [(LOW, None)] * 4
    elapsed = [0.0]

    def sleep(seconds: float) -> None:
        elapsed[0] += seconds
        script.sleep(seconds)

    script = MemoryScript(tmp_path / "meminfo", docker, steps)
    assert memguard.run(config, once=False, sleep=sleep, runner=docker, clock=lambda: elapsed[0]) == 0
    assert actions_taken(docker.calls) == [["kill", "glm53-r0"]]  # the guard did its work
    assert [event["action"] for event in events(tmp_path)] == ["killed"]
    captured = capsys.readouterr()
    assert captured.err == (f"memguard glm53: cannot write the metrics file {path}: No such file or directory; "
                            "carrying on without it\n")
    assert not (tmp_path / "absent").exists()


def test_the_metrics_keys_and_their_defaults(tmp_path: Path) -> None:
    config = memguard.parse_config(base_config(tmp_path))
    assert (config.metrics_path, config.metrics_interval_s) == (None, 15.0)
    config = memguard.parse_config(base_config(tmp_path, metrics_path=None, metrics_interval_s=2))
    assert (config.metrics_path, config.metrics_interval_s) == (None, 2.0)
    config = memguard.parse_config(base_config(tmp_path, metrics_path="m.prom", metrics_interval_s=0.5))
    assert (config.metrics_path, config.metrics_interval_s) == ("m.prom", 0.5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"metrics_path": ""}, 'metrics_path is ""; set the path of the node-exporter textfile, like '
                               "/var/lib/node_exporter/textfile/sparkserve-memguard-glm53.prom, or null for no "
                               "metrics"),
        ({"metrics_path": 3}, "metrics_path is 3; set the path of the node-exporter textfile"),
        ({"metrics_path": ["m.prom"]}, 'metrics_path is ["m.prom"]; set the path'),
        ({"metrics_path": False}, "metrics_path is false; set the path"),
        ({"metrics_interval_s": 0}, "metrics_interval_s is 0; set a number of seconds above 0"),
        ({"metrics_interval_s": -5}, "metrics_interval_s is -5; set a number of seconds above 0"),
        ({"metrics_interval_s": "15"}, 'metrics_interval_s is "15"; set a number of seconds above 0'),
        ({"metrics_interval_s": True}, "metrics_interval_s is true; set a number of seconds above 0"),
        ({"metrics_interval_s": None}, "metrics_interval_s is null; set a number of seconds above 0"),
        ({"metrics_intervals": 15}, "unknown key metrics_intervals"),
    ],
)
def test_check_config_refuses_bad_metrics_keys_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], message: str
) -> None:
    path = write_config(tmp_path, base_config(tmp_path, **changes))
    assert memguard.main(["--config", str(path), "--check-config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"memguard config {path}: {message}")
    assert captured.err.count("\n") == 1


def test_a_nan_metrics_interval_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "memguard.json"
    path.write_text(json.dumps(base_config(tmp_path)).replace('"docker_command"', '"metrics_interval_s": NaN, '
                                                                                   '"docker_command"'),
                    encoding="utf-8")
    with pytest.raises(memguard.ConfigError, match="metrics_interval_s is NaN"):
        memguard.load_config(str(path))


# A docker client for the program: the rank container runs.
RUNNING_DOCKER = """
import sys
if sys.argv[1:3] == ["container", "inspect"]:
    print("true")
    sys.exit(0)
sys.exit(1)
"""


def test_the_program_writes_its_file_and_removes_it_on_sigterm(tmp_path: Path) -> None:
    path = metrics_file(tmp_path)
    docker = tmp_path / "docker.py"
    docker.write_text(RUNNING_DOCKER, encoding="utf-8")
    write_meminfo(tmp_path / "meminfo", HIGH, HIGH)
    config = write_config(tmp_path, base_config(tmp_path, docker_command=[sys.executable, str(docker)],
                                                metrics_path=str(path), metrics_interval_s=0.05))
    program = installed(tmp_path)
    check = subprocess.run([sys.executable, program, "--config", str(config), "--check-config"],
                           capture_output=True, text=True, timeout=30, env=node_layout.env(tmp_path / "node"))
    assert (check.returncode, check.stdout, check.stderr) == (0, "OK\n", "")
    assert not path.exists()  # --check-config writes nothing
    guard = subprocess.Popen([sys.executable, program, "--config", str(config)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=node_layout.env(tmp_path / "node"))
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert guard.poll() is None, "the guard exited"
            assert time.monotonic() < deadline, "no metrics file"
            time.sleep(0.01)
        before = time.time()
        families = exposition.parse(path.read_text(encoding="utf-8"))
        assert families["sparkserve_memguard_rank_running"].samples == [(RANK, 1)]
        assert families["sparkserve_memguard_mem_available_bytes"].value(**DEP) == HIGH
        assert before - 60 < families["sparkserve_memguard_last_sample_timestamp_seconds"].value(**DEP) <= before
        guard.send_signal(signal.SIGTERM)
        out, err = guard.communicate(timeout=30)
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait()
    assert guard.returncode == 0
    assert err == ""
    assert out.endswith("memguard: terminated; exiting\n")
    assert not path.exists()
    assert exposition.leftovers(path) == []
