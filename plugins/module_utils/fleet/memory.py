"""A deployment's memory need on each node it runs on, in GiB, with the way it was computed.

``estimate`` reads the recipe's raw mapping (perhaps invalid: the recipe's validation reports that later) and
takes, in order:

1. ``memory.budget_gib``, the recipe's own figure per node;
2. else the engine's memory fraction of the node's whole memory (``Engine.memory_fraction``: vLLM's
   ``gpu-memory-utilization``, SGLang's ``mem-fraction-static``; a Spark's memory is unified, so the fraction
   is of all of it), plus the engine's overhead where the fraction leaves its activations out;
3. else the weights per rank (the model and the draft model, from the hub's file sizes of their pinned
   revisions, split over tensor x pipeline ranks) plus the KV cache per rank plus the engine's overhead.

A container memory cap (``launch.memory_limit``) below the result is the need: the container cannot use more.

``hub_revision_bytes`` asks the hub for a revision's size once and keeps it in a small JSON cache (a pinned
revision never changes). Standard library only, no Ansible: this runs anywhere the controller runs.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES
from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import GIB, Engine
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import write_atomic

CACHE_FORMAT = 1
# launch.memory_limit in docker's form: a number of bytes, or of b, k, m, g (powers of 1024).
_DOCKER_SIZE = re.compile(r"^([0-9]+)([bkmgBKMG]?)$")
_DOCKER_FACTORS = {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
# A commit names content that never changes; a branch or tag does not, and is never cached.
_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
# An engine the registry lacks (the validation refuses the recipe): no fraction, the base overhead.
_GENERIC = Engine()


@dataclass(frozen=True)
class Need:
    """Memory a deployment takes on each of its nodes, in GiB, and a short phrase saying how it was found."""

    gib: float
    basis: str


class SizeUnknown(Exception):  # noqa: N818 (an outcome the caller reports: the name says what is unknown)
    """The need cannot be computed: the weights' size is needed and unknown (or the hub did not answer)."""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _positive(value: Any) -> float | None:
    """A finite number above 0, else None (a bool or a string is no number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _whole(value: Any, default: int = 1) -> int:
    """A count of 1 or more, DEFAULT when the value is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else default


def _num(value: float) -> str:
    """A figure for a sentence: at most two decimals, no trailing zeros (121, 90.75, 45.4)."""
    return f"{round(value, 2):g}"


def _fraction_text(value: float) -> str:
    """A memory fraction as engines print it: two decimals (0.80), more only when they matter (0.875)."""
    return f"{value:.2f}" if abs(round(value, 2) - value) < 1e-9 else f"{value:g}"


def docker_size_bytes(value: Any) -> int | None:
    """Bytes of a docker memory size (``110g``, ``512m``, ``1073741824``); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if not isinstance(value, str):
        return None
    match = _DOCKER_SIZE.match(value.strip())
    if match is None:
        return None
    size = int(match.group(1)) * _DOCKER_FACTORS[match.group(2).lower()]
    return size if size > 0 else None


def _engine(recipe: Mapping[str, Any]) -> Engine:
    name = recipe.get("engine")
    return ENGINES.get(name, _GENERIC) if isinstance(name, str) else _GENERIC


def _uncapped(recipe: Mapping[str, Any], node_memory_gib: float, weights_bytes: int | None) -> Need:
    budget = _positive(_mapping(recipe.get("memory")).get("budget_gib"))
    if budget is not None:
        return Need(gib=budget, basis=f"memory.budget_gib {_num(budget)} GiB (the recipe's own figure)")
    engine = _engine(recipe)
    fraction = engine.memory_fraction(recipe)
    if fraction is not None:
        flag = engine.memory_fraction_flag or "memory fraction"
        basis = f"{flag} {_fraction_text(fraction)} of {_num(node_memory_gib)} GiB"
        gib = fraction * node_memory_gib
        if not engine.fraction_covers_overhead:
            gib += engine.overhead_gib
            basis += f" + {_num(engine.overhead_gib)} GiB engine overhead"
        return Need(gib=gib, basis=basis)
    name = recipe.get("name") if isinstance(recipe.get("name"), str) else "?"
    if weights_bytes is None:
        raise SizeUnknown(f"recipe {name} sets no memory fraction its engine sizes itself by, so its need is its "
                          "weights' size plus its KV cache, and that size is unknown: the recipe needs "
                          "memory.budget_gib, or the hub reachable from the controller")
    parallel = _mapping(recipe.get("parallel"))
    ranks = _whole(parallel.get("tensor")) * _whole(parallel.get("pipeline"))
    per_node = _whole(parallel.get("gpus_per_node"))
    weights = weights_bytes / GIB / ranks
    kv = engine.kv_cache_gib(recipe)
    gib = (weights + (kv or 0.0) + engine.overhead_gib) * per_node
    basis = f"weights {_num(weights)} GiB per rank ({_num(weights_bytes / GIB)} GiB over {ranks} ranks)"
    basis += f" + KV cache {_num(kv)} GiB" if kv is not None else " + KV cache not stated (not counted)"
    basis += f" + {_num(engine.overhead_gib)} GiB engine overhead"
    if per_node > 1:
        basis += f", x {per_node} ranks per node"
    return Need(gib=gib, basis=basis)


def estimate(recipe: Mapping[str, Any], node_memory_gib: float, weights_bytes: int | None) -> Need:
    """The memory the recipe's deployment takes on each node it runs on (see the module's docstring).

    ``node_memory_gib`` is the node's whole memory (a Spark: about 121 GiB), ``weights_bytes`` the bytes of
    the model and the draft model together (``hub_revision_bytes`` of each), or None when unknown. Raises
    ``SizeUnknown`` when the need depends on the weights' size and that is None.
    """
    recipe = _mapping(recipe)
    need = _uncapped(recipe, node_memory_gib, weights_bytes)
    raw = _mapping(recipe.get("launch")).get("memory_limit")
    limit = docker_size_bytes(raw)
    if limit is not None and limit / GIB < need.gib:
        return Need(gib=limit / GIB, basis=f"launch.memory_limit {raw} ({_num(limit / GIB)} GiB) caps "
                                           f"{need.basis} ({_num(need.gib)} GiB)")
    return need


def weights_bytes_of(files: Iterable[Mapping[str, Any]]) -> int:
    """The bytes of a revision from the hub's file list: every file's ``size`` (or ``lfs.size``), summed.

    Entries name their file as ``rfilename`` (model info's siblings) or ``path`` (the tree listing). The
    weights dominate, but small files count too. A file listed without a size raises ``SizeUnknown``.
    """
    total = 0
    for entry in files:
        entry = _mapping(entry)
        size = entry.get("size")
        if isinstance(size, bool) or not isinstance(size, int):
            size = _mapping(entry.get("lfs")).get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            name = entry.get("rfilename") or entry.get("path") or "a file"
            raise SizeUnknown(f"the hub lists {name} without its size (ask with ?blobs=true)")
        total += size
    return total


def default_cache_path() -> str:
    """``$XDG_CACHE_HOME/sparkserve/model-sizes.json``, else ``~/.cache/sparkserve/model-sizes.json``."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sparkserve", "model-sizes.json")


def _read_cache(path: str) -> dict[str, int]:
    """The cache's sizes by ``repo@revision``; empty when the file is missing or broken."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    sizes = data.get("sizes") if isinstance(data, dict) and data.get("format") == CACHE_FORMAT else None
    if not isinstance(sizes, dict):
        return {}
    return {key: value for key, value in sizes.items()
            if isinstance(key, str) and isinstance(value, int) and not isinstance(value, bool) and value >= 0}


def _write_cache(path: str, key: str, size: int) -> None:
    """Add KEY to the cache, atomically; a cache that cannot be written is no error (it is only a cache)."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        sizes = _read_cache(path)  # again: another run may have added sizes meanwhile
        sizes[key] = size
        text = json.dumps({"format": CACHE_FORMAT, "sizes": dict(sorted(sizes.items()))}, indent=1) + "\n"
        write_atomic(path, text, mode=0o644, sync=False)
    except OSError:
        pass


def _failure(error: BaseException, timeout_s: float) -> str:
    """What went wrong, in a few words, never the request's headers (the token)."""
    if isinstance(error, urllib.error.HTTPError):
        reason = f" {error.reason}" if error.reason else ""
        hint = " (a gated or private repository needs a token that may read it)" if error.code in (401, 403) else ""
        return f"the hub answered HTTP {error.code}{reason}{hint}"
    if isinstance(error, urllib.error.URLError):
        error = error.reason if isinstance(error.reason, BaseException) else OSError(str(error.reason))
    if isinstance(error, TimeoutError):
        return f"the hub did not answer within {_num(timeout_s)} s"
    if isinstance(error, ValueError):
        return f"the hub's answer is not the JSON of a model ({error})"
    return f"the hub could not be reached ({type(error).__name__}: {error})"


def hub_revision_bytes(endpoint: str, repo: str, revision: str, token: str | None, timeout_s: float = 10.0,
                       cache_path: str | None = None) -> int:
    """The bytes of every file of REPO at REVISION, as the hub at ENDPOINT lists them.

    One ``GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true`` (with ``Authorization: Bearer
    TOKEN`` when a token is given); its ``siblings`` sizes are summed. A commit's size is kept in the JSON
    cache at ``cache_path`` (``default_cache_path()`` when None), so asking again needs no network. Raises
    ``SizeUnknown`` when the hub cannot say, with one sentence naming the repository, the revision and why.
    """
    path = cache_path or default_cache_path()
    key = f"{repo}@{revision}"
    cacheable = bool(_COMMIT.match(revision))
    if cacheable:
        cached = _read_cache(path).get(key)
        if cached is not None:
            return cached
    url = "%s/api/models/%s/revision/%s?blobs=true" % (
        endpoint.rstrip("/"), urllib.parse.quote(repo, safe="/"), urllib.parse.quote(revision, safe=""))
    headers = {"Accept": "application/json", "User-Agent": "sparkserve"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        # A fresh opener: the proxy settings of the environment as they are now.
        with urllib.request.build_opener().open(request, timeout=timeout_s) as response:
            info = json.loads(response.read().decode("utf-8"))
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise SizeUnknown(f"the size of {repo} at revision {revision} is unknown: "
                          f"{_failure(error, timeout_s)}") from None
    siblings = info.get("siblings") if isinstance(info, dict) else None
    if not isinstance(siblings, list) or not siblings:
        raise SizeUnknown(f"the size of {repo} at revision {revision} is unknown: the hub's answer lists no files")
    try:
        size = weights_bytes_of(siblings)
    except SizeUnknown as error:
        raise SizeUnknown(f"the size of {repo} at revision {revision} is unknown: {error}") from None
    if cacheable:
        _write_cache(path, key, size)
    return size
