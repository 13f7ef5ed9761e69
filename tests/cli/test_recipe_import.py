"""`sparkserve recipe import`: sparkrun and spark-vllm-docker recipes converted into sparkserve recipes.

The fixtures (tests/cli/fixtures/import/) are recipes written for these tests in each format, after the real
ones of spark-arena/recipe-registry and eugr/spark-vllm-docker. Each test checks the mapping field by field,
what is listed as not carried, and that the written recipe is refused by the project's validator for its
unpinned image and revision only.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import validate_recipe
from sparkserve.recipe_import import (
    HEADER_MARK,
    SPARK_VLLM_DOCKER,
    SPARKRUN,
    ImportResult,
    RecipeImportError,
    import_recipes,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "import"
SPARKRUN_DIR = FIXTURES / "sparkrun"
EUGR_DIR = FIXTURES / "spark-vllm-docker"
DIGEST = "sha256:" + "ab" * 32
COMMIT = "cd" * 20


def one(source: Path, out: Path) -> tuple[ImportResult, dict[str, Any], str]:
    [result] = import_recipes([source], out)
    text = result.path.read_text(encoding="utf-8")
    return result, yaml.safe_load(text), text


def noted(result: ImportResult, start: str) -> str:
    found = [sentence for sentence in result.not_carried if sentence.startswith(start)]
    assert len(found) == 1, (start, result.not_carried)
    return found[0]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# ------------------------------------------------------------------ sparkrun

def test_sparkrun_template_maps_field_by_field(tmp_path: Path) -> None:
    result, recipe, _ = one(SPARKRUN_DIR / "qwen3-8b-tp2.yaml", tmp_path)
    assert (result.fmt, result.name, result.path) == (SPARKRUN, "qwen3-8b-tp2", tmp_path / "qwen3-8b-tp2.yml")
    assert result.source == SPARKRUN_DIR / "qwen3-8b-tp2.yaml" and result.changed
    assert recipe["name"] == "qwen3-8b-tp2"
    assert recipe["description"] == "Qwen3 8B over two Sparks, tensor-parallel 2, MTP drafts"  # metadata.description
    assert recipe["engine"] == "vllm"
    assert recipe["image"] == "ghcr.io/example-org/dgx-vllm:0.11.2"  # as given, tag and all
    # served_model_name is in defaults but not in the template: sparkrun appends --served-model-name itself.
    assert recipe["model"] == {"repo": "Qwen/Qwen3-8B", "revision": "main", "served_name": "qwen3-8b"}
    assert recipe["parallel"] == {"tensor": 2, "pipeline": 1}  # -tp {tensor_parallel}, -pp {pipeline_parallel}
    assert recipe["launch"] == {"api_host": "0.0.0.0", "api_port": 8080, "restart_policy": "unless-stopped"}
    assert recipe["kv_cache"] == {"dtype": "fp8"}
    assert recipe["engine_args"] == {
        "gpu-memory-utilization": 0.85,
        "max-model-len": 32768,
        "max-num-seqs": 8,
        "enable-auto-tool-choice": True,
        "tool-call-parser": "hermes",
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 2},
        "enable-prefix-caching": True,
        "trust-remote-code": True,
    }
    assert recipe["env"] == {"NCCL_CUMEM_ENABLE": "0", "VLLM_MARLIN_USE_ATOMIC_ADD": "1"}
    assert list(recipe) == ["name", "description", "engine", "image", "model", "parallel", "launch", "engine_args",
                            "kv_cache", "env"]


def test_sparkrun_lists_what_it_cannot_carry(tmp_path: Path) -> None:
    result, _, _ = one(SPARKRUN_DIR / "qwen3-8b-tp2.yaml", tmp_path)
    assert "pin it by digest" in noted(result, "image ghcr.io/example-org/dgx-vllm:0.11.2: the tag :0.11.2")
    assert "sparkserve recipe pin qwen3-8b-tp2" in noted(result, "model.revision main (from model_revision)")
    assert "overlays" in noted(result, 'mods ["mods/fix-qwen3-chat-template"]')
    assert "bench" in noted(result, "benchmark ")
    noted(result, "pre_exec ")
    assert '"shm_size": "20gb"' in noted(result, "executor_config ")
    noted(result, "min_nodes 2")
    noted(result, "max_nodes 2")
    assert "maintainer, model_dtype, model_params" in noted(result, "metadata ")
    noted(result, "defaults.seed 7")
    assert not [s for s in result.not_carried if "served_model_name" in s or "model.served_name" in s]
    assert len(result.not_carried) == 10


def test_sparkrun_without_command_uses_the_runtimes_flag_map(tmp_path: Path) -> None:
    result, recipe, _ = one(SPARKRUN_DIR / "qwen3-1.7b-structured.yaml", tmp_path)
    assert result.fmt == SPARKRUN and recipe["engine"] == "vllm"
    assert recipe["image"] == "scitrera/dgx-spark-vllm"
    # A commit as model_revision is already pinned: kept, with nothing to say about it.
    assert recipe["model"] == {"repo": "Qwen/Qwen3-1.7B", "revision": "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e",
                               "served_name": "Qwen/Qwen3-1.7B"}
    assert recipe["parallel"] == {"tensor": 1, "pipeline": 1}
    assert recipe["launch"] == {"api_port": 8000}
    # enforce_eager false is the engine's default: no flag, as sparkrun renders it.
    assert recipe["engine_args"] == {"gpu-memory-utilization": 0.5, "max-model-len": 8192,
                                     "enable-prefix-caching": True}
    assert "description" not in recipe and "env" not in recipe
    assert not [s for s in result.not_carried if s.startswith("model.revision")]
    assert "Docker reads as :latest" in noted(result, "image scitrera/dgx-spark-vllm: no tag")
    assert "answers to the model" in noted(result, "model.served_name Qwen/Qwen3-1.7B")
    noted(result, 'defaults.reasoning_parser "qwen3"')
    assert "127.0.0.1" in noted(result, "launch.api_host")


def test_sparkrun_sglang(tmp_path: Path) -> None:
    result, recipe, _ = one(SPARKRUN_DIR / "sglang-qwen3-30b-a3b.yaml", tmp_path)
    assert recipe["engine"] == "sglang"
    assert recipe["model"] == {"repo": "Qwen/Qwen3-30B-A3B", "revision": "main", "served_name": "qwen3-30b-a3b"}
    assert recipe["parallel"] == {"tensor": 2, "pipeline": 1}  # --tp-size
    assert recipe["launch"] == {"api_host": "0.0.0.0", "api_port": 30000}
    assert recipe["kv_cache"] == {"dtype": "fp8_e4m3", "block_size": 64}  # --page-size
    assert recipe["engine_args"] == {"mem-fraction-static": 0.8, "context-length": 65536, "enable-metrics": True}
    assert recipe["env"] == {"SGLANG_ENABLE_JIT_DEEPGEMM": "0"}
    noted(result, "min_nodes 2")


# ------------------------------------------------------------------ spark-vllm-docker

def test_spark_vllm_docker_maps_field_by_field(tmp_path: Path) -> None:
    result, recipe, text = one(EUGR_DIR / "glm-4.7-flash-awq.yaml", tmp_path)
    assert (result.fmt, result.name) == (SPARK_VLLM_DOCKER, "glm-4.7-flash-awq")
    assert recipe["description"] == "vLLM serving GLM-4.7-Flash AWQ over two nodes"
    assert '"GLM-4.7-Flash-AWQ"' in text.split("\n", 1)[0] + text.split("\n", 2)[1]  # its name there, in the header
    assert recipe["engine"] == "vllm" and recipe["image"] == "vllm-node-tf5"
    assert recipe["model"] == {"repo": "cyankiwi/GLM-4.7-Flash-AWQ-4bit", "revision": "main",
                               "served_name": "glm-4.7-flash", "aliases": ["glm-flash"]}
    assert recipe["parallel"] == {"tensor": 2, "pipeline": 1}
    assert recipe["launch"] == {"api_host": "0.0.0.0", "api_port": 8000}
    assert recipe["kv_cache"] == {"block_size": 64}
    # str.format's {{ }} are the braces of the JSON.
    assert recipe["engine_args"] == {
        "gpu-memory-utilization": 0.7,
        "max-model-len": 131072,
        "max-num-seqs": 4,
        "tool-call-parser": "glm47",
        "reasoning-parser": "glm45",
        "enable-auto-tool-choice": True,
        "compilation-config": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
        "load-format": "fastsafetensors",
    }
    assert recipe["env"] == {"VLLM_USE_DEEP_GEMM": "0", "HF_HUB_CACHE": "$HOME/.cache/huggingface/hub"}


def test_spark_vllm_docker_lists_what_it_cannot_carry(tmp_path: Path) -> None:
    result, _, _ = one(EUGR_DIR / "glm-4.7-flash-awq.yaml", tmp_path)
    assert "Ray" in noted(result, "command flag --distributed-executor-backend ray")
    assert "build_args --pre-tf" in noted(result, "container vllm-node-tf5: a local image")
    noted(result, "image vllm-node-tf5: no tag")
    noted(result, "model.revision main: the source names no revision")
    noted(result, 'mods ["mods/fix-glm-4.7-flash"]')
    noted(result, "benchmark ")
    noted(result, "cluster_only: true")
    noted(result, 'env.HF_HUB_CACHE "$HOME/.cache/huggingface/hub"')
    assert len(result.not_carried) == 8


def test_spark_vllm_docker_served_name_and_kv_size(tmp_path: Path) -> None:
    result, recipe, _ = one(EUGR_DIR / "nemotron-nano-solo.yaml", tmp_path)
    assert recipe["description"] == "Nemotron-Nano-Solo"  # the recipe's name, where it has no description
    assert recipe["image"] == "nvcr.io/nvidia/vllm:26.01-py3"
    # No --served-model-name: vLLM answers to the model as the command names it.
    assert recipe["model"]["served_name"] == "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"
    noted(result, "model.served_name nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4")
    assert recipe["kv_cache"] == {"memory_gib_per_rank": 16}  # --kv-cache-memory-bytes 16G
    assert recipe["parallel"] == {"tensor": 1, "pipeline": 1}
    assert "engine's default" in noted(result, "parallel.tensor 1")
    assert recipe["engine_args"] == {"max-model-len": 262144, "trust-remote-code": True,
                                     "gpu-memory-utilization": 0.7}
    noted(result, "pull_image true")
    noted(result, "solo_only: true")
    assert not [s for s in result.not_carried if s.startswith("container ")]  # a registry's image, pulled


# ------------------------------------------------------------------ the written file

def test_header_says_where_it_came_from_and_to_pin(tmp_path: Path) -> None:
    result, _, text = one(SPARKRUN_DIR / "qwen3-8b-tp2.yaml", tmp_path)
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert header[0].startswith(HEADER_MARK + " from qwen3-8b-tp2.yaml, a sparkrun recipe")
    joined = " ".join(line.lstrip("# ") for line in header)
    assert "Not valid until pinned: `sparkserve recipe pin qwen3-8b-tp2`" in joined
    for sentence in result.not_carried:
        assert " ".join(sentence.split()) in " ".join(joined.split())


def test_import_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    sources = [SPARKRUN_DIR, EUGR_DIR]
    first = import_recipes(sources, tmp_path)
    texts = {r.path: r.path.read_bytes() for r in first}
    stamps = {r.path: r.path.stat().st_mtime_ns for r in first}
    again = import_recipes(sources, tmp_path)
    assert [r.changed for r in first] == [True] * 5 and [r.changed for r in again] == [False] * 5
    assert {r.path: r.path.read_bytes() for r in again} == texts
    assert {r.path: r.path.stat().st_mtime_ns for r in again} == stamps  # not rewritten
    assert [r.not_carried for r in again] == [r.not_carried for r in first]


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    [result] = import_recipes([EUGR_DIR / "nemotron-nano-solo.yaml"], tmp_path / "out", dry_run=True)
    assert result.changed and not result.path.exists() and not (tmp_path / "out").exists()
    import_recipes([EUGR_DIR / "nemotron-nano-solo.yaml"], tmp_path / "out")
    [result] = import_recipes([EUGR_DIR / "nemotron-nano-solo.yaml"], tmp_path / "out", dry_run=True)
    assert not result.changed


def test_a_directory_source_imports_every_recipe_in_it_sorted(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for path in sorted(SPARKRUN_DIR.iterdir()):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "qwen3-8b-tp2.yaml").rename(folder / "qwen3-8b-tp2.yml")  # both endings are read
    (folder / "README.md").write_text("not a recipe\n")
    (folder / "nested").mkdir()
    (folder / "nested" / "other.yaml").write_text("model: a/b\ncontainer: c:d\n")
    results = import_recipes([folder], tmp_path / "out")
    assert [r.name for r in results] == ["qwen3-1.7b-structured", "qwen3-8b-tp2", "sglang-qwen3-30b-a3b"]
    assert [r.source.name for r in results] == ["qwen3-1.7b-structured.yaml", "qwen3-8b-tp2.yml",
                                                "sglang-qwen3-30b-a3b.yaml"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [r.name + ".yml" for r in results]


# ------------------------------------------------------------------ the validator

@pytest.mark.parametrize("source", sorted(SPARKRUN_DIR.iterdir()) + sorted(EUGR_DIR.iterdir()),
                         ids=lambda p: p.name)
def test_validator_refuses_only_the_unpinned_image_and_revision(tmp_path: Path, source: Path) -> None:
    [result] = import_recipes([source], tmp_path)
    data = yaml.safe_load(result.path.read_text(encoding="utf-8"))
    _, errors = validate_recipe(data, result.name)
    pinned_revision = len(data["model"]["revision"]) == 40
    assert [e.split(" is ", 1)[0] for e in errors] == ["recipe %s: image" % result.name] + (
        [] if pinned_revision else ["recipe %s: model.revision" % result.name])
    # What `sparkserve recipe pin` writes makes it valid: the image's digest and the revision's commit.
    data["image"] = "registry.example.com/" * ("/" not in data["image"]) + data["image"] + "@" + DIGEST
    data["model"]["revision"] = data["model"]["revision"] if pinned_revision else COMMIT
    _, errors = validate_recipe(data, result.name)
    assert errors == []


# ------------------------------------------------------------------ refused sources

def test_an_unknown_format_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "compose.yaml", """\
        services:
          vllm:
            image: vllm/vllm-openai:latest
        """)
    with pytest.raises(RecipeImportError) as caught:
        import_recipes([path], tmp_path / "out")
    [problem] = caught.value.problems
    assert problem.startswith(str(path) + ": neither a sparkrun recipe")
    assert "spark-vllm-docker recipe" in problem and "it has services" in problem
    assert str(caught.value) == problem
    assert not (tmp_path / "out").exists()


def test_broken_yaml_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", """\
        model: Qwen/Qwen3-8B
        container: [vllm/vllm-openai:latest
        defaults:
          port: 8000
        """)
    with pytest.raises(RecipeImportError) as caught:
        import_recipes([path], tmp_path / "out")
    [problem] = caught.value.problems
    assert problem.startswith(str(path) + ": the file is not valid YAML at line ")
    assert problem.endswith("; correct the YAML there.")


@pytest.mark.parametrize(("text", "words"), [
    ("", "the file is empty"),
    ("- model: a/b\n", "holds a list, not a mapping"),
    ("engine: vllm\nimage: x@sha256:00\nparallel: {tensor: 1}\n", "already a sparkserve recipe"),
    ("model: a/b\nruntime: llama-cpp\ncontainer: c:1\n", 'runtime is "llama-cpp"; sparkserve serves vLLM and SGLang'),
    ("model: a/b\ncontainer: c:1\ncommand: llama-server -hf {model}\n", "sparkserve serves vLLM and SGLang only"),
    ("recipe_version: '1'\nname: x\ncontainer: c\ncommand: python3 server.py --port 8000\n",
     "command runs no vLLM or SGLang server"),
    ("recipe_version: '1'\nname: x\ncommand: vllm serve a/b\n", "needs container; add it"),
    ("model: a/b\ncontainer: c:1\nruntime: vllm\ncommand: sglang serve --model-path {model}\n",
     "command runs sglang while runtime says vllm"),
])
def test_refused_sources_say_why(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeImportError) as caught:
        import_recipes([path], tmp_path / "out")
    [problem] = caught.value.problems
    assert problem.startswith(str(path) + ": ") and words in problem, problem


def test_nothing_is_written_when_one_source_fails(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", "just: a mapping\n")
    missing = tmp_path / "missing.yaml"
    with pytest.raises(RecipeImportError) as caught:
        import_recipes([EUGR_DIR, bad, missing], tmp_path / "out")
    missing_problem, bad_problem = caught.value.problems
    assert missing_problem == "%s: no such file or folder; give a recipe file or a folder of recipes." % missing
    assert bad_problem.startswith("%s: neither" % bad)
    assert not (tmp_path / "out").exists()


def test_a_hand_written_recipe_is_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "nemotron-nano-solo.yml").write_text("name: nemotron-nano-solo\n")
    with pytest.raises(RecipeImportError) as caught:
        import_recipes([EUGR_DIR / "nemotron-nano-solo.yaml"], out)
    assert "exists and was not written by sparkserve recipe import" in str(caught.value)
    assert (out / "nemotron-nano-solo.yml").read_text() == "name: nemotron-nano-solo\n"


def test_two_sources_with_one_name_are_refused(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        write(tmp_path / folder, "Same Name.yaml", "model: a/b\ncontainer: c:1\n")
    with pytest.raises(RecipeImportError) as caught:
        import_recipes([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    [problem] = caught.value.problems
    assert "its recipe name same-name is also the name of" in problem


# ------------------------------------------------------------------ the command, taken apart

def test_command_shell_details(tmp_path: Path) -> None:
    path = write(tmp_path, "shell.yaml", """\
        model: org/model-a
        container: vllm/vllm-openai:v0.31.0
        defaults:
          port: 8000
          cc_mode: PIECEWISE
        command: |
          pip install extra-package && \\
          VLLM_LOGGING_LEVEL=DEBUG exec vllm serve {model} \\
            --port={port} \\
            -O3 \\
            -cc.cudagraph_mode={cc_mode} \\
            -xyz 4 \\
            --max-num-seqs {max_seqs} \\
            --middleware a.b --middleware c.d \\
            --served-model-name name-a  # a comment
        """)
    result, recipe, _ = one(path, tmp_path / "out")
    assert recipe["launch"]["api_port"] == 8000
    assert recipe["model"]["served_name"] == "name-a"
    assert recipe["env"] == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert recipe["engine_args"] == {"optimization-level": 3, "compilation-config.cudagraph_mode": "PIECEWISE",
                                     "middleware": ["a.b", "c.d"]}
    assert "only the engine" in noted(result, 'command runs "pip install extra-package" besides the engine')
    assert "long name" in noted(result, "command flag -xyz 4")
    assert "{max_seqs} no value" in noted(result, "command flag --max-num-seqs {max_seqs}")


def test_sparkrun_ray_runtime_and_local_model_path(tmp_path: Path) -> None:
    path = write(tmp_path, "ray.yaml", """\
        recipe_version: "2"
        model: org/model-b
        runtime: vllm-ray
        container: example/vllm:1
        command: vllm serve /models/local --served-model-name b --revision v1.0 --host 0.0.0.0
        """)
    result, recipe, _ = one(path, tmp_path / "out")
    assert recipe["model"] == {"repo": "org/model-b", "revision": "v1.0", "served_name": "b"}
    noted(result, "runtime vllm-ray")
    noted(result, "command serves /models/local, not the recipe's model org/model-b")
    assert "a branch or tag" in noted(result, "model.revision v1.0 (from command flag --revision)")
    assert not [s for s in result.not_carried if s.startswith("model.revision main")]
