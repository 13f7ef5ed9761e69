"""The recipe's schema, as data: every field, its type, default, bounds and fix hint.

``RECIPE_SPEC`` has the shape of an Ansible argument spec (the keys are
listed above it). validate.py checks a loaded recipe against it,
tools/recipe-docs.py writes recipes/README.md and recipes/recipe.schema.json
(JSON Schema) from it. The patterns and constants the checks and the render
share live here too.

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

import re
from typing import Any, Dict

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINE_NAMES
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema_running import RUNNING_SECTIONS

GIB = 1024 ** 3

_HEX40 = r"^[0-9a-f]{40}$"
_HEX64 = r"^[0-9a-f]{64}$"
_VARIABLE = r"^[A-Za-z_][A-Za-z0-9_]*$"
_HF_REPO = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
_ABS_PATH = r"^/[^\s]*$"
_PORT = {"type": "int", "min": 1, "max": 65535, "hint": "use a TCP port between 1 and 65535"}
# A Docker reference pinned by digest: an optional registry host (a dot or a port in it, or localhost; capitals
# allowed), the path in lower case (docker pull refuses capitals there), an optional tag, the sha256 digest.
_IMAGE_HOST = r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9-]+(?=:))(?::[0-9]+)?/"
_IMAGE_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = r"^(?:%s)?%s(?:/%s)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}$" % (
    _IMAGE_HOST, _IMAGE_PART, _IMAGE_PART)
# An address alone: no port (one colon), scheme, brackets or spaces; IPv6 addresses have two colons or more.
_API_HOST = r"^(?![^:]*:[^:]*$)[A-Za-z0-9._:%-]+$"

_IMAGE_HINT = (
    "pin the image by digest, REPO:TAG@sha256:<64 hex>: sparkserve recipe pin {recipe} asks the registry and "
    "writes it (docker buildx imagetools inspect IMAGE prints the digest too); a tag alone can move under the recipe"
)
_REVISION_HINT = (
    "pin the full 40-character commit: sparkserve recipe pin {recipe} asks the hub what {value} points to and "
    'writes it, keeping {value} as track (HfApi().model_info(repo, revision="{value}").sha gives it too)'
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
        "expect": {
            "type": "dict",
            "values": "raw",
            "default": {},
            "description": "Optional values the source must hold, checked on the controller before any node is "
                           "touched: top-level keys of the JSON file to a string, number, boolean or null, or a "
                           "list of them (`eos_token_id: 154828`). Where the file's value is a list, every expected "
                           "value must be in it; otherwise the file's value must equal the expected one. A source "
                           "that is not JSON, lacks a key or holds something else is refused.",
        },
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
    "track": {
        "type": "str",
        "pattern": r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$",
        "hint": "give the branch or tag the commit was pinned from, such as main",
        "description": "The branch or tag `revision` was pinned from (`sparkserve recipe pin` writes it). "
                       "Only `sparkserve recipe pin --check` reads it, to say when the branch has moved; the "
                       "deployment uses `revision`.",
    },
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
            # The registered engine adapters (module_utils/engines), one module per engine.
            "choices": ENGINE_NAMES,
            "description": "The serving engine; its adapter decides the command line (see *The rendered command "
                           "line*).",
        },
        "image": {
            "type": "str",
            "pattern": _IMAGE,
            "hint": _IMAGE_HINT,
            "description": "The engine's container image, pinned by digest: `REPO@sha256:<64 hex>`, or "
                           "`REPO:TAG@sha256:<64 hex>` as `sparkserve recipe pin` writes it (the tag is kept for "
                           "people and `pin --check`; the nodes pull and run `REPO@sha256:...`). A tag alone is "
                           "refused, and so are capitals in the repository's path (Docker refuses them). Set "
                           "exactly one of `image` and `image_from`.",
        },
        "image_id": {
            "type": "str",
            "default": "",
            "pattern": r"^(sha256:[0-9a-f]{64})?$",
            "hint": "give sha256:<64 hex>, as docker image inspect --format '{{.Id}}' IMAGE prints it where the "
                    "image was pulled",
            "description": "The image's ID (the digest of its config, `sha256:<64 hex>`). Optional: when set, "
                           "every node must hold this image (checked after the pull and the relay), and an "
                           "`image_archive` made by `docker save` (which does not keep the registry's manifest) "
                           "is checked against it.",
        },
        "image_archive": {
            "type": "str",
            "default": "",
            "description": "An image archive to deploy from instead of a registry: a `docker save` archive or "
                           "an OCI archive (`skopeo copy docker://IMAGE oci-archive:FILE`), a path on the "
                           "controller (relative to the checkout), or `head:PATH` on the head. It is checked "
                           "against `image` (an OCI archive holds its manifest) or `image_id` before anything "
                           "is loaded, loaded on the head and relayed to the other nodes over the fabric; no "
                           "registry is asked. The inventory variable `image_archive` overrides it.",
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
                "aliases": {
                    "type": "list",
                    "elements": "str",
                    "default": [],
                    "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
                    "hint": "use letters, digits and . _ : / - only",
                    "description": "Other names clients may use for the model (vLLM: more `--served-model-name` "
                                   "values); the gateway routes each of them to this deployment.",
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
                    "pattern": _API_HOST,
                    "hint": "give the address alone (127.0.0.1, 0.0.0.0, ::), without a port; the port goes in "
                            "launch.api_port",
                    "description": "Address the head's API binds to, without a port (that is `api_port`). "
                                   "Loopback by default: the engines bind every interface unless told otherwise.",
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
                "head_delay_s": {
                    "type": "int",
                    "default": 0,
                    "min": 0,
                    "description": "Seconds between the last worker's start and the head's start (workers_first); "
                                   "seed 000 waits 10.",
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
        "engine_flags": {
            "type": "dict",
            "default": {},
            "description": "What `engine_args` are checked against before any host is contacted: the flags of "
                           "the engine's own parser, as tools/engine-flags.py lists them per version "
                           "(plugins/module_utils/engines/flags/). A flag no list has is refused, with the close "
                           "match; one the wrong kind (a value given to a switch, `true` to a flag that takes a "
                           "value) too.",
            "options": {
                "version": {
                    "type": "str",
                    "pattern": r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$",
                    "hint": "give a version, as in 0.31.0",
                    "description": "The engine version whose flag list applies: the version the image carries, "
                                   "or the closest one sparkserve ships (vllm 0.31.0, sglang 0.5.21). "
                                   "Unset: the newest shipped for the engine. A list of the image itself is "
                                   "written by `docker run --rm -i --entrypoint python3 IMAGE - ENGINE < "
                                   "tools/engine-flags.py`.",
                },
                "image_adds": {
                    "type": "list",
                    "elements": "str",
                    "default": [],
                    "description": "Flags (without dashes) the image adds to that version: a patched image's "
                                   "own. They pass unchecked.",
                },
            },
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
                "budget_gib": {
                    "type": "number",
                    "min": 0.001,
                    "description": "The memory this deployment takes on each node it runs on, in GiB "
                                   "(weights, KV cache and the engine's own). Placing several deployments on the "
                                   "nodes uses it instead of the estimate from the engine's memory fraction "
                                   "(vLLM `gpu-memory-utilization`, SGLang `mem-fraction-static`) or from the "
                                   "weights' size on the hub; state it when the estimate is wrong, or when the "
                                   "hub cannot be reached from the controller.",
                },
                "guard": {
                    "type": "dict",
                    "default": {},
                    "description": "Kills (or stops) the local rank when memory stays below a floor; armed "
                                   "before the rank is created, so it watches the load too.",
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
                            "description": "Consecutive one-second samples below the floor before the guard acts.",
                        },
                        "watch": {
                            "type": "str",
                            "default": "both",
                            "choices": ["MemAvailable", "MemFree", "both"],
                            "description": "Which /proc/meminfo value is compared with the floor. MemAvailable "
                                           "counts the page cache of mapped weights as free; GB10's GPU memory "
                                           "follows MemFree.",
                        },
                        "action": {
                            "type": "str",
                            "default": "kill",
                            "choices": ["kill", "stop"],
                            "description": "What the guard does to the local rank: `kill` is `docker kill` "
                                           "(SIGKILL, at once: seed 003's); `stop` is `docker stop -t "
                                           "stop_grace_s` (SIGTERM, SIGKILL after the grace), which lets the "
                                           "engine exit but gives memory back later. A rank container that "
                                           "does not exist (yet) or does not run is left alone.",
                        },
                        "stop_grace_s": {
                            "type": "int",
                            "default": 10,
                            "min": 0,
                            "description": "Seconds `docker stop` waits before it kills the rank; used only with "
                                           "`action: stop`.",
                        },
                        "at_boot": {
                            "type": "bool",
                            "default": False,
                            "description": "Start the guard again after a reboot (the systemd unit is enabled). "
                                           "Off by default: seed 003 installs nothing that persists across a "
                                           "reboot, and the ranks do not restart either.",
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
                "gid_index": {
                    "type": "str",
                    "default": "fixed",
                    "choices": ["fixed", "per_device"],
                    "description": "How NCCL finds each twin's RoCE v2 GID. `fixed` writes `NCCL_IB_GID_INDEX`, "
                                   "the index every twin agrees on; a node whose twins' indexes differ is "
                                   "refused. `per_device` leaves `NCCL_IB_GID_INDEX` unset and sets "
                                   "`NCCL_IB_ROCE_VERSION_NUM=2` and `NCCL_IB_ADDR_FAMILY=AF_INET`, so NCCL "
                                   "(2.21 and later, which selects the GID dynamically when `NCCL_IB_GID_INDEX` "
                                   "is unset / -1) picks each device's RoCE v2 IPv4 GID itself.",
                },
                "require_rdma": {
                    "type": "bool",
                    "default": True,
                    "description": "On more than one node: every launch reads, in each rank's log, which network "
                                   "NCCL chose (the launch runs the ranks with `NCCL_DEBUG=INFO`, "
                                   "`NCCL_DEBUG_SUBSYS=INIT,NET`), and fails naming each rank that does not use "
                                   "RDMA (`NET/IB`) over every twin (sockets, one twin, a failed RDMA memory "
                                   "registration), with NCCL's own line, the likely cause and the fix. `false` "
                                   "serves anyway; each rank's transport is a metric "
                                   "(`sparkserve_rank_transport_info`) either way. A one-node deployment has no "
                                   "network between ranks and is not checked.",
                },
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
        **RUNNING_SECTIONS,
    },
}

RECIPE_SCHEMA: Dict[str, Any] = RECIPE_SPEC["options"]

# Names that are checked beyond the spec: a docker container name, an environment variable, an engine flag.
_CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
