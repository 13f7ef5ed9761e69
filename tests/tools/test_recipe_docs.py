"""tools/recipe-docs.py: recipes/README.md and recipes/recipe.schema.json written from the recipe schema.

The JSON Schema is checked with the jsonschema library against every recipe
and against bad recipes that validate_recipe refuses too.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import _HEX40, RECIPE_SCHEMA
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import validate_recipe
from tests.scripts import load_script

docs = load_script("tools/recipe-docs.py", "recipe_docs")

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
RECIPE_FILES = sorted(RECIPES.glob("*.yml"))
COMMIT = "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5"
VALID: dict[str, Any] = {
    "name": "t",
    "engine": "vllm",
    "image": "registry.example:5000/vllm@sha256:" + "3f" * 32,
    "model": {"repo": "org/model", "revision": COMMIT, "served_name": "m"},
    "parallel": {"tensor": 2},
}


def schema_errors(data: Any) -> list[str]:
    """What the JSON Schema on disk says of ``data``: each error's path and message."""
    schema = json.loads((RECIPES / "recipe.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    return ["%s: %s" % ("/".join(str(p) for p in e.absolute_path), e.message) for e in validator.iter_errors(data)]


def changed(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    change(data)
    return data


def test_readme_is_current() -> None:
    readme = (RECIPES / "README.md").read_text(encoding="utf-8")
    assert readme == docs.schema_markdown(), "regenerate: python3 tools/recipe-docs.py"


def test_json_schema_is_current() -> None:
    text = (RECIPES / "recipe.schema.json").read_text(encoding="utf-8")
    assert text == docs.json_schema_text(), "regenerate: python3 tools/recipe-docs.py"
    assert text.endswith("}\n") and text.startswith('{\n  "$schema"')  # sorted keys, two-space indent
    assert docs.main(["--check"]) == 0


def test_check_names_the_stale_file_and_a_run_rewrites_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("README.md", "recipe.schema.json"):
        shutil.copy(RECIPES / name, tmp_path / name)
    (tmp_path / "recipe.schema.json").write_text("{}\n", encoding="utf-8")
    assert docs.main(["--check", "--recipes", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "recipe.schema.json is stale" in err and "README.md" not in err
    assert (tmp_path / "recipe.schema.json").read_text(encoding="utf-8") == "{}\n"  # --check writes nothing

    (tmp_path / "README.md").unlink()
    assert docs.main(["--check", "--recipes", str(tmp_path)]) == 1
    assert "README.md is missing" in capsys.readouterr().err

    assert docs.main(["--recipes", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "README.md" in out and "recipe.schema.json" in out
    assert docs.main(["--check", "--recipes", str(tmp_path)]) == 0
    assert (tmp_path / "recipe.schema.json").read_text(encoding="utf-8") == docs.json_schema_text()


def test_readme_names_every_field() -> None:
    text = docs.schema_markdown()

    def walk(options: dict[str, Any], prefix: str) -> None:
        for key, spec in options.items():
            path = prefix + key
            assert "| `%s` |" % path in text
            if "options" in spec:
                walk(spec["options"], path + ("[]." if spec["type"] == "list" else "."))

    walk(RECIPE_SCHEMA, "")


def test_json_schema_is_draft_2020_12_and_follows_the_spec_field_by_field() -> None:
    schema = docs.json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    types = {"str": "string", "int": "integer", "number": "number", "bool": "boolean", "dict": "object",
             "list": "array"}

    def walk(options: dict[str, Any], node: dict[str, Any], where: str) -> None:
        assert node["additionalProperties"] is False, where
        assert set(node["properties"]) == set(options), where
        assert node.get("required", []) == [k for k, s in options.items() if s.get("required")], where
        for key, spec in options.items():
            prop, path = node["properties"][key], where + key
            assert prop.get("type") == types.get(spec["type"]), path
            assert prop["description"].startswith(spec["description"]), path
            assert prop.get("default", "unset") == spec.get("default", "unset"), path
            scalar = prop["items"] if spec["type"] == "list" and "items" in prop else prop
            assert scalar.get("enum") == spec.get("choices"), path
            assert scalar.get("pattern") == spec.get("pattern"), path
            assert (scalar.get("minimum"), scalar.get("maximum")) == (spec.get("min"), spec.get("max")), path
            if spec["type"] == "dict" and "options" not in spec:
                values = spec.get("values", "raw")
                assert prop["additionalProperties"] == (True if values == "raw" else {"type": types[values]}), path
            if spec["type"] == "list" and spec.get("elements", "raw") != "raw":
                assert prop["items"]["type"] == types[spec["elements"]], path
            if "options" in spec:
                walk(spec["options"], prop["items"] if spec["type"] == "list" else prop, path + ".")

    walk(RECIPE_SCHEMA, schema, "")
    model = schema["properties"]["model"]
    assert model["properties"]["revision"]["pattern"] == _HEX40
    assert model["oneOf"] == [{"required": ["revision"]}, {"required": ["revision_from"]}]
    assert {"oneOf": [{"required": ["image"]}, {"required": ["image_from"]}]} in schema["allOf"]
    assert {"not": {"required": ["overlays", "overlays_from"]}} in schema["allOf"]


@pytest.mark.parametrize("path", RECIPE_FILES, ids=[p.stem for p in RECIPE_FILES])
def test_every_recipe_names_the_schema_and_validates_against_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == "# yaml-language-server: $schema=recipe.schema.json" == docs.SCHEMA_LINE
    data = yaml.safe_load(text)
    assert schema_errors(data) == []
    # The loader and the validator take the file as it is, schema line and all (the *_from fields for form).
    errors = validate_recipe(data, path.stem)[1]
    assert errors == [], errors


def test_a_valid_recipe_passes_both_and_so_does_its_variable_form() -> None:
    assert schema_errors(VALID) == [] and validate_recipe(VALID, "t")[1] == []
    by_variable = changed(lambda d: (d.pop("image"), d.update(image_from="engine_image")))
    assert schema_errors(by_variable) == [] and validate_recipe(by_variable, "t")[1] == []


BAD = {
    "an unknown top-level key": (lambda d: d.update(replicas=2), "replicas"),
    "an unknown nested key": (lambda d: d["model"].update(branch="main"), "model.branch"),
    "a wrong type": (lambda d: d["parallel"].update(tensor="two"), "parallel.tensor"),
    "a branch instead of a commit": (lambda d: d["model"].update(revision="main"), "model.revision"),
    "a short commit": (lambda d: d["model"].update(revision=COMMIT[:12]), "model.revision"),
    "both revision and revision_from": (lambda d: d["model"].update(revision_from="rev"), "model.revision"),
    "neither revision nor revision_from": (lambda d: d["model"].pop("revision"), "model.revision"),
    "both image and image_from": (lambda d: d.update(image_from="engine_image"), "image"),
    "an image by tag": (lambda d: d.update(image="vllm/vllm-openai:latest"), "image"),
    "an image repository in upper case": (lambda d: d.update(image="vllm/vLLM-openai@" + d["image"].split("@")[1]),
                                          "image"),
    "an unknown engine": (lambda d: d.update(engine="tgi"), "engine"),
    "an API host with a port": (lambda d: d.update(launch={"api_host": "0.0.0.0:8000"}), "launch.api_host"),
    "a port out of range": (lambda d: d.update(launch={"api_port": 70000}), "launch.api_port"),
    "a required field missing": (lambda d: d.pop("parallel"), "parallel"),
    "both overlays and overlays_from": (lambda d: d.update(overlays=[], overlays_from="ov"), "overlays"),
    "an env value not a string": (lambda d: d.update(env={"A": 1}), "env.A"),
    "an override with both sha256 and sha256_from": (
        lambda d: d["model"].update(file_overrides=[{"path": "a.json", "source": "files/a.json",
                                                     "sha256": "ab" * 32, "sha256_from": "h"}]),
        "model.file_overrides[0].sha256"),
}


@pytest.mark.parametrize("change,field", BAD.values(), ids=list(BAD))
def test_bad_recipes_are_refused_by_the_json_schema_and_the_validator(
        change: Callable[[dict[str, Any]], Any], field: str) -> None:
    data = changed(change)
    # The JSON Schema refuses it at the field, or at the mapping that holds it (unknown keys, one-of groups).
    where = field.replace("[", ".").replace("]", "").split(".")
    holders = ["/".join(where[:n]) for n in range(len(where) + 1)]
    refused = schema_errors(data)
    assert refused, "the JSON Schema accepts it"
    assert any(error.split(": ", 1)[0] in holders for error in refused), refused
    errors = validate_recipe(data, "t")[1]
    assert errors and all(e.startswith("recipe t: ") for e in errors)
    assert any(field in e for e in errors), errors
