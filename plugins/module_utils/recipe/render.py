"""A validated recipe rendered for one rank: container name, engine command line, environment, ports, mounts.

``render_rank`` takes the output of validate.validate_recipe and asks the
recipe's engine adapter (``module_utils/engines``) for the command line: the
engine's own words first, then the KV cache words, then ``engine_args``.
``render_mounts`` lists the read-only file mounts of every rank, and
``engine_facts`` what the roles and modules need of the engine (endpoints,
dead-engine pattern, cache mounts, host-IP variable, metric names).

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

import posixpath
from typing import Any, Dict, List, Mapping

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINE_NAMES, ENGINES
from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import Engine
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import _CONTAINER_NAME
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.walk import show


def adapter_of(recipe: Mapping[str, Any]) -> Engine:
    """The adapter of the recipe's engine."""
    engine = recipe.get("engine")
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError("engine is %s; use one of %s" % (show(engine), ", ".join(ENGINE_NAMES)))
    return ENGINES[engine]


def engine_facts(recipe: Mapping[str, Any]) -> Dict[str, Any]:
    """What the roles and modules need of the recipe's engine (plain data for the render)."""
    return adapter_of(recipe).facts(recipe)


def render_rank(recipe: Dict[str, Any], deployment: str, rank: int, world_size: int,
                head_fabric_ip: str) -> Dict[str, Any]:
    """One rank's container name, engine argv, environment and listening ports.

    ``recipe`` is the output of validate_recipe. Rank 0 serves the API; the
    other ranks run without it. The environment is the engine's own defaults,
    then the recipe's ``env``; each node adds its fabric environment from its
    own file (``/etc/sparkserve/fabric.env``, written by the fabric stage).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError("world_size is %s; it must be a positive integer" % show(world_size))
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError("rank is %s; it must be between 0 and %d" % (show(rank), world_size - 1))
    if not isinstance(deployment, str) or not _CONTAINER_NAME.match(deployment):
        raise ValueError("deployment is %s; use letters, digits, _ . and -, starting with a letter or digit"
                         % show(deployment))
    if not head_fabric_ip and world_size > 1:
        raise ValueError("head_fabric_ip is empty; give the head's fabric address")

    engine = adapter_of(recipe)
    launch = recipe["launch"]
    head = rank == 0
    container_name = launch["container_name"].format(deployment=deployment, rank=rank)
    if not _CONTAINER_NAME.match(container_name):
        raise ValueError("container name %s is not valid for docker" % show(container_name))

    argv = engine.launch_argv(recipe, rank, world_size, head_fabric_ip)
    argv += engine.kv_words(recipe.get("kv_cache") or {})
    argv += engine.args_words(recipe.get("engine_args") or {})

    env = engine.environment(recipe)
    env.update(engine.network_report_environment(world_size))
    env.update(recipe.get("env") or {})

    ports = [launch["api_port"], launch["master_port"]] if head else []
    ports += list(launch.get("extra_ports") or [])
    return {"container_name": container_name, "argv": argv, "env": env, "ports": ports,
            "mounts": render_mounts(recipe), "endpoints": engine.endpoints(recipe) if head else {}}


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
                                 "of %s first" % (section, i, show(item.get("sha256_from"))))
            target = posixpath.normpath(posixpath.join(part["path_in_container"], item["path"]))
            mounts.append({"source_rel": item["source"], "target": target, "sha256": item["sha256"]})
    return mounts
