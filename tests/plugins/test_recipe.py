"""Tests for the recipe schema, its validation and the per-rank render (module_utils/recipe/)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.render import render_rank
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import RECIPE_SCHEMA
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import (
    by_digest,
    validate_for_cluster,
    validate_recipe,
    variables_named,
)

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
DIGEST = "sha256:" + "3f" * 32
IMAGE = "registry.example:5000/vllm@" + DIGEST
COMMIT = "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5"
LAB_VARIABLES = {
    "lab_engine_image": "sparkserve-lab-registry:5000/sparkserve/engine@sha256:" + "0a" * 32,
    "lab_model_revision": "1b" * 20,
}


def base(**changes: Any) -> dict[str, Any]:
    """A small valid recipe; keyword arguments replace top-level fields."""
    data: dict[str, Any] = {
        "name": "t",
        "engine": "vllm",
        "image": IMAGE,
        "model": {"repo": "org/model", "revision": COMMIT, "served_name": "m"},
        "parallel": {"tensor": 2},
    }
    data.update(changes)
    return data


def errors_of(data: dict[str, Any], name: str = "t", **kwargs: Any) -> list[str]:
    return validate_recipe(data, name, **kwargs)[1]


def valid(data: dict[str, Any], name: str = "t", **kwargs: Any) -> dict[str, Any]:
    recipe, errors = validate_recipe(data, name, **kwargs)
    assert errors == []
    return recipe


def one_error(data: dict[str, Any], **kwargs: Any) -> str:
    errors = errors_of(data, **kwargs)
    assert len(errors) == 1, errors
    return errors[0]


# ------------------------------------------------------------ defaults

def test_a_minimal_recipe_gets_every_default() -> None:
    recipe = valid(base())
    assert recipe["description"] == ""
    assert recipe["model"]["gated"] is False
    assert recipe["model"]["path_in_container"] == "/models/m"
    assert recipe["parallel"] == {"tensor": 2, "pipeline": 1, "gpus_per_node": 1}
    assert recipe["launch"] == {
        "order": "workers_first", "api_host": "127.0.0.1", "api_port": 8000, "master_port": 29501,
        "extra_ports": [], "container_name": "{deployment}-rank{rank}", "head_delay_s": 0, "stop_grace_s": 60,
        "memory_limit": None, "restart_policy": "no",
    }
    assert recipe["engine_args"] == {} and recipe["env"] == {} and recipe["overlays"] == []
    assert recipe["kv_cache"] == {"dtype": None, "block_size": None, "memory_gib_per_rank": None}
    assert recipe["memory"] == {
        "min_available_gib": 100,
        "budget_gib": None,
        "guard": {"floor_gib": 8, "samples": 3, "watch": "both", "action": "kill", "stop_grace_s": 10,
                  "at_boot": False},
        "flusher": {"mode": "unconditional", "interval_s": 2},
    }
    assert recipe["readiness"]["timeout_s"] == 3600 and recipe["readiness"]["canary_prompt"]
    assert recipe["host"] == {"driver_versions": ["580."], "min_free_disk_gib": None}
    assert recipe["draft_model"] is None and recipe["bench"] is None


def test_defaults_do_not_leak_between_recipes() -> None:
    first = valid(base())
    first["host"]["driver_versions"].append("590.")
    assert valid(base())["host"]["driver_versions"] == ["580."]


def test_given_values_win_over_defaults_and_input_is_not_changed() -> None:
    data = base(launch={"api_port": 30198, "order": "head_first"},
                model={"repo": "org/model", "revision": COMMIT, "served_name": "m", "path_in_container": "/srv/m"})
    before = copy.deepcopy(data)
    recipe = valid(data)
    assert recipe["launch"]["api_port"] == 30198 and recipe["launch"]["order"] == "head_first"
    assert recipe["launch"]["master_port"] == 29501
    assert recipe["model"]["path_in_container"] == "/srv/m"
    assert data == before


def test_engine_args_keep_file_order() -> None:
    args = {"max-model-len": 262144, "gpu-memory-utilization": 0.75, "enable-chunked-prefill": True}
    assert list(valid(base(engine_args=args))["engine_args"]) == list(args)


def test_optional_sections_are_accepted() -> None:
    recipe = valid(base(
        draft_model={"repo": "org/draft", "revision": COMMIT},
        overlays=[{"path": "/usr/lib/python3/x.py", "original_sha256": "a" * 64, "patch": "p/x.diff",
                   "result_sha256": "b" * 64}],
        bench={"suites": [{"name": "speed"}, "smoke"], "reference": {"file": "r.json"},
               "gates": {"throughput_floor": 0.98, "ttft_ceiling": 1.05}},
        kv_cache={"dtype": "fp8", "block_size": 2304, "memory_gib_per_rank": 8},
        launch={"memory_limit": "110g", "extra_ports": [30000]},
    ))
    assert recipe["draft_model"] == {"repo": "org/draft", "revision": COMMIT, "revision_from": None, "track": None,
                                     "gated": False, "path_in_container": "/models/draft", "file_overrides": []}
    assert recipe["bench"]["gates"]["throughput_floor"] == 0.98


# ------------------------------------------------------------ rules of validate_recipe

def test_style_example_revision_main() -> None:
    data = base(name="glm53-fp4local-mtp-tp2",
                model={"repo": "nvidia/GLM-5.3-Flash-FP4-Local", "revision": "main", "served_name": "glm"})
    assert one_error(data, name="glm53-fp4local-mtp-tp2") == (
        'recipe glm53-fp4local-mtp-tp2: model.revision is "main"; pin the full 40-character commit: sparkserve '
        'recipe pin glm53-fp4local-mtp-tp2 asks the hub what main points to and writes it, keeping main as track '
        '(HfApi().model_info(repo, revision="main").sha gives it too).'
    )


def test_short_commit_is_refused() -> None:
    message = one_error(base(model={"repo": "org/model", "revision": COMMIT[:12], "served_name": "m"}))
    assert 'model.revision is "%s"' % COMMIT[:12] in message and "40-character" in message


def test_image_by_tag_is_refused() -> None:
    message = one_error(base(image="eugr/spark-vllm-b12x:latest"))
    assert message.startswith('recipe t: image is "eugr/spark-vllm-b12x:latest"; pin the image by digest')
    assert "REPO:TAG@sha256:<64 hex>: sparkserve recipe pin t asks the registry and writes it" in message


def test_image_with_a_short_digest_is_refused() -> None:
    assert "image is" in one_error(base(image="repo@sha256:abc"))


def test_image_or_image_from_is_required_but_not_both() -> None:
    data = base()
    del data["image"]
    assert one_error(data) == ("recipe t: image is missing; set image, or image_from to the name of an "
                               "inventory variable that holds it.")
    assert one_error(base(image_from="lab_engine_image")) == (
        "recipe t: image and image_from are all set; keep exactly one of them.")


def test_revision_or_revision_from_is_required() -> None:
    assert "model.revision is missing" in one_error(base(model={"repo": "org/model", "served_name": "m"}))


def test_bad_engine() -> None:
    assert one_error(base(engine="trtllm")) == 'recipe t: engine is "trtllm"; use one of: sglang, vllm.'


def test_bad_order() -> None:
    assert one_error(base(launch={"order": "random"})) == (
        'recipe t: launch.order is "random"; use one of: workers_first, head_first.')


@pytest.mark.parametrize("field,value", [("api_port", 0), ("api_port", 70000), ("master_port", 65536)])
def test_ports_out_of_range(field: str, value: int) -> None:
    assert one_error(base(launch={field: value})) == (
        "recipe t: launch.%s is %d; use a TCP port between 1 and 65535." % (field, value))


def test_extra_port_out_of_range() -> None:
    assert one_error(base(launch={"extra_ports": [99999]})) == (
        "recipe t: launch.extra_ports[0] is 99999; use TCP ports between 1 and 65535.")


def test_api_and_master_port_collide() -> None:
    assert one_error(base(launch={"api_port": 29501})) == (
        "recipe t: launch.master_port is 29501; it is already launch.api_port; "
        "give every port of the deployment a different number.")


def test_extra_ports_collide_with_the_others_and_each_other() -> None:
    errors = errors_of(base(launch={"extra_ports": [8000, 30000, 30000]}))
    assert errors == [
        "recipe t: launch.extra_ports[0] is 8000; it is already launch.api_port; "
        "give every port of the deployment a different number.",
        "recipe t: launch.extra_ports[2] is 30000; it is already launch.extra_ports[1]; "
        "give every port of the deployment a different number.",
    ]


def test_unknown_keys_are_errors_at_every_level() -> None:
    data = base(served_name="m", launch={"ordre": "head_first"})
    data["model"]["sha"] = COMMIT
    errors = errors_of(data)
    assert len(errors) == 3
    # A close match, at its own level or one level down or up, is named; without one, the level's fields are.
    assert errors[0] == ("recipe t: served_name is not a field of a recipe; did you mean `model.served_name`? "
                         "(the fields are in recipes/README.md).")
    assert any(e.startswith("recipe t: model.sha is not a field of model; use one of: repo, revision, "
                            "revision_from, track, served_name, aliases, gated, path_in_container") for e in errors)
    assert "recipe t: launch.ordre is not a field of launch; did you mean `launch.order`? " \
           "(the fields are in recipes/README.md)." in errors


def test_unknown_key_in_an_overlay() -> None:
    overlay = {"path": "/a.py", "original_sha256": "a" * 64, "patch": "a.diff", "result_sha256": "b" * 64,
               "fuzz": 2}
    assert "overlays[0].fuzz is not a field of overlays[0]" in one_error(base(overlays=[overlay]))


def test_missing_required_fields() -> None:
    errors = errors_of({"name": "t", "image": IMAGE})
    assert errors[0] == ("recipe t: engine is missing; add it (The serving engine; its adapter decides the command "
                         "line).")
    assert any(e.startswith("recipe t: model is missing; add it") for e in errors)
    assert any(e.startswith("recipe t: parallel is missing; add it") for e in errors)


def test_missing_nested_required_field() -> None:
    assert one_error(base(parallel={"pipeline": 2})).startswith(
        "recipe t: parallel.tensor is missing; add it (Tensor-parallel size).")


def test_wrong_types_name_the_type() -> None:
    assert one_error(base(parallel={"tensor": "two"})) == (
        'recipe t: parallel.tensor is "two"; it must be an integer.')
    assert one_error(base(parallel={"tensor": True})) == "recipe t: parallel.tensor is true; it must be an integer."
    assert one_error(base(engine_args=["max-model-len"])) == (
        'recipe t: engine_args is ["max-model-len"]; it must be a mapping.')


def test_bare_yaml_no_for_restart_policy_says_quote_it() -> None:
    data = yaml.safe_load("restart_policy: no")
    message = one_error(base(launch=data))
    assert message.startswith("recipe t: launch.restart_policy is false; it must be a string (quote it")


def test_env_values_must_be_strings() -> None:
    assert one_error(base(env={"NCCL_IB_DISABLE": 0})).startswith(
        "recipe t: env.NCCL_IB_DISABLE is 0; it must be a string (quote it")


def test_env_names_are_checked() -> None:
    assert "env key is \"NCCL-DEBUG\"" in one_error(base(env={"NCCL-DEBUG": "INFO"}))


def test_name_must_match_the_file() -> None:
    assert one_error(base(name="other")) == (
        'recipe t: name is "other"; make it "t", the name the recipe is loaded under (recipes/t.yml).')


def test_engine_args_keys_without_dashes() -> None:
    assert one_error(base(engine_args={"--max-model-len": 4096})) == (
        'recipe t: engine_args key is "--max-model-len"; write it without leading dashes: max-model-len.')


@pytest.mark.parametrize("key,field", [
    ("tensor-parallel-size", "parallel.tensor"),
    ("tensor_parallel_size", "parallel.tensor"),
    ("port", "launch.api_port"),
    ("headless", "the node's rank"),
    ("kv-cache-dtype", "kv_cache.dtype"),
])
def test_engine_args_may_not_set_what_the_render_sets(key: str, field: str) -> None:
    message = one_error(base(engine_args={key: 4}))
    assert message == "recipe t: engine_args.%s is 4; sparkserve sets --%s from %s; remove it from engine_args." % (
        key, key.replace("_", "-"), field)


def test_sglang_owned_flags_differ() -> None:
    assert "from kv_cache.block_size" in one_error(base(engine="sglang", engine_args={"page-size": 64}))
    valid(base(engine="sglang", engine_args={"mem-fraction-static": 0.8}))


def test_engine_args_values_are_checked() -> None:
    assert "a list value may hold only" in one_error(base(engine_args={"x": [{"a": 1}]},
                                                          engine_flags={"image_adds": ["x"]}))


def test_sglang_has_no_kv_bytes_flag() -> None:
    message = one_error(base(engine="sglang", kv_cache={"memory_gib_per_rank": 8}))
    assert message.startswith("recipe t: kv_cache.memory_gib_per_rank is 8; SGLang has no flag")


def test_model_aliases() -> None:
    model = {"repo": "org/model", "revision": COMMIT, "served_name": "m"}
    head = rendered(base(model={**model, "aliases": ["m-latest", "org/m"]}), 0)
    names = head["argv"][head["argv"].index("--served-model-name") + 1:head["argv"].index("--tensor-parallel-size")]
    assert names == ["m", "m-latest", "org/m"]
    assert "served_name" in one_error(base(model={**model, "aliases": ["x", "m"]}))
    assert "an alias" in one_error(base(model={**model, "aliases": ["x", "x"]}))
    assert "letters, digits" in one_error(base(model={**model, "aliases": ["bad name"]}))
    message = one_error(base(engine="sglang", model={**model, "aliases": ["x"]}))
    assert message.startswith("recipe t: model.aliases is [\"x\"]; SGLang serves one name"), message


def test_container_name_pattern() -> None:
    assert "use only {deployment} and {rank}" in one_error(base(launch={"container_name": "{deployment}"}))
    assert "use only {deployment} and {rank}" in one_error(base(launch={"container_name": "{name}-{rank}"}))
    assert "a container name may hold only" in one_error(base(launch={"container_name": "{deployment} {rank}"}))
    valid(base(launch={"container_name": "glm53-qualified-r{rank}"}))


def test_guard_floor_below_the_gate() -> None:
    message = one_error(base(memory={"min_available_gib": 4}))
    assert message.startswith("recipe t: memory.guard.floor_gib is 8; it must be below memory.min_available_gib (4)")


def test_choices_of_memory_fields() -> None:
    assert one_error(base(memory={"guard": {"watch": "MemTotal"}})) == (
        'recipe t: memory.guard.watch is "MemTotal"; use one of: MemAvailable, MemFree, both.')
    assert "memory.flusher.mode" in one_error(base(memory={"flusher": {"mode": "sometimes"}}))


def test_overlay_hashes_are_checked() -> None:
    overlay = {"path": "x.py", "original_sha256": "short", "patch": "a.diff", "result_sha256": "b" * 64}
    errors = errors_of(base(overlays=[overlay]))
    assert any(e.startswith('recipe t: overlays[0].path is "x.py"; give the absolute path') for e in errors)
    assert any(e.startswith('recipe t: overlays[0].original_sha256 is "short"; give the 64 hex digits')
               for e in errors)


def test_memory_limit_form() -> None:
    assert one_error(base(launch={"memory_limit": "110 GiB"})) == (
        'recipe t: launch.memory_limit is "110 GiB"; give a docker memory size such as 110g.')


def test_draft_model_path_may_not_be_the_models() -> None:
    data = base(draft_model={"repo": "org/d", "revision": COMMIT, "path_in_container": "/models/m"})
    assert "it is model.path_in_container too" in one_error(data)


def test_a_recipe_that_is_not_a_mapping() -> None:
    recipe, errors = validate_recipe(["x"], "t")  # type: ignore[arg-type]
    assert recipe == {} and errors == ['recipe t: the recipe is ["x"]; it must be a YAML mapping of the fields '
                                       'in recipes/README.md.']


def test_every_problem_is_reported_at_once() -> None:
    data = base(engine="tgi", image="repo:tag", launch={"order": "x", "api_port": 29501})
    data["model"]["revision"] = "main"
    assert len(errors_of(data)) == 5


# ------------------------------------------------------------ *_from keys

def test_from_keys_resolve_and_are_checked_like_the_value() -> None:
    data = base(image_from="engine_image")
    del data["image"]
    data["model"] = {"repo": "org/model", "revision_from": "model_rev", "served_name": "m"}
    recipe = valid(data, variables={"engine_image": IMAGE, "model_rev": COMMIT})
    assert recipe["image"] == IMAGE and recipe["image_from"] == "engine_image"
    assert recipe["model"]["revision"] == COMMIT
    errors = errors_of(data, variables={"engine_image": "repo:latest", "model_rev": "main"})
    assert errors[0].startswith('recipe t: image (from the variable engine_image) is "repo:latest"; pin the image')
    assert errors[1].startswith('recipe t: model.revision (from the variable model_rev) is "main"; pin the full')


def test_from_keys_name_a_missing_variable() -> None:
    data = base(image_from="engine_image")
    del data["image"]
    assert one_error(data, variables={}) == (
        "recipe t: image_from names the inventory variable engine_image, which is not set; set it to the image "
        "pinned by digest, REPO@sha256:<64 hex> (docker buildx imagetools inspect IMAGE prints the digest).")


def test_from_keys_without_variables_are_checked_for_form_only() -> None:
    data = base(image_from="engine_image")
    del data["image"]
    assert valid(data)["image"] is None
    data["image_from"] = "not a name"
    assert 'image_from is "not a name"; give the name of an inventory variable' in one_error(data)


def test_every_from_field_resolves_and_every_missing_one_is_listed_at_once() -> None:
    overlay = {"path": "/a.py", "original_sha256": "a" * 64, "patch": "p/a.diff", "result_sha256": "b" * 64}
    data = base(overlays_from="my_overlays",
                model={"repo": "org/model", "revision_from": "model_rev", "served_name": "m",
                       "file_overrides": [{"path": "generation_config.json", "source": "files/t/g.json",
                                           "sha256_from": "g_sha"}]})
    variables = {"my_overlays": [overlay], "model_rev": COMMIT, "g_sha": "c" * 64}
    recipe = valid(data, variables=variables)
    assert recipe["overlays"] == [overlay] and recipe["overlays_from"] == "my_overlays"
    assert recipe["model"]["file_overrides"][0]["sha256"] == "c" * 64
    assert variables_named(data) == ["my_overlays", "model_rev", "g_sha"]
    errors = errors_of(data, variables={"model_rev": None})
    assert errors == [
        "recipe t: overlays_from names the inventory variable my_overlays, which is not set; set it to a list of "
        "overlays, each {path, original_sha256, patch, result_sha256} as recipes/README.md describes them, with "
        "each patch file put in the recipes folder.",
        "recipe t: model.revision_from names the inventory variable model_rev, which is not set; set it to the full "
        '40-character commit of org/model (HfApi().model_info("org/model").sha gives the newest).',
        "recipe t: model.file_overrides[0].sha256_from names the inventory variable g_sha, which is not set; set it "
        "to the 64 hex digits of sha256sum files/t/g.json.",
    ]


def test_supply_says_where_to_find_a_missing_value() -> None:
    data = base(image_from="engine_image", supply={"engine_image": "the digest of org/engine:v8 (see its README)"})
    del data["image"]
    assert one_error(data, variables={}) == (
        "recipe t: image_from names the inventory variable engine_image, which is not set; set it to the digest of "
        "org/engine:v8 (see its README).")


def test_supply_must_name_a_variable_or_a_file_of_the_recipe() -> None:
    message = one_error(base(supply={"nobody": "x"}))
    assert message == ('recipe t: supply key is "nobody"; it names no variable of a *_from field and no file of '
                       "the recipe; name one of: none (remove supply).")
    overlay = {"path": "/a.py", "original_sha256": "a" * 64, "patch": "p/a.diff", "result_sha256": "b" * 64}
    valid(base(overlays=[overlay], supply={"p/a.diff": "the release's diff"}))


def test_an_overlay_patch_stays_in_the_recipes_folder() -> None:
    for patch in ("../../etc/x.patch", "/tmp/x.patch"):
        overlay = {"path": "/a.py", "original_sha256": "a" * 64, "patch": patch, "result_sha256": "b" * 64}
        assert one_error(base(overlays=[overlay])) == (
            'recipe t: overlays[0].patch is "%s"; give the patch file relative to the recipes folder, without .. '
            "(patches/RECIPE/NAME.patch)." % patch)


def test_a_value_and_its_from_twin_are_not_both_set() -> None:
    overlay = {"path": "/a.py", "original_sha256": "a" * 64, "patch": "p/a.diff", "result_sha256": "b" * 64}
    assert one_error(base(overlays=[overlay], overlays_from="x")) == (
        "recipe t: overlays and overlays_from are both set; keep one of them.")


def test_resolved_list_items_are_checked_and_labelled_with_their_variable() -> None:
    bad = {"path": "a.py", "original_sha256": "a" * 64, "patch": "p/a.diff", "result_sha256": "b" * 64}
    message = one_error(base(overlays_from="ov"), variables={"ov": [bad]})
    assert message.startswith('recipe t: overlays[0].path (from the variable ov) is "a.py"; give the absolute path')


def override(**changes: Any) -> dict[str, Any]:
    item = {"path": "generation_config.json", "source": "files/t/generation_config.json", "sha256": "c" * 64}
    item.update(changes)
    return item


def test_file_overrides_are_checked() -> None:
    def model(*items: dict[str, Any]) -> dict[str, Any]:
        return base(model={"repo": "org/model", "revision": COMMIT, "served_name": "m", "file_overrides": list(items)})

    valid(model(override(), override(path="tokenizer_config.json")))
    assert "give the file's path relative to the model folder" in one_error(model(override(path="/etc/passwd")))
    assert "without .." in one_error(model(override(path="../x/config.json")))
    assert "without .." in one_error(model(override(source="../../etc/passwd")))
    assert "weight shards are never replaced" in one_error(model(override(path="model-00001-of-00002.safetensors")))
    assert "it is already model.file_overrides[0].path" in one_error(
        model(override(), override(path="./generation_config.json")))
    assert one_error(model(override(sha256=None))) == (
        "recipe t: model.file_overrides[0].sha256 is missing; set model.file_overrides[0].sha256, or "
        "model.file_overrides[0].sha256_from to the name of an inventory variable that holds it.")
    assert "give the 64 hex digits" in one_error(model(override(sha256="abc")))
    draft = base(draft_model={"repo": "org/d", "revision": COMMIT, "file_overrides": [override(path="x.bin")]})
    assert "draft_model.file_overrides[0].path" in one_error(draft)


def test_recipes_dir_checks_named_files_and_override_hashes(tmp_path: Path) -> None:
    (tmp_path / "files/t").mkdir(parents=True)
    content = b'{"eos_token_id": [2, 3]}\n'
    (tmp_path / "files/t/generation_config.json").write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    overlay = {"path": "/a.py", "original_sha256": "a" * 64, "patch": "patches/t/a.diff", "result_sha256": "b" * 64}
    data = base(overlays=[overlay], supply={"patches/t/a.diff": "the release's first diff"},
                model={"repo": "org/model", "revision": COMMIT, "served_name": "m",
                       "file_overrides": [override(sha256=digest)]})
    assert errors_of(data, recipes_dir=str(tmp_path)) == [
        'recipe t: overlays[0].patch names "patches/t/a.diff", which is not in the recipes folder (%s); put the '
        "file there: the release's first diff." % tmp_path]
    (tmp_path / "patches/t").mkdir(parents=True)
    (tmp_path / "patches/t/a.diff").write_text("--- a\n+++ b\n", encoding="utf-8")
    assert errors_of(data, recipes_dir=str(tmp_path)) == []
    data["model"]["file_overrides"][0]["sha256"] = "d" * 64
    assert errors_of(data, recipes_dir=str(tmp_path)) == [
        'recipe t: model.file_overrides[0].source names "files/t/generation_config.json", whose sha256 is %s, not '
        "the %s given in model.file_overrides[0].sha256; put the right file there or correct the hash."
        % (digest, "d" * 64)]


def test_sglang_names_its_fp8_kv_formats() -> None:
    assert one_error(base(engine="sglang", kv_cache={"dtype": "fp8"})) == (
        'recipe t: kv_cache.dtype is "fp8"; SGLang names the FP8 formats fp8_e4m3 and fp8_e5m2; give one of them.')
    valid(base(engine="sglang", kv_cache={"dtype": "fp8_e4m3"}))


def test_recipe_variables_filter() -> None:
    from ansible_collections.sparkserve.deploy.plugins.filter import recipe_variables as rf

    data = yaml.safe_load((RECIPES / "lab-tp2.yml").read_text(encoding="utf-8"))
    assert rf.FilterModule().filters()["recipe_variables"](data) == ["lab_engine_image", "lab_model_revision"]
    assert rf.recipe_variables("not a recipe") == []
    # The file's text works too; a text that is not YAML names no variable (recipe_render says why).
    assert rf.recipe_variables((RECIPES / "lab-tp2.yml").read_text(encoding="utf-8")) == [
        "lab_engine_image", "lab_model_revision"]
    assert rf.recipe_variables("image: [unclosed\n") == []
    yaml.safe_load(rf.DOCUMENTATION)


# ------------------------------------------------------------ validate_for_cluster

def test_cluster_size_must_match_the_parallel_sizes() -> None:
    recipe = valid(base())
    assert validate_for_cluster(recipe, "t", 2, False) == []
    assert validate_for_cluster(recipe, "t", 4, False) == [
        "recipe t: parallel.tensor × parallel.pipeline is 2 × 1 = 2 GPUs but the cluster has 4 nodes × "
        "parallel.gpus_per_node 1 = 4 GPUs; make the two equal, by changing parallel.tensor or by "
        "deploying on 2 nodes."
    ]


def test_cluster_size_counts_pipeline_and_gpus_per_node() -> None:
    recipe = valid(base(parallel={"tensor": 2, "pipeline": 2, "gpus_per_node": 2}))
    assert validate_for_cluster(recipe, "t", 2, False) == []
    assert ("is 2 × 2 = 4 GPUs but the cluster has 3 nodes × parallel.gpus_per_node 2 = 6 GPUs"
            in validate_for_cluster(recipe, "t", 3, False)[0])


@pytest.mark.parametrize("key", ["load-format", "load_format"])
def test_instanttensor_is_refused_on_several_nodes(key: str) -> None:
    recipe = valid(base(engine_args={key: "instanttensor"}))
    assert validate_for_cluster(recipe, "t", 2, False) == [
        'recipe t: engine_args.%s is "instanttensor"; instanttensor loads made ranks die silently on more '
        "than one node (seed 000); remove it for this 2-node deployment." % key
    ]
    single = valid(base(engine_args={key: "instanttensor"}, parallel={"tensor": 1}))
    assert validate_for_cluster(single, "t", 1, False) == []


def test_gated_model_needs_a_token() -> None:
    recipe = valid(base(model={"repo": "meta/llama", "revision": COMMIT, "served_name": "m", "gated": True}))
    assert validate_for_cluster(recipe, "t", 2, True) == []
    assert validate_for_cluster(recipe, "t", 2, False) == [
        'recipe t: model.gated is true for "meta/llama" and no Hugging Face token is configured; put the token '
        "in the Ansible Vault variable weights_hf_token, or export HF_TOKEN where the playbook runs."
    ]


def test_gated_draft_model_needs_a_token() -> None:
    recipe = valid(base(draft_model={"repo": "org/d", "revision": COMMIT, "gated": True}))
    assert validate_for_cluster(recipe, "t", 2, False)[0].startswith("recipe t: draft_model.gated is true")


def test_bad_world_size() -> None:
    assert "deploy on at least one node" in validate_for_cluster(valid(base()), "t", 0, False)[0]


def test_cluster_check_survives_an_invalid_recipe() -> None:
    recipe, errors = validate_recipe({"name": "t", "parallel": [], "engine_args": "x"}, "t")
    assert errors
    assert validate_for_cluster(recipe, "t", 2, False) == []


# ------------------------------------------------------------ bad input, second round (issue 17)

@pytest.mark.parametrize("data,key,meant", [
    (base(tensor=2), "tensor", "`parallel.tensor`"),
    (base(guard={"floor_gib": 4}), "guard", "`memory.guard`"),
    (base(**{"served-name": "m"}), "served-name", "`model.served_name`"),
    (base(parallel={"tensor": 2, "tensr": 2}), "parallel.tensr", "`parallel.tensor`"),
    (base(launch={"min_available_gb": 90}), "launch.min_available_gb", "`memory.min_available_gib`"),
    (base(memory={"guard": {"flor_gib": 4}}), "memory.guard.flor_gib", "`memory.guard.floor_gib`"),
    (base(model={"repo": "org/model", "revision": COMMIT, "served_name": "m",
                 "file_overrides": [{"path": "a.json", "source": "files/a.json", "sha265": "a" * 64}]}),
     "model.file_overrides[0].sha265", "`model.file_overrides[0].sha256`"),
])
def test_an_unknown_key_names_its_close_match_at_its_level_or_one_away(data: dict[str, Any], key: str,
                                                                       meant: str) -> None:
    assert "recipe t: %s is not a field of %s; did you mean %s? (the fields are in recipes/README.md)." % (
        key, key.rsplit(".", 1)[0] if "." in key else "a recipe", meant) in errors_of(data)


def test_an_unknown_key_without_a_close_match_lists_its_level() -> None:
    assert one_error(base(replicas=2)).startswith(
        "recipe t: replicas is not a field of a recipe; use one of: name, description, engine,")


@pytest.mark.parametrize("engine,key,near,field", [
    ("vllm", "tensor-paralel-size", "tensor-parallel-size", "parallel.tensor"),
    ("vllm", "pipline_parallel_size", "pipeline-parallel-size", "parallel.pipeline"),
    ("vllm", "served-model-nam", "served-model-name", "model.served_name"),
    ("vllm", "kv-cache-dtpye", "kv-cache-dtype", "kv_cache.dtype"),
    ("vllm", "prot", "port", "launch.api_port"),
    ("sglang", "page-sise", "page-size", "kv_cache.block_size"),
])
def test_an_engine_flag_one_letter_off_an_owned_one_is_refused(engine: str, key: str, near: str, field: str) -> None:
    assert one_error(base(engine=engine, engine_args={key: 4})) == (
        "recipe t: engine_args.%s is 4; it is one letter off --%s, which sparkserve sets itself from %s: did you "
        "mean `%s`? Set that field and remove this key from engine_args." % (key, near, field, field))


def test_an_owned_flag_set_from_the_cluster_one_letter_off() -> None:
    assert one_error(base(engine_args={"nnode": 2})) == (
        "recipe t: engine_args.nnode is 2; it is one letter off --nnodes, which sparkserve sets itself from the "
        "cluster's node count: remove this key from engine_args.")


@pytest.mark.parametrize("engine,key", [
    ("sglang", "dp-size"), ("sglang", "ep-size"), ("vllm", "data-parallel-size"), ("vllm", "max-model-len"),
    ("vllm", "max-num-seqs"), ("sglang", "context-length"),
])
def test_real_engine_flags_near_owned_ones_pass(engine: str, key: str) -> None:
    valid(base(engine=engine, engine_args={key: 2}))


FLAGS_FILE = "plugins/module_utils/engines/flags/%s-%s.json"


@pytest.mark.parametrize("engine,key,fix", [
    ("vllm", "max-modle-len", "did you mean --max-model-len? vllm 0.31.0's parser (%s) has no --max-modle-len"
     % FLAGS_FILE % ("vllm", "0.31.0")),
    ("vllm", "enable-prefix-cacheing", "did you mean --enable-prefix-caching or --no-enable-prefix-caching?"),
    ("sglang", "mem-fraction-statik", "did you mean --mem-fraction-static?"),
    # SGLang 0.5.21 split --cuda-graph-bs in two; the old spelling is an ambiguous abbreviation there.
    ("sglang", "cuda-graph-bs", "did you mean --cuda-graph-bs-decode or --cuda-graph-bs-prefill? sglang 0.5.21's "
     "parser (%s) has no --cuda-graph-bs" % FLAGS_FILE % ("sglang", "0.5.21")),
    ("vllm", "totally-made-up", "vllm 0.31.0's parser (%s) has no --totally-made-up; if the image adds it (a "
     "patched image), list it under engine_flags.image_adds." % FLAGS_FILE % ("vllm", "0.31.0")),
])
def test_a_flag_the_engine_does_not_have_is_refused_with_its_close_match(engine: str, key: str, fix: str) -> None:
    message = one_error(base(engine=engine, engine_args={key: 2}))
    assert message.startswith("recipe t: engine_args.%s is 2; " % key) and fix in message
    assert message.endswith("list it under engine_flags.image_adds.")


def test_an_abbreviated_flag_is_refused_with_its_full_name() -> None:
    assert one_error(base(engine_args={"max-model": 4096})) == (
        "recipe t: engine_args.max-model is 4096; it abbreviates --max-model-len of vllm 0.31.0's parser (%s); "
        "write it in full (an abbreviation changes meaning when the engine adds a flag with the same start)."
        % FLAGS_FILE % ("vllm", "0.31.0"))
    # An abbreviation of a flag sparkserve sets (argparse would expand it to that flag).
    assert one_error(base(engine_args={"kv-cache-memory": 2})) == (
        "recipe t: engine_args.kv-cache-memory is 2; it abbreviates --kv-cache-memory-bytes, which sparkserve sets "
        "itself from kv_cache.memory_gib_per_rank; remove it from engine_args.")


def test_a_flag_of_the_wrong_kind_is_refused() -> None:
    assert one_error(base(engine_args={"enable-prefix-caching": "yes"})) == (
        'recipe t: engine_args.enable-prefix-caching is "yes"; --enable-prefix-caching is a switch in vllm 0.31.0: '
        "write true to set it, false or null to leave it out.")
    assert one_error(base(engine="sglang", engine_args={"context-length": True})) == (
        "recipe t: engine_args.context-length is true; --context-length takes a value in sglang 0.5.21: true would "
        "pass the flag alone; give its value.")
    valid(base(engine_args={"enable-prefix-caching": False, "no-enable-prefix-caching": True,
                            "max_model_len": "32k", "speculative-config.method": "mtp"}))


def test_image_adds_lets_a_patched_image_s_own_flags_pass() -> None:
    args = {"dflash-aux-layers": 3, "max-model-len": 4096}
    assert "has no --dflash-aux-layers" in one_error(base(engine_args=args))
    recipe = valid(base(engine_args=args, engine_flags={"image_adds": ["dflash_aux_layers"]}))
    assert recipe["engine_flags"] == {"version": None, "image_adds": ["dflash_aux_layers"]}


def test_a_flag_list_the_checkout_does_not_ship_is_refused_with_how_to_make_it() -> None:
    assert one_error(base(engine_flags={"version": "0.1.dev21830+g8244d1c44"})) == (
        'recipe t: engine_flags.version is "0.1.dev21830+g8244d1c44"; sparkserve ships the flags of vllm 0.31.0 '
        "only; name the one closest to the version the image carries, or list the image's own flags into "
        "plugins/module_utils/engines/flags/vllm-0.1.dev21830+g8244d1c44.json with: docker run --rm -i "
        "--entrypoint python3 IMAGE - vllm < tools/engine-flags.py.")


@pytest.mark.parametrize("key", ["HF_TOKEN", "hf_token", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "MYAPIKEY",
                                 "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "CLIENT_SECRETS", "Redis_Passwd"])
def test_a_secret_looking_env_name_is_refused_and_its_value_never_shown(key: str) -> None:
    message = one_error(base(env={key: "s3cr3t-value"}))
    assert message.startswith("recipe t: env.%s is ********; its name says it holds a secret" % key)
    assert "Ansible Vault as weights_hf_token (ansible-vault encrypt_string --name weights_hf_token)" in message
    assert "s3cr3t-value" not in message
    # Nor in any other message about it (a value of the wrong type).
    assert not any("12345" in e for e in errors_of(base(env={key: 12345})))


@pytest.mark.parametrize("key", ["TOKENIZERS_PARALLELISM", "VLLM_MAX_TOKENS", "NCCL_DEBUG", "KEYBOARD_LAYOUT",
                                 "NCCL_IB_PKEY", "MONKEY_PATCH"])
def test_env_names_that_only_look_alike_pass(key: str) -> None:
    valid(base(env={key: "x"}))


def test_secrets_are_masked_where_printed() -> None:
    from ansible_collections.sparkserve.deploy.plugins.filter import mask_secrets as ms

    mask = ms.FilterModule().filters()["mask_secrets"]
    assert mask({"HF_TOKEN": "hf_x", "NCCL_DEBUG": "INFO", "TOKENIZERS_PARALLELISM": "false"}) == {
        "HF_TOKEN": "********", "NCCL_DEBUG": "INFO", "TOKENIZERS_PARALLELISM": "false"}
    assert mask(["vllm", "serve", "--api-key", "sk-x", "--api_key=sk-y", "--port", "8000", "--ssl-keyfile",
                 "--enforce-eager"]) == ["vllm", "serve", "--api-key", "********", "--api_key=********", "--port",
                                         "8000", "--ssl-keyfile", "--enforce-eager"]
    assert mask("text") == "text"
    yaml.safe_load(ms.DOCUMENTATION)


# Credential-shaped test values (none is a real token).
HF_LIKE = "hf_" + "aB3" * 12
TOKEN_LIKE = [HF_LIKE, "sk-" + "x9" * 12, "ghp_" + "Q" * 36, "AKIA" + "7" * 16, "xoxb-1234-5678-abcdef"]


@pytest.mark.parametrize("token", TOKEN_LIKE)
def test_a_credential_shaped_value_is_refused_whatever_its_name(token: str) -> None:
    for data, path in ((base(env={"HF_AUTH": token}), "env.HF_AUTH"),
                       (base(engine_args={"allowed-origins": [token]}), "engine_args.allowed-origins"),
                       (base(engine_args={"speculative-config": {"note": token}}), "engine_args.speculative-config")):
        message = one_error(data)
        assert message.startswith("recipe t: %s is ********; its value has the form of a credential" % path)
        assert "Ansible Vault as weights_hf_token" in message and token not in message


def test_credential_shaped_values_are_masked_where_printed() -> None:
    from ansible_collections.sparkserve.deploy.plugins.filter import mask_secrets as ms

    mask = ms.FilterModule().filters()["mask_secrets"]
    assert mask({"HF_AUTH": HF_LIKE, "MODEL": "/models/hf_tiny", "PATH_HINT": "task-list"}) == {
        "HF_AUTH": "********", "MODEL": "/models/hf_tiny", "PATH_HINT": "task-list"}
    assert mask(["vllm", "--note", HF_LIKE, "--json", '{"k":"%s"}' % HF_LIKE, "--x", "sk-short"]) == [
        "vllm", "--note", "********", "--json", "********", "--x", "sk-short"]


@pytest.mark.parametrize("image", [
    "eugr/Spark-vLLM@" + DIGEST,
    "Eugr/spark@" + DIGEST,
    "registry.example:5000/Team/vllm@" + DIGEST,
])
def test_an_image_repository_in_upper_case_is_refused_with_its_lower_case_form(image: str) -> None:
    repo = image.split("@")[0]
    host = repo.split("/")[0] + "/" if "." in repo.split("/")[0] else ""
    assert one_error(base(image=image)) == (
        'recipe t: image is "%s"; Docker accepts only lower-case repository names (the registry host and the tag '
        "may hold capitals; docker pull refuses the rest); write %s%s@%s." % (
            image, host, repo[len(host):].lower(), DIGEST))


@pytest.mark.parametrize("image", [
    "Registry.Example:5000/vllm:Latest@" + DIGEST, "localhost:5000/a/b@" + DIGEST, "nvcr.io/nvidia/vllm:25.09-py3@"
    + DIGEST, "vllm/vllm-openai@" + DIGEST, "a__b/c-d.e@" + DIGEST,
])
def test_image_references_docker_accepts_pass(image: str) -> None:
    valid(base(image=image))


@pytest.mark.parametrize("host,fix", [
    ("0.0.0.0:8000", "give the address alone and the port in launch.api_port: api_host: 0.0.0.0 and api_port: 8000"),
    ("[::1]:8000", "give the address alone and the port in launch.api_port: api_host: ::1 and api_port: 8000"),
    ("http://0.0.0.0:8000/", "give the address alone and the port in launch.api_port: api_host: 0.0.0.0 and "
                             "api_port: 8000"),
    ("localhost:", "give the address alone, without a scheme, brackets, port or spaces (127.0.0.1, 0.0.0.0, ::); "
                   "the port goes in launch.api_port"),
    ("my host", "give the address alone, without a scheme, brackets, port or spaces (127.0.0.1, 0.0.0.0, ::); the "
                "port goes in launch.api_port"),
])
def test_an_api_host_with_a_port_is_refused(host: str, fix: str) -> None:
    assert one_error(base(launch={"api_host": host})) == 'recipe t: launch.api_host is %s; %s.' % (
        json.dumps(host), fix)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1%eth0", "spark-a.local"])
def test_api_hosts_without_a_port_pass(host: str) -> None:
    valid(base(launch={"api_host": host}))


def test_a_digest_one_digit_short_says_how_many_digits_it_has() -> None:
    short = "repo@sha256:" + "3f" * 31 + "3"
    assert one_error(base(image=short)) == (
        'recipe t: image is "%s"; it has 63 hex digits, not the 64 of a digest; copy the whole digest (docker '
        "buildx imagetools inspect IMAGE prints it)." % short)
    assert "must be sha256:<64 hex>" in one_error(base(image="repo@md5:" + "3f" * 16))


def test_a_full_length_commit_with_a_wrong_character_says_which() -> None:
    upper = COMMIT[:10] + COMMIT[10:].upper()
    assert one_error(base(model={"repo": "org/model", "revision": upper, "served_name": "m"})) == (
        'recipe t: model.revision is "%s"; a commit is lower-case hex and character 11 (E) is upper case; write '
        "it in lower case: %s." % (upper, COMMIT))
    typo = COMMIT[:5] + "x" + COMMIT[6:]
    assert one_error(base(model={"repo": "org/model", "revision": typo, "served_name": "m"})) == (
        'recipe t: model.revision is "%s"; character 6 ("x") is not a hex digit: a commit is 40 lower-case hex '
        'digits, 0-9 and a-f; copy the commit again (HfApi().model_info(repo, revision="main").sha gives the '
        "newest)." % typo)
    assert "it has 12 hex digits, not the 40 of a commit; pin the full 40-character commit" in one_error(
        base(model={"repo": "org/model", "revision": COMMIT[:12], "served_name": "m"}))


def test_a_sha256_with_a_capital_says_so() -> None:
    overlay = {"path": "/a.py", "original_sha256": "A" + "a" * 63, "patch": "a.diff", "result_sha256": "b" * 64}
    assert one_error(base(overlays=[overlay])) == (
        'recipe t: overlays[0].original_sha256 is "%s"; a sha256 is lower-case hex and character 1 (A) is upper '
        "case; write it in lower case: %s." % ("A" + "a" * 63, "a" * 64))


def test_one_node_is_not_nodes() -> None:
    assert validate_for_cluster(valid(base()), "t", 1, False) == [
        "recipe t: parallel.tensor × parallel.pipeline is 2 × 1 = 2 GPUs but the cluster has 1 node × "
        "parallel.gpus_per_node 1 = 1 GPU; make the two equal, by changing parallel.tensor or by deploying on "
        "2 nodes."]
    assert validate_for_cluster(valid(base(parallel={"tensor": 1})), "t", 2, False)[0].endswith(
        "= 1 GPU but the cluster has 2 nodes × parallel.gpus_per_node 1 = 2 GPUs; make the two equal, by changing "
        "parallel.tensor or by deploying on 1 node.")


# ------------------------------------------------------------ render

def rendered(data: dict[str, Any], rank: int, world_size: int = 2) -> dict[str, Any]:
    recipe = valid(data)
    return render_rank(recipe, "glm53", rank, world_size, "10.77.1.11")


def test_vllm_head() -> None:
    data = base(launch={"api_host": "0.0.0.0", "api_port": 30198, "extra_ports": [30300]},
                kv_cache={"dtype": "fp8", "block_size": 2304, "memory_gib_per_rank": 8},
                engine_args={"max-model-len": 262144, "enable-prefix-caching": True, "enforce-eager": False,
                             "quantization": None})
    out = rendered(data, 0)
    assert out["container_name"] == "glm53-rank0"
    assert out["argv"] == [
        "vllm", "serve", "/models/m", "--served-model-name", "m",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.77.1.11", "--master-port", "29501",
        "--host", "0.0.0.0", "--port", "30198",
        "--kv-cache-dtype", "fp8", "--block-size", "2304", "--kv-cache-memory-bytes", "8589934592",
        "--max-model-len", "262144", "--enable-prefix-caching",
    ]
    assert out["ports"] == [30198, 29501, 30300]


def test_vllm_worker_is_headless_without_api() -> None:
    out = rendered(base(launch={"extra_ports": [30300]}), 1)
    assert out["container_name"] == "glm53-rank1"
    argv = out["argv"]
    assert "--headless" in argv
    assert "--host" not in argv and "--port" not in argv
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "10.77.1.11"
    assert out["ports"] == [30300]
    assert "VLLM_HOST_IP" not in out["env"], "each node's fabric file gives its own address"


def test_sglang_head_and_worker() -> None:
    data = base(engine="sglang", parallel={"tensor": 4}, kv_cache={"dtype": "fp8_e4m3", "block_size": 64},
                engine_args={"chunked-prefill-size": 2048, "cuda-graph-bs-decode": [1, 2, 4]})
    head = rendered(data, 0, world_size=4)
    assert head["argv"] == [
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/m", "--served-model-name", "m",
        "--tp-size", "4", "--pp-size", "1", "--nnodes", "4", "--node-rank", "0",
        "--dist-init-addr", "10.77.1.11:29501", "--host", "127.0.0.1", "--port", "8000",
        "--kv-cache-dtype", "fp8_e4m3", "--page-size", "64",
        "--chunked-prefill-size", "2048", "--cuda-graph-bs-decode", "1", "2", "4",
    ]
    worker = rendered(data, 3, world_size=4)
    assert "--host" not in worker["argv"] and "--headless" not in worker["argv"]
    assert worker["argv"][worker["argv"].index("--node-rank") + 1] == "3"
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in worker["env"]


def test_sglang_ipv6_head() -> None:
    recipe = valid(base(engine="sglang"))
    out = render_rank(recipe, "d", 1, 2, "fd00::1")
    assert out["argv"][out["argv"].index("--dist-init-addr") + 1] == "[fd00::1]:29501"


def test_engine_args_lists_and_mappings() -> None:
    args = {
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 5},
        "cuda-graph-sizes": [1, 2, 4],
        "middleware": ["a.B", "c.D"],
        "allowed-origins": ["https://x"],
        "default-chat-template-kwargs": {"enable_thinking": False},
        "empty": [],
    }
    assert ENGINES["vllm"].args_words(args) == [
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":5}',
        "--cuda-graph-sizes", "1", "2", "4",
        "--middleware", "a.B", "--middleware", "c.D",
        "--allowed-origins", '["https://x"]',
        "--default-chat-template-kwargs", '{"enable_thinking":false}',
    ]
    assert ENGINES["sglang"].args_words({"middleware": ["a", "b"]}) == ["--middleware", "a", "b"]


def test_draft_model_goes_through_engine_args_only() -> None:
    data = base(draft_model={"repo": "org/draft", "revision": COMMIT, "path_in_container": "/models/d"},
                engine_args={"speculative-config": {"model": "/models/d", "num_speculative_tokens": 7}})
    argv = rendered(data, 0)["argv"]
    assert argv[-2:] == ["--speculative-config", '{"model":"/models/d","num_speculative_tokens":7}']
    assert sum("/models/d" in word for word in argv) == 1


def test_env_precedence() -> None:
    data = base(env={"VLLM_ENGINE_READY_TIMEOUT_S": "7200", "NCCL_DEBUG": "WARN"}, readiness={"timeout_s": 900})
    env = rendered(data, 0)["env"]
    # The recipe's env comes last: over the engine's own and NCCL's report the launch asks for.
    assert env == {"VLLM_ENGINE_READY_TIMEOUT_S": "7200", "NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert rendered(base(readiness={"timeout_s": 900}), 0)["env"]["VLLM_ENGINE_READY_TIMEOUT_S"] == "900"


@pytest.mark.parametrize("engine,variable", [("vllm", "VLLM_HOST_IP"), ("sglang", "SGLANG_HOST_IP")])
def test_the_engines_host_ip_is_the_fabric_stages(engine: str, variable: str) -> None:
    errors = errors_of(base(engine=engine, env={variable: "10.0.0.9"}))
    assert errors == ['recipe t: env.%s is "10.0.0.9"; the fabric stage sets %s on each node to the node\'s own '
                      "fabric address (sparkserve_fabric_ip); remove it from env." % (variable, variable)]


def test_container_name_pattern_is_applied() -> None:
    out = rendered(base(launch={"container_name": "{deployment}-qualified-r{rank}"}), 1)
    assert out["container_name"] == "glm53-qualified-r1"


@pytest.mark.parametrize("rank,world,deployment,head", [
    (2, 2, "glm53", "10.0.0.1"), (-1, 2, "glm53", "10.0.0.1"), (0, 2, "bad name", "10.0.0.1"),
    (0, 2, "glm53", ""), (0, 0, "glm53", "10.0.0.1"),
])
def test_render_refuses_bad_arguments(rank: int, world: int, deployment: str, head: str) -> None:
    with pytest.raises(ValueError):
        render_rank(valid(base()), deployment, rank, world, head)


def test_file_overrides_render_as_read_only_mounts_on_every_rank() -> None:
    data = base(model={"repo": "org/model", "revision": COMMIT, "served_name": "m",
                       "file_overrides": [override(path="./generation_config.json")]},
                draft_model={"repo": "org/d", "revision": COMMIT, "path_in_container": "/models/d",
                             "file_overrides": [override(path="sub/config.json", source="files/t/d.json")]})
    for rank in (0, 1):
        assert rendered(data, rank)["mounts"] == [
            {"source_rel": "files/t/generation_config.json", "target": "/models/m/generation_config.json",
             "sha256": "c" * 64},
            {"source_rel": "files/t/d.json", "target": "/models/d/sub/config.json", "sha256": "c" * 64},
        ]
    assert rendered(base(), 0)["mounts"] == []


def test_endpoints_per_engine() -> None:
    paths = {"health": "/health", "models": "/v1/models", "completions": "/v1/completions"}
    assert rendered(base(), 0)["endpoints"] == dict(paths, metrics="/metrics")
    assert rendered(base(), 1)["endpoints"] == {}
    sglang = rendered(base(engine="sglang"), 0)["endpoints"]
    assert sglang == dict(paths, metrics=None)
    with_metrics = rendered(base(engine="sglang", engine_args={"enable-metrics": True}), 0)
    assert with_metrics["endpoints"]["metrics"] == "/metrics"


def test_sglang_workers_get_no_engine_environment_and_no_ports() -> None:
    out = rendered(base(engine="sglang"), 1)
    # Only NCCL's report of its network, which every rank over several nodes gets.
    assert out["env"] == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"} and out["ports"] == []


def test_render_output_is_json_serialisable() -> None:
    json.dumps(rendered(base(), 0))


# ------------------------------------------------------------ the lab's recipes and the README

@pytest.mark.parametrize("name,nodes,order", [("lab-tp2", 2, "workers_first"), ("lab-tp4", 4, "head_first")])
def test_lab_recipes_validate_with_sample_variables(name: str, nodes: int, order: str) -> None:
    data = yaml.safe_load((RECIPES / f"{name}.yml").read_text(encoding="utf-8"))
    recipe = valid(data, name=name, variables=LAB_VARIABLES)
    assert recipe["image"] == LAB_VARIABLES["lab_engine_image"]
    assert recipe["model"]["revision"] == LAB_VARIABLES["lab_model_revision"]
    assert recipe["launch"]["order"] == order
    assert recipe["launch"]["api_host"] == "0.0.0.0" and recipe["launch"]["api_port"] == 8000
    assert recipe["launch"]["master_port"] == 29501
    assert recipe["readiness"]["timeout_s"] == 300 and recipe["readiness"]["canary_prompt"]
    assert recipe["memory"]["min_available_gib"] == 1
    # The lab's tiny model is gated on the lab's hub double, which gives the token.
    assert validate_for_cluster(recipe, name, nodes, True) == []
    assert validate_for_cluster(recipe, name, nodes + 1, True)
    assert validate_recipe(data, name, variables=LAB_VARIABLES, recipes_dir=str(RECIPES))[1] == []
    for rank in range(nodes):
        out = render_rank(recipe, name, rank, nodes, "10.77.1.11")
        assert out["argv"][:3] == ["vllm", "serve", "/models/tiny-model"]
        assert ("--headless" in out["argv"]) == (rank > 0)


def test_lab_recipes_need_their_variables() -> None:
    data = yaml.safe_load((RECIPES / "lab-tp2.yml").read_text(encoding="utf-8"))
    errors = errors_of(data, name="lab-tp2", variables={})
    assert [e.split(" names")[0] for e in errors] == ["recipe lab-tp2: image_from",
                                                      "recipe lab-tp2: model.revision_from"]


def test_schema_has_every_top_level_field() -> None:
    # recipes/README.md and recipes/recipe.schema.json are written from it (tests/tools/test_recipe_docs.py).
    assert set(RECIPE_SCHEMA) == {
        "name", "description", "engine", "image", "image_id", "image_archive", "image_from", "model", "draft_model",
        "parallel", "launch",
        "engine_args", "engine_flags", "env", "kv_cache", "overlays", "overlays_from", "overlays_repo", "memory",
        "fabric", "readiness", "supervise", "host", "bench", "supply",
    }


def test_schema_is_well_formed() -> None:
    known = {"type", "required", "default", "default_template", "choices", "pattern", "min", "max", "elements",
             "options", "values", "one_of", "hint", "wants", "description"}

    def walk(options: dict[str, Any]) -> None:
        for key, spec in options.items():
            assert set(spec) <= known, key
            assert spec.get("description"), key
            assert spec["type"] in {"str", "int", "number", "bool", "dict", "list", "raw"}, key
            assert not (spec.get("required") and "default" in spec), key
            if "options" in spec:
                walk(spec["options"])

    walk(RECIPE_SCHEMA)


def test_a_memory_guard_floor_of_zero_is_refused() -> None:
    # the guard refuses a floor of 0 at start; the recipe says so first
    message = one_error(base(memory={"min_available_gib": 100, "guard": {"floor_gib": 0}}))
    assert "memory.guard.floor_gib" in message and "0" in message


def test_patches_of_a_pinned_overlays_repository_need_no_file_in_the_recipes_folder(tmp_path: Any) -> None:
    recipe = yaml.safe_load((ROOT / "recipes/lab-tp2.yml").read_text(encoding="utf-8"))
    variables = {"lab_engine_image": "r/e@sha256:" + "ab" * 32, "lab_model_revision": "1" * 40}
    missing = validate_recipe(dict(recipe), "lab-tp2", variables=variables, recipes_dir=str(tmp_path))[1]
    assert any("overlays[0].patch" in e and "not in the recipes folder" in e for e in missing)
    recipe["overlays_repo"] = {"repo": "acme/release", "revision_from": "release_revision"}
    errors = validate_recipe(dict(recipe), "lab-tp2", variables=variables, recipes_dir=str(tmp_path))[1]
    assert errors == ["recipe lab-tp2: overlays_repo.revision_from names the inventory variable release_revision, "
                      "which is not set; set it to " + errors[0].split("set it to ", 1)[1]]
    resolved, errors = validate_recipe(dict(recipe), "lab-tp2", variables=dict(variables, release_revision="2" * 40),
                                          recipes_dir=str(tmp_path))
    assert errors == [] and resolved["overlays_repo"]["revision"] == "2" * 40


def test_qualify_suite_names_one_of_the_bench_suites() -> None:
    bench = {"suites": [{"name": "coding-peak", "max_tokens": 8}], "qualify_suite": "coding-peak"}
    assert valid(base(bench=bench))["bench"]["qualify_suite"] == "coding-peak"
    message = one_error(base(bench=dict(bench, qualify_suite="coding_peak")))
    assert "bench.qualify_suite" in message and '"coding_peak"' in message
    assert "name one of bench.suites (coding-peak)" in message
    assert "none yet" in one_error(base(bench={"qualify_suite": "canary"}))


@pytest.mark.parametrize(("written", "pulled"), [
    ("registry.local:5000/team/vllm:25.11@sha256:" + "a" * 64, "registry.local:5000/team/vllm@sha256:" + "a" * 64),
    ("vllm/vllm-openai:latest@sha256:" + "b" * 64, "vllm/vllm-openai@sha256:" + "b" * 64),
    ("registry.local:5000/team/vllm@sha256:" + "c" * 64, "registry.local:5000/team/vllm@sha256:" + "c" * 64),
])
def test_a_tag_beside_the_digest_is_dropped_from_what_the_nodes_pull(written: str, pulled: str) -> None:
    assert by_digest(written) == pulled
    assert valid(base(image=written))["image"] == pulled
