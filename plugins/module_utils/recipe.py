"""The recipe: one YAML file per served configuration.

The schema is defined once, as data (``RECIPE_SPEC``), in the shape of an
Ansible argument spec. ``validate_recipe`` checks a loaded recipe against it
and fills the defaults, ``validate_for_cluster`` checks it against the cluster
it is about to run on, and ``render_rank`` turns it into one rank's container
name, engine command line, environment and ports. ``schema_markdown`` writes
``recipes/README.md`` from the same data, so the documentation cannot drift.

Pure standard library: this file also runs on the nodes, which have no
pyyaml. Callers load the YAML themselves. Run it as a script to print the
README: ``python plugins/module_utils/recipe.py > recipes/README.md``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import posixpath
import re
import string
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeGuard, Union

GIB = 1024 ** 3

_HEX40 = r"^[0-9a-f]{40}$"
_HEX64 = r"^[0-9a-f]{64}$"
_VARIABLE = r"^[A-Za-z_][A-Za-z0-9_]*$"
_HF_REPO = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
_ABS_PATH = r"^/[^\s]*$"
_PORT = {"type": "int", "min": 1, "max": 65535, "hint": "use a TCP port between 1 and 65535"}

_IMAGE_HINT = (
    "pin the image by digest, REPO@sha256:<64 hex> (docker buildx imagetools inspect IMAGE "
    "prints the digest); a tag alone can move under the recipe"
)
_REVISION_HINT = (
    'pin the full 40-character commit (HfApi().model_info(repo, revision="{value}").sha gives it)'
)
_FROM_HINT = "give the name of an inventory variable, letters, digits and underscores"
# A path inside a folder: relative, without spaces, and no part of it "..".
_RELATIVE_PATH = r"^(?!/)(?!(?:.*/)?\.\.(?:/|$))[^\s]+$"
# Files of a model folder that hold weights; file_overrides may not replace them.
_SHARD_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")


def _from(key: str, holds: str, wants: str) -> Dict[str, Any]:
    """The field KEY_from, which names the inventory variable that holds KEY's value.

    ``wants`` says what the variable must hold; a deployment whose inventory
    lacks the variable is refused with it (or with the recipe's own ``supply``
    sentence for that variable). ``{sibling}`` in it is replaced by the value
    of that sibling field.
    """
    return {
        "type": "str",
        "pattern": _VARIABLE,
        "hint": _FROM_HINT,
        "wants": wants,
        "description": "Instead of `%s`: the name of an inventory variable that holds %s. The resolved "
                       "value is checked like `%s`." % (key, holds, key),
    }


# Small files of a model folder replaced or added: model.file_overrides and draft_model.file_overrides.
_FILE_OVERRIDES: Dict[str, Any] = {
    "type": "list",
    "elements": "dict",
    "default": [],
    "one_of": [["sha256", "sha256_from"]],
    "description": "A small file of the model folder replaced or added, hash-checked, mounted read-only over "
                   "the model; the shards are never touched. Each rank gets one read-only mount per file "
                   "(see *Mounts*).",
    "options": {
        "path": {
            "type": "str",
            "required": True,
            "pattern": _RELATIVE_PATH,
            "hint": "give the file's path relative to the model folder, without .. (generation_config.json)",
            "description": "The file, relative to the model folder (`generation_config.json`); no `..`, and "
                           "never a weight shard.",
        },
        "source": {
            "type": "str",
            "required": True,
            "pattern": _RELATIVE_PATH,
            "hint": "give a file of the recipes folder, relative to it, without .. "
                    "(files/RECIPE/generation_config.json)",
            "description": "The replacement: a file of the recipes folder, relative to it "
                           "(`files/RECIPE/generation_config.json`).",
        },
        "sha256": {
            "type": "str",
            "pattern": _HEX64,
            "hint": "give the 64 hex digits of sha256sum of the source file",
            "description": "sha256 of `source`; the file is refused when it differs.",
        },
        "sha256_from": _from("sha256", "the sha256", "the 64 hex digits of sha256sum {source}"),
    },
}

# The options of a Hugging Face repository pinned to a commit (the model, the draft model).
_PINNED_REPO: Dict[str, Any] = {
    "repo": {
        "type": "str",
        "required": True,
        "pattern": _HF_REPO,
        "hint": "give the Hugging Face repository as ORG/NAME",
        "description": "Hugging Face repository, `ORG/NAME`.",
    },
    "revision": {
        "type": "str",
        "pattern": _HEX40,
        "hint": _REVISION_HINT,
        "description": "The full 40-character commit of the repository; a branch or tag is refused. "
                       "Set exactly one of `revision` and `revision_from`.",
    },
    "revision_from": _from("revision", "the commit",
                           'the full 40-character commit of {repo} (HfApi().model_info("{repo}").sha gives '
                           "the newest)"),
}

# The schema. Keys of a field: type (str, int, number, bool, dict, list, raw),
# required, default, default_template (a default formatted with the sibling
# fields), choices, pattern, min, max, elements (type of list items), options
# (the fields of a mapping, or of each mapping of a list), values (type of the
# values of a free mapping), one_of (groups of sibling fields of which exactly
# one must be set), hint (how to fix a bad value; {value} is the value given),
# wants (for a KEY_from field: what the variable must hold, said when it is
# missing), description. A field KEY_from beside a field KEY names the
# inventory variable that holds KEY's value (see _from); at most one of the
# two may be set.
RECIPE_SPEC: Dict[str, Any] = {
    "type": "dict",
    "one_of": [["image", "image_from"]],
    "options": {
        "name": {
            "type": "str",
            "required": True,
            "pattern": r"^[a-z0-9][a-z0-9._-]*$",
            "hint": "use lower-case letters, digits, dots, dashes and underscores, the same as the file name",
            "description": "The recipe's name; the same as its file name without `.yml`.",
        },
        "description": {
            "type": "str",
            "default": "",
            "description": "One or two sentences: what is served, on what, and why this configuration.",
        },
        "engine": {
            "type": "str",
            "required": True,
            "choices": ["vllm", "sglang"],
            "description": "The serving engine; it decides the command line (see *The rendered command line*).",
        },
        "image": {
            "type": "str",
            "pattern": r"^[A-Za-z0-9][A-Za-z0-9._/:-]*@sha256:[0-9a-f]{64}$",
            "hint": _IMAGE_HINT,
            "description": "The engine's container image, pinned by digest: `REPO@sha256:<64 hex>`. "
                           "A tag alone is refused. Set exactly one of `image` and `image_from`.",
        },
        "image_from": _from("image", "the digest-pinned reference (for images built where the recipe is "
                                     "used, as in the lab)",
                            "the image pinned by digest, REPO@sha256:<64 hex> (docker buildx imagetools inspect "
                            "IMAGE prints the digest)"),
        "model": {
            "type": "dict",
            "required": True,
            "one_of": [["revision", "revision_from"]],
            "description": "The served weights.",
            "options": {
                **_PINNED_REPO,
                "served_name": {
                    "type": "str",
                    "required": True,
                    "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
                    "hint": "use letters, digits and . _ : / - only",
                    "description": "The model name clients put in requests (`--served-model-name`).",
                },
                "gated": {
                    "type": "bool",
                    "default": False,
                    "description": "The repository needs an accepted licence and a token to download; the "
                                   "deployment then refuses to start without `weights_hf_token` or `HF_TOKEN`.",
                },
                "path_in_container": {
                    "type": "str",
                    "default_template": "/models/{served_name}",
                    "pattern": _ABS_PATH,
                    "hint": "give an absolute path without spaces",
                    "description": "Where the weights are mounted in the container; the engine loads from here.",
                },
                "file_overrides": _FILE_OVERRIDES,
            },
        },
        "overlays_repo": {
            "type": "dict",
            "one_of": [["revision", "revision_from"]],
            "description": "Optional Hugging Face repository, pinned to a commit, that holds the overlays' patches "
                           "(a release published that way). The weights stage downloads, relays and verifies it like "
                           "the weights; each `overlays[].patch` is then a path inside it, not in the recipes folder.",
            "options": {
                **_PINNED_REPO,
                "gated": {
                    "type": "bool",
                    "default": False,
                    "description": "As `model.gated`.",
                },
            },
        },
        "draft_model": {
            "type": "dict",
            "one_of": [["revision", "revision_from"]],
            "description": "Optional weights of a draft model for speculative decoding, downloaded and mounted "
                           "beside the model. The recipe passes it to the engine itself, through `engine_args` "
                           "(for vLLM, `speculative-config` with `model` set to `path_in_container`).",
            "options": {
                **_PINNED_REPO,
                "gated": {
                    "type": "bool",
                    "default": False,
                    "description": "As `model.gated`.",
                },
                "path_in_container": {
                    "type": "str",
                    "default": "/models/draft",
                    "pattern": _ABS_PATH,
                    "hint": "give an absolute path without spaces",
                    "description": "Where the draft weights are mounted in the container.",
                },
                "file_overrides": dict(_FILE_OVERRIDES, description="As `model.file_overrides`, over the "
                                                                    "draft model's folder."),
            },
        },
        "parallel": {
            "type": "dict",
            "required": True,
            "description": "How the model is split. tensor × pipeline must equal nodes × gpus_per_node.",
            "options": {
                "tensor": {
                    "type": "int",
                    "required": True,
                    "min": 1,
                    "description": "Tensor-parallel size.",
                },
                "pipeline": {
                    "type": "int",
                    "default": 1,
                    "min": 1,
                    "description": "Pipeline-parallel size.",
                },
                "gpus_per_node": {
                    "type": "int",
                    "default": 1,
                    "min": 1,
                    "description": "GPUs each node contributes; a DGX Spark has one.",
                },
            },
        },
        "launch": {
            "type": "dict",
            "default": {},
            "description": "How the ranks are started and stopped.",
            "options": {
                "order": {
                    "type": "str",
                    "default": "workers_first",
                    "choices": ["workers_first", "head_first"],
                    "description": "`workers_first`: the highest rank first, the head (rank 0) last, as both seeds "
                                   "do. `head_first`: rank 0 first, then the workers once its master port answers.",
                },
                "api_host": {
                    "type": "str",
                    "default": "127.0.0.1",
                    "description": "Address the head's API binds to. Loopback by default: the engines "
                                   "bind every interface unless told otherwise.",
                },
                "api_port": dict(_PORT, default=8000, description="The head's API port (`--port`)."),
                "master_port": dict(_PORT, default=29501, description="The head's rendezvous port: vLLM "
                                    "`--master-port`, SGLang `--dist-init-addr HEAD:PORT`."),
                "extra_ports": {
                    "type": "list",
                    "elements": "int",
                    "default": [],
                    "min": 1,
                    "max": 65535,
                    "hint": "use TCP ports between 1 and 65535",
                    "description": "Other ports the engine listens on, on every rank; they must be free before a "
                                   "launch and may not repeat `api_port` or `master_port`.",
                },
                "container_name": {
                    "type": "str",
                    "default": "{deployment}-rank{rank}",
                    "description": "Pattern of each rank's container name; `{deployment}` and `{rank}` are "
                                   "replaced, and `{rank}` must appear.",
                },
                "stop_grace_s": {
                    "type": "int",
                    "default": 60,
                    "min": 0,
                    "description": "Seconds `docker stop` waits before it kills a rank.",
                },
                "memory_limit": {
                    "type": "str",
                    "pattern": r"^[0-9]+[bkmgBKMG]?$",
                    "hint": "give a docker memory size such as 110g",
                    "description": "Optional container memory and swap cap, in docker's form (`110g`).",
                },
                "restart_policy": {
                    "type": "str",
                    "default": "no",
                    "choices": ["no", "on-failure", "unless-stopped", "always"],
                    "description": "Docker restart policy. `no`: a dead rank stays down and the deployment is "
                                   "relaunched as a whole, in order. Quote it in YAML (`\"no\"`).",
                },
            },
        },
        "engine_args": {
            "type": "dict",
            "values": "raw",
            "default": {},
            "description": "Engine flags, name (without leading dashes) to value, rendered in file order after "
                           "the flags sparkserve sets (see *Engine arguments*).",
        },
        "env": {
            "type": "dict",
            "values": "str",
            "default": {},
            "description": "Environment of every rank's container, name to string value. The fabric's "
                           "variables (`VLLM_HOST_IP`, `NCCL_*`, ...) are set per node and win over these.",
        },
        "kv_cache": {
            "type": "dict",
            "default": {},
            "description": "The KV cache. Unset fields leave the engine's default.",
            "options": {
                "dtype": {
                    "type": "str",
                    "description": "`--kv-cache-dtype`, for example `fp8`.",
                },
                "block_size": {
                    "type": "int",
                    "min": 1,
                    "description": "Tokens per KV block: vLLM `--block-size`, SGLang `--page-size`.",
                },
                "memory_gib_per_rank": {
                    "type": "number",
                    "min": 0.001,
                    "description": "A fixed KV cache size per rank in GiB, instead of a fraction of free memory: "
                                   "vLLM `--kv-cache-memory-bytes`. SGLang has no such flag (size its pool with "
                                   "`engine_args` `max-total-tokens`).",
                },
            },
        },
        "overlays": {
            "type": "list",
            "elements": "dict",
            "default": [],
            "description": "Source files of the image replaced by patched copies, each verified before and after.",
            "options": {
                "path": {
                    "type": "str",
                    "required": True,
                    "pattern": _ABS_PATH,
                    "hint": "give the absolute path of the file inside the image",
                    "description": "The file inside the image.",
                },
                "original_sha256": {
                    "type": "str",
                    "required": True,
                    "pattern": _HEX64,
                    "hint": "give the 64 hex digits of sha256sum of the file in the pinned image",
                    "description": "sha256 of the file as the pinned image has it.",
                },
                "patch": {
                    "type": "str",
                    "required": True,
                    "pattern": _RELATIVE_PATH,
                    "hint": "give the patch file relative to the recipes folder, without .. "
                            "(patches/RECIPE/NAME.patch)",
                    "description": "The patch, relative to the recipes folder; applied with zero fuzz.",
                },
                "result_sha256": {
                    "type": "str",
                    "required": True,
                    "pattern": _HEX64,
                    "hint": "give the 64 hex digits of sha256sum of the patched file",
                    "description": "sha256 of the file once patched.",
                },
            },
        },
        "overlays_from": _from("overlays", "the list of overlays, each with the fields of `overlays[]` (for "
                                           "patches published apart from the recipe)",
                               "a list of overlays, each {path, original_sha256, patch, result_sha256} as "
                               "recipes/README.md describes them, with each patch file put in the recipes folder"),
        "memory": {
            "type": "dict",
            "default": {},
            "description": "Unified-memory safety on each node.",
            "options": {
                "min_available_gib": {
                    "type": "number",
                    "default": 100,
                    "min": 0,
                    "description": "MemAvailable needed on a node before its rank loads.",
                },
                "guard": {
                    "type": "dict",
                    "default": {},
                    "description": "Stops the local rank when memory stays below a floor.",
                    "options": {
                        "floor_gib": {
                            "type": "number",
                            "default": 8,
                            "min": 0.01,
                            "description": "Floor in GiB, above 0 and below `min_available_gib`.",
                        },
                        "samples": {
                            "type": "int",
                            "default": 3,
                            "min": 1,
                            "description": "Consecutive one-second samples below the floor before the rank is stopped.",
                        },
                        "watch": {
                            "type": "str",
                            "default": "both",
                            "choices": ["MemAvailable", "MemFree", "both"],
                            "description": "Which /proc/meminfo value is compared with the floor. MemAvailable "
                                           "counts the page cache of mapped weights as free; GB10's GPU memory "
                                           "follows MemFree.",
                        },
                    },
                },
                "flusher": {
                    "type": "dict",
                    "default": {},
                    "description": "Drops the page cache while the ranks load.",
                    "options": {
                        "mode": {
                            "type": "str",
                            "default": "unconditional",
                            "choices": ["unconditional", "threshold"],
                            "description": "`unconditional` flushes at every interval; `threshold` only while "
                                           "the page cache (Cached) exceeds the flusher role's "
                                           "`flusher_threshold_bytes`, which still let loads run out of memory.",
                        },
                        "interval_s": {
                            "type": "number",
                            "default": 2,
                            "min": 0.1,
                            "description": "Seconds between two flushes.",
                        },
                    },
                },
            },
        },
        "fabric": {
            "type": "dict",
            "default": {},
            "description": "Checks of the RoCE fabric beyond the links (see the fabric role).",
            "options": {
                "nccl_probe": {
                    "type": "dict",
                    "default": {},
                    "description": "The NCCL all-reduce probe (tag `nccl_probe`): every rank of the recipe, in its "
                                   "image, with the node's fabric environment, before the engine starts.",
                    "options": {
                        "enabled": {
                            "type": "bool",
                            "default": False,
                            "description": "Run the probe in every `site.yml` run, not only under `--tags nccl_probe`.",
                        },
                        "min_busbw_gbps": {
                            "type": "number",
                            "default": 15,
                            "min": 0,
                            "description": "Least all-reduce bus bandwidth, in GB/s, at the largest size; two Sparks "
                                           "over both twins give about 20.",
                        },
                        "transports": {
                            "type": "list",
                            "elements": "str",
                            "default": ["NET/IB"],
                            "choices": ["NET/IB", "NET/Socket", "P2P", "SHM"],
                            "description": "Transports NCCL may use between ranks; `NET/Socket` means RDMA failed "
                                           "and NCCL fell back to TCP.",
                        },
                        "sizes_mib": {
                            "type": "list",
                            "elements": "number",
                            "default": [1, 16, 128, 512],
                            "min": 0.001,
                            "description": "Message sizes of the all-reduce, in MiB.",
                        },
                        "iters": {
                            "type": "int",
                            "default": 20,
                            "min": 1,
                            "description": "Timed all-reduces per size, after five warm-up ones.",
                        },
                        "port": {
                            "type": "int", "min": 1, "max": 65535, "hint": "use a TCP port between 1 and 65535",
                            "default": 29599,
                            "description": "TCP port of the probe's rendezvous on the head's fabric address.",
                        },
                        "timeout_s": {
                            "type": "int",
                            "default": 300,
                            "min": 10,
                            "description": "Seconds the whole probe may take.",
                        },
                    },
                },
            },
        },
        "readiness": {
            "type": "dict",
            "default": {},
            "description": "When the deployment counts as serving.",
            "options": {
                "timeout_s": {
                    "type": "int",
                    "default": 3600,
                    "min": 1,
                    "description": "Seconds a boot may take, cold caches included; also vLLM's "
                                   "`VLLM_ENGINE_READY_TIMEOUT_S`.",
                },
                "canary_prompt": {
                    "type": "str",
                    "default": "The capital of France is",
                    "description": "Prompt of the one-token completion that proves the engine serves; "
                                   "`/v1/models` alone answers while the engine is dead.",
                },
            },
        },
        "host": {
            "type": "dict",
            "default": {},
            "description": "What each node must have.",
            "options": {
                "driver_versions": {
                    "type": "list",
                    "elements": "str",
                    "default": ["580."],
                    "description": "Allowed NVIDIA driver versions, as prefixes (`580.` allows 580.x; 590.x "
                                   "deadlocks in CUDA-graph capture on GB10).",
                },
                "min_free_disk_gib": {
                    "type": "number",
                    "min": 0,
                    "description": "Optional free disk needed where the weights go.",
                },
            },
        },
        "bench": {
            "type": "dict",
            "description": "Optional qualification benchmark (its fields belong to the bench stage).",
            "options": {
                "suites": {
                    "type": "list",
                    "elements": "raw",
                    "default": [],
                    "description": "The suites to run.",
                },
                "reference": {
                    "type": "raw",
                    "description": "Optional reference result the run is compared with.",
                },
                "gates": {
                    "type": "dict",
                    "values": "raw",
                    "default": {},
                    "description": "Pass conditions, name to value.",
                },
            },
        },
        "supply": {
            "type": "dict",
            "values": "str",
            "default": {},
            "description": "Where the user finds each value or file the recipe's source does not publish: the name "
                           "of an inventory variable a `*_from` field names, or a file of the recipes folder "
                           "(`overlays[].patch`, `file_overrides[].source`), to one sentence. A deployment "
                           "missing one is refused with every missing one listed, each with its sentence (see "
                           "*Values the user supplies*).",
        },
    },
}

RECIPE_SCHEMA: Dict[str, Any] = RECIPE_SPEC["options"]

# Flags that sparkserve renders itself, per engine, with the recipe field that
# sets them. engine_args may not repeat them (compared with - for _).
_OWNED_FLAGS: Dict[str, Dict[str, str]] = {
    "vllm": {
        "model": "model.path_in_container",
        "served-model-name": "model.served_name",
        "tensor-parallel-size": "parallel.tensor",
        "tp": "parallel.tensor",
        "pipeline-parallel-size": "parallel.pipeline",
        "pp": "parallel.pipeline",
        "nnodes": "the cluster's node count",
        "node-rank": "the node's rank",
        "master-addr": "the head's fabric address",
        "master-port": "launch.master_port",
        "headless": "the node's rank",
        "host": "launch.api_host",
        "port": "launch.api_port",
        "kv-cache-dtype": "kv_cache.dtype",
        "block-size": "kv_cache.block_size",
        "kv-cache-memory-bytes": "kv_cache.memory_gib_per_rank",
    },
    "sglang": {
        "model-path": "model.path_in_container",
        "model": "model.path_in_container",
        "served-model-name": "model.served_name",
        "tp-size": "parallel.tensor",
        "tp": "parallel.tensor",
        "tensor-parallel-size": "parallel.tensor",
        "pp-size": "parallel.pipeline",
        "pp": "parallel.pipeline",
        "pipeline-parallel-size": "parallel.pipeline",
        "nnodes": "the cluster's node count",
        "node-rank": "the node's rank",
        "dist-init-addr": "the head's fabric address and launch.master_port",
        "host": "launch.api_host",
        "port": "launch.api_port",
        "kv-cache-dtype": "kv_cache.dtype",
        "page-size": "kv_cache.block_size",
    },
}

# How a list value is passed. Both engines read list options as one flag
# followed by the values; these flags differ.
_REPEATED_FLAGS: Dict[str, frozenset] = {
    "vllm": frozenset({"middleware"}),  # one flag per value (argparse append)
    "sglang": frozenset(),
}
_JSON_LIST_FLAGS: Dict[str, frozenset] = {
    "vllm": frozenset({"allowed-origins", "allowed-methods", "allowed-headers"}),  # one JSON list
    "sglang": frozenset(),
}

_CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "dict": "a mapping",
    "list": "a list",
}


# ---------------------------------------------------------------- messages

def _show(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=False)
    except (TypeError, ValueError):
        return repr(value)


def _message(name: str, path: str, value: Any, fix: str) -> str:
    return "recipe %s: %s is %s; %s." % (name, path, _show(value), fix.rstrip("."))


def _summary(description: str) -> str:
    """The first sentence of a field's description, without Markdown."""
    text = re.sub(r"\s*\(see [^)]*\)", "", description).replace("`", "").replace("*", "")
    return text.split(". ")[0].rstrip(".")


def _join(path: str, key: str) -> str:
    return "%s.%s" % (path, key) if path else key


# ---------------------------------------------------------------- checking

def _is_type(value: Any, kind: str) -> bool:
    if kind == "raw":
        return True
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "list":
        return isinstance(value, list)
    raise ValueError("unknown schema type %r" % kind)


def _is_number(value: object) -> TypeGuard[Union[int, float]]:
    """_is_type(value, "number"), telling the type checker so."""
    return _is_type(value, "number")


def _is_count(value: object) -> TypeGuard[int]:
    """An int (not a bool) above zero."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _type_fix(kind: str, value: Any) -> str:
    fix = "it must be %s" % _TYPE_WORDS.get(kind, kind)
    if kind == "str" and isinstance(value, (bool, int, float)):
        fix += ' (quote it: YAML reads bare yes, no, on, off and numbers as non-strings)'
    return fix


class _Checker:
    """Walks a value against a field spec, collecting messages."""

    def __init__(self, name: str, resolved: Mapping[str, str]) -> None:
        self.name = name
        self.resolved = resolved  # dotted path -> variable it was taken from
        self.errors: List[str] = []

    def label(self, path: str) -> str:
        return _label(path, self.resolved)

    def error(self, path: str, value: Any, fix: str) -> None:
        self.errors.append(_message(self.name, self.label(path), value, fix))

    def field(self, spec: Mapping[str, Any], value: Any, path: str) -> Any:
        kind = spec.get("type", "raw")
        if not _is_type(value, kind):
            self.error(path, value, _type_fix(kind, value))
            return value
        if kind == "dict":
            if "options" in spec:
                return self.mapping(spec, value, path)
            return self.free_mapping(spec, value, path)
        if kind == "list":
            return self.sequence(spec, value, path)
        self.scalar(spec, value, path)
        return value

    def scalar(self, spec: Mapping[str, Any], value: Any, path: str) -> None:
        hint = spec.get("hint", "")
        if "choices" in spec and value not in spec["choices"]:
            self.error(path, value, "use one of: %s" % ", ".join(str(c) for c in spec["choices"]))
        if "pattern" in spec and isinstance(value, str) and not re.match(spec["pattern"], value):
            self.error(path, value, hint.replace("{value}", value) or "it must match %s" % spec["pattern"])
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = spec.get("min"), spec.get("max")
            if (low is not None and value < low) or (high is not None and value > high):
                if hint:
                    fix = hint
                elif high is None:
                    fix = "it must be at least %s" % low
                else:
                    fix = "it must be between %s and %s" % (low, high)
                self.error(path, value, fix)

    def sequence(self, spec: Mapping[str, Any], value: List[Any], path: str) -> List[Any]:
        elements = spec.get("elements", "raw")
        item_spec = {k: v for k, v in spec.items() if k in ("min", "max", "hint", "choices", "pattern")}
        item_spec["type"] = elements
        if "options" in spec:
            item_spec["options"] = spec["options"]
            item_spec["one_of"] = spec.get("one_of", [])
        return [self.field(item_spec, item, "%s[%d]" % (path, i)) for i, item in enumerate(value)]

    def free_mapping(self, spec: Mapping[str, Any], value: Dict[Any, Any], path: str) -> Dict[Any, Any]:
        kind = spec.get("values", "raw")
        out: Dict[Any, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.error(_join(path, str(key)), key, "keys of %s must be strings; quote the key" % path)
                continue
            if not _is_type(item, kind):
                self.error(_join(path, key), item, _type_fix(kind, item))
            out[key] = item
        return out

    def mapping(self, spec: Mapping[str, Any], value: Dict[Any, Any], path: str) -> Dict[str, Any]:
        options: Mapping[str, Any] = spec["options"]
        for key in value:
            if key not in options:
                where = path or "a recipe"
                self.errors.append(
                    "recipe %s: %s is not a field of %s; use one of: %s (see recipes/README.md)."
                    % (self.name, _join(path, str(key)), where, ", ".join(options))
                )
        for group in spec.get("one_of", []):
            self.one_of(group, value, path)
        grouped = {key for group in spec.get("one_of", []) for key in group}
        for key in options:
            pair = [key, key + "_from"]
            if pair[1] in options and key not in grouped:
                given = [k for k in pair if value.get(k) is not None and _join(path, k) not in self.resolved]
                if len(given) == 2:
                    self.errors.append("recipe %s: %s and %s are both set; keep one of them."
                                       % (self.name, _join(path, key), _join(path, pair[1])))
        out: Dict[str, Any] = {}
        for key, sub in options.items():
            here = _join(path, key)
            item = value.get(key)
            if item is not None:
                out[key] = self.field(sub, item, here)
            elif sub.get("required"):
                self.errors.append("recipe %s: %s is missing; add it (%s)."
                                   % (self.name, here, _summary(sub.get("description", ""))))
                out[key] = None
            elif "default" in sub:
                out[key] = self.field(sub, copy.deepcopy(sub["default"]), here)
            else:
                out[key] = None
        for key, sub in options.items():
            template = sub.get("default_template")
            if template and out.get(key) is None:
                fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
                if all(isinstance(out.get(f), str) for f in fields):
                    out[key] = template.format(**{f: out[f] for f in fields})
        return out

    def one_of(self, group: List[str], value: Mapping[str, Any], path: str) -> None:
        given = [k for k in group if value.get(k) is not None and _join(path, k) not in self.resolved]
        if len(given) > 1:
            self.errors.append(
                "recipe %s: %s are all set; keep exactly one of them."
                % (self.name, " and ".join(_join(path, k) for k in given))
            )
        elif not given and not any(_join(path, k) in self.resolved for k in group):
            first = _join(path, group[0])
            self.errors.append(
                "recipe %s: %s is missing; set %s, or %s to the name of an inventory variable that holds it."
                % (self.name, first, first, _join(path, group[1]))
            )


def _label(path: str, resolved: Mapping[str, str]) -> str:
    """A field's path, naming the variable it (or the field holding it) came from."""
    for source, variable in resolved.items():
        if path == source or path.startswith(source + ".") or path.startswith(source + "["):
            return "%s (from the variable %s)" % (path, variable)
    return path


def _fill(template: str, holder: Mapping[str, Any]) -> str:
    """``{field}`` replaced by the string value of that field of ``holder``, or by `field`."""
    def one(match: "re.Match[str]") -> str:
        value = holder.get(match.group(1))
        return value if isinstance(value, str) and value else match.group(1)
    return re.sub(r"\{([a-z_]+)\}", one, template)


def _from_pairs(spec: Mapping[str, Any]) -> List[Tuple[str, Mapping[str, Any]]]:
    """(KEY, spec of KEY_from) for every KEY of a mapping spec that may come from a variable."""
    options = spec.get("options") or {}
    return [(key, options[key + "_from"]) for key in options if key + "_from" in options]


_Visit = Callable[[Dict[str, Any], str, Mapping[str, Any], str], Dict[str, Any]]


def _walk_from(data: Any, spec: Mapping[str, Any], path: str, visit: _Visit) -> Any:
    """Call ``visit(holder, key, from_spec, path)`` for every KEY_from of ``data``; rebuild the mappings.

    ``visit`` returns the holder to go on with (a copy with KEY filled, say).
    Sub-mappings and mappings in lists are walked after their parent's own
    KEY_from fields, so that a list taken from a variable is walked too.
    """
    if not isinstance(data, dict) or "options" not in spec:
        return data
    holder = dict(data)
    for key, from_spec in _from_pairs(spec):
        holder = visit(holder, key, from_spec, path)
    for key, sub in spec["options"].items():
        value = holder.get(key)
        here = _join(path, key)
        if sub.get("type") == "dict" and isinstance(value, dict):
            holder[key] = _walk_from(value, sub, here, visit)
        elif sub.get("type") == "list" and "options" in sub and isinstance(value, list):
            item_spec = dict(sub, type="dict")
            holder[key] = [_walk_from(item, item_spec, "%s[%d]" % (here, i), visit) for i, item in enumerate(value)]
    return holder


def variables_named(data: Any) -> List[str]:
    """The inventory variables a loaded recipe's ``*_from`` fields name, in file order, each once.

    The caller passes their values as ``variables`` to validate_recipe (the
    recipe role takes exactly these from the inventory).
    """
    names: List[str] = []

    def visit(holder: Dict[str, Any], key: str, from_spec: Mapping[str, Any], path: str) -> Dict[str, Any]:
        variable = holder.get(key + "_from")
        if isinstance(variable, str) and re.match(_VARIABLE, variable) and variable not in names:
            names.append(variable)
        return holder

    _walk_from(data, RECIPE_SPEC, "", visit)
    return names


def _supply_of(data: Mapping[str, Any]) -> Dict[str, str]:
    supply = data.get("supply") if isinstance(data, Mapping) else None
    if not isinstance(supply, dict):
        return {}
    return {k: v.strip() for k, v in supply.items() if isinstance(k, str) and isinstance(v, str) and v.strip()}


def _resolve(data: Dict[str, Any], name: str, variables: Mapping[str, Any],
             errors: List[str]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Fill every KEY from its KEY_from variable; report each variable that is not set."""
    resolved: Dict[str, str] = {}
    supply = _supply_of(data)

    def visit(holder: Dict[str, Any], key: str, from_spec: Mapping[str, Any], path: str) -> Dict[str, Any]:
        variable = holder.get(key + "_from")
        if not isinstance(variable, str) or not re.match(_VARIABLE, variable) or holder.get(key) is not None:
            return holder  # a bad or doubled KEY_from is reported by the schema check
        if variables.get(variable) is None:
            wants = supply.get(variable) or _fill(from_spec.get("wants", "its value"), holder)
            errors.append("recipe %s: %s names the inventory variable %s, which is not set; set it to %s."
                          % (name, _join(path, key + "_from"), variable, wants.rstrip(".")))
            return holder
        holder[key] = copy.deepcopy(variables[variable])
        resolved[_join(path, key)] = variable
        return holder

    return _walk_from(data, RECIPE_SPEC, "", visit), resolved


# ---------------------------------------------------------------- public API

def validate_recipe(data: Dict[str, Any], name: str,
                    variables: Optional[Mapping[str, Any]] = None,
                    recipes_dir: Optional[str] = None) -> Tuple[Dict[str, Any], List[str]]:
    """Check a loaded recipe; return it with defaults filled, and every problem found.

    ``variables`` resolves every ``*_from`` field (``image_from``,
    ``model.revision_from``, ``overlays_from``, ...): each names a variable
    whose value is put in the field beside it and checked like it; a variable
    that is not set is reported, with what to set it to. Without ``variables``
    the ``*_from`` fields are only checked for form. With ``recipes_dir`` the
    files the recipe names (``overlays[].patch``, ``file_overrides[].source``)
    must be in that folder, and each override must have its sha256.
    """
    errors: List[str] = []
    if not isinstance(data, dict):
        return {}, [_message(name, "the recipe", data, "it must be a YAML mapping of the fields in recipes/README.md")]
    resolved: Dict[str, str] = {}
    if variables is not None:
        data, resolved = _resolve(data, name, variables, errors)
    checker = _Checker(name, resolved)
    recipe = checker.mapping(RECIPE_SPEC, data, "")
    errors.extend(checker.errors)
    errors.extend(_cross_checks(recipe, name, data))
    if recipes_dir is not None:
        errors.extend(_file_checks(recipe, name, recipes_dir, resolved))
    return recipe, errors


def _named_files(recipe: Mapping[str, Any]) -> List[Tuple[str, Any, Optional[Any]]]:
    """(path of the field, file named, expected sha256 or None) of every file of the recipes folder."""
    files: List[Tuple[str, Any, Optional[Any]]] = []
    overlays = recipe.get("overlays") if isinstance(recipe, Mapping) else None
    if _section(recipe, "overlays_repo"):
        overlays = None  # the patches are files of the pinned overlays repository, checked by its manifest
    for i, overlay in enumerate(overlays if isinstance(overlays, list) else []):
        if isinstance(overlay, dict):
            files.append(("overlays[%d].patch" % i, overlay.get("patch"), None))
    for section in ("model", "draft_model"):
        overrides = _section(recipe, section).get("file_overrides")
        for i, item in enumerate(overrides if isinstance(overrides, list) else []):
            if isinstance(item, dict):
                files.append(("%s.file_overrides[%d].source" % (section, i), item.get("source"), item.get("sha256")))
    return files


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_checks(recipe: Dict[str, Any], name: str, recipes_dir: str, resolved: Mapping[str, str]) -> List[str]:
    """Every file the recipe names is in the recipes folder, with its sha256 where one is given."""
    errors: List[str] = []
    supply = _section(recipe, "supply")
    for path, rel, sha256 in _named_files(recipe):
        if not isinstance(rel, str) or not re.match(_RELATIVE_PATH, rel):
            continue  # reported by the schema check
        full = os.path.join(recipes_dir, rel)
        if not os.path.isfile(full):
            supplied = supply.get(rel)
            where = supplied if isinstance(supplied, str) else ""
            errors.append("recipe %s: %s names %s, which is not in the recipes folder (%s); put the file there%s."
                          % (name, _label(path, resolved), _show(rel), recipes_dir,
                             (": " + where.strip().rstrip(".")) if where.strip() else ""))
            continue
        if isinstance(sha256, str) and re.match(_HEX64, sha256):
            actual = _sha256_file(full)
            if actual != sha256:
                errors.append("recipe %s: %s names %s, whose sha256 is %s, not the %s given in %s; put the right "
                              "file there or correct the hash."
                              % (name, _label(path, resolved), _show(rel), actual, sha256,
                                 _label(path.rsplit(".", 1)[0] + ".sha256", resolved)))
    return errors


def _section(recipe: Mapping[str, Any], key: str) -> Dict[str, Any]:
    value = recipe.get(key) if isinstance(recipe, Mapping) else None
    return value if isinstance(value, dict) else {}


def _cross_checks(recipe: Dict[str, Any], name: str, data: Mapping[str, Any]) -> List[str]:
    errors: List[str] = []
    if isinstance(recipe.get("name"), str) and recipe["name"] != name:
        errors.append(_message(name, "name", recipe["name"],
                               "make it %s, the name the recipe is loaded under (recipes/%s.yml)"
                               % (_show(name), name)))

    launch = _section(recipe, "launch")
    ports: List[Tuple[str, Any]] = [("launch.api_port", launch.get("api_port")),
                                    ("launch.master_port", launch.get("master_port"))]
    extra = launch.get("extra_ports")
    if isinstance(extra, list):
        ports += [("launch.extra_ports[%d]" % i, p) for i, p in enumerate(extra)]
    seen: Dict[Any, str] = {}
    for path, port in ports:
        if not isinstance(port, int) or isinstance(port, bool):
            continue
        if port in seen:
            errors.append(_message(name, path, port, "it is already %s; give every port of the deployment "
                                   "a different number" % seen[port]))
        else:
            seen[port] = path

    pattern = launch.get("container_name")
    if isinstance(pattern, str):
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None]
        except ValueError:
            fields = ["?"]
        if any(f not in ("deployment", "rank") for f in fields) or "rank" not in fields:
            errors.append(_message(name, "launch.container_name", pattern,
                                   "use only {deployment} and {rank}, and include {rank}, "
                                   "as in {deployment}-rank{rank}"))
        else:
            sample = pattern.format(deployment="d", rank=0)
            if not _CONTAINER_NAME.match(sample):
                errors.append(_message(name, "launch.container_name", pattern,
                                       "a container name may hold only letters, digits, _ . and -, "
                                       "and must start with a letter or digit"))

    engine = recipe.get("engine")
    args = recipe.get("engine_args")
    if isinstance(args, dict):
        owned = _OWNED_FLAGS.get(engine, {}) if isinstance(engine, str) else {}
        for key, value in args.items():
            if not isinstance(key, str):
                continue
            path = "engine_args.%s" % key
            if key.startswith("-"):
                errors.append(_message(name, "engine_args key", key,
                                       "write it without leading dashes: %s" % key.lstrip("-")))
                continue
            if not _FLAG_NAME.match(key):
                errors.append(_message(name, "engine_args key", key,
                                       "a flag name holds only letters, digits, _ . and -"))
                continue
            flag = key.replace("_", "-")
            if flag in owned:
                errors.append(_message(name, path, value,
                                       "sparkserve sets --%s from %s; remove it from engine_args"
                                       % (flag, owned[flag])))
                continue
            errors.extend(_check_arg_value(name, path, value))

    env = recipe.get("env")
    if isinstance(env, dict):
        for key in env:
            if isinstance(key, str) and not _ENV_NAME.match(key):
                errors.append(_message(name, "env key", key,
                                       "an environment variable name holds letters, digits and _, "
                                       "and does not start with a digit"))

    kv = _section(recipe, "kv_cache")
    if engine == "sglang" and kv.get("dtype") == "fp8":
        errors.append(_message(name, "kv_cache.dtype", kv["dtype"],
                               "SGLang names the FP8 formats fp8_e4m3 and fp8_e5m2; give one of them"))
    if engine == "sglang" and kv.get("memory_gib_per_rank") is not None:
        errors.append(_message(name, "kv_cache.memory_gib_per_rank", kv["memory_gib_per_rank"],
                               "SGLang has no flag for a KV cache size in bytes; remove it and size the pool "
                               "with engine_args max-total-tokens or mem-fraction-static"))

    memory = _section(recipe, "memory")
    guard = _section(memory, "guard")
    floor, gate = guard.get("floor_gib"), memory.get("min_available_gib")
    if _is_number(floor) and _is_number(gate) and floor >= gate:
        errors.append(_message(name, "memory.guard.floor_gib", floor,
                               "it must be below memory.min_available_gib (%s), or the guard stops ranks "
                               "the gate lets start; lower the floor or raise the gate" % _show(gate)))

    model = _section(recipe, "model")
    draft = _section(recipe, "draft_model")
    if draft and draft.get("path_in_container") and draft.get("path_in_container") == model.get("path_in_container"):
        errors.append(_message(name, "draft_model.path_in_container", draft["path_in_container"],
                               "it is model.path_in_container too; mount the draft somewhere else"))
    for section, part in (("model", model), ("draft_model", draft)):
        errors.extend(_check_file_overrides(name, section, part.get("file_overrides")))
    errors.extend(_check_supply(recipe, name, data))
    return errors


def _check_file_overrides(name: str, section: str, overrides: Any) -> List[str]:
    errors: List[str] = []
    seen: Dict[str, str] = {}
    for i, item in enumerate(overrides if isinstance(overrides, list) else []):
        target = item.get("path") if isinstance(item, dict) else None
        if not isinstance(target, str) or not re.match(_RELATIVE_PATH, target):
            continue
        path = "%s.file_overrides[%d].path" % (section, i)
        norm = "/".join(part for part in target.split("/") if part not in ("", "."))
        if norm.lower().endswith(_SHARD_SUFFIXES):
            errors.append(_message(name, path, target, "weight shards are never replaced; override only small "
                                                       "files such as generation_config.json"))
        elif norm in seen:
            errors.append(_message(name, path, target, "it is already %s; override each file once" % seen[norm]))
        else:
            seen[norm] = path
    return errors


def _check_supply(recipe: Mapping[str, Any], name: str, data: Mapping[str, Any]) -> List[str]:
    """Every entry of supply names a variable of a *_from field or a file of the recipe."""
    supply = recipe.get("supply")
    if not isinstance(supply, dict):
        return []
    known = set(variables_named(data)) | {rel for _, rel, _ in _named_files(recipe) if isinstance(rel, str)}
    errors: List[str] = []
    for key, text in supply.items():
        if not isinstance(key, str):
            continue
        if key not in known:
            errors.append(_message(name, "supply key", key,
                                   "it names no variable of a *_from field and no file of the recipe; "
                                   "name one of: %s" % (", ".join(sorted(known)) or "none (remove supply)")))
        elif isinstance(text, str) and not text.strip():
            errors.append(_message(name, "supply.%s" % key, text, "say where the user finds the value"))
    return errors


def _check_arg_value(name: str, path: str, value: Any) -> List[str]:
    scalar = (str, int, float, bool)
    if value is None or isinstance(value, scalar):
        return []
    if isinstance(value, list):
        if all(isinstance(v, scalar) for v in value):
            return []
        return [_message(name, path, value, "a list value may hold only strings, numbers and booleans; "
                                            "give a mapping to pass JSON")]
    if isinstance(value, dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return [_message(name, path, value, "the mapping must be plain JSON data")]
        return []
    return [_message(name, path, value, "give a string, a number, true, false, null, a list or a mapping")]


def validate_for_cluster(recipe: Dict[str, Any], name: str, world_size: int,
                         hf_token_present: bool) -> List[str]:
    """Check a validated recipe against the cluster it is about to run on."""
    errors: List[str] = []
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        return ["recipe %s: the cluster has %s nodes; deploy on at least one node (sparkserve_world_size)."
                % (name, _show(world_size))]
    parallel = _section(recipe, "parallel")
    tensor, pipeline = parallel.get("tensor"), parallel.get("pipeline", 1)
    per_node = parallel.get("gpus_per_node", 1)
    if _is_count(tensor) and _is_count(pipeline) and _is_count(per_node):
        want, have = tensor * pipeline, world_size * per_node
        if want != have:
            errors.append(
                "recipe %s: parallel.tensor × parallel.pipeline is %d × %d = %d GPUs but the cluster has "
                "%d nodes × parallel.gpus_per_node %d = %d GPUs; make the two equal, by changing "
                "parallel.tensor or by deploying on %s nodes."
                % (name, tensor, pipeline, want, world_size, per_node, have,
                   want // per_node if want % per_node == 0 else "a matching number of")
            )
    for key, value in _section(recipe, "engine_args").items():
        if isinstance(key, str) and key.replace("_", "-") == "load-format" and value == "instanttensor" \
                and world_size > 1:
            errors.append(_message(name, "engine_args.%s" % key, value,
                                   "instanttensor loads made ranks die silently on more than one node "
                                   "(seed 000); remove it for this %d-node deployment" % world_size))
    if not hf_token_present:
        for section in ("model", "draft_model", "overlays_repo"):
            part = _section(recipe, section)
            if part.get("gated") is True:
                errors.append(
                    "recipe %s: %s.gated is true for %s and no Hugging Face token is configured; put the token "
                    "in the Ansible Vault variable weights_hf_token, or export HF_TOKEN where the playbook runs."
                    % (name, section, _show(part.get("repo")))
                )
    return errors


def _scalar_arg(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render_engine_args(engine: str, args: Mapping[str, Any]) -> List[str]:
    """engine_args as command-line words, in their order.

    true gives a bare flag; false and null leave the flag out; a mapping is
    passed as one JSON word; a list follows the engine's reading of that flag:
    one flag then every value (most list options), one flag per value, or one
    JSON list.
    """
    words: List[str] = []
    for key, value in args.items():
        flag = "--" + key
        norm = key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, dict):
            words += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, list):
            if not value:
                continue
            if norm in _JSON_LIST_FLAGS.get(engine, frozenset()):
                words += [flag, json.dumps(value, separators=(",", ":"))]
            elif norm in _REPEATED_FLAGS.get(engine, frozenset()):
                for item in value:
                    words += [flag, _scalar_arg(item)]
            else:
                words += [flag] + [_scalar_arg(item) for item in value]
        else:
            words += [flag, _scalar_arg(value)]
    return words


def _kv_words(engine: str, kv: Mapping[str, Any]) -> List[str]:
    words: List[str] = []
    if kv.get("dtype") is not None:
        words += ["--kv-cache-dtype", str(kv["dtype"])]
    if kv.get("block_size") is not None:
        words += ["--block-size" if engine == "vllm" else "--page-size", str(kv["block_size"])]
    if engine == "vllm" and kv.get("memory_gib_per_rank") is not None:
        words += ["--kv-cache-memory-bytes", str(int(round(kv["memory_gib_per_rank"] * GIB)))]
    return words


def render_rank(recipe: Dict[str, Any], deployment: str, rank: int, world_size: int,
                head_fabric_ip: str, fabric_env: Dict[str, str]) -> Dict[str, Any]:
    """One rank's container name, engine argv, environment and listening ports.

    ``recipe`` is the output of validate_recipe. Rank 0 serves the API; the
    other ranks run without it (vLLM ``--headless``). The environment is the
    render's own defaults, then the recipe's ``env``, then ``fabric_env``,
    each winning over the one before.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError("world_size is %s; it must be a positive integer" % _show(world_size))
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError("rank is %s; it must be between 0 and %d" % (_show(rank), world_size - 1))
    if not isinstance(deployment, str) or not _CONTAINER_NAME.match(deployment):
        raise ValueError("deployment is %s; use letters, digits, _ . and -, starting with a letter or digit"
                         % _show(deployment))
    if not head_fabric_ip:
        raise ValueError("head_fabric_ip is empty; give the head's fabric address")

    engine = recipe["engine"]
    model = recipe["model"]
    parallel = recipe["parallel"]
    launch = recipe["launch"]
    head = rank == 0
    container_name = launch["container_name"].format(deployment=deployment, rank=rank)
    if not _CONTAINER_NAME.match(container_name):
        raise ValueError("container name %s is not valid for docker" % _show(container_name))

    common = ["--served-model-name", model["served_name"]]
    if engine == "vllm":
        argv = ["vllm", "serve", model["path_in_container"]] + common + [
            "--tensor-parallel-size", str(parallel["tensor"]),
            "--pipeline-parallel-size", str(parallel["pipeline"]),
            "--nnodes", str(world_size),
            "--node-rank", str(rank),
            "--master-addr", head_fabric_ip,
            "--master-port", str(launch["master_port"]),
        ]
        argv += ["--host", launch["api_host"], "--port", str(launch["api_port"])] if head else ["--headless"]
    elif engine == "sglang":
        host = "[%s]" % head_fabric_ip if ":" in head_fabric_ip else head_fabric_ip
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", model["path_in_container"]] + common + [
            "--tp-size", str(parallel["tensor"]),
            "--pp-size", str(parallel["pipeline"]),
            "--nnodes", str(world_size),
            "--node-rank", str(rank),
            "--dist-init-addr", "%s:%d" % (host, launch["master_port"]),
        ]
        if head:
            argv += ["--host", launch["api_host"], "--port", str(launch["api_port"])]
    else:
        raise ValueError("engine is %s; use vllm or sglang" % _show(engine))
    argv += _kv_words(engine, recipe.get("kv_cache") or {})
    argv += render_engine_args(engine, recipe.get("engine_args") or {})

    env: Dict[str, str] = {}
    if engine == "vllm":
        env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(recipe["readiness"]["timeout_s"])
    env.update(recipe.get("env") or {})
    for key, value in (fabric_env or {}).items():
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ValueError("fabric_env.%s is %s; give a string" % (key, _show(value)))
        env[str(key)] = str(value)

    ports = [launch["api_port"], launch["master_port"]] if head else []
    ports += list(launch.get("extra_ports") or [])
    return {"container_name": container_name, "argv": argv, "env": env, "ports": ports,
            "mounts": render_mounts(recipe), "endpoints": engine_endpoints(recipe) if head else {}}


def render_mounts(recipe: Dict[str, Any]) -> List[Dict[str, str]]:
    """The read-only file mounts of every rank: each ``file_overrides`` entry of the model and the draft.

    ``source_rel`` is relative to the recipes folder, ``target`` the path in
    the container (over the mounted model folder), ``sha256`` what the source
    must hash to when it is mounted.
    """
    mounts: List[Dict[str, str]] = []
    for section in ("model", "draft_model"):
        part = recipe.get(section) or {}
        for i, item in enumerate(part.get("file_overrides") or []):
            if not isinstance(item.get("sha256"), str):
                raise ValueError("%s.file_overrides[%d].sha256 is not resolved; validate the recipe with the value "
                                 "of %s first" % (section, i, _show(item.get("sha256_from"))))
            target = posixpath.normpath(posixpath.join(part["path_in_container"], item["path"]))
            mounts.append({"source_rel": item["source"], "target": target, "sha256": item["sha256"]})
    return mounts


# The head's HTTP paths per engine: liveness, the model list, Prometheus metrics.
ENGINE_ENDPOINTS: Dict[str, Dict[str, str]] = {
    "vllm": {"health": "/health", "models": "/v1/models", "metrics": "/metrics"},
    "sglang": {"health": "/health", "models": "/v1/models", "metrics": "/metrics"},
}


def engine_endpoints(recipe: Mapping[str, Any]) -> Dict[str, Optional[str]]:
    """The head's health, models and metrics paths; metrics is None where the engine does not serve them.

    SGLang serves /metrics only when started with --enable-metrics.
    """
    engine = recipe.get("engine", "vllm")
    endpoints: Dict[str, Optional[str]] = dict(ENGINE_ENDPOINTS.get(engine, ENGINE_ENDPOINTS["vllm"]))
    if engine == "sglang":
        args = recipe.get("engine_args") or {}
        enabled = any(k.replace("_", "-") == "enable-metrics" and v is True for k, v in args.items())
        if not enabled:
            endpoints["metrics"] = None
    return endpoints


# ---------------------------------------------------------------- documentation

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

<!-- Generated by schema_markdown() in plugins/module_utils/recipe.py from the
schema itself; do not edit. Regenerate with:
python plugins/module_utils/recipe.py > recipes/README.md -->

A recipe is checked in full before anything changes on a node. Unknown keys
are errors at every level, and every problem is reported at once, each naming
the field, the bad value and the fix, for example:

```
recipe glm53-fp4local-mtp-tp2: model.revision is "main"; pin the full 40-character commit (HfApi().model_info(repo, revision="main").sha gives it).
```

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
recipe glm53-nvfp4-dflash2-tp4: model.revision_from names the inventory variable glm53_nvfp4_revision, which is not set; set it to the full 40-character commit of zai-org/GLM-5.3-Flash-NVFP4 you deploy; seed 000 names no commit (HfApi().model_info("zai-org/GLM-5.3-Flash-NVFP4").sha gives the newest).
recipe glm53-fp4local-mtp-tp2: model.file_overrides[0].source names "files/glm53-fp4local-mtp-tp2/generation_config.json", which is not in the recipes folder (recipes); put the file there: model/generation_config.json of DevelopingDad/GLM-5.3-Flash-FP4-Local-DGX-Spark-Optimized (...), the upstream file with terminal EOS id 154828 added; NVIDIA Open Model Agreement.
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
addresses and ports, KV cache) are refused in `engine_args`; set the recipe
field named in the error instead. A draft model is passed the same way, by
the recipe: its weights are mounted at `draft_model.path_in_container`, and
the recipe names that path in the engine's speculative-decoding flag.
"""


def schema_markdown() -> str:
    """recipes/README.md, from the schema."""
    return _DOC_HEAD + "\n".join(_doc_rows(RECIPE_SCHEMA, "")) + "\n" + _DOC_TAIL


if __name__ == "__main__":
    sys.stdout.write(schema_markdown())
