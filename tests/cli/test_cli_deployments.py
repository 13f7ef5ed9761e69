"""Several deployments in one inventory: --deployment as ansible's limit, and every deployment's status and endpoint.

The inventory's deployments are read with the real ansible-inventory on the example cluster files (which touches
no host); the runs are recorded streams played into the command, as in test_cli_main.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cli_streams import stream
from test_cli_ansible import sparkserve
from test_cli_main import FakeRun, Session

from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.deployments import group_name
from sparkserve import cli
from sparkserve.deployments import (
    ONE_DEPLOYMENT_VERBS,
    Deployment,
    InventoryRead,
    deployments_of,
    limit_for,
    read_inventory,
)
from sparkserve.events import load_events, replay
from sparkserve.project import ROOT
from sparkserve.status import STATUSES, UNMANAGED
from sparkserve.summary import ENDPOINTS

FLEET = (Deployment("gemma", "deployment_gemma"), Deployment("gemma-b", "deployment_gemma_b"),
         Deployment("old-model", "deployment_old_model", present=False))


class Reader:
    """ansible-inventory's answer, as read_inventory gives it, and how often it was asked."""

    def __init__(self, read: InventoryRead) -> None:
        self.read, self.calls = read, 0

    def __call__(self, _root: Path, _inventory: Path, _environ: Mapping[str, str]) -> InventoryRead:
        self.calls += 1
        return self.read


def fleet(project: Path, name: str = "status", reader: Reader | None = None) -> tuple[Session, FakeRun, Reader]:
    run, reader = FakeRun(name, 0), reader or Reader(InventoryRead(deployments=FLEET))
    return Session(project, run, read_deployments=reader), run, reader


def limit(run: FakeRun) -> str | None:
    argv = shlex.split(run.calls[0]["cmdline"])
    return argv[argv.index("--limit") + 1] if "--limit" in argv else None


# -- the inventory's deployments ------------------------------------------------------------------------------

LISTING: dict[str, Any] = {
    "_meta": {"hostvars": {
        "gemma@spark-a": {"sparkserve_deployment": "gemma"},
        "gemma-b@spark-b": {"sparkserve_deployment": "gemma-b"},
        "old-model@spark-a": {"sparkserve_deployment": "old-model"},
    }},
    "all": {"children": ["ungrouped", "sparks", "nodes", "absent", "deployment_gemma", "deployment_gemma_b",
                         "deployment_old_model"]},
    "sparks": {"children": ["head", "workers"], "hosts": ["gemma@spark-a", "gemma-b@spark-b"]},
    "head": {"hosts": ["gemma@spark-a", "gemma-b@spark-b"]},
    "absent": {"hosts": ["old-model@spark-a"]},
    "deployment_gemma": {"hosts": ["gemma@spark-a"]},
    "deployment_gemma_b": {"hosts": ["gemma-b@spark-b"]},
    "deployment_old_model": {"hosts": ["old-model@spark-a"]},
}


def test_the_deployments_of_an_inventory_listing() -> None:
    assert deployments_of(LISTING) == FLEET
    # A plain YAML inventory has no deployment group: it serves one deployment, named by its recipe.
    assert deployments_of({"_meta": {"hostvars": {"spark-a": {}}}, "all": {"children": ["sparks"]},
                           "sparks": {"hosts": ["spark-a"]}}) == ()
    # A group of a hand-written inventory whose hosts carry no sparkserve_deployment: named after the group.
    assert deployments_of({"all": {"children": ["deployment_x"]}, "deployment_x": {"hosts": ["h"]}}) == (
        Deployment("x", "deployment_x", present=False),)


def test_ansible_inventory_lists_the_example_fleet(tmp_path: Path) -> None:
    """The real ansible-inventory on the example's two deployments; a group_vars file is not read (no vars plugin
    runs: neither a vault password nor a broken file stops the listing)."""
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("not: [yaml\n", encoding="utf-8")
    fleet_file(tmp_path)
    read = read_inventory(ROOT, tmp_path, {"PATH": "/usr/bin:/bin"})
    assert read == InventoryRead(deployments=(Deployment("gemma", "deployment_gemma"),
                                              Deployment("gemma-b", "deployment_gemma_b")))
    one = read_inventory(ROOT, ROOT / "inventory" / "example" / "two-sparks.sparks.yml", {"PATH": "/usr/bin:/bin"})
    assert [d.name for d in one.present] == ["glm53-fp4local-mtp-tp2"]
    assert read_inventory(ROOT, ROOT / "inventory" / "example" / "hosts.yml", {}) == InventoryRead()
    missing = read_inventory(ROOT, tmp_path / "none.sparks.yml", {})
    assert missing.deployments == () and missing.problem.startswith("ansible-inventory exited ")


def fleet_file(tmp_path: Path) -> Path:
    """The example's two deployments, their nodes' addresses on loopback."""
    source = (ROOT / "inventory" / "example" / "two-sparks-fleet.sparks.yml").read_text(encoding="utf-8")
    path = tmp_path / "fleet.sparks.yml"
    path.write_text(source.replace("192.168.1.", "127.0.0."), encoding="utf-8")
    return path


def test_render_of_one_deployment_through_ansible_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real command on render.yml (which touches no host): the controller's play runs, one deployment renders."""
    monkeypatch.setenv("ANSIBLE_CACHE_PLUGIN", "memory")
    code, out, err, runs = sparkserve(tmp_path, "render", "-i", str(fleet_file(tmp_path)), "--deployment", "gemma-b")
    assert code == 0, err
    assert "rank 0 on gemma-b@spark-b: container gemma-b-rank0" in out and "gemma@spark-a" not in out
    [run] = list(runs.iterdir())
    argv = json.loads((run / "command").read_text(encoding="utf-8"))["command"]
    assert argv[argv.index("--limit") + 1] == "deployment_gemma_b:localhost"
    model = replay(load_events(run))
    # The inventory has Sparks: the controller's check has no host; the recipe is read for gemma-b alone.
    check, read = model.stages[:2]
    assert check.name == "Check the inventory has a Spark" and not check.hosts
    assert read.name == "Read the inventory and the recipe"
    assert read.hosts and all(host.startswith("gemma-b@") for host in read.hosts)
    code, _out, err, _runs = sparkserve(tmp_path, "render", "-i", str(fleet_file(tmp_path)), "--deployment", "x")
    assert code == 2 and err.endswith("its deployments are gemma, gemma-b\n")


# -- --deployment as ansible's limit ---------------------------------------------------------------------------

def test_the_limit_of_the_chosen_deployments() -> None:
    gemma, gemma_b, old = FLEET
    assert limit_for([gemma_b], None, FLEET) == "deployment_gemma_b:localhost"
    assert limit_for([gemma, gemma_b, gemma], None, FLEET) == "deployment_gemma:deployment_gemma_b:localhost"
    # Within the user's own limit: its hosts and the controller, less every other deployment.
    assert limit_for([gemma_b], "spark-b-hosts", FLEET) == \
        "spark-b-hosts:localhost:!deployment_gemma:!deployment_old_model"
    assert limit_for([gemma, gemma_b, old], "sparks", FLEET) == "sparks:localhost"
    assert group_name("gemma-b.v2") == "deployment_gemma_b_v2"


@pytest.mark.parametrize("verb", ["up", "down", "status", "logs", "upgrade", "rollback", "bench", "render",
                                  "check", "diagnose"])
def test_deployment_limits_every_verb_to_its_group_and_the_controller(project: Path, verb: str) -> None:
    session, run, _reader = fleet(project)
    assert session(verb, "--deployment", "gemma-b") == 0, session.stderr.getvalue()
    assert limit(run) == "deployment_gemma_b:localhost"


def test_several_deployments_and_the_user_s_limit(project: Path) -> None:
    session, run, _reader = fleet(project)
    assert session("up", "--deployment", "gemma", "--deployment", "gemma-b") == 0
    assert limit(run) == "deployment_gemma:deployment_gemma_b:localhost"
    session, run, _reader = fleet(project)
    assert session("status", "--deployment", "gemma-b", "--limit", "gemma-b@spark-b") == 0
    assert limit(run) == "gemma-b@spark-b:localhost:!deployment_gemma:!deployment_old_model"
    # The name as its group spells it finds the deployment too.
    session, run, _reader = fleet(project)
    assert session("logs", "--deployment", "gemma_b") == 0
    assert limit(run) == "deployment_gemma_b:localhost"


def test_an_unknown_deployment_is_refused_with_the_names(project: Path) -> None:
    session, run, _reader = fleet(project)
    assert session("up", "--deployment", "llama") == 2
    assert session.stderr.getvalue() == ("sparkserve up: --deployment llama: the inventory has no such deployment; "
                                         "its deployments are gemma, gemma-b, old-model\n")
    assert run.calls == []


def test_up_and_status_act_on_every_deployment_without_reading_the_inventory(project: Path) -> None:
    for verb in ("up", "status", "render", "check", "diagnose"):
        session, run, reader = fleet(project)
        assert session(verb) == 0
        assert limit(run) is None and reader.calls == 0


@pytest.mark.parametrize("verb", sorted(ONE_DEPLOYMENT_VERBS))
def test_a_verb_on_one_deployment_asks_which(project: Path, verb: str) -> None:
    session, run, _reader = fleet(project)
    assert session(verb) == 2
    assert session.stderr.getvalue() == (f"sparkserve {verb}: the inventory has 2 deployments (gemma, gemma-b) and "
                                         f"{verb} acts on one; name it with --deployment NAME\n")
    assert run.calls == []
    # With one deployment nothing changes: no limit, as before.
    single = Reader(InventoryRead(deployments=FLEET[:1] + FLEET[2:]))
    session, run, reader = fleet(project, reader=single)
    assert session(verb) == 0 and limit(run) is None and reader.calls == 1
    # A limit of the user's own already says what runs.
    session, run, reader = fleet(project)
    assert session(verb, "--limit", "deployment_gemma:localhost") == 0
    assert limit(run) == "deployment_gemma:localhost" and reader.calls == 0


def test_down_stops_one_deployment_or_all(project: Path) -> None:
    session, run, _reader = fleet(project)
    assert session("down") == 2
    assert session.stderr.getvalue() == ("sparkserve down: the inventory has 2 deployments (gemma, gemma-b); name "
                                         "the one to stop with --deployment NAME, or stop them all with --all\n")
    assert run.calls == []
    session, run, reader = fleet(project)
    assert session("down", "--all") == 0 and limit(run) is None and reader.calls == 0
    session, run, _reader = fleet(project)
    assert session("down", "--all", "--deployment", "gemma") == 2
    assert session.stderr.getvalue() == "sparkserve down: give --deployment NAME or --all, not both\n"
    session, run, _reader = fleet(project, reader=Reader(InventoryRead(deployments=FLEET[:1])))
    assert session("down") == 0 and limit(run) is None


def test_an_inventory_that_cannot_be_read(project: Path) -> None:
    broken = Reader(InventoryRead(problem="ansible-inventory exited 1: the cluster file is refused"))
    session, run, _reader = fleet(project, reader=broken)
    assert session("status", "--deployment", "gemma") == 2
    assert "cannot read the deployments of " in session.stderr.getvalue()
    assert session.stderr.getvalue().endswith(" to find gemma: ansible-inventory exited 1: the cluster file is "
                                              "refused\n")
    assert run.calls == []
    # Nothing named: the run reads the same inventory and says what is wrong with it.
    session, run, _reader = fleet(project, reader=broken)
    assert session("logs") == 0 and limit(run) is None


def test_an_inventory_without_deployment_groups(project: Path) -> None:
    session, run, _reader = fleet(project, reader=Reader(InventoryRead()))
    assert session("logs", "--deployment", "lab-tp2") == 2
    assert "the inventory names no deployment" in session.stderr.getvalue()
    session, run, _reader = fleet(project, reader=Reader(InventoryRead()))
    assert session("logs") == 0 and limit(run) is None


def test_help_names_the_options() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["down", "--all"]).all_deployments is True
    assert parser.parse_args(["bench", "--deployment", "a", "--deployment", "b"]).deployment == ["a", "b"]
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--all"])


# -- every deployment's status ---------------------------------------------------------------------------------

def two_statuses() -> list[dict[str, Any]]:
    """The recorded status run, as a run over two deployments ends: the last one's status whole, both by name."""
    events = copy.deepcopy(stream("status"))
    stats = events[-1]["event_data"]["artifact_data"]
    last = stats["sparkserve_status"]
    last["deployment"] = "gemma-b"
    other_rank = dict(last["ranks"][0], node="spark-3", image="reg:5000/other@sha256:" + "cd" * 32)
    stats[STATUSES] = {
        "gemma": {"recipe": "gemma4", "ranks": [other_rank],
                  "endpoint": dict(last["endpoint"], url="http://10.0.0.3:8001", model_name="gemma4")},
        "gemma-b": {"recipe": last["recipe"], "endpoint": last["endpoint"], "ranks": last["ranks"]},
    }
    stats[UNMANAGED] = {"spark-2": ["llama-test"]}
    return events


def test_status_shows_every_deployment(project: Path) -> None:
    run = FakeRun("status", 0)
    run.events = two_statuses()
    session = Session(project, run)
    assert session("status") == 0
    out = session.stdout.getvalue()
    assert out.index("deployment gemma · recipe gemma4") < out.index("deployment gemma-b · recipe lab-tp2")
    assert "Endpoint: http://10.0.0.3:8001 serving gemma4" in out
    assert "Endpoint: http://172.30.77.11:8000 serving tiny-model" in out
    found = [line.split() for line in out.splitlines()]
    assert ["0", "spark-3", "running", "12-02", "09:58:01", "other@sha256:cdcdcdcd", "ok"] in found
    assert ["1", "spark-2", "running", "12-02", "09:57:59", "engine@sha256:141cd527", "changed"] in found
    # The last deployment's block has what its batch read whole: readiness, the nodes.
    assert out.count("Readiness: health 200") == 1 and out.index("Readiness") > out.index("deployment gemma-b")
    assert "spark-2 runs llama-test, of no deployment this inventory lists (left running)" in out


def test_status_json_gives_every_deployment(project: Path) -> None:
    run = FakeRun("status", 0)
    run.events = two_statuses()
    session = Session(project, run)
    assert session("status", "--json") == 0
    document = json.loads(session.stdout.getvalue())
    assert sorted(document) == ["deployments", "unmanaged"]
    assert list(document["deployments"]) == ["gemma", "gemma-b"]
    gemma, gemma_b = document["deployments"]["gemma"], document["deployments"]["gemma-b"]
    assert gemma["deployment"] == "gemma" and gemma["endpoint"]["url"] == "http://10.0.0.3:8001"
    assert "nodes" not in gemma and gemma_b["nodes"][0]["node"] == "spark-1"
    assert [r["rank"] for r in gemma_b["ranks"]] == [0, 1]
    assert document["unmanaged"] == {"spark-2": ["llama-test"]}


def test_the_playbook_writes_the_keys_the_command_reads() -> None:
    """status.yml's aggregate keys, which plugins/module_utils/run_stats.py does not name yet."""
    text = (ROOT / "playbooks" / "status.yml").read_text(encoding="utf-8")
    assert f"{STATUSES}:" in text and f"{UNMANAGED}:" in text


# -- every deployment's endpoint ------------------------------------------------------------------------------

def two_endpoints() -> list[dict[str, Any]]:
    events = copy.deepcopy(stream("up_success"))
    stats = events[-1]["event_data"]["artifact_data"]
    last = stats["sparkserve_endpoint"]
    first = dict(last, deployment="gemma", url="http://172.30.77.12:8001", model_name="gemma4", head="spark-2",
                 ranks=[{"rank": 0, "node": "spark-2"}], nodes=["spark-2"])
    last = dict(last, deployment="gemma-b")
    stats["sparkserve_endpoint"] = last
    stats[ENDPOINTS] = {"gemma": first, "gemma-b": last}
    return events


def test_up_ends_with_every_deployment_s_endpoint(project: Path) -> None:
    run = FakeRun("up_success", 0)
    run.events = two_endpoints()
    session = Session(project, run)
    assert session("up") == 0
    out = session.stdout.getvalue().splitlines()
    first, second = out.index("Serving gemma at http://172.30.77.12:8001"), \
        out.index("Serving gemma-b at http://172.30.77.11:8000")
    assert first < second < out.index("Stages") < out.index("Try gemma:") < out.index("Try gemma-b:")
    assert "  model      gemma4" in out[first:second] and "  ranks      0 → spark-2" in out[first:second]
    assert out[out.index("Try gemma:") + 1].startswith("  curl -s http://172.30.77.12:8001/v1/completions")
    assert out[-1].startswith("  curl -s http://172.30.77.11:8000/v1/completions")


def test_a_run_of_one_deployment_ends_as_before(project: Path) -> None:
    events = copy.deepcopy(stream("up_success"))
    stats = events[-1]["event_data"]["artifact_data"]
    stats[ENDPOINTS] = {stats["sparkserve_endpoint"]["deployment"]: stats["sparkserve_endpoint"]}
    with_both, plain = FakeRun("up_success", 0), FakeRun("up_success", 0)
    with_both.events = events
    one, two = Session(project, with_both), Session(project, plain)
    assert one("up") == two("up") == 0
    assert one.stdout.getvalue().splitlines()[-12:] == two.stdout.getvalue().splitlines()[-12:]
    assert "Serving at http://172.30.77.11:8000" in one.stdout.getvalue()


def test_up_ask_asks_every_deployment(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def complete(endpoint: Mapping[str, Any], prompt: str, key: str = "") -> str:
        asked.append(str(endpoint["url"]))
        return f"{endpoint['model_name']} says 4"

    monkeypatch.setattr(cli, "complete", complete)
    run = FakeRun("up_success", 0)
    run.events = two_endpoints()
    session = Session(project, run)
    assert session("up", "--ask", "2+2=") == 0
    assert asked == ["http://172.30.77.12:8001", "http://172.30.77.11:8000"]
    assert session.stdout.getvalue().splitlines()[-2:] == [
        "Asked '2+2='; deployment gemma answered: 'gemma4 says 4'",
        "Asked '2+2='; deployment gemma-b answered: 'tiny-model says 4'"]
