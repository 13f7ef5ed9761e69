"""The shape of the pipeline: one context play first in every entry playbook, the deploy pipeline's plays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

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


def test_no_play_but_the_context_play_runs_the_recipe_role() -> None:
    for path in [ROOT / "site.yml", *sorted(PLAYBOOKS.glob("*.yml"))]:
        for play in plays(path):
            roles = [role if isinstance(role, str) else role.get("role") for role in play.get("roles") or []]
            if "recipe" in roles:
                assert path.name == "context.yml", f"{path.name}: play {play.get('name')!r} runs the recipe role"


def test_the_deploy_pipeline_runs_its_stages_in_order() -> None:
    names = [play.get("name") for play in plays(PLAYBOOKS / "deploy.yml")]
    assert names == [
        "Find what serves and what the recipe asks", "Fabric between the Sparks",
        "The recipe's image on every Spark, pulled once and relayed over the fabric",
        "NCCL across the Sparks, in the engine image, when asked",
        "What every Spark holds of the weights", "Weights on every Spark", "Overlays on the pinned image",
        "Measure the serving release on the qualification suite, when no run of it is recorded",
        "Prepare every node for the launch", "Launch the engine",
        "Qualify the new release", "Roll back to the serving release when the new one failed",
        "Supervise the deployment", "The gateway in front of the deployments", "Monitor the deployment",
        "End the run"]
