"""Command line -> ansible_runner.run() keyword arguments, checked against ansible-runner itself."""

from __future__ import annotations

import re
import shlex
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from ansible_runner.interface import init_runner  # type: ignore[import-untyped]

from sparkserve.cli import build_parser, invocation
from sparkserve.project import ROOT, UsageError, default_inventory, keep_runs, resolve_inventory
from sparkserve.runner import (
    RUNS_DIR,
    VAULT_PROMPT,
    Interrupt,
    Invocation,
    build_run_kwargs,
    cmdline_args,
    new_ident,
    private_data_dir,
    prune_runs,
    run_envvars,
    sigint_to,
)

IDENT = "20261202T100000Z-up"


def keep(_event: dict[str, Any]) -> bool:
    return True


def parsed(project: Path, *argv: str) -> Invocation:
    return invocation(build_parser().parse_args(list(argv)), project, project)


def kwargs_of(project: Path, inv: Invocation, **extra: Any) -> dict[str, Any]:
    return build_run_kwargs(inv, project, IDENT, project / ".cache" / "runner" / "x", event_handler=keep,
                            environ={"PATH": "/usr/bin"}, **extra)


@pytest.mark.parametrize(("verb", "playbook", "tags", "extra"), [
    ("up", "site.yml", [], []),
    ("down", "playbooks/stop.yml", [], []),
    ("status", "playbooks/status.yml", ["--tags", "status"], []),
    ("logs", "playbooks/logs.yml", [], ["-e", "sparkserve_logs_lines=100"]),
    ("render", "playbooks/render.yml", [], []),
    ("check", "playbooks/preflight.yml", [], []),
    ("bench", "playbooks/bench.yml", [], []),
    ("rollback", "playbooks/rollback.yml", [], []),
    ("upgrade", "playbooks/upgrade.yml", [], []),
    ("diagnose", "playbooks/diagnose.yml", [], []),
])
def test_every_verb_runs_its_playbook(project: Path, verb: str, playbook: str, tags: list[str],
                                      extra: list[str]) -> None:
    kwargs = kwargs_of(project, parsed(project, verb))
    assert kwargs["playbook"] == playbook
    assert kwargs["project_dir"] == str(project)
    assert kwargs["inventory"] == str(project / "inventory" / "lab")
    assert shlex.split(kwargs["cmdline"]) == extra + tags


def test_upgrade_no_rollback_leaves_a_failed_release_as_it_is(project: Path) -> None:
    kwargs = kwargs_of(project, parsed(project, "upgrade", "--no-rollback"))
    assert kwargs["playbook"] == "playbooks/upgrade.yml"
    assert shlex.split(kwargs["cmdline"]) == ["-e", "release_rollback=false"]
    with pytest.raises(SystemExit):
        parsed(project, "up", "--no-rollback")


def test_options_pass_through_to_ansible_playbook(project: Path, tmp_path: Path) -> None:
    (tmp_path / "mine.sparks.yml").write_text("plugin: sparkserve.deploy.spark_cluster\n")
    inv = parsed(project, "up", "-i", str(tmp_path / "mine.sparks.yml"), "--recipe", "glm53-fp4local-mtp-tp2",
                 "-e", "weights_parallel=4", "--extra-vars", "@vars/site.yml", "-e", '{"a": "b c"}',
                 "--tags", "weights,launch", "--tags", "bench", "--limit", "spark-1,spark-2",
                 "--vault-id", "lab@prompt", "--vault-id", "prod@~/.vault-prod", "--vault-password-file", "~/.vp",
                 "-vvv")
    kwargs = kwargs_of(project, inv)
    assert kwargs["inventory"] == str(tmp_path / "mine.sparks.yml")
    assert shlex.split(kwargs["cmdline"]) == [
        "-e", "sparkserve_recipe=glm53-fp4local-mtp-tp2", "-e", "weights_parallel=4", "-e", "@vars/site.yml",
        "-e", '{"a": "b c"}', "--tags", "weights,launch,bench", "--limit", "spark-1,spark-2",
        "--vault-id", "lab@prompt", "--vault-id", "prod@~/.vault-prod", "--vault-password-file", "~/.vp", "-vvv",
    ]
    assert inv.prompts_for_vault  # lab@prompt asks


def test_logs_options_become_extra_vars_and_status_keeps_its_tag(project: Path) -> None:
    logs = parsed(project, "logs", "--rank", "1", "--lines", "20", "--follow")
    assert logs.extra_vars == ("sparkserve_logs_rank=1", "sparkserve_logs_lines=20")
    status = parsed(project, "status", "--tags", "status,fabric")
    assert status.tags == ("status", "fabric")
    with pytest.raises(UsageError, match="--lines 0"):
        parsed(project, "logs", "--lines", "0")


def test_the_vault_password_is_answered_at_the_prompt_and_never_written(project: Path) -> None:
    inv = parsed(project, "up", "--ask-vault-pass")
    assert inv.prompts_for_vault and cmdline_args(inv) == ["--ask-vault-pass"]
    kwargs = kwargs_of(project, inv, vault_password="s3cret")
    assert kwargs["passwords"] == {VAULT_PROMPT: "s3cret"}
    assert kwargs["suppress_env_files"] is True
    assert "passwords" not in kwargs_of(project, parsed(project, "up"))
    prompt = re.compile(VAULT_PROMPT, re.M)
    assert prompt.search("Vault password: ") and prompt.search("PLAY\r\nVault password (lab): ")
    assert not prompt.search("Vault password was wrong, try again\r\n")


def test_the_run_keeps_this_process_s_environment_with_the_venv_first(project: Path) -> None:
    env = run_envvars(project, {"PATH": "/usr/bin:/bin"}, python="/opt/venv/bin/python")
    assert env["PATH"] == "/opt/venv/bin:/usr/bin:/bin"
    assert env["ANSIBLE_CONFIG"] == str(project / "ansible.cfg")
    assert env["ANSIBLE_FORCE_COLOR"] == "0"
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert run_envvars(project, {"PATH": "/opt/venv/bin:/usr/bin"}, python="/opt/venv/bin/python")["PATH"] == \
        "/opt/venv/bin:/usr/bin"
    assert "ANSIBLE_HOST_KEY_CHECKING" not in run_envvars(project, {"ANSIBLE_HOST_KEY_CHECKING": "False"})
    (project / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\n")
    assert run_envvars(project, {})["ANSIBLE_HOST_KEY_CHECKING"] == "False"


def test_ansible_runner_builds_the_expected_command_from_the_kwargs(project: Path, tmp_path: Path) -> None:
    """The kwargs go through ansible-runner's own preparation (everything but starting the process)."""
    inv = parsed(project, "status", "--recipe", "lab-tp2", "--limit", "spark-1", "--ask-vault-pass", "-v")
    private = tmp_path / "private"
    private.mkdir()
    kwargs = build_run_kwargs(inv, project, IDENT, private, event_handler=keep, vault_password="pw",
                              cancel_callback=lambda: False, runs_dir=tmp_path / "runs")
    runner = init_runner(**kwargs)
    config = runner.config
    assert config.command == [
        "ansible-playbook", "-e", "sparkserve_recipe=lab-tp2", "--tags", "status", "--limit", "spark-1",
        "--ask-vault-pass", "-v", "-i", str(project / "inventory" / "lab"), "playbooks/status.yml"]
    assert config.cwd == str(project)
    assert config.artifact_dir == str(tmp_path / "runs" / IDENT)
    assert config.env["ANSIBLE_CONFIG"] == str(project / "ansible.cfg")
    assert config.env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    # ansible.cfg's fact cache stays in charge, and host keys are checked as ansible-playbook checks them.
    assert "ANSIBLE_CACHE_PLUGIN" not in config.env
    assert config.env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert [p.pattern for p in config.expect_passwords if hasattr(p, "pattern")] == [VAULT_PROMPT]
    assert config.rotate_artifacts == 0 and config.suppress_ansible_output is True
    assert runner.event_handler is keep
    assert list(private.iterdir()) == []  # nothing written where runner keeps env/


def test_the_default_inventory_is_the_lab_s_when_the_lab_wrote_one(project: Path, tmp_path: Path) -> None:
    assert default_inventory(project) == project / "inventory" / "lab"
    (project / "inventory" / "lab" / "cluster.sparks.yml").unlink()
    with pytest.raises(UsageError, match=r"pass one with -i/--inventory"):
        default_inventory(project)
    (tmp_path / "two.sparks.yml").write_text("x")
    assert resolve_inventory(project, "two.sparks.yml", tmp_path) == tmp_path / "two.sparks.yml"
    with pytest.raises(UsageError, match="no-such.yml: no such file"):
        resolve_inventory(project, "no-such.yml", tmp_path)


def test_run_idents_are_utc_time_and_verb(tmp_path: Path) -> None:
    now = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
    assert new_ident("up", tmp_path, now) == "20261202T100000Z-up"
    (tmp_path / "20261202T100000Z-up").mkdir()
    assert new_ident("up", tmp_path, now) == "20261202T100000Z-up-2"


def test_retention_keeps_the_newest_runs_only(tmp_path: Path) -> None:
    runs = tmp_path / RUNS_DIR
    names = [f"202612{day:02d}T100000Z-up" for day in range(1, 8)] + ["20261207T100000Z-status-2"]
    for name in names:
        (runs / name / "job_events").mkdir(parents=True)
    (runs / "notes.txt").write_text("kept")
    (runs / "lab-tp2").mkdir()
    removed = prune_runs(runs, 3)
    assert sorted(p.name for p in removed) == names[:5]
    assert sorted(p.name for p in runs.iterdir()) == sorted([*names[5:], "notes.txt", "lab-tp2"])
    assert prune_runs(runs, 0) == [] and prune_runs(tmp_path / "none", 3) == []


def test_how_many_runs_to_keep() -> None:
    assert keep_runs({}) == 20
    assert keep_runs({"SPARKSERVE_KEEP_RUNS": "5"}) == 5
    assert keep_runs({"SPARKSERVE_KEEP_RUNS": "0"}) == 0
    with pytest.raises(UsageError, match="SPARKSERVE_KEEP_RUNS='many'"):
        keep_runs({"SPARKSERVE_KEEP_RUNS": "many"})


def test_the_private_data_folder_is_fresh_and_removed(tmp_path: Path) -> None:
    with private_data_dir(tmp_path / "runner", IDENT) as first, private_data_dir(tmp_path / "runner", IDENT) as second:
        assert first != second and first.is_dir() and list(first.iterdir()) == []
        (first / "env").mkdir()
    assert list((tmp_path / "runner").iterdir()) == []


def test_ctrl_c_asks_the_playbook_to_stop_then_has_runner_kill_it() -> None:
    sent: list[tuple[int, int]] = []
    said: list[str] = []
    interrupt = Interrupt(pid=lambda: 4242, kill=lambda pid, sig: sent.append((pid, sig)), notify=said.append)
    assert not interrupt.interrupted and not interrupt.cancel()
    interrupt.handle()
    assert sent == [(4242, signal.SIGINT)] and interrupt.interrupted and not interrupt.cancel()
    interrupt.handle()
    assert sent == [(4242, signal.SIGINT)] and interrupt.cancel()
    assert said == ["stopping the playbook (Ctrl-C again to kill it)", "killing the playbook"]
    early = Interrupt(pid=lambda: None, kill=lambda pid, sig: sent.append((pid, sig)))
    early.handle()
    assert early.cancel() and len(sent) == 1


def test_the_installed_package_knows_its_project_root() -> None:
    assert (ROOT / "site.yml").is_file() and (ROOT / "sparkserve" / "cli.py").is_file()


def test_sigint_is_left_alone_outside_the_main_thread() -> None:
    seen: list[object] = []

    def body() -> None:
        with sigint_to(lambda _signum, _frame: None):
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_files_named_from_where_the_command_was_typed_are_found(project: Path, tmp_path: Path) -> None:
    here = tmp_path / "here"
    (here / "vars").mkdir(parents=True)
    (here / "vars" / "site.yml").write_text("a: 1\n")
    (here / "vault-pass").write_text("pw\n")
    args = build_parser().parse_args(["up", "-e", "@vars/site.yml", "-e", "@group_vars/all/x.yml", "-e", "a=@b",
                                      "--vault-password-file", "vault-pass", "--vault-id", "lab@vault-pass",
                                      "--vault-id", "dev@prompt"])
    inv = invocation(args, project, here)
    assert inv.extra_vars == (f"@{here / 'vars' / 'site.yml'}", "@group_vars/all/x.yml", "a=@b")
    assert inv.vault_password_file == str(here / "vault-pass")
    assert inv.vault_ids == (f"lab@{here / 'vault-pass'}", "dev@prompt")
