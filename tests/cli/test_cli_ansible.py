"""The command through the real ansible-runner and ansible-playbook, on render.yml (which touches no host).

The cluster's management addresses are on loopback all the same, so nothing could leave this machine. Runs
and runner's private folders go to the test's own folder, not the project's artifacts/.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from cli_streams import FIXTURES

from sparkserve.cli import Context, main
from sparkserve.events import load_events, replay

CLUSTER = """\
plugin: sparkserve.deploy.spark_cluster
recipe: lab-tp2
management_subnet: 127.0.0.0/24
fabric:
  mtu: {mtu}
  twins:
    - {{interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 10.77.1.0/24}}
    - {{interface: enP2p1s0f1np1, rdma_device: roceP2p1s0f1, subnet: 10.77.2.0/24}}
nodes:
  - {{name: spark-1, address: 127.0.0.11}}
  - {{name: spark-2, address: 127.0.0.12}}
vars:
  lab_engine_image: sparkserve-lab-registry:5000/sparkserve/engine@sha256:{digest}
  lab_model_revision: '0123456789abcdef0123456789abcdef01234567'
  lab_release_revision: '0123456789abcdef0123456789abcdef01234567'
  weights_hf_token: test-token-not-shown
"""


def cluster(tmp_path: Path, mtu: int = 9000) -> Path:
    path = tmp_path / "cluster.sparks.yml"
    path.write_text(CLUSTER.format(mtu=mtu, digest="ab" * 32), encoding="utf-8")
    return path


def sparkserve(tmp_path: Path, *argv: str) -> tuple[int, str, str, Path]:
    out, err = io.StringIO(), io.StringIO()
    runs = tmp_path / "runs"
    context = Context(cwd=tmp_path, stdout=out, stderr=err, tty=False, runs_dir=runs,
                      private_dirs=tmp_path / "private", environ={"SPARKSERVE_KEEP_RUNS": "5"})
    code = main(list(argv), context)
    return code, out.getvalue(), err.getvalue(), runs


@pytest.fixture(autouse=True)
def no_fact_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSIBLE_CACHE_PLUGIN", "memory")


def test_render_through_ansible_runner(tmp_path: Path) -> None:
    code, out, err, runs = sparkserve(tmp_path, "render", "-i", str(cluster(tmp_path)))
    assert code == 0, err
    assert "rank 0 on spark-1: container lab-tp2-rank0" in out
    assert "--node-rank 1 --master-addr 10.77.1.1" in out
    assert "test-token-not-shown" not in out + err
    [run] = list(runs.iterdir())
    assert run.name.endswith("-render") and (run / "rc").read_text() == "0"
    # Runner kept the events; replayed, they give the same stage.
    model = replay(load_events(run))
    # The context plays (the inventory, the recipe) come first; the render is the last stage.
    assert (model.stages[-1].name, model.stages[-1].state) == ("Render every rank's engine command", "ok")
    assert list((tmp_path / "private").iterdir()) == []
    assert not (run / "fact_cache").exists()


def test_json_lines_through_ansible_runner(tmp_path: Path) -> None:
    code, out, _err, _runs = sparkserve(tmp_path, "render", "--json", "-i", str(cluster(tmp_path)))
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and records[-1]["summary"]["exit_code"] == 0
    assert {"Render every rank's engine command", None} <= {r.get("stage") for r in records[:-1]}


def test_an_unknown_recipe_is_bad_input(tmp_path: Path) -> None:
    code, _out, err, _runs = sparkserve(tmp_path, "render", "--recipe", "no-such-recipe", "-i", str(cluster(tmp_path)))
    assert code == 2
    assert 'recipe "no-such-recipe" is unknown' in err and "(role recipe)" in err


def test_a_refused_inventory_is_bad_input_with_ansible_s_own_words(tmp_path: Path) -> None:
    code, _out, err, _runs = sparkserve(tmp_path, "render", "-i", str(cluster(tmp_path, mtu=65000)))
    assert code == 2
    assert "before running any task" in err and "fabric MTU 65000 is outside 1280..9216" in err


def test_the_recorded_fixtures_are_runner_s_own_layout() -> None:
    for name in ("render_ok", "render_unknown_recipe", "render_bad_inventory"):
        names = [p.name for p in (FIXTURES / name / "job_events").iterdir()]
        assert names and all(n.split("-", 1)[0].isdigit() and n.endswith(".json") for n in names)
