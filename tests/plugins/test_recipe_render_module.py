"""Tests for the recipe_render module, run through its main() as Ansible would run it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import recipe_render

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
COMMIT = "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5"
IMAGE = "registry.example:5000/vllm@sha256:" + "3f" * 32
LAB_VARIABLES = {
    "lab_engine_image": "sparkserve-lab-registry:5000/sparkserve/engine@sha256:" + "0a" * 32,
    "lab_model_revision": "1b" * 20,
}


def run_module(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Run main() with these arguments; return its JSON result."""
    with patch_module_args(args), pytest.raises(SystemExit):
        recipe_render.main()
    return json.loads(capsys.readouterr().out)


def lab_args(name: str = "lab-tp2", world_size: int = 2, **changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "recipe": yaml.safe_load((RECIPES / f"{name}.yml").read_text(encoding="utf-8")),
        "name": name,
        "deployment": "lab",
        "world_size": world_size,
        "ranks": [{"rank": r, "head_fabric_ip": "10.77.1.11"} for r in range(world_size)],
        "variables": LAB_VARIABLES,
        # The lab's tiny model is gated on the lab's hub double, which gives the token.
        "hf_token_present": True,
        "recipe_dir": str(RECIPES),
    }
    args.update(changes)
    return args


def test_success_renders_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_module(lab_args(), capsys)
    assert not result.get("failed") and result["changed"] is False
    assert result["recipe"]["image"] == LAB_VARIABLES["lab_engine_image"]
    assert result["recipe"]["memory"]["guard"]["samples"] == 3
    head, worker = result["ranks"]
    assert head["rank"] == 0 and head["container_name"] == "lab-rank0"
    assert head["argv"][:3] == ["vllm", "serve", "/models/tiny-model"]
    assert head["ports"] == [8000, 29501]
    assert worker["rank"] == 1 and "--headless" in worker["argv"] and worker["ports"] == []
    assert worker["env"] == {"VLLM_ENGINE_READY_TIMEOUT_S": "300", "VLLM_DOUBLE_LOAD_MIB_S": "64",
                             "VLLM_DOUBLE_LOAD_DELAY_S": "2"}
    engine = result["engine"]
    assert engine["name"] == "vllm" and engine["host_ip_variable"] == "VLLM_HOST_IP"
    assert engine["endpoints"]["health"] == "/health" and engine["dead_health_pattern"]
    assert [m["name"] for m in engine["cache_mounts"]] == ["vllm", "flashinfer"]


def test_check_mode_gives_the_same_result(capsys: pytest.CaptureFixture[str]) -> None:
    plain = run_module(lab_args(), capsys)
    checked = run_module(dict(lab_args(), _ansible_check_mode=True), capsys)
    assert checked["ranks"] == plain["ranks"] and checked["changed"] is False


def test_four_nodes_head_first(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_module(lab_args("lab-tp4", 4), capsys)
    assert result["recipe"]["launch"]["order"] == "head_first"
    assert [r["container_name"] for r in result["ranks"]] == [f"lab-rank{r}" for r in range(4)]


def test_failure_joins_every_message(capsys: pytest.CaptureFixture[str]) -> None:
    args = lab_args()
    args["recipe"]["launch"]["order"] = "sideways"
    args["recipe"]["engine_args"]["load-format"] = "instanttensor"
    args["variables"] = {"lab_engine_image": "sparkserve/engine:latest", "lab_model_revision": "main"}
    result = run_module(args, capsys)
    assert result["failed"] is True
    errors = result["errors"]
    assert result["msg"] == "\n".join(errors)
    assert len(errors) == 4
    assert errors[0].startswith('recipe lab-tp2: image (from the variable lab_engine_image) is '
                                '"sparkserve/engine:latest"; pin the image by digest')
    assert errors[1] == ('recipe lab-tp2: model.revision (from the variable lab_model_revision) is "main"; pin the '
                         'full 40-character commit (HfApi().model_info(repo, revision="main").sha gives it).')
    assert errors[2] == 'recipe lab-tp2: launch.order is "sideways"; use one of: workers_first, head_first.'
    assert "instanttensor" in errors[3] and "2-node" in errors[3]


def test_failure_on_cluster_size(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_module(lab_args("lab-tp2", 4), capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("recipe lab-tp2: parallel.tensor × parallel.pipeline is 2 × 1 = 2 GPUs "
                                    "but the cluster has 4 nodes")


def test_failure_on_gated_model_without_token(capsys: pytest.CaptureFixture[str]) -> None:
    args = lab_args(hf_token_present=False)
    args["recipe"]["model"]["gated"] = True
    assert "weights_hf_token" in run_module(args, capsys)["msg"]
    assert not run_module(dict(args, hf_token_present=True), capsys).get("failed")


def test_failure_on_missing_variables(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_module(lab_args(variables={}), capsys)
    assert result["failed"] is True
    assert result["msg"].splitlines() == [
        "recipe lab-tp2: image_from names the inventory variable lab_engine_image, which is not set; set it to the "
        "image pinned by digest, REPO@sha256:<64 hex> (docker buildx imagetools inspect IMAGE prints the digest).",
        "recipe lab-tp2: model.revision_from names the inventory variable lab_model_revision, which is not set; set "
        'it to the full 40-character commit of sparkserve-lab/tiny-model (HfApi().model_info("sparkserve-lab/'
        'tiny-model").sha gives the newest).',
    ]


def test_failure_on_a_patch_missing_from_the_recipes_folder(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    result = run_module(lab_args(recipe_dir=str(tmp_path)), capsys)
    assert result["failed"] is True
    assert result["errors"] == [
        'recipe lab-tp2: overlays[0].patch names "patches/lab/vllm_double-logs.patch", which is not in the recipes '
        "folder (%s); put the file there." % tmp_path]


def test_mounts_and_endpoints_are_rendered(capsys: pytest.CaptureFixture[str]) -> None:
    head, worker = run_module(lab_args(), capsys)["ranks"]
    assert head["mounts"] == [] and worker["mounts"] == []
    assert head["endpoints"]["health"] == "/health" and worker["endpoints"] == {}


def test_failure_on_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    ranks = [{"rank": 0, "head_fabric_ip": "10.77.1.11"}, {"rank": 0, "head_fabric_ip": "10.77.1.11"},
             {"rank": 5, "head_fabric_ip": "10.77.1.11"}]
    result = run_module(lab_args(ranks=ranks), capsys)
    assert result["errors"] == [
        "recipe lab-tp2: rank 0 is given twice in ranks; give each rank once.",
        "recipe lab-tp2: rank 5 is outside the cluster of 2 nodes; ranks go from 0 to 1.",
    ]


def test_failure_on_a_bad_deployment_name(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_module(lab_args(deployment="my lab"), capsys)
    assert result["failed"] is True
    assert result["msg"].startswith('recipe lab-tp2: rank 0: deployment is "my lab"; use letters')


def test_a_plain_recipe_without_variables(capsys: pytest.CaptureFixture[str]) -> None:
    recipe = {"name": "plain", "engine": "sglang", "image": IMAGE,
              "model": {"repo": "org/model", "revision": COMMIT, "served_name": "m"},
              "parallel": {"tensor": 1}}
    result = run_module({"recipe": recipe, "name": "plain", "deployment": "p", "world_size": 1,
                         "ranks": [{"rank": 0, "head_fabric_ip": "127.0.0.1"}]}, capsys)
    assert result["ranks"][0]["argv"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert result["ranks"][0]["env"] == {}


def test_documentation_is_valid_yaml_and_matches_the_arguments() -> None:
    doc = yaml.safe_load(recipe_render.DOCUMENTATION)
    assert doc["module"] == "recipe_render"
    assert set(doc["options"]) == {"recipe", "name", "deployment", "world_size", "ranks", "hf_token_present",
                                   "variables", "recipe_dir"}
    assert set(doc["options"]["ranks"]["suboptions"]) == {"rank", "head_fabric_ip"}

    def descriptions(options: dict[str, Any]) -> None:
        for spec in options.values():
            text = spec["description"]
            assert all(isinstance(line, str) for line in (text if isinstance(text, list) else [text]))
            descriptions(spec.get("suboptions", {}))

    assert all(isinstance(line, str) for line in doc["description"])
    descriptions(doc["options"])
    yaml.safe_load(recipe_render.EXAMPLES)
    assert set(yaml.safe_load(recipe_render.RETURN)) == {"recipe", "ranks", "engine", "errors"}
