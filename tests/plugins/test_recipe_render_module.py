"""Tests for the recipe_render module, run through its main() as Ansible would run it."""

from __future__ import annotations

import json
import sys
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
    assert worker["env"] == {"VLLM_ENGINE_READY_TIMEOUT_S": "300", "NCCL_DEBUG": "INFO",
                             "NCCL_DEBUG_SUBSYS": "INIT,NET", "VLLM_DOUBLE_LOAD_MIB_S": "64",
                             "VLLM_DOUBLE_LOAD_DELAY_S": "2",
                             "VLLM_DOUBLE_STALL_FILE": "/root/.cache/vllm/sparkserve-stall",
                             "VLLM_DOUBLE_CRASH_FILE": "/root/.cache/vllm/sparkserve-crash"}
    engine = result["engine"]
    assert engine["name"] == "vllm" and engine["host_ip_variable"] == "VLLM_HOST_IP"
    assert engine["endpoints"]["health"] == "/health" and engine["dead_health_pattern"]
    assert [m["name"] for m in engine["cache_mounts"]] == ["vllm", "flashinfer", "triton"]


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
                         'full 40-character commit: sparkserve recipe pin lab-tp2 asks the hub what main points to '
                         'and writes it, keeping main as track (HfApi().model_info(repo, revision="main").sha gives '
                         'it too).')
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
                                   "variables", "ports", "recipe_dir"}
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


# ------------------------------------------------------------ the recipe read from its file (issue 17)

TEXT = f"""name: t
engine: vllm
image: {IMAGE}
model:
  repo: org/model
  revision: '{COMMIT}'
  served_name: m
parallel:
  tensor: 2
launch:
  api_host: 0.0.0.0
engine_args:
  max-model-len: 4096
env:
  NCCL_DEBUG: INFO
"""
WHERE = "recipe t (recipes/t.yml"


def from_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], text: str,
              world_size: int = 2) -> dict[str, Any]:
    """Run the module on recipes/t.yml holding TEXT, from the folder above it, without passing the recipe."""
    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "recipes" / "t.yml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return run_module({"name": "t", "deployment": "d", "world_size": world_size, "recipe_dir": "recipes",
                       "ranks": [{"rank": r, "head_fabric_ip": "10.0.0.1"} for r in range(world_size)]}, capsys)


def test_the_module_reads_the_recipe_file_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    result = from_file(tmp_path, monkeypatch, capsys, TEXT)
    assert not result.get("failed"), result
    assert result["recipe"]["image"] == IMAGE and result["ranks"][0]["argv"][:2] == ["vllm", "serve"]


# Each case: the change to TEXT, and the whole message: the file and the line, the field, the value, the fix.
BAD_FILES = {
    "a YAML syntax error": (
        ("image: " + IMAGE, "image: [unclosed"),
        WHERE + ', line 3, column 8): the file is not valid YAML: expected "," or "]", but got ":" while parsing '
        'a flow sequence (the line reads "image: [unclosed"); close the [ opened there with ], or quote the value '
        "if the [ belongs to it."),
    "a tab": (
        ("  tensor: 2", "\ttensor: 2"),
        WHERE + ', line 9, column 1): the file is not valid YAML: found character "\\t" that cannot start any token '
        'while scanning for the next token (the line reads "\\ttensor: 2"); YAML indents with spaces only; replace '
        "the tab with spaces."),
    "an empty file": (
        (TEXT, "# a recipe, one day\n"),
        WHERE + "): the file is empty; write the recipe's fields there (recipes/README.md lists them; "
        "recipes/lab-tp2.yml is a short example)."),
    "a list": (
        (TEXT, "- name: t\n- engine: vllm\n"),
        WHERE + ", line 1): the file holds a list, not a mapping of fields; write each field at the top level as "
        "KEY: VALUE, without a leading dash (name: t, engine: ..., see recipes/README.md)."),
    "a key given twice": (
        ("engine: vllm\n", "engine: vllm\nengine: sglang\n"),
        WHERE + ", line 3): engine is given twice in one mapping (first at line 2); YAML keeps only the last, so "
        "keep one."),
    "a key one level up": (
        ("parallel:\n  tensor: 2\n", "tensor: 2\nparallel:\n  pipeline: 1\n"),
        WHERE + ", line 8): tensor is not a field of a recipe; did you mean `parallel.tensor`? (the fields are in "
        "recipes/README.md)."),
    "an owned flag one letter off": (
        ("  max-model-len: 4096", "  tensor-paralel-size: 2"),
        WHERE + ", line 13): engine_args.tensor-paralel-size is 2; it is one letter off --tensor-parallel-size, "
        "which sparkserve sets itself from parallel.tensor: did you mean `parallel.tensor`? Set that field and "
        "remove this key from engine_args."),
    "a secret in env": (
        ("  NCCL_DEBUG: INFO", "  HF_TOKEN: hf_not_a_real_token"),
        WHERE + ", line 15): env.HF_TOKEN is ********; its name says it holds a secret (a TOKEN, KEY, SECRET or "
        "PASSWORD), and a recipe is committed and printed: remove it from the recipe, and keep the Hugging Face "
        "token in Ansible Vault as weights_hf_token (ansible-vault encrypt_string --name weights_hf_token), which "
        "the weights stage uses, and any other secret in Vault too."),
    "an image repository in upper case": (
        ("registry.example:5000/vllm", "registry.example:5000/Team/vLLM"),
        WHERE + ', line 3): image is "registry.example:5000/Team/vLLM@sha256:%s"; Docker accepts only lower-case '
        "repository names (the registry host and the tag may hold capitals; docker pull refuses the rest); write "
        "registry.example:5000/team/vllm@sha256:%s." % ("3f" * 32, "3f" * 32)),
    "an API host with a port": (
        ("0.0.0.0", "0.0.0.0:8000"),
        WHERE + ', line 11): launch.api_host is "0.0.0.0:8000"; give the address alone and the port in '
        "launch.api_port: api_host: 0.0.0.0 and api_port: 8000."),
    "a digest one digit short": (
        ("3f" * 32, "3f" * 31 + "3"),
        WHERE + ', line 3): image is "registry.example:5000/vllm@sha256:%s"; it has 63 hex digits, not the 64 of '
        "a digest; copy the whole digest (docker buildx imagetools inspect IMAGE prints it)." % ("3f" * 31 + "3")),
    "a commit in upper case": (
        (COMMIT, COMMIT.upper()),
        WHERE + ', line 6): model.revision is "%s"; a commit is lower-case hex and character 6 (D) is upper case; '
        "write it in lower case: %s." % (COMMIT.upper(), COMMIT)),
    "a commit with a letter that is not hex": (
        (COMMIT, COMMIT[:-1] + "g"),
        WHERE + ', line 6): model.revision is "%s"; character 40 ("g") is not a hex digit: a commit is 40 '
        'lower-case hex digits, 0-9 and a-f; copy the commit again (HfApi().model_info(repo, revision="main").sha '
        "gives the newest)." % (COMMIT[:-1] + "g")),
}


@pytest.mark.parametrize("change,message", BAD_FILES.values(), ids=list(BAD_FILES))
def test_a_bad_recipe_file_is_refused_naming_the_file_line_field_and_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        change: tuple[str, str], message: str) -> None:
    assert change[0] in TEXT
    result = from_file(tmp_path, monkeypatch, capsys, TEXT.replace(*change))
    assert result["failed"] is True
    assert result["errors"][0] == message, result["errors"]
    assert "hf_not_a_real_token" not in json.dumps(result)


def test_one_node_is_one_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    result = from_file(tmp_path, monkeypatch, capsys, TEXT, world_size=1)
    assert result["errors"] == [
        WHERE + ", line 9): parallel.tensor × parallel.pipeline is 2 × 1 = 2 GPUs but the cluster has 1 node × "
        "parallel.gpus_per_node 1 = 1 GPU; make the two equal, by changing parallel.tensor or by deploying on 2 nodes."]


def test_a_missing_recipe_file_and_a_missing_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    args = {"name": "t", "deployment": "d", "world_size": 1, "ranks": [{"rank": 0, "head_fabric_ip": "10.0.0.1"}]}
    assert run_module(args, capsys)["msg"] == ("recipe t: neither recipe nor recipe_dir is given; give the recipes "
                                               "folder (recipe_dir), or the loaded recipe.")
    assert run_module(dict(args, recipe_dir=str(tmp_path)), capsys)["msg"] == (
        "recipe t (t.yml): the file does not exist; give the name of a file of the recipes folder, without .yml.")


def test_a_node_without_pyyaml_is_told_to_pass_the_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError, as on a bare node
    result = from_file(tmp_path, monkeypatch, capsys, TEXT)
    assert result["msg"] == (WHERE + "): reading the file needs PyYAML, which this Python lacks; pass the loaded "
                             "recipe as recipe, or run recipe_render from a playbook (its action plugin reads the "
                             "file on the controller).")


def test_recipe_data_that_is_not_a_mapping_is_refused_by_the_validator(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_module(lab_args(recipe=["name", "lab-tp2"]), capsys)
    assert result["errors"] == ['recipe lab-tp2: the recipe is ["name", "lab-tp2"]; it must be a YAML mapping of '
                                "the fields in recipes/README.md."]
