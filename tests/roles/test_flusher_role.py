"""The flusher role, and the engine's steps that hold and release the node's flusher, through real
ansible-playbook runs on this machine: one flusher unit per node, a settings file per deployment, the holds of
two deployments' loads, and the per-deployment units of before retired.

The plays run with connection local against a temporary inventory (two deployments, alpha and beta, on one
node), every path of the role moved into the temporary folder, and a double of systemctl on PATH. The double
keeps the units' states in a JSON file and logs every call; it runs a Type=notify unit as systemd does, from
the installed unit file: ExecStart with NOTIFY_SOCKET, ready at READY=1, SIGTERM to stop, then ExecStopPost.
So the hold units run the real flusher program (--hold, --release), which calls the double to start and stop
the node's unit. No systemd, nothing outside the temporary folder is written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.roles.test_flusher import flusher
from tests.roles.test_shared_paths import ROOT, local_vars, run_play

UNIT = "sparkserve-flusher.service"
OLD = "sparkserve-flusher@old.service"
GIB = 1024**3


def hold(deployment: str) -> str:
    return f"sparkserve-flusher-hold@{deployment}.service"


SYSTEMCTL = r'''
import fcntl, fnmatch, json, os, shlex, signal, socket, subprocess, sys, time
here = HERE
units_dir = os.path.join(here, "etc-systemd-system")
state_file = os.path.join(here, "state.json")
raw = sys.argv[1:]
args = [a for a in raw if a not in ("-l", "--no-block")]
with open(os.path.join(here, "calls.jsonl"), "a") as log:
    log.write(json.dumps(raw) + "\n")


class State:
    """The units' states (unit -> {"pid": main pid or null}; absent: inactive), under a lock."""
    def __enter__(self):
        self.fd = os.open(os.path.join(here, ".state.lock"), os.O_RDWR | os.O_CREAT)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.units = json.load(open(state_file)) if os.path.exists(state_file) else {}
        return self.units
    def __exit__(self, *exc):
        json.dump(self.units, open(state_file, "w"))
        os.close(self.fd)


def unit_file(unit):
    base, at, _ = unit.partition("@")
    return os.path.join(units_dir, base + "@.service" if at else unit)


def exists(unit):
    return os.path.exists(unit_file(unit))


def runs(pid):
    try:
        os.kill(pid, 0)
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def active(units, unit):
    entry = units.get(unit)
    return entry is not None and (entry["pid"] is None or runs(entry["pid"]))


def directives(unit):
    instance = unit.partition("@")[2].rpartition(".service")[0]
    found = {}
    for line in open(unit_file(unit)):
        key, sep, value = line.strip().partition("=")
        if sep and key in ("Type", "ExecStart", "ExecStopPost", "Environment"):
            found[key] = value.replace("%i", instance)
    env = dict(os.environ)
    name, _, value = found.get("Environment", "").partition("=")
    if name:
        env[name] = value
    return found, env


def output(unit):
    return open(os.path.join(here, unit + ".log"), "a")


def start(unit):
    with State() as units:
        if active(units, unit):
            return 0
    if not exists(unit):
        print(f"Failed to start {unit}: Unit {unit} not found.", file=sys.stderr)
        return 5
    found, env = directives(unit)
    if found.get("Type") != "notify":  # the node's flusher and the units of before: a state, nothing runs
        with State() as units:
            units[unit] = {"pid": None}
        return 0
    name = f"sparkserve-test-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(60)
    env["NOTIFY_SOCKET"] = "@" + name
    proc = subprocess.Popen(shlex.split(found["ExecStart"]), env=env, stdin=subprocess.DEVNULL, stdout=output(unit),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = sock.recv(64) == b"READY=1"
    except socket.timeout:
        ready = False
    if not ready:
        proc.kill()
        proc.wait()
        stop_post(unit)
        return 1
    with State() as units:
        units[unit] = {"pid": proc.pid}
    return 0


def stop_post(unit):
    found, env = directives(unit) if exists(unit) else ({}, {})
    if "ExecStopPost" in found:
        subprocess.run(shlex.split(found["ExecStopPost"]), env=env, stdin=subprocess.DEVNULL, stdout=output(unit),
                       stderr=subprocess.STDOUT, timeout=120)


def stop(unit):
    with State() as units:
        entry = units.pop(unit, None)
    if entry is None:
        return 0
    pid = entry["pid"]
    if pid is not None and runs(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while runs(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    stop_post(unit)
    return 0


command = args[0] if args else ""
unit = args[-1] if len(args) > 1 else ""
if command == "show":
    with State() as units:
        on = active(units, unit)
    print(f"LoadState={'loaded' if exists(unit) else 'not-found'}")
    print(f"ActiveState={'active' if on else 'inactive'}")
    print(f"SubState={'running' if on else 'dead'}")
elif command == "is-active":
    with State() as units:
        on = active(units, unit)
    print("active" if on else "inactive")
    sys.exit(0 if on else 3)
elif command == "start":
    sys.exit(start(unit))
elif command == "restart":
    stop(unit)
    sys.exit(start(unit))
elif command == "stop":
    sys.exit(stop(unit))
elif command == "list-units":
    with State() as units:
        names = sorted(units)
    for name in names:
        if fnmatch.fnmatch(name, args[-1]):
            print(f"{name} {'loaded' if exists(name) else 'not-found'} active running sparkserve flusher")
elif command in ("daemon-reload", "marker"):
    pass
else:
    print(f"systemctl double: {raw} not known", file=sys.stderr)
    sys.exit(2)
'''


class Node:
    """A node in the temporary folder: its paths, the systemctl double and what it was asked."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.runs = 0
        self.systemd = tmp_path / "systemd"
        self.units = self.systemd / "etc-systemd-system"
        self.units.mkdir(parents=True)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        double = bin_dir / "systemctl"
        double.write_text(f"#!{sys.executable}\nHERE = {str(self.systemd)!r}\n{SYSTEMCTL}", encoding="utf-8")
        double.chmod(0o755)
        self.path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        (tmp_path / "drop_caches").write_text("", encoding="ascii")

    @property
    def config_dir(self) -> Path:
        return self.root / "etc" / "flusher"

    @property
    def holds_dir(self) -> Path:
        return self.root / "run" / "flusher"

    def settings(self, deployment: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.config_dir / f"{deployment}.json").read_text(encoding="utf-8"))
        return loaded

    def markers(self) -> dict[str, int]:
        """Each marker's deployment and the pid of its hold."""
        if not self.holds_dir.exists():
            return {}
        return {path.stem: json.loads(path.read_text(encoding="utf-8"))["pid"]
                for path in sorted(self.holds_dir.glob("*.load"))}

    def calls(self) -> list[list[str]]:
        log = self.systemd / "calls.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]

    def acts(self) -> list[list[str]]:
        """The calls that change something (not show, is-active, list-units)."""
        return [call for call in self.calls() if call[0] not in ("show", "is-active", "list-units")]

    def step(self, number: int) -> list[list[str]]:
        """The changing calls of step number of the last play()."""
        calls = self.acts()
        start = calls.index(["marker", f"{self.runs}.{number}"])
        end = next((i for i in range(start + 1, len(calls)) if calls[i][0] == "marker"), len(calls))
        return calls[start + 1:end]

    def state(self) -> dict[str, Any]:
        path = self.systemd / "state.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}

    def active(self) -> list[str]:
        return sorted(self.state())

    def old_layout(self) -> None:
        """A node set up before issue 39: the template unit, one instance running, its settings file."""
        (self.units / "sparkserve-flusher@.service").write_text("[Service]\n", encoding="utf-8")
        (self.systemd / "state.json").write_text(json.dumps({OLD: {"pid": None}}), encoding="utf-8")
        self.config_dir.mkdir(parents=True)
        (self.config_dir / "old.env").write_text('FLUSHER_ARGS="--mode unconditional"\n', encoding="utf-8")

    def host(self, deployment: str, mode: str) -> dict[str, Any]:
        root = self.root
        return local_vars(
            sparkserve_project_dir=str(ROOT),
            sparkserve_programs_dir=str(root / "programs"),
            sparkserve_config_dir=str(root / "etc"),
            sparkserve_metrics_dir=str(root / "metrics"),
            sparkserve_lock_dir=str(root / "run" / "locks"),
            sparkserve_drop_caches_path=str(root / "drop_caches"),
            recipe_deployment=deployment,
            recipe_config={"memory": {"flusher": {"mode": mode, "interval_s": 1.5 if mode == "threshold" else 2}},
                           "readiness": {"timeout_s": 600}},
            flusher_threshold_bytes=4 * GIB,
        )

    def play(self, *steps: tuple[str, dict[str, Any]]) -> str:
        """Run each (host, play fields) in turn, a marker call before each (step N of this run); the output."""
        self.runs += 1
        plays: list[dict[str, Any]] = []
        for number, (host, fields) in enumerate(steps):
            plays.append({"name": f"Marker {number}", "hosts": host, "gather_facts": False,
                          "tasks": [{"name": "Mark", "ansible.builtin.command": {
                              "argv": ["systemctl", "marker", f"{self.runs}.{number}"]}, "changed_when": False}]})
            plays.append({"name": f"Step {number} on {host}", "hosts": host, "gather_facts": False, **fields})
        inventory = {"sparks": {"hosts": {"alpha": self.host("alpha", "unconditional"),
                                          "beta": self.host("beta", "threshold")}}}
        done = run_play(self.root, plays, inventory, "-e", json.dumps({"__flusher_systemd_dir": str(self.units)}),
                        path=self.path)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def kill_holds(self) -> None:
        for entry in self.state().values():
            if entry["pid"] is not None:
                try:
                    os.kill(entry["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass


ROLE = {"roles": ["flusher"]}


def load_starts(deployment: str) -> dict[str, Any]:
    """The launch's step before the first rank (roles/engine/tasks/launch.yml): the load holds the flusher."""
    return {"tasks": [{"name": "Start the page-cache flusher on every node for the load",
                       "ansible.builtin.systemd_service": {"name": hold(deployment), "state": "restarted"}}]}


def load_ends(deployment: str) -> dict[str, Any]:
    """The engine's own step when the load ends (serving, or a failed launch): roles/engine/tasks/stop_flusher.yml."""
    return {"vars": {"engine_flusher_hold_unit": hold(deployment), "sparkserve_deployment_hosts": [deployment]},
            "tasks": [{"name": "Stop the flusher",
                       "ansible.builtin.include_tasks": str(ROOT / "roles/engine/tasks/stop_flusher.yml")}]}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(tmp_path)
    yield made
    made.kill_holds()


def test_one_unit_per_node_two_deployments_settings_and_the_old_units_retired(node: Node) -> None:
    node.old_layout()
    node.play(("alpha", ROLE), ("beta", ROLE))
    # The first run retires the per-deployment flusher of before: stopped, its template and settings removed.
    first = node.step(0)
    assert first.index(["stop", OLD]) < first.index(["daemon-reload"])
    assert not (node.units / "sparkserve-flusher@.service").exists()
    assert sorted(p.name for p in node.config_dir.iterdir()) == ["alpha.json", "beta.json"]
    assert node.active() == []  # nothing runs outside a load
    program = node.root / "programs" / "sparkserve-flusher.py"
    options = f"--config {node.config_dir} --holds {node.holds_dir} --unit {UNIT}"
    unit = (node.units / UNIT).read_text(encoding="utf-8")
    assert f"\nExecStart=/usr/bin/python3 {program} {options}\n" in unit
    template = (node.units / "sparkserve-flusher-hold@.service").read_text(encoding="utf-8")
    assert "\nType=notify\n" in template
    assert f"\nExecStart=/usr/bin/python3 {program} {options} --hold %i\n" in template
    assert f"\nExecStopPost=/usr/bin/python3 {program} {options} --release %i\n" in template
    # The second deployment adds its settings: no unit changes, nothing retired again.
    assert node.step(1) == []
    assert node.settings("alpha") == {
        "deployment": "alpha", "mode": "unconditional", "interval_s": 2.0, "threshold_bytes": None,
        "timeout_s": 600.0, "drop_caches_path": str(node.root / "drop_caches"), "meminfo_path": "/proc/meminfo",
        "metrics_path": str(node.root / "metrics" / "flusher-alpha.prom")}
    assert (node.settings("beta")["mode"], node.settings("beta")["threshold_bytes"],
            node.settings("beta")["interval_s"]) == ("threshold", 4 * GIB, 1.5)

    # Again: nothing changes.
    node.play(("alpha", ROLE), ("beta", ROLE))
    assert node.step(0) == node.step(1) == []


def test_the_first_load_ending_leaves_the_flusher_running_the_last_stops_it(node: Node) -> None:
    node.play(("alpha", ROLE), ("beta", ROLE))
    # Both deployments' loads hold the node's flusher: each hold puts its marker and starts the one unit.
    node.play(("alpha", load_starts("alpha")), ("beta", load_starts("beta")))
    # (restarted starts a hold that does not run)
    assert node.step(0) == [["start", hold("alpha")], ["start", UNIT]]
    assert node.step(1) == [["start", hold("beta")], ["start", UNIT]]
    state = node.state()
    assert sorted(state) == [hold("alpha"), hold("beta"), UNIT]
    assert node.markers() == {"alpha": state[hold("alpha")]["pid"], "beta": state[hold("beta")]["pid"]}

    # alpha serves: its hold goes, and the flusher runs on for beta's load.
    node.play(("alpha", load_ends("alpha")))
    assert node.step(0) == [["stop", hold("alpha")]]
    assert node.active() == [hold("beta"), UNIT]
    assert list(node.markers()) == ["beta"]
    log = (node.systemd / f"{hold('alpha')}.log").read_text(encoding="utf-8")
    assert f"flusher release alpha: {UNIT} runs on: the load of beta holds it" in log

    # beta serves: the last hold goes, the flusher stops (by the hold's release as it ends, and again by its
    # ExecStopPost, which finds it stopped).
    node.play(("beta", load_ends("beta")))
    assert node.step(0) == [["stop", hold("beta")], ["stop", UNIT], ["stop", UNIT]]
    assert node.active() == []
    assert node.markers() == {}
    # A stop of a hold that is not there changes nothing.
    node.play(("beta", load_ends("beta")))
    assert node.step(0) == []


def test_a_killed_hold_s_marker_is_released_and_a_new_load_replaces_a_hold_left_behind(node: Node) -> None:
    node.play(("alpha", ROLE), ("beta", ROLE))
    node.play(("alpha", load_starts("alpha")), ("beta", load_starts("beta")))
    # A launch of alpha that died left its hold; the next launch replaces it with a fresh one (restarted).
    left = node.markers()["alpha"]
    node.play(("alpha", load_starts("alpha")))
    assert node.step(0) == [["restart", hold("alpha")], ["start", UNIT]]
    assert node.markers()["alpha"] != left
    # beta's hold is killed: its marker stays, its pid gone, so the flusher leaves it out.
    killed = node.markers()["beta"]
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while flusher.pid_runs(killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(node.markers()) == ["alpha", "beta"]
    holds = flusher.look(str(node.config_dir), str(node.holds_dir), time.time())
    assert [marker.deployment for marker, _ in holds.live] == ["alpha"]
    # systemd sees the hold's main process die and runs its ExecStopPost (here: the double's stop of a unit whose
    # process is gone), which releases the marker; alpha still holds the flusher: it runs on.
    done = subprocess.run([str(node.root / "bin" / "systemctl"), "stop", hold("beta")], timeout=120, check=False)
    assert done.returncode == 0
    assert list(node.markers()) == ["alpha"]
    assert node.active() == [hold("alpha"), UNIT]
    # The engine's stop of beta's hold then changes nothing.
    node.play(("beta", load_ends("beta")))
    assert node.step(0) == []
    node.play(("alpha", load_ends("alpha")))
    assert node.step(0) == [["stop", hold("alpha")], ["stop", UNIT], ["stop", UNIT]]
    assert (node.active(), node.markers()) == ([], {})


def test_the_engine_supervisor_and_diagnose_follow_the_node_s_unit() -> None:
    def load(path: str) -> Any:
        return yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))

    engine = load("roles/engine/defaults/main.yml")
    assert engine["engine_flusher_unit"] == "{{ sparkserve_flusher_service }}.service"
    assert engine["engine_flusher_hold_unit"] == "{{ sparkserve_flusher_service }}-hold@{{ engine_deployment }}.service"
    # The engine holds and releases the flusher with the deployment's hold; status reads the node's unit.
    [left] = [t for t in load("roles/engine/tasks/main.yml") if "flusher" in t["name"]]
    assert left["ansible.builtin.systemd_service"] == {"name": "{{ engine_flusher_hold_unit }}", "state": "stopped"}
    [launch] = [t for t in load("roles/engine/tasks/launch.yml") if t.get("block")]
    [started] = [t for t in launch["block"] if t["name"] == "Start the page-cache flusher on every node for the load"]
    assert started["ansible.builtin.systemd_service"] == {"name": "{{ engine_flusher_hold_unit }}",
                                                          "state": "restarted"}
    [stopped] = load("roles/engine/tasks/stop_flusher.yml")
    assert stopped["ansible.builtin.systemd_service"] == {"name": "{{ engine_flusher_hold_unit }}", "state": "stopped"}
    [units] = [t for t in load("roles/engine/tasks/status.yml") if "unit states" in t["name"]]
    assert "engine_flusher_unit" in units["loop"]
    # The supervisor starts and stops the same hold around a heal; diagnose reads the unit and the hold.
    assert load("roles/supervisor/defaults/main.yml")["supervisor_flusher_unit"] == (
        "{{ sparkserve_flusher_service }}-hold@{{ supervisor_deployment }}.service")
    assert load("roles/diagnose/defaults/main.yml")["diagnose_units"] == [
        "{{ sparkserve_memguard_service }}.service", "{{ sparkserve_flusher_service }}.service",
        "{{ sparkserve_flusher_service }}-hold@{{ diagnose_deployment }}.service"]
