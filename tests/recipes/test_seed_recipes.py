"""The seed recipes and their lab variants: every value a seed states reaches the ranks.

Each seed recipe is validated and rendered through module_utils/recipe/ with
fake cluster inputs, with the values the user supplies filled by test values
(clearly not real ones); without those values the deployment must be refused
with the list of what to supply. The lab variants must validate with only the
variables the lab sets.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import known_flags
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.render import render_rank
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import (
    validate_for_cluster,
    validate_recipe,
    variables_named,
)

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
SEEDS = ("glm53-nvfp4-dflash2-tp4", "glm53-fp4local-mtp-tp2")
LABS = {"lab-glm53-nvfp4-dflash2": 4, "lab-glm53-fp4local-mtp": 2, "lab-sglang-tp2": 2}
LAB_VARIABLES = {
    "lab_engine_image": "sparkserve-lab-registry:5000/sparkserve/engine@sha256:" + "0a" * 32,
    "lab_model_revision": "1b" * 20,
    "lab_release_revision": "2c" * 20,
}
HEAD_IP = "10.77.1.11"

# Test values for what the seeds do not publish: none of them is a real hash or commit.
TEST_SHA = "e" * 64
OVERLAYS = [{"path": "/usr/local/lib/python3.12/dist-packages/vllm/test_overlay_%d.py" % i,
             "original_sha256": "%x" % i * 64, "patch": "patches/glm53-fp4local-mtp-tp2/%d.patch" % i,
             "result_sha256": "%x" % (i + 4) * 64} for i in range(1, 5)]
SUPPLIED = {
    "glm53-nvfp4-dflash2-tp4": {
        "glm53_dflash2_image": "radixark/vllm-glm53-flash@sha256:" + "ab" * 32,
        "glm53_nvfp4_revision": "cd" * 20,
        "glm53_dflash2_draft_revision": "ef" * 20,
    },
    "glm53-fp4local-mtp-tp2": {
        "glm53_fp4local_overlays": OVERLAYS,
        "glm53_fp4local_generation_config_sha256": TEST_SHA,
    },
}


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((RECIPES / f"{name}.yml").read_text(encoding="utf-8"))


def valid(name: str, variables: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    recipe, errors = validate_recipe(load(name), name, variables=variables, **kwargs)
    assert errors == []
    return recipe


def render_all(name: str, variables: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    recipe = valid(name, variables)
    nodes = recipe["parallel"]["tensor"] * recipe["parallel"]["pipeline"] // recipe["parallel"]["gpus_per_node"]
    assert validate_for_cluster(recipe, name, nodes, True) == []
    ranks = [render_rank(recipe, name, rank, nodes, HEAD_IP)
             for rank in range(nodes)]
    json.dumps(ranks)
    return recipe, ranks


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, (name, argv)
    return argv[argv.index(name) + 1]


# ------------------------------------------------------------ seed 000

def test_seed_000_every_stated_value_reaches_every_rank() -> None:
    recipe, ranks = render_all("glm53-nvfp4-dflash2-tp4", SUPPLIED["glm53-nvfp4-dflash2-tp4"])
    assert len(ranks) == 4
    assert recipe["image"] == SUPPLIED["glm53-nvfp4-dflash2-tp4"]["glm53_dflash2_image"]
    assert recipe["model"]["repo"] == "zai-org/GLM-5.3-Flash-NVFP4"
    assert recipe["draft_model"]["repo"] == "incoai/GLM-5.3-Flash-DFlash2"
    assert recipe["launch"]["order"] == "workers_first"  # ranks 3, 2, 1, then the head
    assert recipe["launch"]["head_delay_s"] == 10  # "Wait 10s" before the head
    for rank, out in enumerate(ranks):
        argv = out["argv"]
        assert argv[:3] == ["vllm", "serve", "/models/glm-5.3-flash-nvfp4"]
        assert flag(argv, "--tensor-parallel-size") == "4" and flag(argv, "--nnodes") == "4"
        assert flag(argv, "--node-rank") == str(rank) and flag(argv, "--master-addr") == HEAD_IP
        assert flag(argv, "--served-model-name") == "glm-5.3-flash-dflash2"
        assert flag(argv, "--block-size") == "2304"
        assert flag(argv, "--max-model-len") == "262144"
        assert flag(argv, "--gpu-memory-utilization") == "0.75"
        assert flag(argv, "--kv-cache-dtype") == "fp8_e4m3"
        spec = json.loads(flag(argv, "--speculative-config"))
        assert spec == {"method": "dflash", "model": recipe["draft_model"]["path_in_container"],
                        "num_speculative_tokens": 7}
        # What the seed learned not to use.
        assert "--load-format" not in argv and "instanttensor" not in " ".join(argv)
        for v3 in ("--kv-cache-memory-bytes", "--enable-chunked-prefill", "--default-chat-template-kwargs"):
            assert v3 not in argv
        assert ("--headless" in argv) == (rank > 0)
        assert "VLLM_HOST_IP" not in out["env"], "each node's fabric file gives its own address"
        assert out["mounts"] == []
    head = ranks[0]["argv"]
    assert flag(head, "--host") == "0.0.0.0" and flag(head, "--port") == "8000"
    assert ranks[0]["endpoints"]["health"] == "/health"


def test_seed_000_states_what_it_cannot_render() -> None:
    text = (RECIPES / "glm53-nvfp4-dflash2-tp4.yml").read_text(encoding="utf-8")
    assert "radixark/vllm-glm53-flash:sm121-v8-dflash2-tony" in text
    assert "instanttensor" in text and "0.80" in text and "16GiB" in text
    assert "--enable-chunked-prefill" in text and "enable_thinking" in text


def published(name: str, baseline: str | None = None) -> dict[str, dict[str, Any]]:
    """The recipe's bench.reference as the bench tool reads it: cell label -> figures."""
    sys.path.insert(0, str(RECIPES.parent / "bench"))
    from sparkserve_bench.reference import load_reference
    from sparkserve_bench.suites import load_suites

    assert load_suites(RECIPES / (name + ".yml"))  # the suites parse as the tool runs them
    ref = load_reference(str(RECIPES / (name + ".yml")), published=True, baseline=baseline)
    return {cell.label: cell.metrics for cell in ref.cells}


def test_seed_000_benchmark_and_reference() -> None:
    bench = valid("glm53-nvfp4-dflash2-tp4", SUPPLIED["glm53-nvfp4-dflash2-tp4"])["bench"]
    assert [s["name"] for s in bench["suites"]][:3] == ["coding-peak", "sustained-decode", "prefill"]
    peak = bench["suites"][0]
    assert peak["temperature"] == 0.0 and peak["max_tokens"] == 2000
    figures = published("glm53-nvfp4-dflash2-tp4")
    values = sorted(str(v) for metrics in figures.values() for v in metrics.values())
    for stated in ("69.3", "36.7", "31.6", "56.1", "84.7", "52.5", "64.1", "42.2", "36.8", "64.0", "2.37", "4.84",
                   "37.7", "76.1"):
        assert stated in values, stated
    per_position = [m["acceptance_per_position"] for m in figures.values() if "acceptance_per_position" in m]
    assert per_position and all(len(p) == 7 for p in per_position)


def test_seed_000_needs_four_nodes() -> None:
    recipe = valid("glm53-nvfp4-dflash2-tp4", SUPPLIED["glm53-nvfp4-dflash2-tp4"])
    errors = validate_for_cluster(recipe, "glm53-nvfp4-dflash2-tp4", 2, True)
    assert "4 GPUs but the cluster has 2 nodes" in errors[0]


# ------------------------------------------------------------ seed 003

def test_seed_003_every_stated_value_reaches_every_rank() -> None:
    recipe, ranks = render_all("glm53-fp4local-mtp-tp2", SUPPLIED["glm53-fp4local-mtp-tp2"])
    assert recipe["image"] == ("eugr/spark-vllm-b12x@sha256:"
                               "03a956544e9f9b4b7ba91690469fbe7848bdbef29a7d2e0f5788368467bb3595")
    assert recipe["model"]["repo"] == "nvidia/GLM-5.3-Flash-FP4-Local"
    assert recipe["model"]["revision"] == "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5"
    assert recipe["overlays"] == OVERLAYS
    launch = recipe["launch"]
    assert launch["order"] == "workers_first" and launch["restart_policy"] == "no"
    assert launch["stop_grace_s"] == 60 and launch["memory_limit"] == "110g"
    memory = recipe["memory"]
    assert memory["min_available_gib"] == 100
    assert memory["guard"]["floor_gib"] == 8 and memory["guard"]["samples"] == 3
    assert [out["container_name"] for out in ranks] == ["glm53-qualified-r0", "glm53-qualified-r1"]
    for rank, out in enumerate(ranks):
        argv = out["argv"]
        assert argv[:3] == ["vllm", "serve", "/models/glm53-fp4local"]
        assert flag(argv, "--served-model-name") == "nvidia/GLM-5.3-Flash-FP4-Local"
        assert flag(argv, "--tensor-parallel-size") == "2" and flag(argv, "--nnodes") == "2"
        assert flag(argv, "--node-rank") == str(rank)
        assert flag(argv, "--max-model-len") == "262144"
        assert flag(argv, "--kv-cache-memory-bytes") == "8589934592"
        assert flag(argv, "--kv-cache-dtype") == "fp8"
        assert flag(argv, "--max-num-seqs") == "4"
        assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv
        assert json.loads(flag(argv, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 5}
        assert out["mounts"] == [{"source_rel": "files/glm53-fp4local-mtp-tp2/generation_config.json",
                                  "target": "/models/glm53-fp4local/generation_config.json", "sha256": TEST_SHA}]
    head = ranks[0]
    assert flag(head["argv"], "--host") == "127.0.0.1" and flag(head["argv"], "--port") == "30198"
    assert head["ports"] == [30198, launch["master_port"]]
    assert "--headless" in ranks[1]["argv"] and "--port" not in ranks[1]["argv"]


def test_seed_003_benchmark_reference_and_gates() -> None:
    bench = valid("glm53-fp4local-mtp-tp2", SUPPLIED["glm53-fp4local-mtp-tp2"])["bench"]
    assert bench["gates"]["throughput_floor"] == 0.98 and bench["gates"]["ttft_ceiling"] == 1.05
    qualified = published("glm53-fp4local-mtp-tp2", "qualified")
    original = published("glm53-fp4local-mtp-tp2", "original")
    cells = ["prose-c1", "code-c1", "prose-c2", "prose-c4"]
    speed = {label.split("/")[-1]: m["tok_s"] for label, m in qualified.items() if "tok_s" in m}
    base = {label.split("/")[-1]: m["tok_s"] for label, m in original.items() if "tok_s" in m}
    assert [speed[c] for c in cells] == [31.18, 38.78, 46.11, 64.24]
    assert [base[c] for c in cells] == [25.53, 34.69, 35.06, 49.69]
    ratios = [speed[c] / base[c] for c in cells]
    assert (ratios[0] * ratios[1] * ratios[2] * ratios[3]) ** 0.25 == pytest.approx(1.23434, abs=5e-5)
    suite = next(s for s in bench["suites"] if s["name"] == "speed")
    assert suite["repetitions"] == 3 and [c["concurrency"] for c in suite["primary"]] == [1, 1, 2, 4]
    assert suite["max_tokens"] == 512


def test_seed_003_names_the_eos_override() -> None:
    text = (RECIPES / "glm53-fp4local-mtp-tp2.yml").read_text(encoding="utf-8")
    assert "154828" in text
    assert "154828" in load("glm53-fp4local-mtp-tp2")["supply"]["files/glm53-fp4local-mtp-tp2/generation_config.json"]
    # The seed does not print the file: it is not in the repository, and its hash is the user's to supply.
    assert not (RECIPES / "files/glm53-fp4local-mtp-tp2/generation_config.json").exists()


def test_seed_003_files_are_checked_in_the_recipes_folder(tmp_path: Path) -> None:
    name = "glm53-fp4local-mtp-tp2"
    errors = validate_recipe(load(name), name, variables=SUPPLIED[name], recipes_dir=str(tmp_path))[1]
    assert [e.split(" names ")[0] for e in errors] == [
        "recipe %s: overlays[%d].patch (from the variable glm53_fp4local_overlays)" % (name, i) for i in range(4)
    ] + ["recipe %s: model.file_overrides[0].source" % name]
    assert all("which is not in the recipes folder" in e for e in errors)
    assert "put the file there: model/generation_config.json of" in errors[-1]
    for overlay in OVERLAYS:
        (tmp_path / overlay["patch"]).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / overlay["patch"]).write_text("--- a\n+++ b\n", encoding="utf-8")
    config = tmp_path / "files" / name / "generation_config.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"eos_token_id": [154820, 154828]}\n', encoding="utf-8")  # a test file, not the release's
    [error] = validate_recipe(load(name), name, variables=SUPPLIED[name], recipes_dir=str(tmp_path))[1]
    assert "whose sha256 is" in error and TEST_SHA in error
    # A file without the seed's terminal EOS id is refused for that too, naming what it holds.
    config.write_text('{"eos_token_id": [154820, 154827]}\n', encoding="utf-8")
    errors = validate_recipe(load(name), name, variables=SUPPLIED[name], recipes_dir=str(tmp_path))[1]
    assert errors[1:] == [
        "recipe %s: model.file_overrides[0] (generation_config.json): eos_token_id is [154820, 154827], it must "
        "include 154828; put the right file at files/%s/generation_config.json or correct "
        "model.file_overrides[0].expect." % (name, name)]


# ------------------------------------------------------------ refused without the user's values

@pytest.mark.parametrize("name, listed", [
    ("glm53-nvfp4-dflash2-tp4", [("image_from", "glm53_dflash2_image"),
                                 ("model.revision_from", "glm53_nvfp4_revision"),
                                 ("draft_model.revision_from", "glm53_dflash2_draft_revision")]),
    ("glm53-fp4local-mtp-tp2", [("overlays_from", "glm53_fp4local_overlays"),
                                ("model.file_overrides[0].sha256_from", "glm53_fp4local_generation_config_sha256")]),
])
def test_without_the_supplied_values_the_deployment_is_refused_with_the_list(
        name: str, listed: list[tuple[str, str]]) -> None:
    data = load(name)
    assert validate_recipe(data, name)[1] == []  # the form alone is fine
    assert variables_named(data) == [variable for _, variable in listed]
    errors = validate_recipe(data, name, variables={})[1]
    assert len(errors) == len(listed)
    for error, (key, variable) in zip(errors, listed, strict=True):
        assert error.startswith("recipe %s: %s names the inventory variable %s, which is not set; set it to "
                                % (name, key, variable))
        assert data["supply"][variable].split()[0] in error  # the recipe's own sentence says where to find it
    # One supplied, the rest still listed.
    first = listed[0][1]
    errors = validate_recipe(data, name, variables={first: SUPPLIED[name][first]})[1]
    assert [e.split(" names ")[0] for e in errors] == ["recipe %s: %s" % (name, key) for key, _ in listed[1:]]


def test_every_supply_sentence_belongs_to_a_missing_value() -> None:
    for name in SEEDS:
        data = load(name)
        named = set(variables_named(data))
        for key in data["supply"]:
            assert key in named or (RECIPES / key).suffix, key


# ------------------------------------------------------------ the lab variants

@pytest.mark.parametrize("name", sorted(LABS))
def test_lab_variants_validate_with_only_the_lab_variables(name: str) -> None:
    data = load(name)
    assert set(variables_named(data)) <= set(LAB_VARIABLES)
    recipe, ranks = render_all(name, LAB_VARIABLES)
    assert validate_recipe(data, name, variables=LAB_VARIABLES, recipes_dir=str(RECIPES))[1] == []
    assert len(ranks) == LABS[name] and recipe["supply"] == {}
    assert recipe["memory"]["min_available_gib"] <= 1 and recipe["memory"]["guard"]["floor_gib"] < 1
    assert validate_recipe(data, name, variables={})[1]  # and they do need the lab's variables


def test_lab_dflash2_variant_has_the_seed_000_structure() -> None:
    seed = valid("glm53-nvfp4-dflash2-tp4", SUPPLIED["glm53-nvfp4-dflash2-tp4"])
    lab, ranks = render_all("lab-glm53-nvfp4-dflash2", LAB_VARIABLES)
    for key in ("engine", "parallel", "kv_cache"):
        assert lab[key] == seed[key], key
    assert lab["launch"]["order"] == seed["launch"]["order"]
    assert lab["launch"]["head_delay_s"] == seed["launch"]["head_delay_s"] == 10
    assert lab["engine_args"]["gpu-memory-utilization"] == 0.75
    spec = lab["engine_args"]["speculative-config"]
    assert spec["num_speculative_tokens"] == 7 and spec["model"] == lab["draft_model"]["path_in_container"]
    assert [s["name"] for s in lab["bench"]["suites"]] == [s["name"] for s in seed["bench"]["suites"]]
    assert all("--headless" in out["argv"] for out in ranks[1:])


def test_lab_fp4local_variant_has_the_seed_003_structure() -> None:
    seed = valid("glm53-fp4local-mtp-tp2", SUPPLIED["glm53-fp4local-mtp-tp2"])
    lab, ranks = render_all("lab-glm53-fp4local-mtp", LAB_VARIABLES)
    for key in ("order", "api_host", "api_port", "stop_grace_s", "restart_policy"):
        assert lab["launch"][key] == seed["launch"][key], key
    for key in ("max-num-seqs", "enable-prefix-caching", "enable-chunked-prefill", "speculative-config"):
        assert lab["engine_args"][key] == seed["engine_args"][key], key
    assert lab["kv_cache"]["dtype"] == "fp8" and lab["kv_cache"]["memory_gib_per_rank"] is not None
    assert lab["bench"]["gates"]["throughput_floor"] == 0.98 and lab["bench"]["gates"]["ttft_ceiling"] == 1.05
    assert [out["container_name"] for out in ranks] == ["lab-qualified-r0", "lab-qualified-r1"]
    [mount] = ranks[0]["mounts"]
    assert mount["target"] == "/models/tiny-model/generation_config.json"
    config = json.loads((RECIPES / mount["source_rel"]).read_text(encoding="utf-8"))
    assert config["eos_token_id"] == [2, 3]
    # The lab's EOS id 3 stands in for the seed's 154828, and both recipes say so in expect.
    assert lab["model"]["file_overrides"][0]["expect"] == {"eos_token_id": 3}
    assert seed["model"]["file_overrides"][0]["expect"] == {"eos_token_id": 154828}
    assert ranks[1]["mounts"] == ranks[0]["mounts"]


def test_lab_sglang_variant_runs_sglang_through_the_double() -> None:
    sys.path.insert(0, str(ROOT / "lab/engine"))
    from sglang import launch_server

    recipe, ranks = render_all("lab-sglang-tp2", LAB_VARIABLES)
    assert recipe["engine"] == "sglang"
    for rank, out in enumerate(ranks):
        assert out["argv"][:3] == ["python3", "-m", "sglang.launch_server"]
        args, problems, ns = launch_server.parse_args(out["argv"][3:])
        assert problems == [] and args.node_rank == rank and ns.dist_init_addr == (HEAD_IP, 29501)
        assert "SGLANG_HOST_IP" not in out["env"], "each node's fabric file gives its own address"
        assert "VLLM_ENGINE_READY_TIMEOUT_S" not in out["env"]
    assert ranks[0]["endpoints"]["metrics"] == "/metrics"


# ------------------------------------------------------------ the acceptance check

def test_acceptance_greps() -> None:
    first = (RECIPES / "glm53-nvfp4-dflash2-tp4.yml").read_text(encoding="utf-8").lower()
    for value in ("2304", "262144", "0.75", "fp8", "dflash"):
        assert value in first, value
    second = (RECIPES / "glm53-fp4local-mtp-tp2.yml").read_text(encoding="utf-8").lower()
    for value in ("30198", "154828", "03a956544e9f9b4b7ba91690469fbe7848bdbef29a7d2e0f5788368467bb3595",
                  "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5", "262144"):
        assert value in second, value
    assert re.search(r"8589934592|8 ?gib|8g\b", second)


# ------------------------------------------------------------ every rendered flag is one the engine has

@pytest.mark.parametrize("name", [*SEEDS, *LABS, "lab-tp2", "lab-tp4"])
def test_every_rendered_flag_is_in_the_engine_version_s_flag_list(name: str) -> None:
    variables = SUPPLIED.get(name, LAB_VARIABLES)
    recipe, ranks = render_all(name, variables)
    version = recipe["engine_flags"]["version"] or known_flags.newest(recipe["engine"])
    listed = known_flags.load(recipe["engine"], version)
    adds = {flag.replace("_", "-") for flag in recipe["engine_flags"]["image_adds"]}
    for out in ranks:
        words = [word[2:].split(".", 1)[0] for word in out["argv"] if word.startswith("--")]
        assert words and not [word for word in words if word not in listed.flags and word not in adds], out["argv"]
        # A switch is never followed by a value of its own (the next word is a flag or the end).
        argv = out["argv"]
        for i, word in enumerate(argv):
            if word.startswith("--") and listed.flags.get(word[2:]) == known_flags.SWITCH and i + 1 < len(argv):
                assert argv[i + 1].startswith("--"), (word, argv[i + 1])
