"""A rendered deployment's layout on the nodes (module_utils/recipe/layout.py), as the engine role reads it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.filter.engine_layout import engine_layout
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.release import overlay_set_id
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe import layout

DIRS = {"models": "/var/lib/sparkserve/models", "overlays": "/var/lib/sparkserve/overlays",
        "overrides": "/var/lib/sparkserve/overrides", "cache": "/var/lib/sparkserve/cache"}
OVERLAY = {"path": "/usr/lib/python3/dist-packages/vllm/x.py", "result_sha256": "b" * 64}
RECIPE: dict[str, Any] = {
    "name": "lab-tp2", "image": "reg:5000/engine@sha256:" + "a" * 64,
    "model": {"repo": "org/tiny", "revision": "c" * 40, "path_in_container": "/models/tiny", "served_name": "tiny"},
    "draft_model": {"repo": "org/draft", "revision": "d" * 40, "path_in_container": "/models/draft"},
    "overlays": [OVERLAY],
    "launch": {"api_host": "0.0.0.0", "api_port": 8000, "order": "workers_first", "memory_limit": "100g"},
}
ADAPTER = {"name": "vllm", "cache_mounts": [{"name": "vllm", "container_path": "/root/.cache/vllm"}]}
RANKS = {0: {"container_name": "lab-tp2-rank0", "mounts": [{"sha256": "e" * 64, "target": "/models/tiny/c.json"}]},
         1: {"container_name": "lab-tp2-rank1", "mounts": []}}
HOSTS = {0: "spark-1", 1: "spark-2"}
# The engine's caches of RECIPE's image: the folder of its digest.
IMAGE_CACHE = f"{DIRS['cache']}/sha256-{'a' * 64}"


def whole(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(ranks=RANKS, adapter=ADAPTER, deployment="lab-tp2", dirs=DIRS, host_of_rank=HOSTS,
                                nodes=["spark-1", "spark-2"], head="spark-1", head_address="172.30.77.11",
                                ssh_user="root", gpus="all", loopback_hosts=["127.0.0.1", "localhost", "::1"],
                                wildcard_hosts=["0.0.0.0", "::"])
    recipe = changes.pop("recipe", RECIPE)
    args.update(changes)
    return engine_layout(recipe, **args)


def test_the_volumes_of_every_rank_container_in_their_order() -> None:
    assert whole()["volumes"] == [
        f"{DIRS['models']}/org/tiny/{'c' * 40}:/models/tiny:ro",
        f"{IMAGE_CACHE}/vllm:/root/.cache/vllm",
        f"{DIRS['models']}/org/draft/{'d' * 40}:/models/draft:ro",
        f"{DIRS['overlays']}/lab-tp2/{overlay_set_id([OVERLAY])}{OVERLAY['path']}:{OVERLAY['path']}:ro",
        f"{DIRS['overrides']}/lab-tp2/{'e' * 64}:/models/tiny/c.json:ro",
    ]
    plain = dict(RECIPE, overlays=[])
    del plain["draft_model"]
    assert whole(recipe=plain, ranks={"0": {"container_name": "r0"}, "1": {"container_name": "r1"}})["volumes"] == [
        f"{DIRS['models']}/org/tiny/{'c' * 40}:/models/tiny:ro", f"{IMAGE_CACHE}/vllm:/root/.cache/vllm"]


def test_the_watched_containers_and_the_start_order() -> None:
    found = whole()
    assert found["watched"] == [
        {"name": "lab-tp2-rank0", "rank": 0, "host": "", "memory_limit": "100g"},
        {"name": "lab-tp2-rank1", "rank": 1, "host": "spark-2", "memory_limit": "100g"}]
    assert layout.start_order("workers_first", 4) == [3, 2, 1, 0]
    assert layout.start_order("head_first", 4) == [0, 1, 2, 3]
    assert found["start_order"] == [1, 0] and found["cache_dirs"] == [f"{IMAGE_CACHE}/vllm"]


def test_each_image_has_caches_of_its_own_and_deployments_of_one_image_share_them() -> None:
    two = {"name": "vllm", "cache_mounts": [{"name": "vllm", "container_path": "/root/.cache/vllm"},
                                             {"name": "triton", "container_path": "/root/.triton"}]}
    assert layout.cache_dirs(RECIPE, two, DIRS) == [f"{IMAGE_CACHE}/vllm", f"{IMAGE_CACHE}/triton"]
    # Another tag of the same digest is the same image; another digest is another folder.
    retagged = dict(RECIPE, image="other/repo:v2@sha256:" + "a" * 64)
    assert layout.cache_dirs(retagged, two, DIRS) == layout.cache_dirs(RECIPE, two, DIRS)
    moved = dict(RECIPE, image="reg:5000/engine@sha256:" + "f" * 64)
    assert layout.cache_dirs(moved, two, DIRS) == [f"{DIRS['cache']}/sha256-{'f' * 64}/vllm",
                                                   f"{DIRS['cache']}/sha256-{'f' * 64}/triton"]
    # A new image changes the volumes, so the fingerprint, so every rank starts again with the new caches.
    assert whole(recipe=moved)["fingerprint_inputs"]["volumes"] != whole()["fingerprint_inputs"]["volumes"]
    assert layout.cache_dirs(RECIPE, {"name": "none"}, DIRS) == []


@pytest.mark.parametrize(("api_host", "url", "loopback"), [
    ("0.0.0.0", "http://172.30.77.11:8000", False),       # every interface: the head's management address
    ("127.0.0.1", "http://127.0.0.1:8000", True),         # the head's loopback: through an ssh tunnel
    ("fd00::1", "http://[fd00::1]:8000", False),          # its own address, bracketed when IPv6
])
def test_where_a_user_reaches_the_api(api_host: str, url: str, loopback: bool) -> None:
    recipe = dict(RECIPE, launch=dict(RECIPE["launch"], api_host=api_host))
    found = whole(recipe=recipe)["endpoint"]
    assert (found["url"], found["loopback"], found["api_port"]) == (url, loopback, 8000)
    assert found["image_digest"] == "sha256:" + "a" * 64 and found["model_revision"] == "c" * 40
    assert found["ranks"] == [{"rank": 0, "node": "spark-1", "container": "lab-tp2-rank0"},
                              {"rank": 1, "node": "spark-2", "container": "lab-tp2-rank1"}]


def test_the_fingerprint_inputs_hash_the_same_as_the_role_did() -> None:
    """The role adds each node's fabric checksum and hashes the sorted JSON; the value must not move."""
    inputs = whole()["fingerprint_inputs"]
    assert sorted(inputs) == ["gpus", "image", "memory", "overlays", "ranks", "volumes"]
    assert inputs["overlays"] == ["b" * 64] and inputs["memory"] == "100g"
    text = json.dumps(dict(inputs, fabric=["x", "y"]), sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest() == hashlib.sha256(json.dumps(
        {"fabric": ["x", "y"], "gpus": "all", "image": RECIPE["image"], "memory": "100g", "overlays": ["b" * 64],
         "ranks": RANKS, "volumes": whole()["volumes"]}, sort_keys=True).encode()).hexdigest()


def test_a_render_without_what_the_layout_needs_is_said_so() -> None:
    with pytest.raises(AnsibleFilterError, match="^engine_layout: the render lacks 'launch'"):
        whole(recipe={k: v for k, v in RECIPE.items() if k != "launch"})
