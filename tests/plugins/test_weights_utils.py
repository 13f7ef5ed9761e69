"""Tests for module_utils/weights: the manifest, parallel hashing, the verify cache and relay plans."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils import weights as w

REVISION = "0123456789abcdef0123456789abcdef01234567"
HOUR_AGO_NS = time.time_ns() - 3600 * 10**9


def make_revision(root: Path, contents: dict[str, bytes], age_ns: int = HOUR_AGO_NS) -> dict[str, Any]:
    """Write these files under root (modified an hour ago, older than the racy window); their manifest."""
    files = {}
    for relpath, data in contents.items():
        target = root / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.utime(target, ns=(age_ns, age_ns))
        files[relpath] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "source": "computed"}
    manifest = {"format": 1, "repo": "org/name", "revision": REVISION, "files": files}
    (root / w.MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    return manifest


CONTENTS = {
    "config.json": b'{"hidden_size": 64}',
    "model-00001-of-00002.safetensors": os.urandom(5 * 1024 * 1024 + 7),  # more than one 4 MiB read
    "model-00002-of-00002.safetensors": os.urandom(300_000),
    "sub/tokenizer.json": b"{}",
}


# The manifest

def good_manifest() -> dict[str, Any]:
    return {"format": 1, "repo": "org/name", "revision": REVISION,
            "files": {"config.json": {"size": 3, "sha256": "a" * 64, "source": "computed"}}}


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(format=2), "format is 2"),
    (lambda m: m.pop("format"), "format is None"),
    (lambda m: m.update(repo="name-only"), "repo 'name-only' is not of the form org/name"),
    (lambda m: m.update(revision="main"), "revision 'main' is not a 40-character hex commit id"),
    (lambda m: m.update(files=[]), "files is missing or not an object"),
    (lambda m: m.update(files={}), "files is empty"),
    (lambda m: m["files"].update({"/etc/passwd": {"size": 1, "sha256": "a" * 64}}), "'/etc/passwd' is absolute"),
    (lambda m: m["files"].update({"a/../b": {"size": 1, "sha256": "a" * 64}}), "'a/../b' has an empty, '.' or '..'"),
    (lambda m: m["files"].update({"a//b": {"size": 1, "sha256": "a" * 64}}), "'a//b' has an empty"),
    (lambda m: m["files"].update({"a\\b": {"size": 1, "sha256": "a" * 64}}), "holds a backslash"),
    (lambda m: m["files"].update({".cache/x": {"size": 1, "sha256": "a" * 64}}), "'.cache/x' is bookkeeping"),
    (lambda m: m["files"].update({".sparkserve-x": {"size": 1, "sha256": "a" * 64}}), "is bookkeeping"),
    (lambda m: m["files"].update({"x": "nope"}), "file x: not an object"),
    (lambda m: m["files"]["config.json"].update(size=-1), "file config.json: size -1 is not"),
    (lambda m: m["files"]["config.json"].update(size=True), "file config.json: size True is not"),
    (lambda m: m["files"]["config.json"].pop("size"), "file config.json: size None is not"),
    (lambda m: m["files"]["config.json"].update(sha256="A" * 64), "sha256 'AAAA"),
    (lambda m: m["files"]["config.json"].update(sha256="ab"), "sha256 'ab' is not 64 lowercase hex digits"),
    (lambda m: m["files"]["config.json"].update(source=3), "source 3 is not a string"),
])
def test_manifest_validation_names_the_problem(change: Any, message: str) -> None:
    manifest = good_manifest()
    change(manifest)
    with pytest.raises(ValueError, match=r"^manifest: .*" + re.escape(message)):
        w.validate_manifest(manifest)


def test_a_good_manifest_loads(tmp_path: Path) -> None:
    path = tmp_path / w.MANIFEST_NAME
    path.write_text(json.dumps(good_manifest()), encoding="utf-8")
    assert w.load_manifest(str(path)) == good_manifest()
    assert w.validate_manifest(good_manifest()) == good_manifest()


def test_load_manifest_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    with pytest.raises(ValueError, match=f"manifest {path} does not exist"):
        w.load_manifest(str(path))
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=f"manifest {path} is not valid JSON"):
        w.load_manifest(str(path))
    path.write_text(json.dumps(dict(good_manifest(), repo=3)), encoding="utf-8")
    with pytest.raises(ValueError, match=f"manifest {path}: repo 3 is not of the form org/name"):
        w.load_manifest(str(path))


def test_bookkeeping_paths() -> None:
    for relpath in (".sparkserve-manifest.json", ".sparkserve-verify-cache.json", ".sparkserve-partial/x",
                    "sub/.sparkserve-partial/x", ".cache/huggingface/download/x.incomplete", ".cache"):
        assert w.is_bookkeeping(relpath), relpath
    for relpath in ("config.json", "sub/.cache/x", "sparkserve-x", "a/b.sparkserve-c", ".cachex/y"):
        assert not w.is_bookkeeping(relpath), relpath


def test_revision_path() -> None:
    assert w.revision_path("/srv/models", "org/name", REVISION) == f"/srv/models/org/name/{REVISION}"
    with pytest.raises(ValueError, match="not of the form org/name"):
        w.revision_path("/srv/models", "../x", REVISION)


# Hashing

def test_parallel_hashing_equals_hashlib(tmp_path: Path) -> None:
    make_revision(tmp_path, CONTENTS)
    digests = w.hash_files(str(tmp_path), list(CONTENTS), workers=3)
    assert digests == {p: hashlib.sha256(data).hexdigest() for p, data in CONTENTS.items()}
    assert list(digests) == list(CONTENTS)  # in the order asked
    assert w.hash_files(str(tmp_path), list(CONTENTS)) == digests  # workers default to the cores
    assert w.hash_files(str(tmp_path), []) == {}


def test_hashing_a_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        w.hash_files(str(tmp_path), ["nope"], workers=2)


# verify and its cache

def test_an_intact_folder_verifies_and_the_second_run_hashes_nothing(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    first = w.verify(str(tmp_path), manifest, workers=2)
    assert first["ok"] == list(CONTENTS)
    assert (first["missing"], first["corrupt"], first["unexpected"]) == ([], [], [])
    assert first["hashed_bytes"] == sum(len(d) for d in CONTENTS.values()) == first["bytes_total"]
    assert first["cached"] == 0
    assert (tmp_path / w.CACHE_NAME).is_file()

    second = w.verify(str(tmp_path), manifest, workers=2)
    assert second["ok"] == list(CONTENTS)
    assert second["hashed_bytes"] == 0
    assert second["cached"] == len(CONTENTS)

    third = w.verify(str(tmp_path), manifest, workers=2, use_cache=False)
    assert third["hashed_bytes"] == first["hashed_bytes"] and third["cached"] == 0


def test_a_touched_file_is_hashed_again(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    w.verify(str(tmp_path), manifest)
    later = HOUR_AGO_NS + 10**9
    os.utime(tmp_path / "config.json", ns=(later, later))
    result = w.verify(str(tmp_path), manifest)
    assert result["hashed_bytes"] == len(CONTENTS["config.json"])
    assert result["cached"] == len(CONTENTS) - 1
    assert result["ok"] == list(CONTENTS)


def test_a_modified_file_is_hashed_again_and_found_corrupt(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    w.verify(str(tmp_path), manifest)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    data = bytearray(CONTENTS["model-00002-of-00002.safetensors"])
    data[1000] ^= 0xFF  # same size, other content, a new mtime
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(HOUR_AGO_NS + 5 * 10**9,) * 2)
    result = w.verify(str(tmp_path), manifest)
    assert result["hashed_bytes"] == len(data)
    assert result["corrupt"] == [{
        "path": "model-00002-of-00002.safetensors", "reason": "sha256",
        "expected": hashlib.sha256(CONTENTS["model-00002-of-00002.safetensors"]).hexdigest(),
        "actual": hashlib.sha256(bytes(data)).hexdigest(), "expected_size": len(data), "actual_size": len(data)}]
    assert "model-00002-of-00002.safetensors" not in result["ok"]
    # The cache keeps the content's hash, so the verdict holds without hashing again.
    again = w.verify(str(tmp_path), manifest)
    assert again["hashed_bytes"] == 0 and again["corrupt"] == result["corrupt"]


def test_a_replaced_file_with_the_same_mtime_is_hashed_again(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    w.verify(str(tmp_path), manifest)
    replacement = tmp_path / "config.json.new"
    replacement.write_bytes(CONTENTS["config.json"])
    os.utime(replacement, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    os.replace(replacement, tmp_path / "config.json")  # a new inode, like rsync's rename
    result = w.verify(str(tmp_path), manifest)
    assert result["hashed_bytes"] == len(CONTENTS["config.json"]) and result["ok"] == list(CONTENTS)


def test_a_file_modified_just_now_is_not_cached(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS, age_ns=time.time_ns())
    assert w.verify(str(tmp_path), manifest)["hashed_bytes"] == manifest_bytes(manifest)
    assert w.verify(str(tmp_path), manifest)["hashed_bytes"] == manifest_bytes(manifest)


def manifest_bytes(manifest: dict[str, Any]) -> int:
    return sum(entry["size"] for entry in manifest["files"].values())


@pytest.mark.parametrize("junk", [b"{broken", b"[]", b'{"format": 1, "files": {"config.json": {"ino": "x"}}}',
                                  b"\xff\xfe"])
def test_a_corrupt_cache_is_ignored(tmp_path: Path, junk: bytes) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    (tmp_path / w.CACHE_NAME).write_bytes(junk)
    result = w.verify(str(tmp_path), manifest)
    assert result["ok"] == list(CONTENTS) and result["cached"] == 0
    assert w.verify(str(tmp_path), manifest)["hashed_bytes"] == 0  # and rewritten


def test_a_cache_entry_with_a_wrong_hash_for_another_inode_is_not_trusted(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    st = (tmp_path / "config.json").stat()
    entries = {"config.json": {"ino": st.st_ino + 1, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                               "sha256": "b" * 64}}
    assert w.save_cache(str(tmp_path), entries)
    assert w.load_cache(str(tmp_path)) == entries
    result = w.verify(str(tmp_path), manifest)
    assert "config.json" in result["ok"]


def test_the_cache_is_written_atomically_and_not_in_check_mode(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    w.verify(str(tmp_path), manifest, write_cache=False)
    assert not (tmp_path / w.CACHE_NAME).exists()
    w.verify(str(tmp_path), manifest)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(w.CACHE_NAME)) == [w.CACHE_NAME]
    assert set(json.loads((tmp_path / w.CACHE_NAME).read_text())["files"]) == set(CONTENTS)


def test_an_unwritable_cache_is_not_an_error(tmp_path: Path) -> None:
    assert w.save_cache(str(tmp_path / "gone"), {}) is False


def test_size_mismatch_is_corrupt_without_hashing(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"short")
    result = w.verify(str(tmp_path), manifest, use_cache=False)
    size = len(CONTENTS["model-00001-of-00002.safetensors"])
    assert result["corrupt"] == [{
        "path": "model-00001-of-00002.safetensors", "reason": "size",
        "expected": manifest["files"]["model-00001-of-00002.safetensors"]["sha256"], "actual": None,
        "expected_size": size, "actual_size": 5}]
    assert result["hashed_bytes"] == manifest_bytes(manifest) - size
    assert w.describe_corrupt(result["corrupt"][0]) == f"model-00001-of-00002.safetensors (size 5, expected {size})"


def test_missing_unexpected_and_bookkeeping(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    (tmp_path / "sub" / "tokenizer.json").unlink()
    (tmp_path / "config.json").unlink()
    (tmp_path / "stray.bin").write_bytes(b"x")
    (tmp_path / "sub" / "extra.txt").write_bytes(b"x")
    for bookkeeping in (".sparkserve-partial/model-00001-of-00002.safetensors", "sub/.sparkserve-partial/t.json",
                        ".cache/huggingface/download/x.incomplete", ".sparkserve-anything"):
        (tmp_path / bookkeeping).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / bookkeeping).write_bytes(b"x")
    result = w.verify(str(tmp_path), manifest)
    assert result["missing"] == ["config.json", "sub/tokenizer.json"]  # manifest order
    assert result["unexpected"] == ["stray.bin", "sub/extra.txt"]
    assert result["ok"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_a_folder_that_is_not_there_is_all_missing(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path / "a", CONTENTS)
    result = w.verify(str(tmp_path / "b"), manifest)
    assert result["missing"] == list(CONTENTS) and result["unexpected"] == [] and result["ok"] == []


def test_a_directory_in_place_of_a_file_is_corrupt(tmp_path: Path) -> None:
    manifest = make_revision(tmp_path, CONTENTS)
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").mkdir()
    result = w.verify(str(tmp_path), manifest)
    assert [(c["path"], c["reason"]) for c in result["corrupt"]] == [("config.json", "not a regular file")]


# Relay plans

NODES = ["spark-1", "spark-2", "spark-3", "spark-4", "spark-5"]


def test_chain() -> None:
    assert w.plan_relay(NODES[:2], "spark-1") == {"spark-1": None, "spark-2": "spark-1"}
    plan = w.plan_relay(NODES, "spark-1")
    assert plan == {"spark-1": None, "spark-2": "spark-1", "spark-3": "spark-2", "spark-4": "spark-3",
                    "spark-5": "spark-4"}
    assert w.relay_depth(plan) == {"spark-1": 0, "spark-2": 1, "spark-3": 2, "spark-4": 3, "spark-5": 4}


def test_chain_with_the_seeder_not_first_keeps_the_others_in_order() -> None:
    assert w.plan_relay(NODES[:4], "spark-3") == {
        "spark-1": "spark-3", "spark-2": "spark-1", "spark-3": None, "spark-4": "spark-2"}


def test_trees() -> None:
    assert w.plan_relay(NODES[:2], "spark-1", fanout=2) == {"spark-1": None, "spark-2": "spark-1"}
    assert w.plan_relay(NODES[:4], "spark-1", fanout=2) == {
        "spark-1": None, "spark-2": "spark-1", "spark-3": "spark-1", "spark-4": "spark-2"}
    assert w.plan_relay(NODES, "spark-1", fanout=2) == {
        "spark-1": None, "spark-2": "spark-1", "spark-3": "spark-1", "spark-4": "spark-2", "spark-5": "spark-2"}
    assert w.plan_relay(NODES, "spark-4", fanout=2) == {
        "spark-1": "spark-4", "spark-2": "spark-4", "spark-3": "spark-1", "spark-4": None, "spark-5": "spark-1"}
    assert w.plan_relay(NODES, "spark-1", fanout=4) == {
        "spark-1": None, "spark-2": "spark-1", "spark-3": "spark-1", "spark-4": "spark-1", "spark-5": "spark-1"}
    assert w.plan_relay(NODES, "spark-2", fanout=3) == {
        "spark-1": "spark-2", "spark-2": None, "spark-3": "spark-2", "spark-4": "spark-2", "spark-5": "spark-1"}
    assert w.plan_relay(["only"], "only", fanout=3) == {"only": None}
    assert max(w.relay_depth(w.plan_relay(NODES, "spark-1", fanout=2)).values()) == 2


@pytest.mark.parametrize("nodes, seeder, fanout, message", [
    (NODES, "spark-9", 1, "seeder spark-9 is not among the nodes"),
    (NODES + ["spark-2"], "spark-1", 1, "nodes named more than once: spark-2"),
    (NODES, "spark-1", 0, "fanout 0 must be a whole number >= 1"),
    (NODES, "spark-1", True, "fanout True must be"),
    ([], "spark-1", 1, "no nodes"),
])
def test_relay_plan_errors(nodes: list[str], seeder: str, fanout: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        w.plan_relay(copy.copy(nodes), seeder, fanout)
