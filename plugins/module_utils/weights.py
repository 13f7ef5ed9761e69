"""Model weights on the nodes: the manifest, parallel hashing, a verify cache and relay planning.

A model revision lives on each node in ``MODELS/<org>/<name>/<revision>/``. The manifest
``.sparkserve-manifest.json`` inside that folder names every file of the revision with its size and
sha256::

    {"format": 1, "repo": "org/name", "revision": "<40 hex>",
     "files": {"config.json": {"size": 123, "sha256": "<64 hex>", "source": "computed"}, ...}}

Paths are POSIX and relative to the folder. Bookkeeping files are never checked, never reported as
unexpected and never transferred: a path under ``.cache/`` (the hub client's), and a path any of
whose components starts with ``.sparkserve-`` (ours: the manifest, the verify cache, rsync's
partial-dir, which rsync makes beside the file it receives, so also in subfolders).

Standard library only, so the same code runs on the controller and on the nodes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Union

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import write_atomic

MANIFEST_NAME = ".sparkserve-manifest.json"
CACHE_NAME = ".sparkserve-verify-cache.json"
# Written by the download program (roles/weights/files) when it starts: {"bytes": the revision's size}.
DOWNLOAD_NAME = ".sparkserve-download.json"
PARTIAL_DIR = ".sparkserve-partial"
OUR_PREFIX = ".sparkserve-"
HUB_CACHE_DIR = ".cache"
MANIFEST_FORMAT = 1
CACHE_FORMAT = 1
READ_SIZE = 4 * 1024 * 1024
# A file modified this close to the moment it was looked at may still be being written (or be
# written again within the same mtime tick), so its hash is not kept in the verify cache.
RACY_WINDOW_NS = 2_000_000_000

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REVISION = re.compile(r"^[0-9a-fA-F]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

Manifest = dict[str, Any]
Stamp = tuple[int, int, int]  # (st_ino, st_size, st_mtime_ns)


def is_bookkeeping(relpath: str) -> bool:
    """True for our and the hub client's own files, which are never checked or transferred."""
    if relpath == HUB_CACHE_DIR or relpath.startswith(HUB_CACHE_DIR + "/"):
        return True
    return any(part.startswith(OUR_PREFIX) for part in relpath.split("/"))


def revision_path(models: str, repo: str, revision: str) -> str:
    """The folder of one revision of a model: MODELS/<org>/<name>/<revision>."""
    if not _REPO.match(repo):
        raise ValueError(f"repo {repo!r} is not of the form org/name")
    if not _REVISION.match(revision):
        raise ValueError(f"revision {revision!r} is not a 40-character hex commit id")
    return os.path.join(models, *repo.split("/"), revision)


def _path_problem(relpath: str) -> Optional[str]:
    if not relpath:
        return "is empty"
    if relpath.startswith("/"):
        return "is absolute"
    if "\\" in relpath or "\0" in relpath:
        return "holds a backslash or a NUL; paths are POSIX"
    parts = relpath.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' component"
    if is_bookkeeping(relpath):
        return f"is bookkeeping (under {HUB_CACHE_DIR}/ or named {OUR_PREFIX}*), never a model file"
    return None


def validate_manifest(data: Any, origin: str = "manifest") -> Manifest:
    """Check a parsed manifest; return it, or raise ValueError naming the first problem found."""
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: not a JSON object")
    if data.get("format") != MANIFEST_FORMAT or isinstance(data.get("format"), bool):
        raise ValueError(f"{origin}: format is {data.get('format')!r}, this code reads format {MANIFEST_FORMAT}")
    repo = data.get("repo")
    if not isinstance(repo, str) or not _REPO.match(repo):
        raise ValueError(f"{origin}: repo {repo!r} is not of the form org/name")
    revision = data.get("revision")
    if not isinstance(revision, str) or not _REVISION.match(revision):
        raise ValueError(f"{origin}: revision {revision!r} is not a 40-character hex commit id")
    files = data.get("files")
    if not isinstance(files, dict):
        raise ValueError(f"{origin}: files is missing or not an object of path -> {{size, sha256}}")
    if not files:
        raise ValueError(f"{origin}: files is empty")
    for relpath, entry in files.items():
        problem = _path_problem(relpath)
        if problem:
            raise ValueError(f"{origin}: file path {relpath!r} {problem}")
        if not isinstance(entry, dict):
            raise ValueError(f"{origin}: file {relpath}: not an object with size and sha256")
        size = entry.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"{origin}: file {relpath}: size {size!r} is not a whole number of bytes >= 0")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise ValueError(f"{origin}: file {relpath}: sha256 {digest!r} is not 64 lowercase hex digits")
        source = entry.get("source", "")
        if not isinstance(source, str):
            raise ValueError(f"{origin}: file {relpath}: source {source!r} is not a string")
    return data


def load_manifest(path: str) -> Manifest:
    """Read and validate a manifest file; ValueError names the file and the problem."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise ValueError(f"manifest {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"manifest {path} cannot be read: {err}") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ValueError(f"manifest {path} is not valid JSON: {err}") from None
    return validate_manifest(data, f"manifest {path}")


def _workers(workers: Optional[int]) -> int:
    if not workers or workers < 1:
        return os.cpu_count() or 1
    return workers


def hash_file(path: str) -> tuple[str, int]:
    """The sha256 of a file and the number of bytes read, in large reads."""
    digest = hashlib.sha256()
    buffer = bytearray(READ_SIZE)
    view = memoryview(buffer)
    total = 0
    with open(path, "rb", buffering=0) as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                break
            digest.update(view[:count])  # hashlib lets go of the GIL for large updates
            total += count
    return digest.hexdigest(), total


def _size_or_zero(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _hash_all(root: str, paths: Sequence[str], workers: Optional[int]
              ) -> dict[str, Union[tuple[str, int], OSError]]:
    """Hash files under root at once, one thread each up to workers; errors are returned, not raised."""
    if not paths:
        return {}

    def one(relpath: str) -> Union[tuple[str, int], OSError]:
        try:
            return hash_file(os.path.join(root, relpath))
        except OSError as err:
            return err

    # Largest first, so one big file left for last does not keep the others waiting.
    order = sorted(paths, key=lambda p: _size_or_zero(os.path.join(root, p)), reverse=True)
    with ThreadPoolExecutor(max_workers=min(_workers(workers), len(order))) as pool:
        done = dict(zip(order, pool.map(one, order), strict=True))
    return {relpath: done[relpath] for relpath in paths}


def hash_files(root: str, paths: Sequence[str], workers: Optional[int] = None) -> dict[str, str]:
    """The sha256 of each path (relative to root), hashed in parallel; workers 0/None = cpu count.

    Raises the first OSError met (a file that is missing or unreadable).
    """
    digests: dict[str, str] = {}
    for relpath, outcome in _hash_all(root, paths, workers).items():
        if isinstance(outcome, OSError):
            raise outcome
        digests[relpath] = outcome[0]
    return digests


# The verify cache: CACHE_NAME in the revision folder, {"format": 1, "files": {path: entry}}, an entry
# being {"ino", "size", "mtime_ns", "sha256"}. A file whose inode, size and mtime match is not hashed
# again.

def load_cache(root: str) -> dict[str, dict[str, Any]]:
    """The verify cache's entries; empty when it is missing, unreadable or not as written."""
    try:
        with open(os.path.join(root, CACHE_NAME), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("files"), dict):
        return {}
    entries = {}
    for relpath, entry in data["files"].items():
        if not isinstance(entry, dict):
            continue
        numbers = [entry.get(key) for key in ("ino", "size", "mtime_ns")]
        if any(isinstance(n, bool) or not isinstance(n, int) for n in numbers):
            continue
        if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
            continue
        entries[relpath] = {"ino": numbers[0], "size": numbers[1], "mtime_ns": numbers[2], "sha256": entry["sha256"]}
    return entries


def save_cache(root: str, entries: Mapping[str, Mapping[str, Any]]) -> bool:
    """Write the verify cache atomically (temporary file, then rename); False when it cannot be written."""
    body = json.dumps({"format": CACHE_FORMAT, "files": dict(entries)}, sort_keys=True)
    try:
        write_atomic(os.path.join(root, CACHE_NAME), body, 0o644)
    except OSError:
        return False
    return True


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _cacheable(st: os.stat_result, now_ns: int) -> bool:
    return abs(now_ns - st.st_mtime_ns) > RACY_WINDOW_NS


def files_on_disk(root: str) -> list[str]:
    """Every file under root as a relative POSIX path, bookkeeping left out, sorted."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [d for d in dirnames if not is_bookkeeping(prefix + d)]
        found.extend(prefix + name for name in filenames if not is_bookkeeping(prefix + name))
        # A symlink to a directory shows among dirnames but is not walked: name it as a file.
        found.extend(prefix + d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))
    return sorted(found)


def verify(root: str, manifest: Manifest, workers: Optional[int] = None, use_cache: bool = True,
           write_cache: bool = True) -> dict[str, Any]:
    """Check the files under root against the manifest.

    Returns ``ok`` (paths), ``missing`` (paths), ``corrupt`` (entries ``{path, reason, expected,
    actual, expected_size, actual_size}``; reason ``size`` when the size differs, found without
    hashing, ``sha256`` when the content differs, ``not a regular file`` or ``unreadable: ...``),
    ``unexpected`` (files on disk the manifest does not name), ``hashed_bytes`` (bytes hashed this
    time), ``cached`` (files whose hash came from the verify cache), ``bytes_total`` (the manifest's
    bytes) and ``cache_saved``. Lists follow the manifest's order; ``unexpected`` is sorted.

    With use_cache false the cache is not read (every present file is hashed); with write_cache true
    the hashes are recorded in it either way.
    """
    files: Mapping[str, Mapping[str, Any]] = manifest["files"]
    cache = load_cache(root) if use_cache else {}
    stamps: dict[str, os.stat_result] = {}
    missing: list[str] = []
    bad: dict[str, dict[str, Any]] = {}
    known: dict[str, str] = {}
    from_cache: set[str] = set()
    for relpath, entry in files.items():
        try:
            st = os.stat(os.path.join(root, relpath))
        except (FileNotFoundError, NotADirectoryError):
            missing.append(relpath)
            continue
        except OSError as err:
            bad[relpath] = _corrupt(relpath, entry, None, None, f"unreadable: {err.strerror or err}")
            continue
        if not stat.S_ISREG(st.st_mode):
            bad[relpath] = _corrupt(relpath, entry, None, None, "not a regular file")
            continue
        stamps[relpath] = st
        if st.st_size != entry["size"]:
            bad[relpath] = _corrupt(relpath, entry, None, st.st_size, "size")
            continue
        hit = cache.get(relpath)
        if hit is not None and (hit["ino"], hit["size"], hit["mtime_ns"]) == _stamp(st):
            known[relpath] = hit["sha256"]
            from_cache.add(relpath)

    to_hash = [p for p in stamps if p not in known and p not in bad]
    hashed_bytes = 0
    fresh: set[str] = set()
    for relpath, outcome in _hash_all(root, to_hash, workers).items():
        if isinstance(outcome, FileNotFoundError):
            missing.append(relpath)
            del stamps[relpath]
            continue
        if isinstance(outcome, OSError):
            bad[relpath] = _corrupt(relpath, files[relpath], None, None,
                                    f"unreadable: {outcome.strerror or outcome}")
            continue
        digest, count = outcome
        hashed_bytes += count
        known[relpath] = digest
        try:
            if _stamp(os.stat(os.path.join(root, relpath))) == _stamp(stamps[relpath]):
                fresh.add(relpath)  # unchanged while it was hashed: the hash may be cached
        except OSError:
            pass

    ok: list[str] = []
    for relpath, digest in known.items():
        expected = files[relpath]["sha256"]
        if digest == expected:
            ok.append(relpath)
        else:
            bad[relpath] = _corrupt(relpath, files[relpath], digest, stamps[relpath].st_size, "sha256")

    cache_saved = False
    if write_cache and os.path.isdir(root):
        now_ns = time.time_ns()
        entries = {}
        for relpath, digest in known.items():
            st = stamps[relpath]
            if relpath in from_cache or (relpath in fresh and _cacheable(st, now_ns)):
                entries[relpath] = {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        previous = load_cache(root) if not use_cache else cache
        cache_saved = entries == previous or save_cache(root, entries)

    order = list(files)
    position = {relpath: n for n, relpath in enumerate(order)}
    return {
        "ok": sorted(ok, key=position.__getitem__),
        "missing": sorted(missing, key=position.__getitem__),
        "corrupt": [bad[p] for p in order if p in bad],
        "unexpected": [p for p in files_on_disk(root) if p not in files] if os.path.isdir(root) else [],
        "hashed_bytes": hashed_bytes,
        "cached": len(from_cache),
        "bytes_total": sum(entry["size"] for entry in files.values()),
        "cache_saved": cache_saved,
    }


def _corrupt(relpath: str, entry: Mapping[str, Any], actual: Optional[str], actual_size: Optional[int],
             reason: str) -> dict[str, Any]:
    return {"path": relpath, "reason": reason, "expected": entry["sha256"], "actual": actual,
            "expected_size": entry["size"], "actual_size": actual_size}


def describe_corrupt(entry: Mapping[str, Any]) -> str:
    """One corrupt file in words, for messages."""
    if entry["reason"] == "size":
        return f"{entry['path']} (size {entry['actual_size']}, expected {entry['expected_size']})"
    if entry["reason"] == "sha256":
        return f"{entry['path']} (sha256 {entry['actual']}, expected {entry['expected']})"
    return f"{entry['path']} ({entry['reason']})"


def plan_relay(nodes: Sequence[str], seeder: str, fanout: int = 1) -> dict[str, Optional[str]]:
    """The upstream of each node when weights are relayed from the seeder.

    The seeder comes first, then the other nodes in the order given. With fanout 1 they form a chain
    (seeder -> n1 -> n2 -> ...); with fanout k the k-ary tree filled in that order, the seeder at its
    root (its children n1..nk, n1's children the next k, and so on). The seeder's upstream is None.
    The result follows the order of nodes.
    """
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout < 1:
        raise ValueError(f"fanout {fanout!r} must be a whole number >= 1")
    nodes = list(nodes)
    if not nodes:
        raise ValueError("no nodes to relay to")
    twice = sorted({n for n in nodes if nodes.count(n) > 1})
    if twice:
        raise ValueError(f"nodes named more than once: {', '.join(twice)}")
    if seeder not in nodes:
        raise ValueError(f"seeder {seeder} is not among the nodes ({', '.join(nodes)})")
    order = [seeder] + [n for n in nodes if n != seeder]
    upstream: dict[str, Optional[str]] = {seeder: None}
    for index in range(1, len(order)):
        upstream[order[index]] = order[(index - 1) // fanout]
    return {n: upstream[n] for n in nodes}


def relay_depth(upstream: Mapping[str, Optional[str]]) -> dict[str, int]:
    """How many hops each node is from the seeder in a plan from plan_relay."""
    depth: dict[str, int] = {}

    def of(node: str) -> int:
        if node not in depth:
            parent = upstream[node]
            depth[node] = 0 if parent is None else of(parent) + 1
        return depth[node]

    for node in upstream:
        of(node)
    return depth


def total_size(manifest: Manifest, paths: Iterable[str]) -> int:
    return sum(manifest["files"][p]["size"] for p in paths)


def bytes_arrived(root: str) -> int:
    """Bytes of the revision's content under root so far: whole files, rsync's partial files and the hub
    client's unfinished downloads (under .cache), not our bookkeeping files or the hub client's metadata."""
    bookkeeping = {MANIFEST_NAME, CACHE_NAME, DOWNLOAD_NAME}
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            if name in bookkeeping or name.endswith((".lock", ".metadata")):
                continue
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue  # renamed or removed while we looked
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def expected_bytes(root: str) -> Optional[int]:
    """The revision's size: from its manifest, else from what the download program wrote when it started."""
    try:
        manifest = load_manifest(os.path.join(root, MANIFEST_NAME))
    except (OSError, ValueError):
        pass
    else:
        return total_size(manifest, manifest["files"])
    try:
        with open(os.path.join(root, DOWNLOAD_NAME), encoding="utf-8") as handle:
            size = json.load(handle).get("bytes")
    except (OSError, ValueError, AttributeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None

