#!/usr/bin/env python3
"""Write recipes/README.md and recipes/recipe.schema.json from the recipe schema.

Both come from ``RECIPE_SPEC`` (plugins/module_utils/recipe/schema.py), the
data validate_recipe checks recipes against, so neither can drift from it:
the README documents every field; the JSON Schema (draft 2020-12) lets
editors check and complete a recipe as it is typed (each recipe's first line
points the YAML language server at it).

Usage::

    python3 tools/recipe-docs.py          # write both files where they differ
    python3 tools/recipe-docs.py --check  # change nothing; exit 1 naming each stale file

Pure standard library, like the schema it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = str(ROOT / "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import (  # noqa: E402 (after the sys.path line above)
    RECIPE_SCHEMA,
    RECIPE_SPEC,
)

RECIPES = ROOT / "recipes"
README = "README.md"
JSON_SCHEMA = "recipe.schema.json"
# The first line of every recipe: the YAML language server checks the file against the JSON Schema beside it.
SCHEMA_LINE = "# yaml-language-server: $schema=%s" % JSON_SCHEMA

# ---------------------------------------------------------------- JSON Schema

_JSON_TYPES = {"str": "string", "int": "integer", "number": "number", "bool": "boolean", "dict": "object",
               "list": "array"}

_JSON_HEAD = (
    "A sparkserve recipe, recipes/NAME.yml: one served configuration. Written by tools/recipe-docs.py from "
    "the schema (plugins/module_utils/recipe/schema.py); do not edit. recipes/README.md documents every field. "
    "The validator checks more than this schema: the name against the file name, distinct ports, the container "
    "name pattern, engine_args and env names, each engine's KV cache rules, the memory guard's floor below the "
    "gate, the values of the "
    "*_from variables, and the files of the recipes folder. It also reads an explicit null as an unset field, "
    "which this schema refuses: leave the field out instead."
)


def _json_type(kind: str) -> Dict[str, Any]:
    """A spec type as JSON Schema; raw (any value) is the empty schema."""
    return {} if kind == "raw" else {"type": _JSON_TYPES[kind]}


def _json_bounds(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """choices, pattern, min and max of a scalar (or of each item of a list)."""
    out: Dict[str, Any] = {}
    if "choices" in spec:
        out["enum"] = list(spec["choices"])
    if "pattern" in spec:
        out["pattern"] = spec["pattern"]
    if spec.get("min") is not None:
        out["minimum"] = spec["min"]
    if spec.get("max") is not None:
        out["maximum"] = spec["max"]
    return out


def _json_object(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """A mapping with fixed fields: no other key, the required ones, and each field or its _from twin.

    A one_of group is "exactly one of these keys"; a KEY beside a KEY_from
    outside any group is "not both".
    """
    options: Mapping[str, Any] = spec["options"]
    out: Dict[str, Any] = {
        "type": "object",
        "properties": {key: _json_field(sub) for key, sub in options.items()},
        "additionalProperties": False,
    }
    required = [key for key, sub in options.items() if sub.get("required")]
    if required:
        out["required"] = required
    rules: List[Dict[str, Any]] = []
    grouped = set()
    for group in spec.get("one_of", []):
        rules.append({"oneOf": [{"required": [key]} for key in group]})
        grouped.update(group)
    for key in options:
        if key + "_from" in options and key not in grouped:
            rules.append({"not": {"required": [key, key + "_from"]}})
    if len(rules) == 1:
        out.update(rules[0])
    elif rules:
        out["allOf"] = rules
    return out


def _json_field(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """One field of the spec as JSON Schema."""
    kind = spec.get("type", "raw")
    out = _json_type(kind)
    description = spec.get("description", "")
    if "default_template" in spec:
        description += " Default: `%s`." % spec["default_template"].replace("{", "<").replace("}", ">")
    if description:
        out["description"] = description
    if "default" in spec:
        out["default"] = spec["default"]
    if kind == "list":
        # The bounds and the fields of a list apply to each of its items, as in the validator.
        items = _json_type(spec.get("elements", "raw"))
        items.update(_json_bounds(spec))
        if "options" in spec:
            items.update(_json_object(spec))
        if items:
            out["items"] = items
    elif kind == "dict" and "options" in spec:
        out.update(_json_object(spec))
    elif kind == "dict":
        values = spec.get("values", "raw")
        out["additionalProperties"] = _json_type(values) if values != "raw" else True
    else:
        out.update(_json_bounds(spec))
    return out


def json_schema() -> Dict[str, Any]:
    """The recipe schema as JSON Schema, draft 2020-12."""
    schema: Dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "sparkserve recipe",
        "description": _JSON_HEAD,
    }
    schema.update(_json_object(RECIPE_SPEC))
    return schema


def json_schema_text() -> str:
    """recipes/recipe.schema.json: sorted keys, two-space indent, a final newline."""
    return json.dumps(json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------- README

def _doc_type(spec: Mapping[str, Any]) -> str:
    kind = spec.get("type", "raw")
    if kind == "list":
        return "list of %s" % spec.get("elements", "raw")
    if kind == "dict" and "options" not in spec:
        return "mapping of %s" % spec.get("values", "raw")
    return kind


def _doc_rows(options: Mapping[str, Any], prefix: str) -> List[str]:
    rows: List[str] = []
    for key, spec in options.items():
        path = prefix + key
        if spec.get("required"):
            need = "required"
        elif spec.get("default") == {} and "options" in spec:
            need = "optional; defaults below"
        elif "default" in spec:
            need = "default `%s`" % json.dumps(spec["default"])
        elif "default_template" in spec:
            need = "default `%s`" % spec["default_template"].replace("{", "<").replace("}", ">")
        else:
            need = "optional"
        notes = [spec.get("description", "")]
        if "choices" in spec:
            notes.append("One of: %s." % ", ".join("`%s`" % c for c in spec["choices"]))
        low, high = spec.get("min"), spec.get("max")
        if low is not None and high is not None:
            notes.append("From %s to %s." % (low, high))
        elif low is not None:
            notes.append("At least %s." % low)
        base = path + ("[]" if spec.get("type") == "list" else "")
        for group in spec.get("one_of", []):
            notes.append("Exactly one of %s%s." % (", ".join("`%s.%s`" % (base, k) for k in group),
                                                   " in each" if spec.get("type") == "list" else ""))
        text = " ".join(n for n in notes if n).replace("|", "\\|")
        rows.append("| `%s` | %s | %s | %s |" % (path, _doc_type(spec), need, text))
        if "options" in spec:
            sub = path + ("[]." if spec.get("type") == "list" else ".")
            rows += _doc_rows(spec["options"], sub)
    return rows


_DOC_HEAD = """\
# Recipes

One YAML file per served configuration: `recipes/NAME.yml`, whose `name` is
`NAME`. A recipe says what is served (engine, image, weights), how it is split
(parallel), how the ranks start and stop (launch), the engine's own flags
(engine_args, env, kv_cache), and what keeps the nodes safe and proves the
deployment serves (memory, readiness, host, bench).

<!-- Generated by tools/recipe-docs.py from the schema itself
(plugins/module_utils/recipe/schema.py); do not edit. Regenerate with:
python3 tools/recipe-docs.py -->

Editors check and complete a recipe as it is typed: its first line,
`# yaml-language-server: $schema=recipe.schema.json`, points the YAML
language server (the YAML extension of VS Code, Neovim's yamlls, ...) at
`recipes/recipe.schema.json`, the JSON Schema (draft 2020-12) written from
the same schema. It knows every field, type, choice, pattern, bound and
default, and which of a field and its `_from` twin to set; the checks across
fields, the variables' values and the files are the validator's alone. Give
every new recipe that first line.

A recipe is checked in full before anything changes on a node. Unknown keys
are errors at every level, each with its close match where there is one, at
its own level or one up or down (`tensor: 2` at the top: did you mean
`parallel.tensor`?), and every problem is reported at once, each naming the
file and the line, the field, the bad value and the fix, for example:

```
recipe glm53-fp4local-mtp-tp2 (recipes/glm53-fp4local-mtp-tp2.yml, line 38): model.revision is "main"; pin the full 40-character commit (HfApi().model_info(repo, revision="main").sha gives it).
```

A file that is not valid YAML (a tab, an unclosed bracket), is empty, is
not a mapping, or gives a key twice is refused first, with the file, line
and column. An `env` name that looks secret (a word KEY, a word ending in
TOKEN or APIKEY, or one holding SECRET or PASSWORD: `HF_TOKEN`,
`OPENAI_API_KEY`) is refused: a
recipe is committed and printed, and the Hugging Face token belongs in
Ansible Vault as `weights_hf_token`. Wherever sparkserve prints an
environment or a command line (`playbooks/render.yml`, the messages), the
value of such a name is shown as `********`.

Then it is checked against the cluster: `parallel.tensor` × `parallel.pipeline`
must equal the number of nodes × `parallel.gpus_per_node`;
`load-format: instanttensor` is refused on more than one node (ranks died
silently in multi-node loads); a gated model needs a token, in the Ansible
Vault variable `weights_hf_token` or the environment variable `HF_TOKEN`.

## Pinned by digest and commit, or by a variable

`image` must be `REPO@sha256:<64 hex>` and `model.revision` a full
40-character commit. Where the value is only known where the recipe is used
(the lab builds its own image and model) or is not published with the
recipe's source, write the field's `_from` twin instead: `image_from`,
`revision_from`, `overlays_from`, `file_overrides[].sha256_from`, each the
name of an inventory variable holding the value. The caller resolves it and
the value is checked as if it were written in the recipe; the recipe role
passes exactly the variables these fields name (`variables_named()`).

## Values the user supplies

What a recipe's source does not publish (a commit, an image digest, a patch,
a hash) is never guessed: the recipe names an inventory variable for it (a
`*_from` field) or a file of the recipes folder, says so in a comment, and
tells in `supply` where the user finds it. Until each is there the
deployment is refused, every missing value at once, each naming the field
and where to find the value:

```
recipe glm53-nvfp4-dflash2-tp4 (recipes/glm53-nvfp4-dflash2-tp4.yml, line 40): model.revision_from names the inventory variable glm53_nvfp4_revision, which is not set; set it to the full 40-character commit of zai-org/GLM-5.3-Flash-NVFP4 you deploy; seed 000 names no commit (HfApi().model_info("zai-org/GLM-5.3-Flash-NVFP4").sha gives the newest).
recipe glm53-fp4local-mtp-tp2 (recipes/glm53-fp4local-mtp-tp2.yml, line 47): model.file_overrides[0].source names "files/glm53-fp4local-mtp-tp2/generation_config.json", which is not in the recipes folder (recipes); put the file there: model/generation_config.json of DevelopingDad/GLM-5.3-Flash-FP4-Local-DGX-Spark-Optimized (...), the upstream file with terminal EOS id 154828 added; NVIDIA Open Model Agreement.
```

A variable without a `supply` sentence is refused with what the field must
hold. Files are checked when the caller gives the recipes folder: each
`overlays[].patch` and `file_overrides[].source` must be there, and an
override's file must hash to its `sha256`.

## Fields

Types: `str`, `int`, `number` (integer or decimal), `bool`, `raw` (any YAML
value). A mapping with its own fields lists them below it; unset optional
fields are `null` in the validated recipe.

| field | type | required / default | meaning |
| --- | --- | --- | --- |
"""  # noqa: E501 (recipes/README.md text: its example errors are shown whole, one line each, as printed)

_DOC_TAIL = """
## The rendered command line

Each rank gets a container named after `launch.container_name` and this
command, then the KV cache flags, then `engine_args`:

- **vllm**: `vllm serve <model.path_in_container> --served-model-name N
  --tensor-parallel-size T --pipeline-parallel-size P --nnodes W --node-rank R
  --master-addr HEAD --master-port MP`, then on rank 0 `--host H --port P`
  and on every other rank `--headless`. KV cache: `--kv-cache-dtype`,
  `--block-size`, `--kv-cache-memory-bytes` (from `memory_gib_per_rank`).
- **sglang**: `python3 -m sglang.launch_server --model-path <model.path_in_container>
  --served-model-name N --tp-size T --pp-size P --nnodes W --node-rank R
  --dist-init-addr HEAD:MP`, then on rank 0 `--host H --port P`. KV cache:
  `--kv-cache-dtype`, `--page-size`.

HEAD is the head's fabric address. Rank 0 listens on `api_port`,
`master_port` and `extra_ports`; the other ranks on `extra_ports`. SGLang
starts the same command on every rank; only rank 0 serves HTTP.

## Mounts

Every rank gets, besides the model (and draft) folder, one read-only file
mount per `file_overrides` entry: the render's `mounts` lists each as
`source_rel` (relative to the recipes folder), `target`
(`path_in_container/path`) and `sha256`. The shards are never replaced.

## Readiness and metrics per engine

The render's `endpoints` (rank 0 only) gives the head's HTTP paths. Both
engines answer `GET /health` (200 once serving; vLLM 503 on
EngineDeadError), `GET /v1/models` and the OpenAI completions; readiness
needs a real one-token completion on both, as `/v1/models` answers while
the engine is dead. `GET /metrics` is always there on vLLM (`vllm:*`
series); SGLang serves it (`sglang:*` series) only with `engine_args`
`enable-metrics: true`, and `endpoints.metrics` is null without it.

The environment of a rank is, each winning over the one before: for vLLM
`VLLM_ENGINE_READY_TIMEOUT_S` set to `readiness.timeout_s`; the recipe's
`env`; the node's fabric variables (`VLLM_HOST_IP` or `SGLANG_HOST_IP`,
`NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`, ...).

## Engine arguments

`engine_args` maps a flag name, without its leading dashes, to a value:

- a string or a number: `--flag value`;
- `true`: the bare flag, `--flag`;
- `false` or `null`: the flag is left out (to turn off a feature the engine
  enables by default, give its negative flag, such as
  `no-enable-prefix-caching: true`);
- a list: as the engine reads that flag: one flag followed by every value
  (most list options, such as `cuda-graph-sizes`), one flag per value (vLLM
  `middleware`), or one JSON list (vLLM `allowed-origins`, `allowed-methods`,
  `allowed-headers`);
- a mapping: one JSON word, as in
  `speculative-config: {method: mtp, num_speculative_tokens: 5}`.

Flags sparkserve sets itself (model, parallel sizes, nodes and rank,
addresses and ports, KV cache) are refused in `engine_args`, and so is a key
one letter off one of them (`tensor-paralel-size`); set the recipe field
named in the error instead. A draft model is passed the same way, by
the recipe: its weights are mounted at `draft_model.path_in_container`, and
the recipe names that path in the engine's speculative-decoding flag.
"""



def schema_markdown() -> str:
    """recipes/README.md, from the schema."""
    return _DOC_HEAD + "\n".join(_doc_rows(RECIPE_SCHEMA, "")) + "\n" + _DOC_TAIL


# ---------------------------------------------------------------- command line

def generated() -> Dict[str, str]:
    """Each generated file of the recipes folder, by name, with its text."""
    return {README: schema_markdown(), JSON_SCHEMA: json_schema_text()}


def stale(recipes: Path) -> List[str]:
    """The generated files of ``recipes`` that are missing or differ from what the schema gives."""
    out: List[str] = []
    for name, text in generated().items():
        path = recipes / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 and name each file that is not current")
    parser.add_argument("--recipes", type=Path, default=RECIPES, help="the recipes folder (default: %(default)s)")
    return parser.parse_args(argv)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    names = stale(args.recipes)
    if args.check:
        for name in names:
            path = args.recipes / name
            state = "is stale: it differs from what the recipe schema gives" if path.is_file() else "is missing"
            sys.stderr.write("%s %s; regenerate it with python3 tools/recipe-docs.py\n" % (_shown(path), state))
        return 1 if names else 0
    texts = generated()
    for name in names:
        (args.recipes / name).write_text(texts[name], encoding="utf-8")
        sys.stdout.write("wrote %s\n" % _shown(args.recipes / name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
