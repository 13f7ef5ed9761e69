"""The shape of the pipeline: one context play first in every entry playbook, the deploy pipeline's plays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"
# Imported by others, never run alone: the pipeline (after preflight), one qualification run, peer access.
IMPORTED = {"context.yml", "deploy.yml", "qualify_run.yml", "access.yml"}
LAB = {"lab.yml", "lab-destroy.yml"}


def plays(path: Path) -> list[dict[str, Any]]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_every_entry_playbook_starts_with_the_context_play() -> None:
    entries = sorted(p.name for p in PLAYBOOKS.glob("*.yml") if p.name not in IMPORTED | LAB)
    assert "status.yml" in entries and "upgrade.yml" in entries
    for name in entries:
        first = plays(PLAYBOOKS / name)[0]
        imported = first.get("ansible.builtin.import_playbook")
        assert imported in ("context.yml", "preflight.yml"), f"playbooks/{name} does not start with the context play"
    assert plays(PLAYBOOKS / "preflight.yml")[0]["ansible.builtin.import_playbook"] == "context.yml"
    assert [p["ansible.builtin.import_playbook"] for p in plays(ROOT / "site.yml")] == [
        "playbooks/preflight.yml", "playbooks/access.yml", "playbooks/deploy.yml", "playbooks/stop.yml"]


def role_calls(play: dict[str, Any]) -> list[dict[str, Any]]:
    """Each role a play runs: its roles: entries and its import_role and include_role tasks, as dicts."""
    calls = [{"name": role} if isinstance(role, str) else {"name": role.get("role"), **role}
             for role in play.get("roles") or []]
    for task in play.get("tasks") or []:
        call = task.get("ansible.builtin.import_role") or task.get("ansible.builtin.include_role")
        if call:
            calls.append(call)
    return calls


def test_no_play_but_the_context_play_runs_the_recipe_role() -> None:
    for path in [ROOT / "site.yml", *sorted(PLAYBOOKS.glob("*.yml"))]:
        for play in plays(path):
            if "recipe" in [call["name"] for call in role_calls(play)]:
                assert path.name == "context.yml", f"{path.name}: play {play.get('name')!r} runs the recipe role"


def test_the_pipeline_checks_the_settings_once_not_at_each_role() -> None:
    # The context play checks every setting against every role's argument spec before any host changes
    # (settings_check); each role site.yml's playbooks run after it is entered without that check again, which
    # would be one more task per role and host in every run.
    checked = []
    for name in ("context.yml", "preflight.yml", "access.yml", "deploy.yml", "qualify_run.yml", "stop.yml"):
        for play in plays(PLAYBOOKS / name):
            assert not play.get("roles"), f"{name}: play {play.get('name')!r} lists roles, which check their spec"
            for call in role_calls(play):
                assert call.get("rolespec_validate") is False, f"{name}: {call['name']} checks its spec again"
                checked.append(call["name"])
    assert {"recipe", "preflight", "node_access", "fabric", "image", "weights", "release", "engine", "supervisor",
            "gateway", "monitoring"} <= set(checked)


def test_the_deploy_pipeline_runs_its_stages_in_order() -> None:
    names = [play.get("name") for play in plays(PLAYBOOKS / "deploy.yml")]
    assert names == [
        "Find what serves and what the recipe asks", "Fabric between the Sparks",
        "The recipe's image on every Spark, pulled once and relayed over the fabric",
        "NCCL across the Sparks, in the engine image, when asked",
        "Measure every link between the Sparks, then NCCL across them, under --tags fabric-bench",
        "What every Spark holds of the weights", "Weights on every Spark", "Overlays on the pinned image",
        "Measure the serving release on the qualification suite, when no run of it is recorded",
        "Prepare every node for the launch", "Launch the engine",
        "Say where each deployment serves, when no rank started", "Qualify the new release",
        "Roll back to the serving release when the new one failed",
        "Supervise the deployment", "The gateway in front of the deployments",
        "A node exporter on every node, when the inventory monitors", "Monitor the deployment",
        "End the run"]


def play_hosts(play: dict[str, Any], hostvars: dict[str, dict[str, Any]] | None, **extra: Any) -> list[str]:
    """The hosts a play's templated hosts: expression selects, as ansible-playbook templates it before the play."""

    sparks = [name for name in (hostvars or {}) if name != "localhost"] or ["spark-1", "spark-2"]
    play_vars = {name: trust_as_template(value) if isinstance(value, str) else value
                 for name, value in (play.get("vars") or {}).items()}
    variables: dict[str, Any] = {"groups": {"sparks": sparks, "all": sparks}, **play_vars, **extra}
    if hostvars is not None:
        variables["hostvars"] = {name: {"inventory_hostname": name, **facts}
                                 for name, facts in {"localhost": {}, **hostvars}.items()}
    selected = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(play["hosts"]))
    return [selected] if isinstance(selected, str) else list(selected)


def test_a_play_with_nothing_to_do_has_no_host() -> None:
    """A run that changes nothing skips these plays whole (no task is even skipped); a run that needs one runs it."""
    deploy = {play.get("name"): play for play in plays(PLAYBOOKS / "deploy.yml")}
    serving = {"spark-1": {"sparkserve_rank": 0, "engine_relaunch": False, "weights_held_all": True,
                           "release_upgrade": False},
               "spark-2": {"sparkserve_rank": 1, "engine_relaunch": False, "weights_held_all": True,
                           "release_upgrade": False}}
    idle = ["Weights on every Spark", "Launch the engine", "Roll back to the serving release when the new one failed",
            "A node exporter on every node, when the inventory monitors", "Monitor the deployment", "End the run"]
    for name in idle:
        assert play_hosts(deploy[name], serving) == [], name
    assert play_hosts(deploy["Say where each deployment serves, when no rank started"], serving) == ["spark-1"]

    def changed(**facts: Any) -> dict[str, dict[str, Any]]:
        return {"spark-1": {**serving["spark-1"], **facts}, "spark-2": serving["spark-2"]}

    assert play_hosts(deploy["Weights on every Spark"], changed(weights_held_all=False)) == ["sparks"]
    assert play_hosts(deploy["Launch the engine"], changed(engine_relaunch=True)) == ["sparks"]
    assert play_hosts(deploy["Say where each deployment serves, when no rank started"],
                      changed(engine_relaunch=True)) == []
    assert play_hosts(deploy["Roll back to the serving release when the new one failed"],
                      changed(release_failure="readiness: ...")) == ["sparks"]
    assert play_hosts(deploy["Monitor the deployment"], changed(sparkserve_monitoring=True)) == ["sparks"]
    # The exporters first, on one host of each node (the plain inventory here has no nodes group: its Sparks).
    assert play_hosts(deploy["A node exporter on every node, when the inventory monitors"],
                      changed(sparkserve_monitoring=True)) == ["sparks"]
    assert play_hosts(deploy["End the run"], changed(release_upgrade=True)) == ["sparks"]
    assert play_hosts(deploy["End the run"], changed(release_failures=["qualification"])) == ["sparks"]
    # What runs was not read (--tags without the prepare stage): the launch play keeps its hosts.
    assert play_hosts(deploy["Launch the engine"], {"spark-1": {"sparkserve_rank": 0}}) == ["sparks"]
    # Before the run's first play (and in --syntax-check) there are no hostvars: no host, no error.
    for name in idle:
        assert play_hosts(deploy[name], None) == [], name


def test_the_context_reads_each_recipe_once_a_run() -> None:
    check, read, absent = plays(PLAYBOOKS / "context.yml")
    assert play_hosts(check, {"spark-1": {}}) == [] and play_hosts(check, None, groups={"sparks": []}) == ["localhost"]
    assert play_hosts(read, None) == ["spark-1", "spark-2"]  # the run's first: every host
    assert play_hosts(read, {"spark-1": {"recipe_rendered_for": "lab-tp2"}, "spark-2": {}}) == ["spark-2"]
    assert play_hosts(read, {"spark-1": {}}, context_reads_recipe=False) == []
    assert play_hosts(absent, {"spark-1": {}}) == []


BENCH_PLAY = "Measure every link between the Sparks, then NCCL across them, under --tags fabric-bench"


def test_the_link_bench_play_runs_only_when_asked_then_the_nccl_probe_once() -> None:
    deploy = {play.get("name"): play for play in plays(PLAYBOOKS / "deploy.yml")}
    bench, nccl = deploy[BENCH_PLAY], deploy["NCCL across the Sparks, in the engine image, when asked"]
    # The bench on every node when asked by its tag; the probe's play has no host unless a recipe or its tag asks.
    every_node = "'nodes' if 'nodes' in groups else 'sparks'"
    assert bench["tags"] == ["fabric-bench", "never"] and bench["hosts"] == "{{ " + every_node + " }}"
    assert f"({every_node})" in nccl["hosts"] and "'nccl_probe' in ansible_run_tags" in nccl["hosts"]
    assert bench["any_errors_fatal"] is True
    steps = [task["ansible.builtin.include_role"] for task in bench["tasks"]]
    assert [(step["name"], step["tasks_from"], step["apply"]["tags"]) for step in steps] == [
        ("fabric", "bench", ["fabric-bench"]), ("fabric", "probe", ["fabric-bench"])]
    probe = bench["tasks"][1]
    assert probe["vars"] == {"fabric_nccl_probe_enabled": True}  # the probe runs under this tag whatever the recipe
    assert any("fabric_nccl_probe_ran is not defined" in when for when in probe["when"])  # and not twice in one run
    assert "fabric_bench_nccl_probe | default(true) | bool" in probe["when"]  # unless the inventory turns it off


def listed(*tags: str) -> str:
    """What ansible-playbook --list-tasks selects of site.yml for an example cluster with these tags."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    playbook = Path(sys.executable).parent / "ansible-playbook"
    command = [str(playbook if playbook.exists() else "ansible-playbook"), "-i",
               str(ROOT / "inventory/example/two-sparks.sparks.yml"), str(ROOT / "site.yml"), "--list-tasks"]
    done = subprocess.run(command + ([f"--tags={','.join(tags)}"] if tags else []), cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def selected(text: str, play: str) -> list[str]:
    """The names of the tasks selected in a play of --list-tasks' output."""
    section = text.split(play, 1)[1].split("\n\n", 1)[0]
    return [line.strip().split("\t")[0] for line in section.splitlines()[2:] if line.strip()]


def test_the_fabric_bench_tag_selects_the_link_bench_and_no_stage() -> None:
    bench_tasks = ["Measure every linked pair of twins with ib_write_bw, gated on fabric_bench_floor_gbps",
                   "Then measure NCCL all-reduce bandwidth across every rank, gated as the recipe says"]
    asked = listed("fabric-bench")
    assert selected(asked, BENCH_PLAY) == bench_tasks
    # every other task it selects runs under any tag (always): no stage runs
    others = [line for line in asked.split(BENCH_PLAY, 1)[0].splitlines() + asked.split(BENCH_PLAY, 1)[1]
              .split("\n\n", 1)[1].splitlines() if "TAGS: [" in line and not line.strip().startswith("play #")]
    assert others and all("always" in line.split("TAGS: [", 1)[1] for line in others), others
    for tags in ((), ("nccl_probe",), ("fabric",)):
        assert selected(listed(*tags), BENCH_PLAY) == [], tags
