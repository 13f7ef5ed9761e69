"""The memory guard of a node with several deployments (roles/memguard/files/sparkserve-memguard.py).

One guard per node reads every deployment's settings file of its folder (DEPLOYMENT.json): when memory stays
below a floor it acts on ONE rank, the deployment of lowest priority whose rank runs (ties by name), with that
deployment's own action, and records the event in that deployment's file; if memory is still low after a new
window, on the next one. The single-deployment behaviour is tests/roles/test_memguard.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
import yaml

from tests.roles import exposition, node_layout
from tests.roles.test_memguard import FLOOR, GIB, HIGH, LOW, MID, PROGRAM, memguard, write_meminfo

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "memguard"


def inspect(container: str) -> list[str]:
    return ["container", "inspect", "--format", "{{.State.Running}}", container]


class NodeDocker:
    """The guard's runner for a node of several containers: answers like docker from ``states`` (running,
    exited; a container not in it does not exist) and records every call."""

    def __init__(self, **states: str) -> None:
        self.states = dict(states)
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        assert argv[0] == "docker"
        args = list(argv[1:])
        self.calls.append(args)
        name = args[-1]
        state = self.states.get(name, "absent")
        if state == "absent":
            return 1, "", f"Error: No such container: {name}\n"
        if args[:2] == ["container", "inspect"]:
            return 0, "true\n" if state == "running" else "false\n", ""
        self.states[name] = "exited"
        return 0, f"{name}\n", ""

    def actions(self) -> list[list[str]]:
        return [call for call in self.calls if call[:2] != ["container", "inspect"]]


def settings(tmp_path: Path, deployment: str, priority: int | None = 0, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "deployment": deployment,
        "container": f"{deployment}-r0",
        "floor_bytes": FLOOR,
        "samples": 2,
        "watch": "both",
        "action": "kill",
        "stop_grace_s": 10,
        "interval_s": 0.05,
        "meminfo_path": str(tmp_path / "meminfo"),
        "events_path": str(tmp_path / "events" / f"{deployment}.events.jsonl"),
        "docker_command": ["docker"],
        "metrics_path": str(tmp_path / "textfile" / f"memguard-{deployment}.prom"),
    }
    if priority is not None:
        config["priority"] = priority
    config.update(changes)
    return config


def folder(tmp_path: Path) -> Path:
    path = tmp_path / "memguard"
    path.mkdir(exist_ok=True)
    (tmp_path / "events").mkdir(exist_ok=True)
    (tmp_path / "textfile").mkdir(exist_ok=True)
    return path


def write_settings(tmp_path: Path, config: dict[str, Any], name: str | None = None) -> Path:
    """One deployment's settings file in the folder, replaced whole as the role's node_files writes it."""
    path = folder(tmp_path) / (name or f"{config['deployment']}.json")
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_text(json.dumps(config), encoding="utf-8")
    os.replace(scratch, path)
    return path


def events(tmp_path: Path, deployment: str) -> list[dict[str, Any]]:
    path = tmp_path / "events" / f"{deployment}.events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def metrics(tmp_path: Path, deployment: str) -> Path:
    return tmp_path / "textfile" / f"memguard-{deployment}.prom"


class Script:
    """A fake sleep for run(): before each sample after the first, the next step's memory goes in meminfo and
    its change (a function, if any) is made; after the last step it ends the guard as SIGTERM would."""

    def __init__(self, tmp_path: Path, steps: list[tuple[int, Callable[[], None] | None]]) -> None:
        self.meminfo = tmp_path / "meminfo"
        self.steps = iter(steps[1:])
        self.apply(steps[0])

    def apply(self, step: tuple[int, Callable[[], None] | None]) -> None:
        value, change = step
        write_meminfo(self.meminfo, value, value)
        if change is not None:
            change()

    def sleep(self, seconds: float) -> None:
        assert seconds == 0.05
        step = next(self.steps, None)
        if step is None:
            raise memguard.Terminated()
        self.apply(step)


def guard_folder(tmp_path: Path, docker: NodeDocker, steps: list[tuple[int, Callable[[], None] | None]]) -> int:
    """Run the node's guard over the folder, as its unit does, through the steps."""
    script = Script(tmp_path, steps)
    source = memguard.Settings(str(folder(tmp_path)), folder=True)
    return memguard.run(source, once=False, sleep=script.sleep, runner=docker)


def low(count: int) -> list[tuple[int, Callable[[], None] | None]]:
    return [(LOW, None)] * count


# --- which rank, and when ---------------------------------------------------------------


def test_the_rank_of_lowest_priority_is_acted_on_first_and_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(tmp_path, settings(tmp_path, "chat", priority=10))
    write_settings(tmp_path, settings(tmp_path, "batch", priority=1))
    docker = NodeDocker(**{"chat-r0": "running", "batch-r0": "running"})
    assert guard_folder(tmp_path, docker, [(HIGH, None), *low(3)]) == 0
    # One window (two low samples) and a third low sample: one action, on batch only.
    assert docker.actions() == [["kill", "batch-r0"]]
    assert docker.states == {"chat-r0": "running", "batch-r0": "exited"}
    [event] = events(tmp_path, "batch")
    assert (event["deployment"], event["container"], event["action"], event["priority"], event["trigger"]) == (
        "batch", "batch-r0", "killed", 1, "batch")
    assert events(tmp_path, "chat") == []
    out = capsys.readouterr().out.splitlines()
    assert ("memguard batch: MemAvailable 4.00 GiB, MemFree 4.00 GiB; below the floor of 8.00 GiB (2/2); "
            "killed container batch-r0 (priority 1)") in out
    assert out[-1] == "memguard: terminated; exiting"


def test_if_memory_stays_low_the_next_window_acts_on_the_next_then_nothing_is_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(tmp_path, settings(tmp_path, "a-high", priority=5))
    write_settings(tmp_path, settings(tmp_path, "z-low", priority=-3))
    write_settings(tmp_path, settings(tmp_path, "middle", priority=0))
    docker = NodeDocker(**{"a-high-r0": "running", "z-low-r0": "running", "middle-r0": "running"})
    seen: list[list[list[str]]] = []

    def note() -> None:
        seen.append(docker.actions())

    steps: list[tuple[int, Callable[[], None] | None]] = [
        (LOW, None), (LOW, note),  # the first window: z-low (priority -3)
        (LOW, note), (LOW, note),  # the next: middle (0)
        (LOW, note), (LOW, note),  # the next: a-high (5)
        (LOW, note), (LOW, note), (LOW, note),  # nothing left: no more actions while memory stays low
    ]
    assert guard_folder(tmp_path, docker, steps) == 0
    kills = [["kill", "z-low-r0"], ["kill", "middle-r0"], ["kill", "a-high-r0"]]
    # note() runs before each sample from the second on: the action of sample N shows at note N.
    assert seen == [[], kills[:1], kills[:1], kills[:2], kills[:2], kills[:3], kills[:3], kills[:3]]
    assert docker.actions() == kills
    assert [len(events(tmp_path, name)) for name in ("z-low", "middle", "a-high")] == [1, 1, 1]
    out = capsys.readouterr().out
    assert "killed container middle-r0 (priority 0; acted on before: z-low-r0)" in out
    assert out.count("nothing left to kill") == 1


def test_equal_priorities_go_by_the_deployments_names(tmp_path: Path) -> None:
    for name in ("gemma", "alpha", "mistral"):
        write_settings(tmp_path, settings(tmp_path, name, priority=None))  # the default priority: 0
    docker = NodeDocker(**{"gemma-r0": "running", "alpha-r0": "running", "mistral-r0": "running"})
    assert guard_folder(tmp_path, docker, low(6)) == 0
    assert docker.actions() == [["kill", "alpha-r0"], ["kill", "gemma-r0"], ["kill", "mistral-r0"]]


def test_each_deployment_keeps_its_own_action_and_grace(tmp_path: Path) -> None:
    write_settings(tmp_path, settings(tmp_path, "one", priority=0, action="stop", stop_grace_s=25))
    write_settings(tmp_path, settings(tmp_path, "two", priority=1, action="kill"))
    docker = NodeDocker(**{"one-r0": "running", "two-r0": "running"})
    assert guard_folder(tmp_path, docker, low(4)) == 0
    assert docker.actions() == [["stop", "-t", "25", "one-r0"], ["kill", "two-r0"]]
    assert [e["action"] for e in events(tmp_path, "one")] == ["stopped"]
    assert [e["action"] for e in events(tmp_path, "two")] == ["killed"]


def test_a_rank_that_does_not_run_is_passed_over_for_the_next(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(tmp_path, settings(tmp_path, "first", priority=0))
    write_settings(tmp_path, settings(tmp_path, "second", priority=1))
    write_settings(tmp_path, settings(tmp_path, "third", priority=2))
    docker = NodeDocker(**{"second-r0": "exited", "third-r0": "running"})  # first-r0 not there
    assert guard_folder(tmp_path, docker, low(2)) == 0
    assert docker.calls == [inspect("first-r0"), inspect("second-r0"), inspect("third-r0"), ["kill", "third-r0"]]
    assert "killed container third-r0 (priority 2; not running: first-r0, second-r0)" in capsys.readouterr().out


def test_when_no_rank_runs_it_says_so_once_and_acts_on_the_first_that_appears(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(tmp_path, settings(tmp_path, "low", priority=0))
    write_settings(tmp_path, settings(tmp_path, "high", priority=9))
    docker = NodeDocker()

    def start_high() -> None:
        docker.states["high-r0"] = "running"

    assert guard_folder(tmp_path, docker, [*low(4), (LOW, start_high), (LOW, None)]) == 0
    assert docker.actions() == [["kill", "high-r0"]]  # low-r0 never ran: high's rank is the one there is
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if "nothing to kill" in line] == [
        "memguard high: MemAvailable 4.00 GiB, MemFree 4.00 GiB; below the floor of 8.00 GiB (2/2); "
        "container low-r0 is not there, container high-r0 is not there: nothing to kill; still watching"]


def test_the_node_acts_when_any_floor_is_crossed_on_the_rank_of_lowest_priority(tmp_path: Path) -> None:
    """Memory at 12 GiB is above cheap's 8 GiB floor and below big's 16 GiB: big's window fires, and the rank
    acted on is still cheap's (lower priority); the event, in cheap's file, names the window that fired."""
    write_settings(tmp_path, settings(tmp_path, "cheap", priority=0))
    write_settings(tmp_path, settings(tmp_path, "big", priority=5, floor_bytes=16 * GIB, samples=3))
    docker = NodeDocker(**{"cheap-r0": "running", "big-r0": "running"})
    assert guard_folder(tmp_path, docker, [(MID, None)] * 3) == 0
    assert docker.actions() == [["kill", "cheap-r0"]]
    [event] = events(tmp_path, "cheap")
    assert (event["deployment"], event["trigger"], event["floor_bytes"], event["samples"], event["priority"]) == (
        "cheap", "big", 16 * GIB, 3, 0)
    assert event["values"] == {"MemAvailable": MID, "MemFree": MID}


def test_a_rank_acted_on_is_acted_on_again_only_after_memory_came_back_above_every_floor(tmp_path: Path) -> None:
    write_settings(tmp_path, settings(tmp_path, "a", priority=0))
    write_settings(tmp_path, settings(tmp_path, "b", priority=1, floor_bytes=16 * GIB))
    docker = NodeDocker(**{"a-r0": "running", "b-r0": "running"})

    def restart_a() -> None:
        docker.states["a-r0"] = "running"

    steps: list[tuple[int, Callable[[], None] | None]] = [
        *low(2),  # a killed
        (MID, restart_a), (MID, None),  # above a's floor, still below b's: the spell goes on; b killed
        (MID, None), (MID, None),  # a runs again but was acted on in this spell: left alone
        (HIGH, None),  # above every floor: the spell is over
        *low(2),  # a killed again
    ]
    assert guard_folder(tmp_path, docker, steps) == 0
    assert docker.actions() == [["kill", "a-r0"], ["kill", "b-r0"], ["kill", "a-r0"]]


# --- the settings folder ------------------------------------------------------------------


def test_a_removed_settings_file_drops_that_rank_and_its_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = write_settings(tmp_path, settings(tmp_path, "batch", priority=0))
    write_settings(tmp_path, settings(tmp_path, "chat", priority=1))
    docker = NodeDocker(**{"chat-r0": "running", "batch-r0": "running"})
    written: list[bool] = []

    def remove_batch() -> None:
        written.append(metrics(tmp_path, "batch").exists())
        batch.unlink()  # memguard_state: absent for batch

    assert guard_folder(tmp_path, docker, [(HIGH, None), (LOW, remove_batch), *low(1)]) == 0
    assert written == [True]
    assert docker.actions() == [["kill", "chat-r0"]]  # batch's rank runs, but it is no longer guarded
    assert events(tmp_path, "batch") == []
    assert not metrics(tmp_path, "batch").exists()
    assert not metrics(tmp_path, "chat").exists()  # SIGTERM removes the others
    assert "memguard batch: settings removed; no longer watching container batch-r0" in capsys.readouterr().out


def test_a_file_added_or_changed_while_it_runs_is_taken_at_the_next_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(tmp_path, settings(tmp_path, "first", priority=0))
    docker = NodeDocker(**{"first-r0": "running", "second-r0": "running"})

    def add_second() -> None:
        write_settings(tmp_path, settings(tmp_path, "second", priority=5))

    def demote_second() -> None:  # second now goes first
        write_settings(tmp_path, settings(tmp_path, "second", priority=-1))

    assert guard_folder(tmp_path, docker, [(HIGH, add_second), (HIGH, demote_second), *low(2)]) == 0
    assert docker.actions() == [["kill", "second-r0"]]
    out = capsys.readouterr().out
    assert "memguard second: settings changed; watching MemAvailable and MemFree" in out
    assert "for container second-r0 (priority -1)" in out


def test_an_empty_folder_idles_and_says_so_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No settings: nothing read, nothing asked, one line; it looks again every second."""
    docker = NodeDocker()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise memguard.Terminated()

    source = memguard.Settings(str(folder(tmp_path)), folder=True)
    assert memguard.run(source, once=False, sleep=sleep, runner=docker) == 0
    assert slept == [1.0, 1.0, 1.0]
    assert docker.calls == []
    assert not (tmp_path / "meminfo").exists()
    out = capsys.readouterr().out.splitlines()
    assert out == [f"memguard: no deployment's settings in {folder(tmp_path)}; watching for some",
                   "memguard: terminated; exiting"]


def test_a_bad_file_in_the_folder_is_said_once_and_the_others_stay_guarded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(tmp_path, settings(tmp_path, "good", priority=1))
    bad = write_settings(tmp_path, settings(tmp_path, "bad", priority=0, watch="Cached"))
    write_settings(tmp_path, settings(tmp_path, "misnamed", priority=0), name="other.json")
    (folder(tmp_path) / ".good.json.123.0.tmp").write_text("{", encoding="utf-8")  # a write under way: ignored
    (folder(tmp_path) / "notes.txt").write_text("not settings", encoding="utf-8")
    docker = NodeDocker(**{"good-r0": "running", "bad-r0": "running", "misnamed-r0": "running"})
    assert guard_folder(tmp_path, docker, low(3)) == 0
    assert docker.actions() == [["kill", "good-r0"]]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f'memguard config {bad}: watch is "Cached"; set one of MemAvailable, MemFree, both; '
        "that deployment is not guarded",
        f'memguard config {folder(tmp_path) / "other.json"}: deployment is "misnamed" but the file is other.json; '
        "name it misnamed.json; that deployment is not guarded",
    ]


def test_a_file_changed_into_a_bad_one_keeps_its_last_valid_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(tmp_path, settings(tmp_path, "only", priority=0))
    docker = NodeDocker(**{"only-r0": "running"})

    def spoil() -> None:
        write_settings(tmp_path, settings(tmp_path, "only", samples=0))

    assert guard_folder(tmp_path, docker, [(HIGH, None), (HIGH, spoil), *low(2)]) == 0
    assert docker.actions() == [["kill", "only-r0"]]
    assert capsys.readouterr().err.endswith("samples is 0; set a whole number of at least 1; "
                                            "keeping its last valid settings\n")


def test_two_files_naming_one_container_keep_the_first_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(tmp_path, settings(tmp_path, "aaa", priority=5, container="shared"))
    later = write_settings(tmp_path, settings(tmp_path, "bbb", priority=0, container="shared"))
    docker = NodeDocker(shared="running")
    assert guard_folder(tmp_path, docker, low(4)) == 0
    assert docker.actions() == [["kill", "shared"]]
    assert [len(events(tmp_path, name)) for name in ("aaa", "bbb")] == [1, 0]
    assert capsys.readouterr().err == (f"memguard config {later}: container shared is deployment aaa's already; "
                                       "it is left out\n")


def test_the_node_samples_at_the_smallest_interval(tmp_path: Path) -> None:
    write_settings(tmp_path, settings(tmp_path, "slow", interval_s=1.0))
    write_settings(tmp_path, settings(tmp_path, "fast", interval_s=0.05))
    write_meminfo(tmp_path / "meminfo", HIGH, HIGH)
    watch = memguard.Watch(memguard.Settings(str(folder(tmp_path)), folder=True), NodeDocker())
    watch.observe_once()
    assert watch.interval_s() == 0.05


def test_each_deployment_writes_its_own_metrics_file(tmp_path: Path) -> None:
    write_settings(tmp_path, settings(tmp_path, "a", priority=0))
    write_settings(tmp_path, settings(tmp_path, "b", priority=1))
    write_meminfo(tmp_path / "meminfo", LOW, LOW)
    docker = NodeDocker(**{"a-r0": "running", "b-r0": "running"})
    elapsed = [0.0]
    source = memguard.Settings(str(folder(tmp_path)), folder=True)
    watch = memguard.Watch(source, docker, clock=lambda: elapsed[0])
    watch.observe_once()
    elapsed[0] = 60.0
    watch.observe_once()  # the window is full: a's rank is killed, and both files written again
    for name, actions in (("a", 1), ("b", 0)):
        families = exposition.read(metrics(tmp_path, name))
        assert families["sparkserve_memguard_actions_total"].value(deployment=name) == actions
        assert families["sparkserve_memguard_floor_bytes"].value(deployment=name) == FLOOR


# --- the command line ---------------------------------------------------------------------


def test_check_config_on_a_folder_names_every_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_settings(tmp_path, settings(tmp_path, "good"))
    bad = write_settings(tmp_path, settings(tmp_path, "bad", priority="high"))
    clash = write_settings(tmp_path, settings(tmp_path, "twin", container="good-r0"))
    assert memguard.main(["--config", str(folder(tmp_path)), "--check-config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f'memguard config {bad}: priority is "high"; set a whole number (the guard acts on the lowest first)',
        f"memguard config {clash}: container good-r0 is deployment good's already; it is left out",
    ]
    bad.unlink()
    clash.unlink()
    assert memguard.main(["--config", str(folder(tmp_path)), "--check-config"]) == 0
    assert capsys.readouterr().out == "OK\n"


@pytest.mark.parametrize(("changes", "message"), [
    ({"priority": 1.5}, "priority is 1.5; set a whole number"),
    ({"priority": True}, "priority is true; set a whole number"),
    ({"at_boot": "yes"}, 'at_boot is "yes"; set true or false'),
])
def test_bad_priority_or_at_boot_is_refused(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(memguard.ConfigError, match=message):
        memguard.parse_config(settings(tmp_path, "x", **changes))


def test_priority_and_at_boot_default_to_0_and_false(tmp_path: Path) -> None:
    config = memguard.parse_config(settings(tmp_path, "x", priority=None))
    assert (config.priority, config.at_boot) == (0, False)


def test_the_program_over_a_folder_acts_on_the_rank_of_lowest_priority(tmp_path: Path) -> None:
    """As the node's unit runs it: the installed program, --config on the folder, a docker of two ranks."""
    docker = tmp_path / "docker.py"
    docker.write_text(
        "import json, pathlib, sys\n"
        "here = pathlib.Path(sys.argv[0]).parent\n"
        "args = sys.argv[1:]\n"
        "with open(here / 'docker.log', 'a') as log:\n"
        "    log.write(json.dumps(args) + '\\n')\n"
        "print('true' if args[:2] == ['container', 'inspect'] else args[-1])\n",
        encoding="utf-8")
    command = [sys.executable, str(docker)]
    write_settings(tmp_path, settings(tmp_path, "keep", priority=3, samples=1, docker_command=command))
    write_settings(tmp_path, settings(tmp_path, "shed", priority=2, samples=1, docker_command=command,
                                      action="stop", stop_grace_s=5))
    write_meminfo(tmp_path / "meminfo", HIGH, LOW)
    program = node_layout.install(tmp_path / "node", PROGRAM)
    done = subprocess.run([sys.executable, str(program), "--config", str(folder(tmp_path)), "--once"],
                          capture_output=True, text=True, timeout=60, env=node_layout.env(tmp_path / "node"))
    assert (done.returncode, done.stderr) == (0, "")
    calls = [json.loads(line) for line in (tmp_path / "docker.log").read_text(encoding="utf-8").splitlines()]
    assert calls == [inspect("shed-r0"), ["stop", "-t", "5", "shed-r0"]]
    [event] = events(tmp_path, "shed")
    assert (event["action"], event["priority"]) == ("stopped", 2)
    assert done.stdout.splitlines()[:2] == [
        f"memguard keep: watching MemAvailable and MemFree in {tmp_path / 'meminfo'} for container keep-r0 "
        "(priority 3); floor 8.00 GiB, 1 samples of 0.05 s, then kill (docker kill)",
        f"memguard shed: watching MemAvailable and MemFree in {tmp_path / 'meminfo'} for container shed-r0 "
        "(priority 2); floor 8.00 GiB, 1 samples of 0.05 s, then stop (docker stop -t 5)",
    ]


# --- the role: one unit per node, a settings file per deployment -------------------------------


def role_file(path: str) -> Any:
    return yaml.safe_load((ROLE / path).read_text(encoding="utf-8"))


def test_one_unit_per_node_runs_the_program_over_the_folder() -> None:
    units = sorted(p.name for p in (ROLE / "templates/etc/systemd/system").iterdir())
    assert units == ["sparkserve-memguard.service.j2"]
    unit = (ROLE / "templates/etc/systemd/system/sparkserve-memguard.service.j2").read_text(encoding="utf-8")
    assert "%i" not in unit
    assert "\nExecStart=/usr/bin/python3 {{ __memguard_program }} --config {{ __memguard_config_dir }}\n" in unit
    variables = role_file("vars/main.yml")
    assert variables["__memguard_unit"] == "{{ sparkserve_memguard_service }}.service"
    assert variables["__memguard_settings"] == "{{ __memguard_config_dir }}/{{ memguard_deployment }}.json"


def test_the_settings_template_writes_the_priority_and_at_boot() -> None:
    template = (ROLE / "templates/etc/sparkserve/memguard/deployment.json.j2").read_text(encoding="utf-8")
    assert "'priority': memguard_priority | int" in template
    assert "'at_boot': memguard_at_boot | bool" in template
    defaults = role_file("defaults/main.yml")
    assert defaults["memguard_priority"] == "{{ sparkserve_deployment_priority | default(0) }}"
    spec = role_file("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert spec["memguard_priority"]["type"] == "int"
    keys = set(memguard.REQUIRED_KEYS + memguard.OPTIONAL_KEYS) - {"docker_command"}
    assert {key for key in keys if f"'{key}':" in template} == keys  # every key the program reads, but docker's


def test_the_old_template_units_are_retired_by_present_and_absent() -> None:
    def includes(path: str, name: str) -> bool:
        return any(task.get("ansible.builtin.include_tasks") == name or task.get("ansible.builtin.import_tasks") == name
                   for task in role_file(path))
    # present retires them when its install changed something (changed.yml, included only then), absent always.
    assert includes("tasks/present.yml", "changed.yml") and includes("tasks/changed.yml", "retire.yml")
    assert includes("tasks/absent.yml", "retire.yml")
    retire = role_file("tasks/retire.yml")
    text = json.dumps(retire)
    assert "__memguard_old_template" in text and "__memguard_old_unit_file" in text
    variables = role_file("vars/main.yml")
    assert variables["__memguard_old_template"] == "{{ sparkserve_memguard_service }}@"
    assert variables["__memguard_old_unit_file"] == "{{ __memguard_systemd_dir }}/{{ __memguard_old_template }}.service"
    assert variables["__memguard_systemd_dir"] == "/etc/systemd/system"
    modules = [next(key for key in task if key.startswith("ansible.builtin.")) for task in retire]
    assert modules == ["ansible.builtin.command", "ansible.builtin.find", "ansible.builtin.systemd_service",
                       "ansible.builtin.file"]
    listed, enabled, stop, remove = retire
    assert listed["ansible.builtin.command"]["argv"][:2] == ["systemctl", "list-units"]
    assert (listed["changed_when"], listed["check_mode"]) == (False, False)
    assert enabled["ansible.builtin.find"]["file_type"] == "link"  # the instances' links in *.wants
    assert stop["ansible.builtin.systemd_service"]["state"] == "stopped"  # first, while the template is there
    assert remove["ansible.builtin.file"]["state"] == "absent"
    assert "__memguard_old_unit_file" in remove["loop"] and "__memguard_old_enabled.files" in remove["loop"]
    assert remove["notify"] == "Memguard old units removed"
    [reload] = [h for h in role_file("handlers/main.yml") if h.get("listen") == "Memguard old units removed"]
    assert reload["ansible.builtin.systemd_service"] == {"daemon_reload": True}
