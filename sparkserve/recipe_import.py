"""`sparkserve recipe import`: recipes of the field's two formats converted into sparkserve recipes.

The two formats (docs/recipe-import.md has the mapping, field by field):

- **sparkrun** (spark-arena/sparkrun; its registry is spark-arena/recipe-registry): ``model``,
  ``model_revision``, ``runtime``, ``container``, ``defaults``, ``env``, ``command`` (a template whose
  ``{key}`` placeholders come from ``defaults``, ``{model}`` from ``model``; without one the runtime builds the
  command from ``defaults``), ``mods``, ``metadata``, ``min_nodes``/``max_nodes``, ``executor_config``, hooks.
- **spark-vllm-docker** (eugr/spark-vllm-docker's ``run-recipe.py``): ``recipe_version: "1"``, ``name``,
  ``container``, ``command`` (a ``str.format`` template over ``defaults``), ``model``, ``build_args``,
  ``mods``, ``defaults``, ``env``, ``solo_only``/``cluster_only``, ``benchmark``.

Each source file gives one sparkserve recipe, OUT_DIR/NAME.yml (NAME from the source's file name). Every value
is carried: the serve command is taken apart into the fields sparkserve sets itself (the parallel sizes, the
API's host and port, the served name, the KV cache) and ``engine_args``; what has no equivalent is listed, one
sentence each, in ``ImportResult.not_carried`` and in the file's opening comment. Nothing written is valid until
pinned: the image keeps its tag and ``model.revision`` its branch (``main`` where the source names none), which
``sparkserve recipe pin NAME`` turns into a digest and a commit. The output is deterministic: importing the same
file twice writes the same bytes.

Pure controller code: the standard library, PyYAML, and the collection's engine adapters (which flags sparkserve
sets itself) and flag lists (which flags take a value).
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES, known_flags
from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import GIB

SPARKRUN = "sparkrun"
SPARK_VLLM_DOCKER = "spark-vllm-docker"
FORMATS = (SPARKRUN, SPARK_VLLM_DOCKER)
# The first line of every file this module writes: a file without it is never overwritten.
HEADER_MARK = "# Imported by `sparkserve recipe import`"

_NAME_BAD = re.compile(r"[^a-z0-9._-]+")
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_EUGR_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_INT = re.compile(r"^-?(?:0|[1-9][0-9]*)$")
_FLOAT = re.compile(r"^-?[0-9]+\.[0-9]+$")
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(k|m|g|t|K|M|G|T|Ki|Mi|Gi|Ti)?$")
_SIZE_FACTORS = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12, "K": 2 ** 10, "M": 2 ** 20,
                 "G": 2 ** 30, "T": 2 ** 40, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}
_OPERATORS = frozenset({";", "&&", "||", "|", "&"})

# sparkrun's top-level keys that the spark-vllm-docker format does not have.
_SPARKRUN_ONLY = frozenset({
    "sparkrun_version", "model_revision", "runtime", "runtime_version", "mode", "min_nodes", "max_nodes",
    "runtime_config", "metadata", "pre_exec", "post_exec", "post_commands", "stop_after_post", "builder",
    "builder_config", "executor_config", "distribution_config",
})
# Keys of a sparkserve recipe: such a file needs no import.
_SPARKSERVE_SIGNS = frozenset({"engine", "parallel", "image", "image_from", "engine_args"})
# sparkrun's runtimes by the engine sparkserve serves them with.
_SPARKRUN_RUNTIMES = {"": "vllm", "vllm": "vllm", "vllm-distributed": "vllm", "vllm-ray": "vllm",
                      "eugr-vllm": "vllm", "sglang": "sglang"}
# sparkrun's structured defaults (used when a recipe has no command): key -> (flag, is a switch), per engine.
_SPARKRUN_FLAG_MAP: dict[str, dict[str, tuple[str, bool]]] = {
    "vllm": {
        "port": ("port", False), "host": ("host", False), "tensor_parallel": ("tensor-parallel-size", False),
        "gpu_memory_utilization": ("gpu-memory-utilization", False), "max_model_len": ("max-model-len", False),
        "max_num_batched_tokens": ("max-num-batched-tokens", False), "max_num_seqs": ("max-num-seqs", False),
        "served_model_name": ("served-model-name", False), "dtype": ("dtype", False),
        "quantization": ("quantization", False), "enforce_eager": ("enforce-eager", True),
        "enable_prefix_caching": ("enable-prefix-caching", True), "trust_remote_code": ("trust-remote-code", True),
        "pipeline_parallel": ("pipeline-parallel-size", False), "data_parallel": ("data-parallel-size", False),
        "kv_cache_dtype": ("kv-cache-dtype", False), "otlp_traces_endpoint": ("otlp-traces-endpoint", False),
        "api_key": ("api-key", False),
    },
    "sglang": {
        "port": ("port", False), "host": ("host", False), "tensor_parallel": ("tp-size", False),
        "pipeline_parallel": ("pp-size", False), "gpu_memory_utilization": ("mem-fraction-static", False),
        "max_model_len": ("context-length", False), "max_num_seqs": ("max-running-requests", False),
        "served_model_name": ("served-model-name", False), "dtype": ("dtype", False),
        "quantization": ("quantization", False), "trust_remote_code": ("trust-remote-code", True),
        "chunked_prefill": ("chunked-prefill-size", False), "kv_cache_dtype": ("kv-cache-dtype", False),
        "tokenizer_path": ("tokenizer-path", False),
        "speculative_draft_model_path": ("speculative-draft-model-path", False), "api_key": ("api-key", False),
    },
}
# vLLM's short spellings (its argument parser's aliases).
_VLLM_SHORT = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
               "dpn": "data-parallel-rank", "dpr": "data-parallel-start-rank", "dpl": "data-parallel-size-local",
               "dpa": "data-parallel-address", "dpp": "data-parallel-rpc-port", "dpb": "data-parallel-backend",
               "q": "quantization", "cc": "compilation-config", "ac": "attention-config"}
# Flags of the engines that sparkserve has no use for: the launcher's business, with the reason.
_LAUNCHER_FLAGS = {
    "distributed-executor-backend": "sparkserve starts every rank itself (vLLM's multiprocessing launch with "
                                    "--nnodes and --node-rank), without a Ray cluster",
    "data-parallel-size": "a sparkserve deployment is one replica of tensor x pipeline ranks; for more replicas "
                          "deploy the recipe again (the gateway spreads requests over deployments)",
    "data-parallel-size-local": "a sparkserve deployment is one replica of tensor x pipeline ranks",
    "data-parallel-rank": "a sparkserve deployment is one replica of tensor x pipeline ranks",
    "data-parallel-start-rank": "a sparkserve deployment is one replica of tensor x pipeline ranks",
    "data-parallel-address": "a sparkserve deployment is one replica of tensor x pipeline ranks",
    "data-parallel-rpc-port": "a sparkserve deployment is one replica of tensor x pipeline ranks",
    "dp-size": "a sparkserve deployment is one replica of tensor x pipeline ranks; for more replicas deploy the "
               "recipe again (the gateway spreads requests over deployments)",
}
_PIN = "run `sparkserve recipe pin {name}` to pin it"


@dataclass(frozen=True)
class ImportResult:
    """One source recipe imported."""

    source: Path
    name: str
    path: Path
    fmt: str
    not_carried: list[str]
    changed: bool


class RecipeImportError(ValueError):
    """Sources that cannot be imported: one sentence per problem (the file, the field, the value, the fix)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class _SourceError(Exception):
    """One source's problem, a sentence naming the file."""


@dataclass
class _Draft:
    """A sparkserve recipe being built from one source."""

    source: Path
    fmt: str
    name: str
    engine: str = "vllm"
    label: str = ""
    served_path: str = ""
    description: str = ""
    image: str | None = None
    repo: str | None = None
    revision: str | None = None
    served: list[str] = field(default_factory=list)
    tensor: int | None = None
    pipeline: int | None = None
    launch: dict[str, Any] = field(default_factory=dict)
    kv_cache: dict[str, Any] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def note(self, sentence: str) -> None:
        if sentence not in self.notes:
            self.notes.append(sentence)


# ------------------------------------------------------------------ entry point

def import_recipes(sources: Sequence[Path], out_dir: Path, *, dry_run: bool = False) -> list[ImportResult]:
    """Convert every source recipe (a file, or each *.yml/*.yaml of a folder) into OUT_DIR/NAME.yml.

    Nothing is written unless every source converts; ``dry_run`` writes nothing and says what would change.
    Raises RecipeImportError with every problem found.
    """
    problems: list[str] = []
    files: list[Path] = []
    for source in sources:
        source = Path(source)
        if source.is_dir():
            found = sorted(p for p in source.iterdir() if p.is_file() and p.suffix in (".yml", ".yaml"))
            if not found:
                problems.append("%s: the folder holds no .yml or .yaml file; give a recipe file or a folder of them."
                                % source)
            files.extend(found)
        elif source.is_file():
            files.append(source)
        else:
            problems.append("%s: no such file or folder; give a recipe file or a folder of recipes." % source)

    drafts: list[_Draft] = []
    for path in files:
        try:
            drafts.append(_convert(path))
        except _SourceError as problem:
            problems.append(str(problem))

    by_name: dict[str, Path] = {}
    for draft in drafts:
        if draft.name in by_name:
            problems.append("%s: its recipe name %s is also the name of %s, and both would be written to %s; rename "
                            "one of the files." % (draft.source, draft.name, by_name[draft.name],
                                                   Path(out_dir) / ("%s.yml" % draft.name)))
        by_name.setdefault(draft.name, draft.source)

    planned: list[tuple[_Draft, Path, str, bool]] = []
    for draft in drafts:
        target = Path(out_dir) / ("%s.yml" % draft.name)
        text = _render(draft)
        old = target.read_text(encoding="utf-8") if target.is_file() else None
        if old is not None and not old.startswith(HEADER_MARK):
            problems.append("%s: %s exists and was not written by sparkserve recipe import; rename the source file "
                            "or move that recipe away." % (draft.source, target))
        planned.append((draft, target, text, old != text))
    if problems:
        raise RecipeImportError(problems)

    results: list[ImportResult] = []
    for draft, target, text, changed in planned:
        if changed and not dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        results.append(ImportResult(source=draft.source, name=draft.name, path=target, fmt=draft.fmt,
                                    not_carried=list(draft.notes), changed=changed))
    return results


# ------------------------------------------------------------------ reading and detecting

def _load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _SourceError("%s: the file cannot be read (%s); make it a UTF-8 text file readable here."
                           % (path, exc)) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = "" if mark is None else " at line %d, column %d" % (mark.line + 1, mark.column + 1)
        raise _SourceError("%s: the file is not valid YAML%s (%s); correct the YAML there." % (
            path, where, exc.problem or exc.context or "a syntax error")) from exc
    except yaml.YAMLError as exc:
        raise _SourceError("%s: the file is not valid YAML (%s); correct it." % (path, exc)) from exc
    if data is None:
        raise _SourceError("%s: the file is empty; give a sparkrun or spark-vllm-docker recipe." % path)
    if not isinstance(data, dict):
        raise _SourceError("%s: the file holds %s, not a mapping of fields; give a sparkrun or spark-vllm-docker "
                           "recipe." % (path, "a list" if isinstance(data, list) else "a single value"))
    return {str(key): value for key, value in data.items()}


def _detect_format(path: Path, data: Mapping[str, Any]) -> str:
    """SPARKRUN or SPARK_VLLM_DOCKER from the recipe's fields; _SourceError (naming PATH) when it is neither."""
    keys = set(data)
    version = str(data.get("recipe_version", data.get("sparkrun_version", "")))
    if "engine" in keys and keys & {"parallel", "image", "image_from"}:
        signs = ", ".join(sorted(keys & _SPARKSERVE_SIGNS - {"engine"}))
        raise _SourceError("%s: this is already a sparkserve recipe (it has engine and %s); copy it into the recipes "
                           "folder instead of importing it." % (path, signs))
    if version == "2" or keys & _SPARKRUN_ONLY:
        return SPARKRUN
    if version == "1" or "build_args" in keys or {"name", "container", "command"} <= keys:
        return SPARK_VLLM_DOCKER
    if {"model", "container"} <= keys:
        return SPARKRUN
    raise _SourceError("%s: neither a sparkrun recipe (model and container, or recipe_version \"2\") nor a "
                       "spark-vllm-docker recipe (recipe_version \"1\", name, container and command); it has %s; "
                       "give a recipe in one of those formats." % (path, ", ".join(sorted(keys)) or "no fields"))


def _recipe_name(path: Path) -> str:
    name = _NAME_BAD.sub("-", path.stem.lower())
    name = re.sub(r"^[^a-z0-9]+", "", name)
    if not name:
        raise _SourceError("%s: no sparkserve recipe name can be made from the file name; rename the file with letters "
                           "or digits (qwen3-8b.yaml)." % path)
    return name


def _convert(path: Path) -> _Draft:
    data = _load(path)
    fmt = _detect_format(path, data)
    draft = _Draft(source=path, fmt=fmt, name=_recipe_name(path))
    if fmt == SPARKRUN:
        _from_sparkrun(draft, data)
    else:
        _from_spark_vllm_docker(draft, data)
    _finish(draft)
    return draft


def _text(path: Path, data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise _SourceError("%s: %s is %s, not a string; give it as text." % (path, key, _show(value)))
    return str(value)


def _mapping(path: Path, data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _SourceError("%s: %s is %s, not a mapping; give it as KEY: VALUE lines." % (path, key, _show(value)))
    return {str(k): v for k, v in value.items()}


# ------------------------------------------------------------------ the two formats

def _from_sparkrun(draft: _Draft, data: dict[str, Any]) -> None:
    path = draft.source
    model = _text(path, data, "model")
    if not model:
        raise _SourceError("%s: a sparkrun recipe needs model (the Hugging Face repository, ORG/NAME); add it." % path)
    command = _text(path, data, "command")
    runtime = _text(path, data, "runtime")
    engine = _sparkrun_engine(path, runtime, command)
    draft.engine = engine
    draft.label = _text(path, data, "name")
    meta = _mapping(path, data, "metadata")
    draft.description = _text(path, data, "description") or str(meta.get("description") or "")
    defaults = _mapping(path, data, "defaults")

    if ":" in model:
        model, quant = model.split(":", 1)
        draft.note("model %s:%s: the :%s part picks a GGUF quantization, which vLLM and SGLang do not serve from a "
                   "repository; model.repo is %s." % (model, quant, quant, model))
    draft.repo = model
    _set_image(draft, _text(path, data, "container"), "container")
    _set_revision(draft, _text(path, data, "model_revision"), "model_revision")
    if runtime == "vllm-ray":
        draft.note("runtime vllm-ray: sparkserve starts every rank itself with vLLM's own multi-node launch "
                   "(--nnodes, --node-rank), without a Ray cluster; engine vllm.")
    elif runtime == "eugr-vllm":
        draft.note("runtime eugr-vllm: sparkserve pulls a ready image instead of building one with eugr's "
                   "build-and-copy.sh; engine vllm.")

    used: set[str] = set()
    if command:
        values = dict(defaults)
        values.setdefault("model", model)
        rendered, used, missing = _substitute(command.replace("\r\n", "\n"), values, eugr=False)
        words = _engine_words(draft, rendered)
        _take_words(draft, words, missing)
        served = defaults.get("served_model_name")
        if not draft.served and served is not None:
            # sparkrun appends --served-model-name when the template lacks it.
            draft.served = [str(served)]
            used.add("served_model_name")
    else:
        used = _take_structured_defaults(draft, defaults)
    _parallel_from_defaults(draft, defaults, used)
    _unused_defaults(draft, defaults, used - {"model"})
    _take_env(draft, _mapping(path, data, "env"), "sparkrun expands $VAR there from the controller's environment")

    extra_meta = sorted(k for k in meta if k != "description")
    if extra_meta:
        draft.note("metadata (%s): facts for sparkrun's memory estimate and listings; sparkserve reads the model's "
                   "size itself (state memory.budget_gib if its estimate is wrong)." % ", ".join(extra_meta))
    for key in ("mode", "min_nodes", "max_nodes", "solo_only", "cluster_only"):
        if key in data:
            draft.note("%s %s: sparkserve places one rank per node, tensor x pipeline ranks in all "
                       "(parallel.tensor %s); give the nodes in the cluster file." % (
                           key, _show(data[key]), draft.tensor if draft.tensor is not None else "unset"))
    if data.get("runtime_version"):
        draft.note("runtime_version %s: informational in sparkrun; the engine's version is the pinned image's."
                   % _show(data["runtime_version"]))
    _not_carried_common(draft, data)
    for key in ("pre_exec", "post_exec", "post_commands", "stop_after_post"):
        if key in data:
            draft.note("%s %s: sparkserve runs no commands of the recipe in or around the engine's container; put "
                       "what they do into the image you pin, or patch its files with overlays (recipes/README.md)."
                       % (key, _show(data[key])))
    for key in ("builder", "builder_config"):
        if key in data:
            draft.note("%s %s: sparkserve builds no image; build it, push it to a registry and name it in image."
                       % (key, _show(data[key])))
    if "executor_config" in data:
        _take_executor_config(draft, _mapping(path, data, "executor_config"))
    if "distribution_config" in data:
        draft.note("distribution_config %s: sparkserve's weights stage downloads the model once and copies it to "
                   "every node itself." % _show(data["distribution_config"]))
    if "runtime_config" in data:
        draft.note("runtime_config %s: runtime settings of sparkrun with no sparkserve equivalent."
                   % _show(data["runtime_config"]))
    known = _SPARKRUN_ONLY | {"recipe_version", "name", "description", "model", "container", "defaults", "env",
                              "command", "mods", "benchmark", "build_args", "solo_only", "cluster_only"}
    for key in sorted(set(data) - known):
        draft.note("%s %s: not a field of sparkrun's either (it sweeps such keys into runtime_config); not carried."
                   % (key, _show(data[key])))


def _from_spark_vllm_docker(draft: _Draft, data: dict[str, Any]) -> None:
    path = draft.source
    command = _text(path, data, "command")
    container = _text(path, data, "container")
    missing_fields = [key for key, value in (("container", container), ("command", command)) if not value]
    if missing_fields:
        raise _SourceError("%s: a spark-vllm-docker recipe needs %s; add %s." % (
            path, " and ".join(missing_fields), "them" if len(missing_fields) > 1 else "it"))
    draft.label = _text(path, data, "name")
    draft.description = _text(path, data, "description") or draft.label
    defaults = _mapping(path, data, "defaults")
    rendered, used, missing = _substitute(command.replace("\r\n", "\n"), defaults, eugr=True)
    words = _engine_words(draft, rendered)
    model_field = _text(path, data, "model")
    _take_words(draft, words, missing, model_field=model_field)
    if draft.repo is None and model_field:
        draft.repo = model_field
    if draft.repo is None:
        draft.note("model.repo: the command serves no Hugging Face repository (ORG/NAME) and the recipe has no model; "
                   "add model.repo and model.served_name to the recipe.")
    _set_image(draft, container, "container")
    _set_revision(draft, "", "model")
    if not data.get("pull_image") and "/" not in container:
        draft.note("container %s: a local image that eugr's build-and-copy.sh builds%s; build it, push it to a "
                   "registry and write that reference in image before pinning it." % (
                       container, " with build_args %s" % " ".join(str(a) for a in data.get("build_args") or [])
                       if data.get("build_args") else ""))
    elif data.get("build_args"):
        draft.note("build_args %s: sparkserve builds no image; build it with them, push it and name it in image."
                   % _show(data["build_args"]))
    _parallel_from_defaults(draft, {}, used)
    _unused_defaults(draft, defaults, used)
    _take_env(draft, _mapping(path, data, "env"), "the launch script exports them through bash, which expands "
                                                  "$VAR there")
    for key in ("solo_only", "cluster_only"):
        if data.get(key):
            draft.note("%s: true: sparkserve places one rank per node, tensor x pipeline ranks in all (parallel.tensor "
                       "%s); give the nodes in the cluster file." % (key, draft.tensor))
    if "pull_image" in data:
        draft.note("pull_image %s: sparkserve always pulls the pinned image on every node." % _show(data["pull_image"]))
    _not_carried_common(draft, data)
    known = {"recipe_version", "name", "description", "model", "container", "command", "defaults", "env", "mods",
             "build_args", "solo_only", "cluster_only", "benchmark", "pull_image"}
    for key in sorted(set(data) - known):
        draft.note("%s %s: not a field of spark-vllm-docker's run-recipe.py; not carried." % (key, _show(data[key])))


def _not_carried_common(draft: _Draft, data: Mapping[str, Any]) -> None:
    if data.get("mods"):
        draft.note("mods %s: sparkserve runs no scripts in the engine's container; bake the changes into the image "
                   "you pin, or patch the image's files with overlays, each checked by sha256 (recipes/README.md)."
                   % _show(data["mods"]))
    if "build_args" in data and draft.fmt == SPARKRUN and data.get("build_args"):
        draft.note("build_args %s: sparkserve builds no image; build it with them, push it and name it in image."
                   % _show(data["build_args"]))
    if data.get("benchmark"):
        draft.note("benchmark %s: sparkserve's benchmark has its own suites and gates; write them under bench "
                   "(bench/README.md)." % _show(data["benchmark"]))


def _sparkrun_engine(path: Path, runtime: str, command: str) -> str:
    first = command.strip()
    if not runtime and first:
        if re.match(r"^(?:sglang\s+serve|python3?\s+-m\s+sglang\.launch_server)\b", first):
            return "sglang"
        if re.match(r"^(?:llama-server|trtllm-serve|mpirun\b)", first):
            raise _SourceError("%s: command starts %s; sparkserve serves vLLM and SGLang only; import a vLLM or SGLang "
                               "recipe." % (path, _show(first.split()[0])))
    if runtime not in _SPARKRUN_RUNTIMES:
        raise _SourceError("%s: runtime is %s; sparkserve serves vLLM and SGLang only (sparkrun's vllm, "
                           "vllm-distributed, vllm-ray, eugr-vllm, sglang); import a recipe of one of those."
                           % (path, _show(runtime)))
    return _SPARKRUN_RUNTIMES[runtime]


# ------------------------------------------------------------------ the command

def _substitute(template: str, values: Mapping[str, Any], *, eugr: bool) -> tuple[str, set[str], set[str]]:
    """TEMPLATE with its {key} placeholders filled from VALUES; the keys used and those without a value.

    spark-vllm-docker formats with str.format ({{ and }} are braces); sparkrun fills known keys again and again
    (a value may hold a placeholder) and leaves unknown ones as they are.
    """
    used: set[str] = set()
    missing: set[str] = set()
    if eugr:
        def one(match: re.Match[str]) -> str:
            token, key = match.group(0), match.group(1)
            if key is None:
                return token[0]
            if key in values:
                used.add(key)
                return _word(values[key])
            missing.add(key)
            return token
        return _EUGR_FIELD.sub(one, template), used, missing

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key in values:
            used.add(key)
            return _word(values[key])
        missing.add(key)
        return match.group(0)
    text = template
    for _ in range(10):
        after = _PLACEHOLDER.sub(fill, text)
        if after == text:
            break
        text = after
    return text, used, missing


def _word(value: Any) -> str:
    return str(value)


def _split_shell(text: str) -> list[list[str]]:
    """TEXT as bash reads it: continuation lines joined, comments dropped, the commands of the text apart."""
    text = re.sub(r"\\[ \t]*\r?\n", " ", text)  # sparkrun also forgives spaces after the backslash
    out: list[str] = []
    quote = ""
    escaped = False
    for char in text:  # newlines outside quotes end a command
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "\n":
            out.append(" ; ")
            continue
        out.append(char)
    lexer = shlex.shlex("".join(out), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError as exc:
        raise _SourceError("command cannot be read as a shell command (%s); close its quotes." % exc) from exc
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token in _OPERATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _program(words: list[str]) -> tuple[str, int] | None:
    """The engine a command runs and where its arguments start, or None when it runs neither."""
    if words[:2] == ["vllm", "serve"]:
        return "vllm", 2
    if words[:2] == ["sglang", "serve"]:
        return "sglang", 2
    if len(words) >= 3 and re.match(r"^python3?$", words[0]) and words[1] == "-m":
        if words[2] == "vllm.entrypoints.openai.api_server":
            return "vllm", 3
        if words[2] == "sglang.launch_server":
            return "sglang", 3
    return None


def _engine_words(draft: _Draft, rendered: str) -> list[str]:
    """The arguments of the engine's command in RENDERED; the other commands and VAR=value prefixes noted."""
    try:
        commands = _split_shell(rendered)
    except _SourceError as problem:
        raise _SourceError("%s: %s" % (draft.source, problem)) from problem
    found: list[str] | None = None
    for words in commands:
        rest = list(words)
        assigned: dict[str, str] = {}
        while rest and (rest[0] == "exec" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", rest[0])):
            word = rest.pop(0)
            if word != "exec":
                key, _, value = word.partition("=")
                assigned[key] = value
        program = _program(rest) if rest else None
        if program is None or found is not None:
            draft.note("command runs %s besides the engine: sparkserve runs only the engine in the container; put "
                       "that step into the image you pin." % _show(" ".join(words)))
            continue
        engine, start = program
        if engine != draft.engine and draft.fmt == SPARK_VLLM_DOCKER:
            draft.engine = engine
        elif engine != draft.engine:
            raise _SourceError("%s: command runs %s while runtime says %s; make them agree." % (
                draft.source, engine, draft.engine))
        for key, value in assigned.items():
            draft.env[key] = value
        found = rest[start:]
    if found is None:
        raise _SourceError("%s: command runs no vLLM or SGLang server (vllm serve, python3 -m sglang.launch_server, "
                           "sglang serve); give the engine's serve command." % draft.source)
    return found


def _flag_kinds(engine: str) -> Mapping[str, str]:
    version = known_flags.newest(engine)
    if version is None:
        return {}
    try:
        return known_flags.load(engine, version).flags
    except (FileNotFoundError, ValueError):
        return {}


def _parse_flags(draft: _Draft, words: list[str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """The positional words and the flags (name without dashes, value) of an engine's arguments, in order.

    A switch of the engine's flag list takes no value; any other flag takes the words up to the next flag (one
    word, or several for the flags that take a list), or none when a flag follows at once.
    """
    kinds = _flag_kinds(draft.engine)
    positional: list[str] = []
    flags: list[tuple[str, Any]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-" or _is_number(word):
            positional.append(word)
            continue
        name, inline = (word[2:], None) if word.startswith("--") else (word[1:], None)
        if "=" in name:
            name, inline = name.split("=", 1)
        if not word.startswith("--"):
            long_name = _long_name(draft.engine, name)
            if long_name is None:
                value = inline if inline is not None else (words[i] if i < len(words) and not _is_flag(words[i])
                                                           else None)
                if inline is None and value is not None:
                    i += 1
                draft.note("command flag %s%s: a short flag the importer cannot name; write it in engine_args by "
                           "its long name (without dashes)." % (word, "" if inline is not None or value is None
                                                                else " " + value))
                continue
            if long_name.startswith("optimization-level="):
                long_name, inline = long_name.split("=", 1)
            name = long_name
        if inline is not None:
            flags.append((name, inline))
            continue
        kind = kinds.get(name.replace("_", "-").split(".", 1)[0])
        if kind == known_flags.SWITCH:
            flags.append((name, True))
            continue
        values: list[str] = []
        while i < len(words) and (not _is_flag(words[i]) or (kind == known_flags.VALUE and not values)):
            values.append(words[i])
            i += 1
        if not values:
            flags.append((name, True))
        else:
            flags.append((name, values[0] if len(values) == 1 else values))
    return positional, flags


def _long_name(engine: str, short: str) -> str | None:
    base, dot, rest = short.partition(".")
    if engine == "vllm":
        if re.match(r"^O[0-9]$", short):
            return "optimization-level=" + short[1:]
        if base == "O" and dot:
            return "compilation-config." + rest
        if base in _VLLM_SHORT:
            return _VLLM_SHORT[base] + dot + rest
    if engine == "sglang" and short in ("tp", "pp", "ep", "dp"):
        return short  # SGLang spells these with two dashes; one dash reaches the same flag
    return None


def _is_number(word: str) -> bool:
    return bool(_INT.match(word) or _FLOAT.match(word))


def _is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _is_number(word)


def _typed(value: str) -> Any:
    """A command word as YAML keeps it best: a whole number, a decimal, a JSON object, else the text."""
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        return float(value)
    if value.startswith("{") and value.endswith("}"):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if isinstance(parsed, dict):
            return parsed
    return value


def _take_words(draft: _Draft, words: list[str], missing: set[str], model_field: str = "") -> None:
    """The engine's arguments into the recipe: sparkserve's own fields, engine_args, or the notes."""
    positional, flags = _parse_flags(draft, words)
    owned = ENGINES[draft.engine].owned_flags if draft.engine in ENGINES else {}
    model_words = list(positional[:1])
    for word in positional[1:]:
        draft.note("command word %s: an argument after the model that the engine's parser would refuse; not "
                   "carried." % _show(word))
    seen: dict[str, str] = {}
    for name, raw in flags:
        norm = name.replace("_", "-")
        shown = "--%s %s" % (name, raw if not isinstance(raw, list) else " ".join(raw)) if raw is not True \
            else "--%s" % name
        unfilled = [key for key in _PLACEHOLDER.findall(" ".join(raw) if isinstance(raw, list) else str(raw))
                    if key in missing]
        if unfilled:
            draft.note("command flag %s: the source gives {%s} no value (it is not in defaults); set it in "
                       "engine_args or the field sparkserve has for it." % (shown, unfilled[0]))
            continue
        if norm in seen and norm not in ENGINES[draft.engine].repeated_flags:
            draft.note("command flag --%s is given twice; the engine keeps the last value, and so does the import."
                       % name)
        seen[norm] = name
        if norm in ("model", "model-path"):
            model_words = [str(raw)]
            continue
        if norm == "revision":
            _set_revision(draft, str(raw), "command flag --revision")
            continue
        if norm in _LAUNCHER_FLAGS:
            draft.note("command flag %s: %s." % (shown, _LAUNCHER_FLAGS[norm]))
            continue
        if norm in owned:
            if norm in ("served-model-name",):
                draft.served = [str(v) for v in (raw if isinstance(raw, list) else [raw])]
                continue
            if not _take_owned(draft, norm, raw, owned[norm]):
                draft.note("command flag %s: sparkserve sets --%s itself, from %s." % (shown, norm, owned[norm]))
            continue
        value: Any = raw if raw is True else ([_typed(v) for v in raw] if isinstance(raw, list) else _typed(raw))
        if norm in ENGINES[draft.engine].repeated_flags and name in draft.engine_args:
            before = draft.engine_args[name]
            draft.engine_args[name] = (before if isinstance(before, list) else [before]) + (
                value if isinstance(value, list) else [value])
            continue
        draft.engine_args.pop(name, None)
        draft.engine_args[name] = value
    draft.served_path = model_words[0] if model_words else ""
    _set_model(draft, draft.served_path, model_field)


def _set_model(draft: _Draft, served_path: str, model_field: str) -> None:
    """model.repo from the model the command serves (the source's model field where it names a local path)."""
    if draft.fmt == SPARKRUN:
        if served_path and served_path != draft.repo:
            draft.note("command serves %s, not the recipe's model %s; sparkserve downloads model.repo %s and serves "
                       "it from model.path_in_container." % (served_path, draft.repo, draft.repo))
        return
    if served_path and _HF_REPO.match(served_path):
        draft.repo = served_path
        if model_field and model_field != served_path:
            draft.note("model %s: the recipe downloads it but its command serves %s; model.repo is %s." % (
                model_field, served_path, served_path))
    elif served_path:
        draft.note("command serves %s, a path rather than a Hugging Face repository; sparkserve downloads model.repo "
                   "and serves it from model.path_in_container." % served_path)


def _take_owned(draft: _Draft, flag: str, raw: Any, target: str) -> bool:
    """A flag sparkserve sets itself into its field; False when the field is not one the import fills."""
    text = str(raw)
    if target in ("parallel.tensor", "parallel.pipeline", "launch.api_port", "launch.master_port",
                  "kv_cache.block_size"):
        if not _INT.match(text):
            draft.note("command flag --%s %s: %s takes a whole number; set it yourself." % (flag, text, target))
            return True
        number = int(text)
        if target == "parallel.tensor":
            draft.tensor = number
        elif target == "parallel.pipeline":
            draft.pipeline = number
        elif target == "launch.api_port":
            draft.launch["api_port"] = number
        elif target == "launch.master_port":
            draft.launch["master_port"] = number
        else:
            draft.kv_cache["block_size"] = number
        return True
    if target == "launch.api_host":
        draft.launch["api_host"] = text
        return True
    if target == "kv_cache.dtype":
        draft.kv_cache["dtype"] = text
        return True
    if target == "kv_cache.memory_gib_per_rank":
        size = _SIZE.match(text)
        if size is None:
            draft.note("command flag --%s %s: not a size the import can read; set kv_cache.memory_gib_per_rank "
                       "yourself." % (flag, text))
            return True
        gib = float(size.group(1)) * _SIZE_FACTORS.get(size.group(2) or "", 1) / GIB
        draft.kv_cache["memory_gib_per_rank"] = int(gib) if gib == int(gib) else gib
        return True
    return False


def _take_structured_defaults(draft: _Draft, defaults: Mapping[str, Any]) -> set[str]:
    """A sparkrun recipe without command: its runtime's command from defaults, through sparkrun's flag map."""
    words: list[str] = []
    used: set[str] = set()
    for key, (flag, switch) in _SPARKRUN_FLAG_MAP[draft.engine].items():
        if key not in defaults or defaults[key] is None:
            continue
        used.add(key)
        if switch:
            if str(defaults[key]).strip().lower() in ("1", "true", "yes", "on", "y", "t"):
                words.append("--" + flag)
        else:
            words += ["--" + flag, str(defaults[key])]
    if "distributed_executor_backend" in defaults:
        used.add("distributed_executor_backend")
        words += ["--distributed-executor-backend", str(defaults["distributed_executor_backend"])]
    _take_words(draft, [draft.repo or ""] + words, set())
    return used


def _parallel_from_defaults(draft: _Draft, defaults: Mapping[str, Any], used: set[str]) -> None:
    """parallel.tensor and .pipeline where the command sets none: the defaults that size the cluster, else 1."""
    for key, attr, flag in (("tensor_parallel", "tensor", "tensor-parallel"),
                            ("pipeline_parallel", "pipeline", "pipeline-parallel")):
        if getattr(draft, attr) is not None:
            continue
        value = defaults.get(key)
        if value is not None and _INT.match(str(value)):
            setattr(draft, attr, int(str(value)))
            used.add(key)
        elif attr == "tensor":
            draft.tensor = 1
            draft.note("parallel.tensor 1: the source sets no %s size, and 1 is the engine's default." % flag)


def _unused_defaults(draft: _Draft, defaults: Mapping[str, Any], used: set[str]) -> None:
    for key in defaults:
        if key not in used:
            draft.note("defaults.%s %s: the command uses no {%s}, so the engine never gets it; not carried." % (
                key, _show(defaults[key]), key))


def _take_env(draft: _Draft, env: Mapping[str, Any], expands: str) -> None:
    for key, value in env.items():
        text = str(value)
        draft.env[key] = text
        if "$" in text:
            draft.note("env.%s %s: %s; sparkserve passes the text as it is, so write the value itself." % (
                key, _show(text), expands))


def _take_executor_config(draft: _Draft, config: Mapping[str, Any]) -> None:
    rest = dict(config)
    policy = rest.pop("restart_policy", None)
    if policy is not None:
        if str(policy) in ("no", "on-failure", "unless-stopped", "always"):
            draft.launch["restart_policy"] = str(policy)
        else:
            draft.note("executor_config.restart_policy %s: sparkserve takes no, on-failure, unless-stopped or always "
                       "(its supervisor restarts the ranks itself); set launch.restart_policy yourself."
                       % _show(policy))
    if rest:
        draft.note("executor_config %s: docker options sparkserve sets itself for every rank (privileged, host "
                   "network and IPC, all GPUs); not carried." % _show(rest))


def _set_image(draft: _Draft, container: str, source_field: str) -> None:
    if not container:
        draft.note("%s: the source names none (sparkrun then picks its runtime's default image); write image as "
                   "REPO:TAG and %s." % (source_field, _PIN.format(name=draft.name)))
        return
    draft.image = container
    if "@sha256:" in container:
        return
    last = container.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else None
    if tag is None:
        draft.note("image %s: no tag, which Docker reads as :latest, and no digest; %s by digest." % (
            container, _PIN.format(name=draft.name)))
    else:
        draft.note("image %s: the tag :%s can move to another image; %s by digest." % (
            container, tag, _PIN.format(name=draft.name)))


def _set_revision(draft: _Draft, revision: str, source_field: str) -> None:
    if revision and _COMMIT.match(revision):
        draft.revision = revision
        return
    if revision:
        draft.revision = revision
        draft.note("model.revision %s (from %s): a branch or tag, which can move; %s to its commit." % (
            revision, source_field, _PIN.format(name=draft.name)))
        return
    if draft.revision is None:
        draft.revision = "main"
        draft.note("model.revision main: the source names no revision and downloads the repository's main branch; "
                   "%s to its commit." % _PIN.format(name=draft.name))


def _finish(draft: _Draft) -> None:
    # --revision in the command replaces the defaulted main: drop the note that said main.
    if draft.revision != "main":
        draft.notes = [n for n in draft.notes if not n.startswith("model.revision main:")]
    if not draft.served and _HF_REPO.match(draft.served_path):
        draft.served = [draft.served_path]
        draft.note("model.served_name %s: the source names no served model, so the engine answers to the model as "
                   "the command names it; the import keeps that name (change it if you like)." % draft.served_path)
    elif not draft.served:
        draft.note("model.served_name: the source names no served model and serves no Hugging Face repository by "
                   "name; add the name clients use.")
    if "api_host" not in draft.launch:
        draft.note("launch.api_host: the source sets no host, so the engine listened on every interface; sparkserve "
                   "binds the API to 127.0.0.1 unless launch.api_host says otherwise (0.0.0.0 keeps the old reach).")


# ------------------------------------------------------------------ writing

def _recipe(draft: _Draft) -> dict[str, Any]:
    recipe: dict[str, Any] = {"name": draft.name}
    if draft.description:
        recipe["description"] = draft.description
    recipe["engine"] = draft.engine
    if draft.image is not None:
        recipe["image"] = draft.image
    model: dict[str, Any] = {}
    if draft.repo is not None:
        model["repo"] = draft.repo
    if draft.revision is not None:
        model["revision"] = draft.revision
    if draft.served:
        model["served_name"] = draft.served[0]
        if len(draft.served) > 1:
            model["aliases"] = draft.served[1:]
    recipe["model"] = model
    recipe["parallel"] = {"tensor": draft.tensor if draft.tensor is not None else 1,
                          "pipeline": draft.pipeline if draft.pipeline is not None else 1}
    launch = {key: draft.launch[key] for key in ("api_host", "api_port", "master_port", "restart_policy")
              if key in draft.launch}
    if launch:
        recipe["launch"] = launch
    if draft.engine_args:
        recipe["engine_args"] = dict(draft.engine_args)
    if draft.kv_cache:
        recipe["kv_cache"] = {key: draft.kv_cache[key] for key in ("dtype", "block_size", "memory_gib_per_rank")
                              if key in draft.kv_cache}
    if draft.env:
        recipe["env"] = dict(draft.env)
    return recipe


def _render(draft: _Draft) -> str:
    named = " (named %s there)" % json.dumps(draft.label) if draft.label and draft.label != draft.name else ""
    first = textwrap.wrap("%s from %s, a %s recipe%s." % (HEADER_MARK[2:], draft.source.name, draft.fmt, named),
                          width=114, break_long_words=False, break_on_hyphens=False)
    lines = ["# " + line for line in first]
    lines += ["# " + line for line in textwrap.wrap(
        "Not valid until pinned: `sparkserve recipe pin %s` pins the image by digest and the model's revision to a "
        "commit. The mapping of the fields: docs/recipe-import.md." % draft.name,
        width=114, break_long_words=False, break_on_hyphens=False)]
    if draft.notes:
        lines.append("# Not carried over, or to check:")
        for sentence in draft.notes:
            wrapped = textwrap.wrap(sentence, width=112, break_long_words=False, break_on_hyphens=False)
            lines.append("# - " + wrapped[0])
            lines.extend("#   " + more for more in wrapped[1:])
    body = yaml.safe_dump(_recipe(draft), sort_keys=False, default_flow_style=False, allow_unicode=True, width=110)
    return "\n".join(lines) + "\n" + body


def _show(value: Any) -> str:
    """A value as it reads in a sentence: JSON, short."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."
