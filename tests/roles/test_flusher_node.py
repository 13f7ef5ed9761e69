"""The page-cache flusher of a node with several deployments (roles/flusher/files/sparkserve-flusher.py --config).

One flusher per node (sparkserve-flusher.service) for the loads of every deployment on it: each deployment's
settings are DEPLOYMENT.json in the settings folder; a load holds the flusher with its marker DEPLOYMENT.load in
the holds folder (put by --hold, which starts the unit; removed by --release, which stops the unit only when no
other live marker is left); a marker whose hold no longer runs, or older than its deployment's timeout_s, is
stale. While several loads hold it, the node flushes as the most demanding one asks. The single-deployment
behaviour, by hand and on a node, is tests/roles/test_flusher.py's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import pytest

from tests.roles import exposition, node_layout
from tests.roles.test_flusher import GIB, DropCachesWatcher, FakeMeminfo, flusher, installed, meminfo_text, no_sleep

UNIT = "sparkserve-flusher.service"
START = ["systemctl", "start", UNIT]
STOP = ["systemctl", "stop", UNIT]
STOP_NO_BLOCK = ["systemctl", "stop", "--no-block", UNIT]


class Systemctl:
    """The runner of the hold, the release and the node's flusher: records each systemctl call; answers rc."""

    def __init__(self, rc: int = 0, err: str = "") -> None:
        self.rc, self.err = rc, err
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        assert timeout_s > 0
        self.calls.append(list(argv))
        return self.rc, "", self.err


def gone_pid() -> int:
    """The pid of a process that ran and was reaped: a hold killed with SIGKILL."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


class Node:
    """A node's flusher folders in the temporary folder."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.config = tmp_path / "etc" / "flusher"
        self.holds = tmp_path / "run" / "flusher"
        self.metrics = tmp_path / "metrics"
        self.drop = tmp_path / "drop_caches"
        self.meminfo = tmp_path / "meminfo"
        for folder in (self.config, self.metrics):
            folder.mkdir(parents=True)
        self.meminfo.write_text(meminfo_text(GIB, GIB), encoding="ascii")

    def settings(self, name: str, **changes: Any) -> dict[str, Any]:
        values: dict[str, Any] = {
            "deployment": name, "mode": "unconditional", "interval_s": 2.0, "threshold_bytes": None,
            "timeout_s": 600.0, "drop_caches_path": str(self.drop), "meminfo_path": str(self.meminfo),
            "metrics_path": str(self.metrics / f"flusher-{name}.prom"), **changes}
        (self.config / f"{name}.json").write_text(json.dumps(values, indent=2), encoding="utf-8")
        return values

    def marker(self, name: str, pid: int | None = None, since: float | None = None) -> Path:
        self.holds.mkdir(parents=True, exist_ok=True)
        path = self.holds / f"{name}.load"
        path.write_text(flusher.marker_text(name, os.getpid() if pid is None else pid,
                                            time.time() if since is None else since), encoding="utf-8")
        return path

    def markers(self) -> list[str]:
        return sorted(p.name for p in self.holds.iterdir() if not p.name.startswith(".")) \
            if self.holds.exists() else []

    def command(self, action: str = "run", deployment: str = "", passes: int | None = None,
                systemctl: str = "systemctl") -> Any:
        return flusher.NodeCommand(action=action, config_dir=str(self.config), holds_dir=str(self.holds),
                                   unit=UNIT, systemctl=systemctl, deployment=deployment, passes=passes)

    def figures(self, name: str) -> tuple[float, float, float, float]:
        """passes, freed bytes, running, last pass of the deployment's metrics file."""
        families = exposition.read(self.metrics / f"flusher-{name}.prom")
        return tuple(families[family].value(deployment=name) for family in (  # type: ignore[return-value]
            "sparkserve_flusher_passes_total", "sparkserve_flusher_freed_bytes_total", "sparkserve_flusher_running",
            "sparkserve_flusher_last_pass_timestamp_seconds"))


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def raise_terminated(seconds: float) -> None:
    raise flusher.Terminated()


# --- the marker protocol -------------------------------------------------------------------------------


def test_two_loads_hold_the_flusher_the_first_ending_leaves_it_running_the_last_stops_it(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.settings("alpha")
    node.settings("beta")
    systemctl = Systemctl()
    seen: list[tuple[list[str], list[list[str]]]] = []

    def sleep(seconds: float) -> None:
        # alpha's hold is in place: its marker (its pid, now) and the unit started. beta's load starts holding
        # the flusher too (its hold runs, here as this process), then alpha's load ends (SIGTERM).
        seen.append((node.markers(), list(systemctl.calls)))
        marker = json.loads((node.holds / "alpha.load").read_text(encoding="utf-8"))
        assert marker["deployment"] == "alpha" and marker["pid"] == os.getpid()
        assert abs(marker["since"] - time.time()) < 60
        assert seconds == pytest.approx(600, abs=5)  # alpha's timeout_s
        node.marker("beta")
        raise flusher.Terminated()

    assert flusher.hold(node.command("hold", "alpha"), run=systemctl, sleep=sleep) == 0
    assert seen == [(["alpha.load"], [START])]
    # alpha's marker went; beta's load still holds the flusher: it is not stopped.
    assert node.markers() == ["beta.load"]
    assert systemctl.calls == [START]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"flusher hold alpha: the load of alpha holds {UNIT} ({node.holds / 'alpha.load'}) until it "
                      "ends, 600 s at most")
    assert out[1:] == ["flusher hold alpha: the hold ends: terminated",
                       f"flusher release alpha: removed {node.holds / 'alpha.load'}",
                       f"flusher release alpha: {UNIT} runs on: the load of beta holds it"]

    # beta's load ends (its hold's release): no marker is left, the unit stops.
    assert flusher.release(node.command("release", "beta"), run=systemctl) == 0
    assert node.markers() == []
    assert systemctl.calls == [START, STOP]
    assert capsys.readouterr().out.splitlines()[-1] == f"flusher release beta: no load holds {UNIT} any more: stopped"
    # A release again (the hold unit's ExecStopPost after the hold released itself) only stops a stopped unit.
    assert flusher.release(node.command("release", "beta"), run=systemctl) == 0
    assert systemctl.calls == [START, STOP, STOP]


def test_a_hold_releases_only_its_own_marker(node: Node) -> None:
    """A hold that ends while another hold of the same deployment replaced its marker leaves that one."""
    node.settings("alpha")
    systemctl = Systemctl()

    def sleep(seconds: float) -> None:
        node.marker("alpha", pid=os.getppid())  # another hold of alpha, which runs
        raise flusher.Terminated()

    assert flusher.hold(node.command("hold", "alpha"), run=systemctl, sleep=sleep) == 0
    assert node.markers() == ["alpha.load"]
    assert systemctl.calls == [START]


def test_a_hold_ends_by_itself_at_its_deployment_s_timeout(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.settings("alpha", timeout_s=30)
    now = [1000.0]
    systemctl = Systemctl()

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert flusher.hold(node.command("hold", "alpha"), run=systemctl, sleep=sleep, clock=lambda: now[0]) == 0
    assert now[0] == 1030.0
    assert node.markers() == []
    assert systemctl.calls == [START, STOP]
    assert "flusher hold alpha: the hold ends: the timeout of 30 s is reached" in capsys.readouterr().out


def test_a_hold_whose_unit_does_not_start_leaves_no_marker_and_exits_1(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.settings("alpha")
    systemctl = Systemctl(rc=5, err="Failed to start sparkserve-flusher.service: Unit not found.\n")
    assert flusher.hold(node.command("hold", "alpha"), run=systemctl, sleep=raise_terminated) == 1
    assert node.markers() == []
    assert systemctl.calls == [START]
    assert capsys.readouterr().out.splitlines() == [
        f"flusher hold alpha: systemctl start {UNIT} failed with status 5: Failed to start "
        "sparkserve-flusher.service: Unit not found."]


def test_a_hold_without_settings_exits_2_and_touches_nothing(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    systemctl = Systemctl()
    assert flusher.hold(node.command("hold", "alpha"), run=systemctl, sleep=raise_terminated) == 2
    assert (node.markers(), systemctl.calls) == ([], [])
    assert capsys.readouterr().out == (
        f"flusher hold alpha: {node.config / 'alpha.json'}: cannot read it: No such file or directory; run the "
        "flusher role for alpha (site.yml)\n")


def test_a_release_that_cannot_stop_the_unit_exits_1(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.marker("alpha")
    assert flusher.release(node.command("release", "alpha"), run=Systemctl(rc=1, err="Access denied")) == 1
    assert node.markers() == []
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"flusher release alpha: systemctl stop {UNIT} failed with status 1: Access denied")


# --- stale markers -------------------------------------------------------------------------------------


def test_a_marker_whose_hold_is_gone_or_too_old_is_stale(node: Node) -> None:
    node.settings("alpha")
    node.settings("beta", timeout_s=100)
    node.settings("gamma")
    now = time.time()
    node.marker("alpha")
    dead = gone_pid()
    node.marker("beta", since=now - 101)  # its hold runs (this process), but past beta's timeout_s
    node.marker("gamma", pid=dead)
    # Written by hand, no settings: judged by its age with the defaults (3600 s), as a live hold.
    node.holds.joinpath("delta.load").write_text("", encoding="utf-8")
    node.holds.joinpath("not a name.load").write_text("", encoding="utf-8")  # not a deployment's: not a marker
    holds = flusher.look(str(node.config), str(node.holds), now)
    assert [(m.deployment, s.deployment, s.mode, s.timeout_s) for m, s in holds.live] == [
        ("alpha", "alpha", "unconditional", 600.0), ("delta", "delta", "unconditional", 3600.0)]
    assert [(m.deployment, why) for m, why in holds.stale] == [
        ("beta", "it is older than the deployment's timeout_s of 100 s"),
        ("gamma", f"its hold (pid {dead}) no longer runs")]
    assert holds.bad == {"delta": f"{node.config / 'delta.json'}: cannot read it: No such file or directory"}
    # The hand-written one is old by its modification time past the defaults' timeout.
    os.utime(node.holds / "delta.load", (now - 3600, now - 3600))
    assert [m.deployment for m, _ in flusher.look(str(node.config), str(node.holds), now).live] == ["alpha"]


def test_a_release_removes_the_stale_markers_and_stops_the_unit_when_no_live_one_is_left(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.settings("alpha")
    node.settings("beta")
    node.marker("alpha")
    dead = gone_pid()
    node.marker("beta", pid=dead)  # beta's hold was killed (SIGKILL): its marker stayed
    systemctl = Systemctl()
    assert flusher.release(node.command("release", "alpha"), run=systemctl) == 0
    assert node.markers() == []
    assert systemctl.calls == [STOP]
    assert capsys.readouterr().out.splitlines() == [
        f"flusher release alpha: removed {node.holds / 'alpha.load'}",
        f"flusher release alpha: removed the stale marker {node.holds / 'beta.load'}: its hold (pid {dead}) no "
        "longer runs",
        f"flusher release alpha: no load holds {UNIT} any more: stopped"]


def test_the_engine_s_release_of_a_killed_hold_removes_its_marker(node: Node) -> None:
    """The marker a run that died left (its hold killed): the deployment's release (the hold unit's
    ExecStopPost, or the engine stopping the hold before the next launch) removes it and stops the unit."""
    node.settings("alpha")
    node.marker("alpha", pid=gone_pid())
    systemctl = Systemctl()
    assert flusher.release(node.command("release", "alpha"), run=systemctl) == 0
    assert (node.markers(), systemctl.calls) == ([], [STOP])


def test_the_node_s_flusher_stops_by_itself_when_only_stale_markers_are_left(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.settings("alpha", timeout_s=100)
    node.marker("alpha", since=time.time() - 200)
    systemctl = Systemctl()
    watcher = DropCachesWatcher(node.drop)
    assert flusher.run_node(node.command(), read=FakeMeminfo([]), sync=watcher.sync, sleep=no_sleep,
                            run=systemctl) == 0
    assert watcher.syncs == 0 and not node.drop.exists()  # no pass
    assert node.markers() == []  # removed
    # Under the holds' lock, so that a hold that comes next starts the unit again once it stopped.
    assert systemctl.calls == [STOP_NO_BLOCK]
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        f"flusher: leaving out the hold of alpha ({node.holds / 'alpha.load'}): it is older than the deployment's "
        "timeout_s of 100 s",
        f"flusher: removed the stale marker {node.holds / 'alpha.load'}: it is older than the deployment's "
        "timeout_s of 100 s",
        "flusher: stopping after 0 passes: no load holds it"]
    assert not (node.metrics / "flusher-alpha.prom").exists()


# --- the node's flusher: merged settings and the loads that hold it --------------------------------------


def test_the_most_demanding_settings_win() -> None:
    settings = flusher.Settings
    plan = flusher.merge([settings("b", mode="threshold", threshold_bytes=4 * GIB, interval_s=1.0),
                          settings("a", mode="unconditional", interval_s=5.0, drop_caches_path="/a/drop")])
    assert plan == flusher.Plan(mode="unconditional", threshold_bytes=None, interval_s=1.0,
                                drop_caches_path="/a/drop", meminfo_path="/proc/meminfo", deployments=("a", "b"))
    plan = flusher.merge([settings("a", mode="threshold", threshold_bytes=8 * GIB, interval_s=3.0),
                          settings("b", mode="threshold", threshold_bytes=4 * GIB, interval_s=2.5)])
    assert (plan.mode, plan.threshold_bytes, plan.interval_s) == ("threshold", 4 * GIB, 2.5)
    assert flusher.describe_plan(plan) == (
        "flusher: flushing when Cached exceeds 4.00 GiB, every 2.5 s, for the loads of a, b")
    # One deployment: its own settings, as before.
    alone = flusher.merge([settings("a", mode="threshold", threshold_bytes=GIB, interval_s=3.0)])
    assert (alone.mode, alone.threshold_bytes, alone.interval_s, alone.deployments) == (
        "threshold", GIB, 3.0, ("a",))
    assert flusher.describe_plan(alone) == (
        "flusher: flushing when Cached exceeds 1.00 GiB, every 3 s, for the load of a")
    assert flusher.path_conflicts([settings("b", meminfo_path="/b/meminfo"), settings("a")]) == [
        "flusher: b's meminfo_path /b/meminfo is not a's /proc/meminfo; the node's flusher uses a's"]


def test_the_node_flushes_as_the_most_demanding_load_asks(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.settings("alpha", mode="threshold", threshold_bytes=8 * GIB, interval_s=5.0)
    node.settings("beta", mode="threshold", threshold_bytes=4 * GIB, interval_s=1.5)
    node.marker("alpha")
    node.marker("beta")
    # 6 GiB of Cached: above beta's threshold, below alpha's: flushed. Then 3 GiB: below both.
    reader = FakeMeminfo([(6 * GIB, 60 * GIB), (2 * GIB, 64 * GIB), (3 * GIB, 63 * GIB)])
    watcher = DropCachesWatcher(node.drop)
    sleeps: list[float] = []
    assert flusher.run_node(node.command(passes=2), read=reader, sync=watcher.sync, sleep=sleeps.append,
                            run=Systemctl()) == 0
    assert watcher.finish() == ["3"]
    assert sleeps == [1.5]
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "flusher: flushing when Cached exceeds 4.00 GiB, every 1.5 s, for the loads of alpha, beta",
        "flusher: pass 1 freed 4.00 GiB of page cache (Cached 6.00 GiB -> 2.00 GiB); MemAvailable 64.00 GiB",
        "flusher: stopping after 2 passes: 2 passes are done"]
    # Unconditional over threshold: a third load that asks it makes every pass flush.
    node.settings("gamma", interval_s=2.0)
    node.marker("gamma")
    reader = FakeMeminfo([(GIB, 60 * GIB), (GIB, 60 * GIB)])
    node.drop.unlink()
    watcher = DropCachesWatcher(node.drop)
    assert flusher.run_node(node.command(passes=1), read=reader, sync=watcher.sync, sleep=no_sleep,
                            run=Systemctl()) == 0
    assert watcher.finish() == ["3"]
    assert capsys.readouterr().out.splitlines()[1] == (
        "flusher: flushing at every pass, every 1.5 s, for the loads of alpha, beta, gamma")


def test_the_node_s_flusher_follows_the_loads_that_hold_it(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    epoch = 1_800_000_000.0  # the fake time of the run and of the markers
    node.settings("alpha", interval_s=2.0)
    node.settings("beta", interval_s=3.0)
    node.marker("alpha", since=epoch)
    reader = FakeMeminfo([(10 * GIB, 60 * GIB), (4 * GIB, 66 * GIB)] * 3)
    systemctl = Systemctl()
    figures: list[dict[str, tuple[float, float, float, float]]] = []
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        figures.append({name: node.figures(name) for name in ("alpha", "beta")
                        if (node.metrics / f"flusher-{name}.prom").exists()})
        if len(sleeps) == 1:
            node.marker("beta", since=epoch + 2)  # beta's load starts: it holds the running flusher too
        elif len(sleeps) == 2:
            (node.holds / "alpha.load").unlink()  # alpha's load ends (its release; beta's keeps it running)
        else:
            (node.holds / "beta.load").unlink()  # beta's too: no load holds it

    stamps = iter(range(1, 100))
    assert flusher.run_node(node.command(), read=reader, sync=lambda: None, sleep=sleep,
                            now=lambda: epoch + next(stamps), run=systemctl) == 0
    assert sleeps == [2.0, 2.0, 3.0]
    assert figures == [
        {"alpha": (1, 6 * GIB, 1, 1_800_000_002)},
        {"alpha": (2, 12 * GIB, 1, 1_800_000_004), "beta": (1, 6 * GIB, 1, 1_800_000_004)},
        {"alpha": (2, 12 * GIB, 0, 1_800_000_004), "beta": (2, 12 * GIB, 1, 1_800_000_006)},
    ]
    # Once no load holds it, every file says running 0; systemd is asked to stop the unit.
    assert node.figures("alpha") == (2, 12 * GIB, 0, 1_800_000_004)
    assert node.figures("beta") == (2, 12 * GIB, 0, 1_800_000_006)
    assert systemctl.calls == [STOP_NO_BLOCK]
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if "flushing" in line] == [
        "flusher: flushing at every pass, every 2 s, for the load of alpha",
        "flusher: flushing at every pass, every 2 s, for the loads of alpha, beta",
        "flusher: flushing at every pass, every 3 s, for the load of beta"]
    assert out[-1] == "flusher: stopping after 3 passes: no load holds it"


def test_a_load_whose_settings_are_bad_is_flushed_as_the_defaults_ask(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    (node.config / "alpha.json").write_text('{"deployment": "alpha"}', encoding="utf-8")
    node.marker("alpha")
    flushing = flusher.NodeFlusher(node.command(), Systemctl(), time.time)
    holds = flushing.look()
    assert [settings for _, settings in holds.live] == [flusher.Settings("alpha")]
    assert flusher.describe_plan(flusher.merge([flusher.Settings("alpha")])) == (
        "flusher: flushing at every pass, every 2 s, for the load of alpha")
    flushing.look()  # said once
    assert capsys.readouterr().out.splitlines() == [
        f"flusher: {node.config / 'alpha.json'}: mode is missing; it is required; the load of alpha is flushed as "
        "the defaults ask"]


def test_sigterm_leaves_every_holding_load_s_file_with_running_0(node: Node) -> None:
    node.settings("alpha")
    node.settings("beta", metrics_path=None)
    node.marker("alpha")
    node.marker("beta")
    reader = FakeMeminfo([(GIB, GIB)] * 2)
    assert flusher.run_node(node.command(), read=reader, sync=lambda: None, sleep=raise_terminated,
                            run=Systemctl()) == 0
    assert node.figures("alpha")[:3] == (1, 0, 0)
    assert sorted(p.name for p in node.metrics.iterdir()) == ["flusher-alpha.prom"]
    assert exposition.leftovers(node.metrics / "flusher-alpha.prom") == []


# --- the settings and their check ----------------------------------------------------------------------


def test_check_config_says_ok_for_good_settings(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.settings("alpha")
    node.settings("beta", mode="threshold", threshold_bytes=0, metrics_path=None)
    assert flusher.main(["--config", str(node.config), "--check-config"]) == 0
    assert capsys.readouterr().out == "OK\n"


@pytest.mark.parametrize(("changes", "message"), [
    ({"mode": "sometimes"}, 'mode is "sometimes"; set unconditional or threshold'),
    ({"mode": "threshold"}, "threshold_bytes is null; mode threshold needs a whole number of bytes, 0 or more"),
    ({"threshold_bytes": 5}, "threshold_bytes is 5; it applies only to mode threshold (write null)"),
    ({"interval_s": 0}, "interval_s is 0; set a number of seconds above 0"),
    ({"timeout_s": True}, "timeout_s is true; set a number of seconds above 0"),
    ({"deployment": "beta"},
     'deployment is "beta" in the file of alpha; the settings of deployment NAME are NAME.json'),
    ({"metrics_path": ""}, 'metrics_path is ""; set a file path or null'),
    ({"drop_caches_path": None}, "drop_caches_path is null; set a file path"),
    ({"until": 3}, "until is not a setting; the settings are deployment, mode, interval_s, threshold_bytes, "
                   "timeout_s, drop_caches_path, meminfo_path, metrics_path"),
])
def test_check_config_refuses_a_bad_file_naming_it(
    node: Node, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], message: str
) -> None:
    node.settings("beta")
    node.settings("alpha", **changes)
    assert flusher.main(["--config", str(node.config), "--check-config"]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"flusher config {node.config / 'alpha.json'}: {message}\n")


def test_check_config_of_a_missing_folder_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert flusher.main(["--config", str(tmp_path / "absent"), "--check-config"]) == 2
    assert capsys.readouterr().err == (
        f"flusher config {tmp_path / 'absent'}: cannot read the folder: No such file or directory\n")


# --- the programs, as the units run them -----------------------------------------------------------------


class Notify:
    """systemd's notification socket (abstract), as NOTIFY_SOCKET names it to a Type=notify unit."""

    def __init__(self, tag: str) -> None:
        self.name = f"sparkserve-flusher-test-{os.getpid()}-{tag}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name)
        self.sock.settimeout(30)

    def receive(self) -> bytes:
        return self.sock.recv(256)

    def close(self) -> None:
        self.sock.close()


def fake_systemctl(tmp_path: Path) -> tuple[str, Path]:
    """A systemctl that only logs its arguments; its path and the log."""
    log = tmp_path / "systemctl.jsonl"
    program = tmp_path / "bin" / "systemctl"
    program.parent.mkdir(exist_ok=True)
    program.write_text(f"#!{sys.executable}\nimport json, sys\nwith open({str(log)!r}, 'a') as f:\n"
                       "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n", encoding="utf-8")
    program.chmod(0o755)
    return str(program), log


def logged(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def test_the_hold_units_programs_two_loads_a_kill_and_the_release_after_it(node: Node) -> None:
    program = installed(node.root)
    systemctl, log = fake_systemctl(node.root)
    node.settings("alpha")
    node.settings("beta")
    base = [sys.executable, program, "--config", str(node.config), "--holds", str(node.holds), "--unit", UNIT,
            "--systemctl", systemctl]
    holds: dict[str, subprocess.Popen[str]] = {}
    sockets = {name: Notify(name) for name in ("alpha", "beta")}
    try:
        for name in ("alpha", "beta"):
            env = node_layout.env(node.root / "node", dict(os.environ, NOTIFY_SOCKET="@" + sockets[name].name))
            holds[name] = subprocess.Popen([*base, "--hold", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True, env=env)
            # Ready once its marker is there and the unit started (Type=notify).
            assert sockets[name].receive() == b"READY=1"
            assert json.loads((node.holds / f"{name}.load").read_text(encoding="utf-8"))["pid"] == holds[name].pid
        assert logged(log) == [["start", UNIT], ["start", UNIT]]
        assert node.markers() == ["alpha.load", "beta.load"]

        # alpha's load ends (its hold stopped: SIGTERM): its marker goes, the unit runs on for beta.
        holds["alpha"].send_signal(signal.SIGTERM)
        out, err = holds["alpha"].communicate(timeout=30)
        assert (holds["alpha"].returncode, err) == (0, "")
        assert out.splitlines()[-1] == f"flusher release alpha: {UNIT} runs on: the load of beta holds it"
        assert node.markers() == ["beta.load"]
        assert logged(log) == [["start", UNIT], ["start", UNIT]]

        # beta's hold is killed: its marker stays, its pid gone; the node's flusher leaves it out.
        holds["beta"].kill()
        holds["beta"].communicate(timeout=30)
        assert node.markers() == ["beta.load"]
        assert flusher.look(str(node.config), str(node.holds), time.time()).live == []
        # The hold unit's ExecStopPost (or the next run stopping the hold) releases it: the unit stops.
        env = node_layout.env(node.root / "node")
        done = subprocess.run([*base, "--release", "beta"], capture_output=True, text=True, timeout=60, env=env)
        assert (done.returncode, done.stderr) == (0, "")
        assert node.markers() == []
        assert logged(log) == [["start", UNIT], ["start", UNIT], ["stop", UNIT]]
    finally:
        for hold in holds.values():
            if hold.poll() is None:
                hold.kill()
                hold.wait()
        for notify in sockets.values():
            notify.close()


def test_the_node_s_unit_program_runs_for_a_hold_and_stops_when_it_ends(node: Node) -> None:
    """The single-deployment path on a node: one load holds the flusher, which flushes until the hold ends."""
    program = installed(node.root)
    systemctl, log = fake_systemctl(node.root)
    node.settings("alpha", interval_s=0.02)
    marker = node.marker("alpha")
    env = node_layout.env(node.root / "node")
    flushing = subprocess.Popen([sys.executable, program, "--config", str(node.config), "--holds", str(node.holds),
                                 "--unit", UNIT, "--systemctl", systemctl],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert flushing.stdout is not None
        assert flushing.stdout.readline().startswith("flusher: the node's flusher, for the loads that hold it")
        assert flushing.stdout.readline() == "flusher: flushing at every pass, every 0.02 s, for the load of alpha\n"
        assert "pass 1 freed" in flushing.stdout.readline()
        marker.unlink()  # the load ends (a release that has not stopped the unit yet)
        out, err = flushing.communicate(timeout=30)
    finally:
        if flushing.poll() is None:
            flushing.kill()
            flushing.wait()
    assert (flushing.returncode, err) == (0, "")
    assert out.splitlines()[-1].endswith(" passes: no load holds it")
    assert node.drop.read_text(encoding="ascii") == "3"
    assert logged(log) == [["stop", "--no-block", UNIT]]
    assert node.figures("alpha")[2] == 0
