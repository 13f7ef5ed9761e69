"""The memguard role through real ansible-playbook runs on this machine: one unit per node, a settings file per
deployment, and the per-deployment units of before retired.

The plays run with connection local against a temporary inventory, every path of the role moved into the
temporary folder and a double of systemctl on PATH (it keeps the units' states in a JSON file and logs every
call): no systemd, nothing outside the temporary folder is written.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.roles.test_shared_paths import ROOT, flat, local_vars, run_play

GIB = 1024**3
UNIT = "sparkserve-memguard.service"
OLD = "sparkserve-memguard@old.service"

# systemctl as the systemd_service module and the role's tasks call it. A unit exists when its file (or, for
# an instance NAME@X.service, its template NAME@.service) is in the systemd folder; enabling one links it in
# multi-user.target.wants.
SYSTEMCTL = r'''
import fnmatch, json, os, sys
here = HERE
units_dir = os.path.join(here, "etc-systemd-system")
wants = os.path.join(units_dir, "multi-user.target.wants")
state_file = os.path.join(here, "state.json")
args = [a for a in sys.argv[1:] if a != "-l"]
with open(os.path.join(here, "calls.jsonl"), "a") as log:
    log.write(json.dumps(args) + "\n")
state = json.load(open(state_file)) if os.path.exists(state_file) else {}

def exists(unit):
    base, at, rest = unit.partition("@")
    return os.path.exists(os.path.join(units_dir, unit)) or bool(at) and os.path.exists(
        os.path.join(units_dir, base + "@.service"))

def enabled(unit):
    return os.path.lexists(os.path.join(wants, unit))

def save():
    json.dump(state, open(state_file, "w"))

command = args[0] if args else ""
unit = args[-1] if len(args) > 1 else ""
if command == "show":
    active = state.get(unit, False)
    shown = {"LoadState": "loaded" if exists(unit) else "not-found", "ActiveState": "active" if active else "inactive",
             "SubState": "running" if active else "dead"}
    asked = [a.split("=", 1)[1] for a in args if a.startswith("--property=")] or list(shown)
    for name in asked:
        print(shown[name] if "--value" in args else f"{name}={shown[name]}")
elif command == "is-enabled":
    if not exists(unit):
        print(f"Failed to get unit file state for {unit}: No such file or directory", file=sys.stderr)
        sys.exit(1)
    print("enabled" if enabled(unit) else "disabled")
    sys.exit(0 if enabled(unit) else 1)
elif command in ("enable", "disable"):
    if not exists(unit):
        sys.exit(1)
    link = os.path.join(wants, unit)
    if command == "enable" and not os.path.lexists(link):
        os.makedirs(wants, exist_ok=True)
        os.symlink(os.path.join(units_dir, unit), link)
    if command == "disable" and os.path.lexists(link):
        os.unlink(link)
elif command in ("start", "restart"):
    if not exists(unit):
        sys.exit(5)
    state[unit] = True
    save()
elif command == "stop":
    state[unit] = False
    save()
elif command == "list-units":
    pattern = args[-1]
    for name in sorted(state):
        if fnmatch.fnmatch(name, pattern) and (state[name] or exists(name)):
            active = "active running" if state[name] else "inactive dead"
            print(f"{name} {'loaded' if exists(name) else 'not-found'} {active} sparkserve memory guard")
elif command in ("daemon-reload", "marker", "written"):
    pass
else:
    print(f"systemctl double: {args} not known", file=sys.stderr)
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
        (tmp_path / "meminfo").write_text("MemTotal: 1 kB\nMemFree: 1 kB\nMemAvailable: 1 kB\n", encoding="ascii")

    @property
    def config_dir(self) -> Path:
        return self.root / "etc" / "memguard"

    def settings(self, deployment: str) -> dict[str, Any]:
        return json.loads((self.config_dir / f"{deployment}.json").read_text(encoding="utf-8"))

    def calls(self) -> list[list[str]]:
        log = self.systemd / "calls.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]

    def acts(self) -> list[list[str]]:
        """The calls that change something (not show, is-enabled, list-units)."""
        return [call for call in self.calls() if call[0] not in ("show", "is-enabled", "list-units", "written")]

    def written(self, number: int) -> list[str]:
        """The paths the install of step number of the last play() wrote."""
        calls = [call for call in self.calls() if call[0] in ("marker", "written")]
        start = calls.index(["marker", f"{self.runs}.{number}"])
        [(_, paths)] = calls[start + 1:start + 2]
        found: list[str] = json.loads(paths)
        return found

    def state(self) -> dict[str, bool]:
        path = self.systemd / "state.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}

    def enabled(self, unit: str) -> bool:
        return os.path.lexists(self.units / "multi-user.target.wants" / unit)

    def old_layout(self) -> None:
        """A node set up before issue 39: the template unit, one instance running and enabled at boot."""
        (self.units / "sparkserve-memguard@.service").write_text("[Service]\n", encoding="utf-8")
        (self.units / "multi-user.target.wants").mkdir()
        (self.units / "multi-user.target.wants" / OLD).symlink_to(self.units / "sparkserve-memguard@.service")
        (self.systemd / "state.json").write_text(json.dumps({OLD: True}), encoding="utf-8")

    def host(self, deployment: str, priority: int, at_boot: bool) -> dict[str, Any]:
        root = self.root
        return local_vars(
            sparkserve_project_dir=str(ROOT),
            sparkserve_programs_dir=str(root / "programs"),
            sparkserve_config_dir=str(root / "etc"),
            sparkserve_metrics_dir=str(root / "metrics"),
            sparkserve_memguard_events_dir=str(root / "events"),
            sparkserve_meminfo_path=str(root / "meminfo"),
            sparkserve_deployment_priority=priority,
            # What the spec's defaults read (the recipe role sets them in a run); the memguard_* below win.
            sparkserve_rank=0,
            recipe_deployment=deployment,
            recipe_ranks=[{"container_name": f"{deployment}-rank0"}],
            recipe_config={"memory": {"guard": {"floor_gib": 8, "samples": 3, "watch": "both", "action": "kill",
                                                "stop_grace_s": 10, "at_boot": at_boot}}},
            memguard_deployment=deployment,
            memguard_container=f"{deployment}-rank0",
            memguard_floor_bytes=8 * GIB,
            memguard_samples=3,
            memguard_watch="both",
            memguard_action="kill",
            memguard_stop_grace_s=10,
            memguard_at_boot=at_boot,
        )

    def play(self, *steps: tuple[str, str]) -> str:
        """Run the role for each (host, state) in turn, a marker call before each (step N of this run); the
        output."""
        self.runs += 1
        plays: list[dict[str, Any]] = []
        for number, (host, state) in enumerate(steps):
            plays.append({"name": f"Marker {number}", "hosts": host, "gather_facts": False,
                          "tasks": [{"name": "Mark", "ansible.builtin.command": {
                              "argv": ["systemctl", "marker", f"{self.runs}.{number}"]}, "changed_when": False}]})
            plays.append({"name": f"Guard {host} {state}", "hosts": host, "gather_facts": False,
                          "roles": [{"role": "memguard", "vars": {"memguard_state": state}}],
                          # What the install wrote (present only), for the double's log.
                          "tasks": [{"name": "Note the paths written", "ansible.builtin.command": {
                              "argv": ["systemctl", "written",
                                       "{{ __memguard_installed.changed_paths | default([]) | to_json }}"]},
                              "changed_when": False}]})
        inventory = {"sparks": {"hosts": {
            "alpha": self.host("alpha", priority=5, at_boot=False),
            "beta": self.host("beta", priority=1, at_boot=True),
        }}}
        done = run_play(self.root, plays, inventory, "-e", json.dumps({"__memguard_systemd_dir": str(self.units)}),
                        path=self.path)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def step(self, number: int) -> list[list[str]]:
        """The changing calls of step number of the last play()."""
        calls = self.acts()
        start = calls.index(["marker", f"{self.runs}.{number}"])
        end = next((i for i in range(start + 1, len(calls)) if calls[i][0] == "marker"), len(calls))
        return calls[start + 1:end]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_two_deployments_share_one_unit_and_the_old_units_are_retired(node: Node) -> None:
    node.old_layout()
    node.play(("alpha", "present"), ("beta", "present"))
    # The first run retires the per-deployment guard of before: stopped, its link and its template removed.
    first = node.step(0)
    assert first.index(["stop", OLD]) < first.index(["daemon-reload"])
    assert ["start", UNIT] in first
    assert ["restart", UNIT] not in first  # it was not running: started once
    assert not (node.units / "sparkserve-memguard@.service").exists()
    assert not node.enabled(OLD)
    assert node.state() == {OLD: False, UNIT: True}
    unit = (node.units / UNIT).read_text(encoding="utf-8")
    program = node.root / "programs" / "sparkserve-memguard.py"
    assert f"\nExecStart=/usr/bin/python3 {program} --config {node.config_dir}\n" in unit
    # The second deployment adds its settings: no restart (the guard reads them at its next sample), no retiring
    # again; it wants the guard at boot, so the node's unit is enabled.
    assert node.step(1) == [["enable", UNIT]]
    assert node.enabled(UNIT)
    assert (node.settings("alpha")["priority"], node.settings("alpha")["at_boot"]) == (5, False)
    assert (node.settings("beta")["priority"], node.settings("beta")["at_boot"]) == (1, True)
    assert node.settings("beta")["container"] == "beta-rank0"
    assert sorted(p.name for p in node.config_dir.iterdir()) == ["alpha.json", "beta.json"]

    # Again, then beta stops, then alpha: nothing changes the second time; when beta stops its file goes and the
    # guard runs on for alpha, not at boot any more (alpha has no at_boot); alpha is the last one: the unit
    # stops. A second stop changes nothing.
    node.play(("alpha", "present"), ("beta", "absent"), ("alpha", "absent"), ("alpha", "absent"))
    assert node.written(0) == []
    assert node.step(0) == []
    assert node.step(1) == [["disable", UNIT]]
    assert node.step(2) == [["stop", UNIT]]
    assert node.step(3) == []
    assert list(node.config_dir.iterdir()) == []
    assert node.state()[UNIT] is False
    assert not node.enabled(UNIT)


def test_a_bad_settings_file_of_another_deployment_fails_the_check(node: Node) -> None:
    node.config_dir.mkdir(parents=True)
    (node.config_dir / "gamma.json").write_text('{"deployment": "gamma"}', encoding="utf-8")
    plays = [{"name": "Guard", "hosts": "alpha", "gather_facts": False,
              "roles": ["memguard"]}]
    inventory = {"sparks": {"hosts": {"alpha": node.host("alpha", priority=0, at_boot=False)}}}
    done = run_play(node.root, plays, inventory, "-e", json.dumps({"__memguard_systemd_dir": str(node.units)}),
                    path=node.path)
    assert done.returncode != 0
    assert (f"memguard config {node.config_dir}/gamma.json: container is missing; it is required"
            in flat(done.stdout))
