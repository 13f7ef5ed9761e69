"""What a rendered deployment looks like on the nodes: its rank containers' volumes, the containers the readiness
wait watches, the order the ranks start in, where a user reaches its API, and what its fingerprint hashes.

Computed on the controller from the recipe, its ranks (recipe_render) and the engine adapter's facts, with the
paths and names the engine role takes as options; the engine role reads it through the ``engine_layout`` filter.
One home for what was Jinja in the engine role's vars, so each piece is a plain function with its tests.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from ..node.images import cache_key
from ..node.release import overlay_set_id


def _rank_entries(ranks: Mapping[Any, Mapping[str, Any]], world_size: int) -> List[Mapping[str, Any]]:
    """The ranks' renders by number, whether keyed by int (as rendered) or by string (as read back as JSON)."""
    by_number = {int(key): value for key, value in ranks.items()}
    return [by_number[rank] for rank in range(world_size)]


def ipwrap(host: str) -> str:
    """An IPv6 address in brackets, as a URL needs it; anything else as it is."""
    try:
        return f"[{host}]" if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address) else host
    except ValueError:
        return host


def image_cache_dir(recipe: Mapping[str, Any], dirs: Mapping[str, str]) -> str:
    """The folder of the engine's caches for the recipe's image, CACHE/sha256-<hex> of its digest: every
    deployment of the node that runs the same image shares it, and a new image starts with caches of its own."""
    return f"{dirs['cache']}/{cache_key(recipe['image'])}"


def _cache_mounts(recipe: Mapping[str, Any], adapter: Mapping[str, Any],
                  dirs: Mapping[str, str]) -> List[Tuple[str, str]]:
    """Each of the adapter's cache mounts as (its folder on the node, image_cache_dir/NAME; its container path)."""
    image_dir = image_cache_dir(recipe, dirs)
    return [(f"{image_dir}/{mount['name']}", mount["container_path"]) for mount in adapter.get("cache_mounts", [])]


def cache_dirs(recipe: Mapping[str, Any], adapter: Mapping[str, Any], dirs: Mapping[str, str]) -> List[str]:
    """The engine's cache folders on the node, one per cache mount: image_cache_dir/NAME."""
    return [host for host, _ in _cache_mounts(recipe, adapter, dirs)]


def volumes(recipe: Mapping[str, Any], adapter: Mapping[str, Any], ranks: Mapping[Any, Mapping[str, Any]],
            deployment: str, dirs: Mapping[str, str]) -> List[str]:
    """Every rank container's volumes, HOST:CONTAINER[:ro]: the model (and draft model) read-only, the engine's
    caches (cache_dirs), each overlay file from the deployment's overlay set, each model-file override by its
    sha256.

    ``dirs``: models, overlays, overrides and cache, the node folders the engine role takes as options.
    """
    model = recipe["model"]
    found = [f"{dirs['models']}/{model['repo']}/{model['revision']}:{model['path_in_container']}:ro"]
    found += [f"{host}:{container}" for host, container in _cache_mounts(recipe, adapter, dirs)]
    draft = recipe.get("draft_model")
    if draft:
        found.append(f"{dirs['models']}/{draft['repo']}/{draft['revision']}:{draft['path_in_container']}:ro")
    overlays = recipe.get("overlays") or []
    set_dir = f"{dirs['overlays']}/{deployment}/{overlay_set_id(overlays)}"
    found += [f"{set_dir}{overlay['path']}:{overlay['path']}:ro" for overlay in overlays]
    first = _rank_entries(ranks, 1)[0] if ranks else {}
    found += [f"{dirs['overrides']}/{deployment}/{mount['sha256']}:{mount['target']}:ro"
              for mount in first.get("mounts") or []]
    return found


def watched(ranks: Mapping[Any, Mapping[str, Any]], host_of_rank: Mapping[Any, str], head: str,
            memory_limit: str) -> List[Dict[str, Any]]:
    """Every rank's container as the head's readiness wait watches it: its name, rank, node ('' for the head's
    own, read locally) and memory cap (named when the kernel's out-of-memory killer ends a rank)."""
    hosts = {int(rank): node for rank, node in host_of_rank.items()}
    return [{"name": entry["container_name"], "rank": rank, "host": "" if hosts[rank] == head else hosts[rank],
             "memory_limit": memory_limit or ""}
            for rank, entry in enumerate(_rank_entries(ranks, len(hosts)))]


def start_order(order: str, world_size: int) -> List[int]:
    """The ranks in the order they start: workers_first, N-1 .. 1 then 0; head_first, 0 .. N-1."""
    if order == "workers_first":
        return list(range(world_size - 1, 0, -1)) + [0]
    return list(range(world_size))


def endpoint(recipe: Mapping[str, Any], adapter: Mapping[str, Any], ranks: Mapping[Any, Mapping[str, Any]],
             deployment: str, host_of_rank: Mapping[Any, str], nodes: Sequence[str], head: str, head_address: str,
             ssh_user: str, loopback_hosts: Sequence[str], wildcard_hosts: Sequence[str]) -> Dict[str, Any]:
    """Where a user reaches the API from the controller, and what serves there (the end of sparkserve up).

    At the head's management address for an API bound to every interface, through an ssh tunnel to the head for
    one on its loopback (at 127.0.0.1), otherwise at the API's own address.
    """
    launch, model = recipe["launch"], recipe["model"]
    api_host = str(launch["api_host"])
    loopback = api_host in loopback_hosts
    host = "127.0.0.1" if loopback else ipwrap(head_address if api_host in wildcard_hosts else api_host)
    image = str(recipe["image"])
    hosts = {int(rank): node for rank, node in host_of_rank.items()}
    return {
        "url": f"http://{host}:{launch['api_port']}",
        "api_host": api_host,
        "api_port": launch["api_port"],
        "loopback": loopback,
        "head": head,
        "head_address": head_address,
        "ssh_user": ssh_user,
        "model_name": model["served_name"],
        "model_repo": model["repo"],
        "model_revision": model["revision"],
        "image": image,
        "image_digest": image.split("@")[-1] if "@" in image else "",
        "engine": adapter["name"],
        "deployment": deployment,
        "recipe": recipe["name"],
        "nodes": list(nodes),
        "ranks": [{"rank": rank, "node": hosts[rank], "container": entry["container_name"]}
                  for rank, entry in enumerate(_rank_entries(ranks, len(hosts)))],
    }


def fingerprint_inputs(recipe: Mapping[str, Any], ranks: Mapping[Any, Any], volume_list: Sequence[str],
                       gpus: Any) -> Dict[str, Any]:
    """Everything a rank container is made from but each node's fabric environment (the role adds its checksum,
    read on the node): any change restarts every rank."""
    launch = recipe.get("launch") or {}
    return {"image": recipe["image"], "ranks": ranks, "volumes": list(volume_list), "gpus": gpus,
            "overlays": [overlay["result_sha256"] for overlay in recipe.get("overlays") or []],
            "memory": launch.get("memory_limit")}


def engine_layout(recipe: Mapping[str, Any], ranks: Mapping[Any, Mapping[str, Any]], adapter: Mapping[str, Any],
                  deployment: str, dirs: Mapping[str, str], host_of_rank: Mapping[Any, str], nodes: Sequence[str],
                  head: str, head_address: str, ssh_user: str, gpus: Any,
                  loopback_hosts: Sequence[str], wildcard_hosts: Sequence[str]) -> Dict[str, Any]:
    """The whole layout: volumes, cache_dirs, overlay_set_dir, watched, start_order, endpoint, fingerprint_inputs."""
    volume_list = volumes(recipe, adapter, ranks, deployment, dirs)
    launch = recipe["launch"]
    return {
        "volumes": volume_list,
        "cache_dirs": cache_dirs(recipe, adapter, dirs),
        "overlay_set_dir": f"{dirs['overlays']}/{deployment}/{overlay_set_id(recipe.get('overlays') or [])}",
        "watched": watched(ranks, host_of_rank, head, launch.get("memory_limit") or ""),
        "start_order": start_order(launch["order"], len(nodes)),
        "endpoint": endpoint(recipe, adapter, ranks, deployment, host_of_rank, nodes, head, head_address, ssh_user,
                             loopback_hosts, wildcard_hosts),
        "fingerprint_inputs": fingerprint_inputs(recipe, ranks, volume_list, gpus),
    }
