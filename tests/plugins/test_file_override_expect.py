"""file_overrides[].expect: the values a model-file override's JSON source must hold, checked on the controller."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import (
    file_expectation_problems,
    validate_recipe,
)

COMMIT = "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5"
IMAGE = "registry.example:5000/vllm@sha256:" + "3f" * 32
SOURCE = "files/t/generation_config.json"


# ------------------------------------------------------------ the pure check

@pytest.mark.parametrize("content, expect", [
    ('{"temperature": 0.6}', {"temperature": 0.6}),  # equal
    ('{"temperature": 1}', {"temperature": 1.0}),  # 1 and 1.0 are the same JSON number
    ('{"do_sample": true, "bos_token_id": null}', {"do_sample": True, "bos_token_id": None}),
    ('{"eos_token_id": [154820, 154828]}', {"eos_token_id": 154828}),  # the list contains it
    ('{"eos_token_id": [154820, 154827, 154828]}', {"eos_token_id": [154828, 154820]}),  # contains them all
    ('{"eos_token_id": [2]}', {"eos_token_id": []}),  # an empty list asks for nothing
    (b'{"eos_token_id": 2}', {"eos_token_id": 2}),  # bytes, as read from the file
    ('{"a": 1}', {}),  # nothing expected
])
def test_a_file_that_holds_what_is_expected_passes(content: str | bytes, expect: dict[str, Any]) -> None:
    assert file_expectation_problems(content, expect) == []


@pytest.mark.parametrize("content, expect, problems", [
    ('{"temperature": 0.7}', {"temperature": 0.6}, ["temperature is 0.7, it must be 0.6"]),
    ('{"eos_token_id": [154820, 154827]}', {"eos_token_id": 154828},
     ["eos_token_id is [154820, 154827], it must include 154828"]),
    ('{"eos_token_id": [154820, 154827]}', {"eos_token_id": [154820, 154828]},
     ["eos_token_id is [154820, 154827], it must include all of [154820, 154828]"]),
    ('{"bos_token_id": 1}', {"eos_token_id": 154828}, ["eos_token_id is missing, it must hold 154828"]),
    # Wrong types: a string is not a number, true is not 1, a scalar does not contain a list.
    ('{"eos_token_id": "154828"}', {"eos_token_id": 154828}, ['eos_token_id is "154828", it must be 154828']),
    ('{"eos_token_id": [true]}', {"eos_token_id": 1}, ["eos_token_id is [true], it must include 1"]),
    ('{"eos_token_id": 2}', {"eos_token_id": [2, 3]}, ["eos_token_id is 2, it must be [2, 3]"]),
    # One phrase per key that fails, in the order of expect.
    ('{"a": 1, "b": 2}', {"a": 2, "b": 2, "c": "x"}, ["a is 1, it must be 2", 'c is missing, it must hold "x"']),
])
def test_a_file_that_does_not_hold_it_is_named(content: str, expect: dict[str, Any], problems: list[str]) -> None:
    assert file_expectation_problems(content, expect) == problems


def test_a_source_that_is_not_a_json_object_holds_nothing() -> None:
    [problem] = file_expectation_problems("eos_token_id: 154828\n", {"eos_token_id": 154828})
    assert problem.startswith("the source is not JSON (") and problem.endswith("), so it holds no eos_token_id")
    [problem] = file_expectation_problems(b"\xff\xfe{", {"eos_token_id": 1})
    assert problem.startswith("the source is not JSON (")
    assert file_expectation_problems("[154828]", {"eos_token_id": 154828, "x": 1}) == [
        "the source holds a list, not a JSON object, so it holds no eos_token_id, x"]
    assert file_expectation_problems("154828", {"eos_token_id": 154828}) == [
        "the source holds 154828, not a JSON object, so it holds no eos_token_id"]


# ------------------------------------------------------------ in validate_recipe

def recipe_with(expect: Any, section: str = "model", sha256: str | None = None) -> dict[str, Any]:
    override = {"path": "generation_config.json", "source": SOURCE, "sha256": sha256 or "a" * 64, "expect": expect}
    data: dict[str, Any] = {
        "name": "t", "engine": "vllm", "image": IMAGE, "parallel": {"tensor": 2},
        "model": {"repo": "org/model", "revision": COMMIT, "served_name": "m"},
    }
    if section == "model":
        data["model"]["file_overrides"] = [override]
    else:
        data["draft_model"] = {"repo": "org/draft", "revision": COMMIT, "file_overrides": [override]}
    return data


def write_source(folder: Path, content: bytes) -> str:
    path = folder / SOURCE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize("section", ["model", "draft_model"])
def test_the_source_is_read_where_the_recipe_is_validated(tmp_path: Path, section: str) -> None:
    digest = write_source(tmp_path, b'{"eos_token_id": [154820, 154827]}\n')
    data = recipe_with({"eos_token_id": 154828}, section, digest)
    assert validate_recipe(data, "t")[1] == []  # without the recipes folder there is nothing to read
    assert validate_recipe(data, "t", recipes_dir=str(tmp_path))[1] == [
        "recipe t: %s.file_overrides[0] (generation_config.json): eos_token_id is [154820, 154827], it must "
        "include 154828; put the right file at %s or correct %s.file_overrides[0].expect." % (section, SOURCE, section)]
    write_source(tmp_path, b'{"eos_token_id": [154820, 154828]}\n')
    data = recipe_with({"eos_token_id": 154828}, section, hashlib.sha256(b'{"eos_token_id": [154820, 154828]}\n')
                       .hexdigest())
    assert validate_recipe(data, "t", recipes_dir=str(tmp_path))[1] == []


def test_expect_is_optional_and_defaults_to_nothing(tmp_path: Path) -> None:
    digest = write_source(tmp_path, b"not json")
    data = recipe_with(None, sha256=digest)
    recipe, errors = validate_recipe(data, "t", recipes_dir=str(tmp_path))
    assert errors == [] and recipe["model"]["file_overrides"][0]["expect"] == {}


def test_a_missing_source_is_reported_once(tmp_path: Path) -> None:
    errors = validate_recipe(recipe_with({"eos_token_id": 1}), "t", recipes_dir=str(tmp_path))[1]
    assert len(errors) == 1 and "which is not in the recipes folder" in errors[0]


def test_expect_takes_scalars_or_lists_of_them() -> None:
    assert validate_recipe(recipe_with({"eos_token_id": [1, 2], "top_p": 0.9, "x": None, "y": "s"}), "t")[1] == []
    assert validate_recipe(recipe_with({"eos_token_id": {"a": 1}}), "t")[1] == [
        'recipe t: model.file_overrides[0].expect.eos_token_id is {"a": 1}; give a string, a number, true, false or '
        "null, or a list of them."]
    assert validate_recipe(recipe_with({"eos_token_id": [[1]]}), "t")[1] == [
        "recipe t: model.file_overrides[0].expect.eos_token_id is [[1]]; give a string, a number, true, false or "
        "null, or a list of them."]
    assert "it must be a mapping" in validate_recipe(recipe_with([1]), "t")[1][0]
