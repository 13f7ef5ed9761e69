"""A recipe key that is an engine flag (``tensor_parallel_size: 2`` at the top, as the field's examples write it)
is answered with the field that carries it: the recipe field sparkserve sets the flag from, or engine_args."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe import suggest
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import validate_recipe

IMAGE = "registry.example:5000/vllm@sha256:" + "3f" * 32
COMMIT = "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5"


def base(engine: str = "vllm", **changes: Any) -> dict[str, Any]:
    """A small valid recipe for ENGINE; keyword arguments add or replace top-level keys."""
    data: dict[str, Any] = {
        "name": "t",
        "engine": engine,
        "image": IMAGE,
        "model": {"repo": "org/model", "revision": COMMIT, "served_name": "m"},
        "parallel": {"tensor": 2},
    }
    data.update(changes)
    return data


def keyed(key: str, value: Any, engine: str = "vllm") -> dict[str, Any]:
    """The small recipe for ENGINE with KEY: VALUE added at the top."""
    data = base(engine)
    data[key] = value
    return data


def one_error(data: dict[str, Any]) -> str:
    errors = validate_recipe(data, "t")[1]
    assert len(errors) == 1, errors
    return errors[0]


def owned(key: str, value: str, engine: str, flag: str, field: str, exact: bool = True, where: str = "a recipe") -> str:
    return ("recipe t: %s is %s, and not a field of %s; %s the %s flag --%s, which sparkserve sets itself from `%s`: "
            "set `%s` instead and remove this key." % (key, value, where, "it is" if exact else "it looks like",
                                                       engine, flag, field, field))


def engine_arg(key: str, value: str, flag: str, exact: bool = True, engine: str = "vllm", top: str = "",
               where: str = "a recipe") -> str:
    return ("recipe t: %s is %s, and not a field of %s; %s the %s flag --%s, which goes in engine_args: write "
            "`engine_args: {%s: %s}`%s instead." % (key, value, where, "it is" if exact else "it looks like",
                                                    engine, flag, flag, value, top))


# ------------------------------------------------------------ a flag sparkserve sets: its field

@pytest.mark.parametrize("engine,key,flag,field,exact", [
    ("vllm", "tensor_paralel_size", "tensor-parallel-size", "parallel.tensor", False),
    ("vllm", "tensor_parallel_size", "tensor-parallel-size", "parallel.tensor", True),
    ("vllm", "--tensor-parallel-size", "tensor-parallel-size", "parallel.tensor", True),
    ("vllm", "tensor-parallel-size", "tensor-parallel-size", "parallel.tensor", True),
    ("vllm", "tp", "tp", "parallel.tensor", True),
    ("vllm", "pipeline_parallel_size", "pipeline-parallel-size", "parallel.pipeline", True),
    ("vllm", "port", "port", "launch.api_port", True),
    ("vllm", "Port", "port", "launch.api_port", True),
    ("vllm", "served_model_name", "served-model-name", "model.served_name", True),
    ("vllm", "kv_cache_dtype", "kv-cache-dtype", "kv_cache.dtype", True),
    ("sglang", "tp_size", "tp-size", "parallel.tensor", True),
    ("sglang", "tp", "tp", "parallel.tensor", True),
    ("sglang", "model_path", "model-path", "model.path_in_container", True),
    ("sglang", "page_size", "page-size", "kv_cache.block_size", True),
])
def test_a_top_level_key_that_is_an_owned_flag_names_its_field(engine: str, key: str, flag: str, field: str,
                                                                exact: bool) -> None:
    assert one_error(keyed(key, 2, engine)) == owned(key, "2", engine, flag, field, exact)


def test_an_owned_flag_of_the_other_engine_names_the_same_field() -> None:
    # vLLM has no --tp-size; SGLang's is set from the same field whatever the engine.
    assert one_error(base("vllm", tp_size=2)) == owned("tp_size", "2", "sglang", "tp-size", "parallel.tensor")


def test_an_owned_flag_without_a_field_says_to_remove_it() -> None:
    assert one_error(base("sglang", dist_init_addr="10.0.0.1:5000")) == (
        'recipe t: dist_init_addr is "10.0.0.1:5000", and not a field of a recipe; it is the sglang flag '
        "--dist-init-addr, which sparkserve sets itself from the head's fabric address and launch.master_port: "
        "remove this key.")


def test_an_owned_flag_in_a_section_names_its_field() -> None:
    assert one_error(base(launch={"port": 9000})) == owned("launch.port", "9000", "vllm", "port", "launch.api_port",
                                                           where="launch")


def test_the_host_section_given_an_address_names_launch_api_host() -> None:
    # host is a field (the node's checks), so host: 0.0.0.0 is a wrong type, not an unknown key.
    assert one_error(base(host="0.0.0.0")) == (
        'recipe t: host is "0.0.0.0"; it must be a mapping; if it is the vllm flag --host, set `launch.api_host` '
        "instead.")


# ------------------------------------------------------------ any other flag of the engine: engine_args

@pytest.mark.parametrize("engine,key,value,shown,flag,exact", [
    ("vllm", "max_model_len", 4096, "4096", "max-model-len", True),
    ("vllm", "--gpu-memory-utilization", 0.8, "0.8", "gpu-memory-utilization", True),
    ("vllm", "gpu_memory_utilisation", 0.8, "0.8", "gpu-memory-utilization", False),
    ("vllm", "max_model_lenn", 4096, "4096", "max-model-len", False),
    ("vllm", "enforce_eager", True, "true", "enforce-eager", True),
    ("vllm", "quantization", "fp8", '"fp8"', "quantization", True),
    ("sglang", "mem_fraction_static", 0.8, "0.8", "mem-fraction-static", True),
])
def test_a_top_level_key_that_is_another_flag_goes_in_engine_args(engine: str, key: str, value: Any, shown: str,
                                                                   flag: str, exact: bool) -> None:
    assert one_error(keyed(key, value, engine)) == engine_arg(key, shown, flag, exact, engine)


def test_a_flag_in_a_section_goes_in_engine_args_at_the_top() -> None:
    data = base(parallel={"tensor": 2, "max_model_len": 4096})
    assert one_error(data) == engine_arg("parallel.max_model_len", "4096", "max-model-len",
                                         top=" at the top of the recipe", where="parallel")


def test_a_secret_flag_keeps_its_value_out_of_the_message() -> None:
    error = one_error(base(api_key="sk-do-not-print-me"))
    assert "do-not-print" not in error
    assert error == engine_arg("api_key", "********", "api-key")


def test_another_engines_flag_is_not_put_in_engine_args() -> None:
    assert one_error(base("vllm", mem_fraction_static=0.8)) == (
        "recipe t: mem_fraction_static is 0.8, and not a field of a recipe; it is the sglang flag "
        "--mem-fraction-static, which vllm, this recipe's engine, does not have: give vllm's own flag in engine_args "
        "(its flags are in plugins/module_utils/engines/flags/vllm-0.31.0.json).")


# ------------------------------------------------------------ what was answered before still is

@pytest.mark.parametrize("key,meant", [
    ("tensor", "`parallel.tensor`"),
    ("served_name", "`model.served_name`"),
    ("descripton", "`description`"),
    ("engine_arg", "`engine_args`"),
    ("block_size", "`kv_cache.block_size`"),
])
def test_a_misspelt_or_misplaced_field_keeps_its_suggestion(key: str, meant: str) -> None:
    assert one_error(keyed(key, 2)) == (
        "recipe t: %s is not a field of a recipe; did you mean %s? (the fields are in recipes/README.md)."
        % (key, meant))


@pytest.mark.parametrize("key", ["wibble", "replicas", "xyz"])
def test_a_key_like_no_flag_and_no_field_lists_the_fields(key: str) -> None:
    assert one_error(keyed(key, 1)).startswith(
        "recipe t: %s is not a field of a recipe; use one of: name, description, engine, image," % key)


# ------------------------------------------------------------ flag_home itself

def test_flag_home_reads_the_recipes_engine_first() -> None:
    assert suggest.flag_home("tp_size", "sglang") == suggest.FlagHome("tp-size", "sglang", "parallel.tensor", True, 1.0)
    assert suggest.flag_home("max_model_len", "vllm") == suggest.FlagHome("max-model-len", "vllm", "", True, 1.0)
    # Without a known engine, every engine's flags are looked at.
    home = suggest.flag_home("mem_fraction_static", None)
    assert home is not None and (home.engine, home.field, home.stranger) == ("sglang", "", "")
    assert suggest.flag_home("mem_fraction_static", ["not", "a", "name"]) == home


@pytest.mark.parametrize("key", ["wibble", "", "---", "a key", "ma"])
def test_flag_home_is_none_for_what_is_no_flag(key: str) -> None:
    assert suggest.flag_home(key, "vllm") is None


def test_an_unknown_engine_flags_version_falls_back_to_the_newest_list() -> None:
    home = suggest.flag_home("max_model_len", "vllm", "0.0.1")
    assert home is not None and home.flag == "max-model-len" and home.field == ""
