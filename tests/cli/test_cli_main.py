"""The command end to end, with a recorded event stream in place of ansible-playbook."""

from __future__ import annotations

import io
import json
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from cli_streams import stream

from sparkserve.cli import Context, build_parser, choose_display, main
from sparkserve.deployments import Deployment, InventoryRead
from sparkserve.display import JsonDisplay, LiveDisplay, PlainDisplay, QuietDisplay
from sparkserve.events import RunModel
from sparkserve.project import PLAYBOOKS
from sparkserve.runner import RunResult


class TTYStringIO(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeRun:
    """Plays a recorded stream into runner's event_handler, as ansible_runner.run() would."""

    def __init__(self, name: str, rc: int) -> None:
        self.events, self.rc = stream(name), rc
        self.calls: list[dict[str, Any]] = []

    def __call__(self, kwargs: dict[str, Any]) -> RunResult:
        self.calls.append(kwargs)
        artifacts = Path(kwargs["artifact_dir"]) / kwargs["ident"]
        (artifacts / "job_events").mkdir(parents=True)
        assert Path(kwargs["private_data_dir"]).is_dir()
        for event in self.events:
            assert kwargs["event_handler"](dict(event)) is True
        return RunResult(rc=self.rc, status="successful" if self.rc == 0 else "failed", artifacts=artifacts)


def one_deployment(_root: Path, _inventory: Path, _environ: Mapping[str, str]) -> InventoryRead:
    """The lab's inventory as ansible-inventory lists it: one deployment."""
    return InventoryRead(deployments=(Deployment("lab-tp2", "deployment_lab_tp2"),))


class Session:
    def __init__(self, project: Path, run: Callable[[dict[str, Any]], RunResult], **extra: Any) -> None:
        self.stdout, self.stderr = io.StringIO(), io.StringIO()
        extra.setdefault("read_deployments", one_deployment)
        self.context = Context(root=project, cwd=project, environ={"PATH": "/usr/bin"}, stdout=self.stdout,
                               stderr=self.stderr, run=run, tty=False, **extra)

    def __call__(self, *argv: str) -> int:
        return main(list(argv), self.context)


def test_up_ends_with_the_endpoint(project: Path) -> None:
    run = FakeRun("up_success", 0)
    session = Session(project, run)
    assert session("up") == 0
    out = session.stdout.getvalue().splitlines()
    assert out[0] == out[0][:11] + "start    Preflight the Sparks"
    assert "Serving at http://172.30.77.11:8000" in out
    assert out[-1].startswith("  curl -s http://172.30.77.11:8000/v1/completions")
    assert session.stderr.getvalue() == ""
    kwargs = run.calls[0]
    assert kwargs["playbook"] == "site.yml" and kwargs["ident"].endswith("-up")
    assert kwargs["artifact_dir"] == str(project / "artifacts" / "runs")
    assert Path(kwargs["private_data_dir"]).parent == project / ".cache" / "runner"
    assert not Path(kwargs["private_data_dir"]).exists()


def test_up_with_json_prints_json_lines_then_the_summary(project: Path) -> None:
    session = Session(project, FakeRun("up_success", 0))
    assert session("up", "--json") == 0
    records = [json.loads(line) for line in session.stdout.getvalue().splitlines()]
    assert records[0]["event"] == "stage_start"
    summary = records[-1]["summary"]
    assert summary["exit_code"] == 0 and summary["verb"] == "up"
    assert summary["stats"]["sparkserve_endpoint"]["url"] == "http://172.30.77.11:8000"
    assert sum(1 for r in records if "summary" in r) == 1


@pytest.mark.parametrize(("name", "rc", "code", "first_line"), [
    ("launch_failed", 2, 5, 'FAILED: stage "launch", node spark-2, rank 1'),
    ("unreachable", 4, 3, 'FAILED: stage "Preflight the Sparks", node spark-2'),
    ("bad_input", 1, 2, "ansible-playbook stopped (exit 1) before running any task; its last lines:"),
])
def test_a_failed_up_exits_with_its_cause(project: Path, name: str, rc: int, code: int, first_line: str) -> None:
    session = Session(project, FakeRun(name, rc))
    assert session("up") == code
    err = session.stderr.getvalue().splitlines()
    assert err[0] == first_line
    assert err[-2].startswith(f"  run artifacts: {project / 'artifacts' / 'runs'}/")
    assert err[-1].startswith(f"exit {code}: ")
    assert "Serving" not in session.stdout.getvalue()


def test_status_shows_the_table_and_status_json_prints_one_document(project: Path) -> None:
    session = Session(project, FakeRun("status", 0))
    assert session("status") == 0
    assert "Readiness: health 200 · models: tiny-model" in session.stdout.getvalue()
    quiet = Session(project, FakeRun("status", 0))
    assert quiet("status", "--json") == 0
    document = json.loads(quiet.stdout.getvalue())
    status = stream("status")[-1]["event_data"]["artifact_data"]["sparkserve_status"]
    # One deployment: sparkserve_status's document as it is, and the same under `deployments`, by name.
    assert document == dict(status, deployments={"lab-tp2": status})
    assert [r["rank"] for r in document["ranks"]] == [0, 1]


def test_a_failed_status_json_is_still_one_document(project: Path) -> None:
    session = Session(project, FakeRun("unreachable", 4))
    assert session("status", "--json") == 3
    document = json.loads(session.stdout.getvalue())
    assert document["error"]["exit_code"] == 3 and document["error"]["failure"]["node"] == "spark-2"
    assert session.stderr.getvalue().startswith("FAILED:")


def test_logs_print_each_rank_and_follow_one(project: Path) -> None:
    followed: list[list[str]] = []

    def follow(argv: list[str]) -> int:
        followed.append(argv)
        raise KeyboardInterrupt

    run = FakeRun("logs", 0)
    session = Session(project, run, follow=follow)
    assert session("logs", "--rank", "1", "--lines", "5", "--follow") == 0
    out = session.stdout.getvalue()
    assert "==> rank 0 · spark-1 · lab-tp2-rank0 <==\nINFO started server\n" in out
    assert followed == [stream("logs")[-1]["event_data"]["artifact_data"]["sparkserve_logs"]["ranks"][1]["follow"]]
    assert "sparkserve_logs_rank=1" in run.calls[0]["cmdline"]
    plain = Session(project, FakeRun("logs", 0), follow=follow)
    assert plain("logs", "--follow") == 0 and followed[-1][-1] == "lab-tp2-rank0"
    missing = Session(project, FakeRun("logs", 0), follow=follow)
    assert missing("logs", "--rank", "9", "--follow") == 1
    assert "no follow command for rank 9" in missing.stderr.getvalue()


def test_render_prints_what_the_playbook_showed(project: Path) -> None:
    session = Session(project, FakeRun("render_ok", 0))
    assert session("render") == 0
    out = session.stdout.getvalue()
    assert "spark-1: Show this rank's container, command line and environment" in out
    assert "  rank 1 on spark-2: container lab-tp2-rank1" in out
    assert "render done in" in out


def test_diagnose_prints_the_archive(project: Path) -> None:
    events = stream("logs")
    events[-1]["event_data"]["artifact_data"] = {"sparkserve_diagnose": {"archive": "/tmp/d/sparkserve-x.tar.gz"}}

    def run(kwargs: dict[str, Any]) -> RunResult:
        for event in events:
            kwargs["event_handler"](event)
        return RunResult(0, "successful", Path(kwargs["artifact_dir"]) / kwargs["ident"])

    session = Session(project, run)
    assert session("diagnose") == 0
    assert session.stdout.getvalue().splitlines()[-1] == "diagnostic archive: /tmp/d/sparkserve-x.tar.gz"


def test_ask_vault_pass_prompts_once_and_hands_the_password_to_runner(project: Path) -> None:
    asked: list[str] = []

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return "s3cret"

    run = FakeRun("up_success", 0)
    session = Session(project, run, ask_password=ask)
    assert session("up", "--ask-vault-pass") == 0
    assert asked == ["Vault password: "]
    assert list(run.calls[0]["passwords"].values()) == ["s3cret"]
    assert "s3cret" not in session.stdout.getvalue() + session.stderr.getvalue()


def test_without_an_inventory_the_command_says_to_pass_one(project: Path) -> None:
    (project / "inventory" / "lab" / "cluster.sparks.yml").unlink()
    session = Session(project, FakeRun("up_success", 0))
    assert session("up") == 2
    assert session.stderr.getvalue().startswith("sparkserve up: no inventory given and ")
    assert "-i/--inventory" in session.stderr.getvalue()


def test_a_missing_playbook_is_named(project: Path) -> None:
    (project / "playbooks" / "diagnose.yml").unlink()
    session = Session(project, FakeRun("up_success", 0))
    assert session("diagnose") == 1
    assert "playbooks/diagnose.yml is missing" in session.stderr.getvalue()


def test_old_runs_are_pruned_after_the_run(project: Path) -> None:
    runs = project / "artifacts" / "runs"
    for day in (1, 2, 3):
        (runs / f"202601{day:02d}T000000Z-up").mkdir(parents=True)
    session = Session(project, FakeRun("up_success", 0))
    session.context.environ = {"SPARKSERVE_KEEP_RUNS": "2"}
    assert session("up") == 0
    kept = sorted(p.name for p in runs.iterdir())
    assert kept[0] == "20260103T000000Z-up" and kept[1].endswith("-up") and len(kept) == 2


def test_the_display_follows_the_output(project: Path) -> None:
    lock, model = threading.Lock(), RunModel()

    def display(*argv: str, tty: bool) -> type:
        args = build_parser().parse_args(list(argv))
        context = Context(root=project, stdout=TTYStringIO() if tty else io.StringIO())
        return type(choose_display(args, model, context, lock))

    assert display("up", tty=True) is LiveDisplay
    assert display("up", tty=False) is PlainDisplay
    assert display("up", "-v", tty=True) is PlainDisplay
    assert display("up", "--json", tty=True) is JsonDisplay
    assert display("status", "--json", tty=False) is QuietDisplay


def test_a_terminal_gets_the_live_display_and_the_same_summary(project: Path) -> None:
    session = Session(project, FakeRun("up_success", 0))
    session.context.stdout = TTYStringIO()
    session.context.tty = None
    assert session("up") == 0
    out = session.context.stdout.getvalue()
    assert "✓ Preflight the Sparks" in out and "Serving at http://172.30.77.11:8000" in out


def test_help_lists_every_verb_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for verb in PLAYBOOKS:
        assert f"    {verb}" in text
    assert "exit codes:" in text and "3    a host was unreachable" in text and "5    the launch failed" in text
    with pytest.raises(SystemExit):
        main(["logs", "--help"])
    text = capsys.readouterr().out
    assert "--follow" in text and "--ask-vault-pass" in text and "4    preflight refused a host" in text


def test_ctrl_c_during_a_run_stops_the_playbook_and_exits_130(project: Path) -> None:
    sent: list[tuple[int, int]] = []
    events = stream("up_success")[:30]

    def run(kwargs: dict[str, Any]) -> RunResult:
        for event in events:
            kwargs["event_handler"](event)
        signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, routed to sparkserve's handler
        assert kwargs["cancel_callback"]() is False  # the first one asks; runner does not kill yet
        return RunResult(99, "failed", Path(kwargs["artifact_dir"]) / kwargs["ident"])

    session = Session(project, run, kill=lambda pid, sig: sent.append((pid, sig)))
    assert session("up") == 130
    assert sent == [(4242, signal.SIGINT)]
    assert "stopping the playbook" in session.stderr.getvalue()
    assert session.stderr.getvalue().splitlines()[-1].startswith("interrupted; run artifacts: ")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_at_the_vault_prompt(project: Path) -> None:
    def ask(_prompt: str) -> str:
        raise KeyboardInterrupt

    session = Session(project, FakeRun("up_success", 0), ask_password=ask)
    assert session("up", "--ask-vault-pass") == 130


def test_a_fault_in_the_display_does_not_stop_the_run(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: PlainDisplay, event: object, notes: object) -> None:
        raise RuntimeError("display bug")

    monkeypatch.setattr(PlainDisplay, "handle", broken)
    run = FakeRun("up_success", 0)
    session = Session(project, run)
    assert session("up") == 0
    assert session.stderr.getvalue().count("cannot show the run (RuntimeError('display bug'))") == 1
    assert "Serving at http://172.30.77.11:8000" in session.stdout.getvalue()


def test_ansible_playbook_that_cannot_start_is_not_called_bad_input(project: Path) -> None:
    def run(kwargs: dict[str, Any]) -> RunResult:
        kwargs["event_handler"]({"event": "verbose", "counter": 1, "stdout": "The command was not found or was "
                                 "not executable: ansible-playbook."})
        return RunResult(127, "failed", Path(kwargs["artifact_dir"]) / kwargs["ident"])

    session = Session(project, run)
    assert session("up") == 1
    assert "not found or was not executable: ansible-playbook" in session.stderr.getvalue()


def test_logs_are_shown_once_though_the_playbook_also_printed_them(project: Path) -> None:
    run = FakeRun("logs", 0)
    shown = {"event": "runner_on_ok", "created": run.events[0].get("created"),
             "event_data": {"play": "Rank logs", "task": "Show this rank's last log lines", "host": "spark-1",
                            "task_action": "ansible.builtin.debug", "role": "engine",
                            "res": {"msg": ["INFO started server"]}}}
    run.events = run.events[:-1] + [shown] + run.events[-1:]
    session = Session(project, run)
    assert session("logs") == 0
    assert session.stdout.getvalue().count("INFO started server") == 1
