"""Tests for the weights download program (roles/weights/files/sparkserve-weights-download.py).

The program runs as a process against the lab's Hub double (lab/hub/hub_double.py) serving a tiny model on
127.0.0.1, with the real huggingface_hub client.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils import weights
from tests.roles import node_layout
from tests.scripts import ROOT, load_script

SCRIPT = ROOT / "roles/weights/files/sparkserve-weights-download.py"
download: ModuleType = load_script("roles/weights/files/sparkserve-weights-download.py", "sparkserve_weights_download")
hub: ModuleType = load_script("lab/hub/hub_double.py", "sparkserve_hub_double_for_weights")

REPO = "acme/tiny"
GATED = "acme/gated"
SHA = "c0ffee" * 6 + "c0ff"
TOKEN = "hf_weightsSECRET987654321"
SHARD = "model-00001-of-00003.safetensors"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/acme/tiny/<SHA>/ (3 shards of 1 MiB) with refs/main, and acme/gated, a gated copy."""
    root = tmp_path_factory.mktemp("hub")
    folder = root / REPO / SHA
    subprocess.run([sys.executable, str(ROOT / "lab/engine/make_tiny_model.py"), str(folder),
                    "--shards", "3", "--shard-mib", "1"], check=True, capture_output=True)
    (root / REPO / "refs").mkdir()
    (root / REPO / "refs" / "main").write_text(SHA + "\n")
    shutil.copytree(root / REPO, root / GATED)
    (root / GATED / ".gated").touch()
    return folder


@pytest.fixture(scope="module")
def endpoint(model: Path) -> Iterator[str]:
    server = hub.make_server(model.parents[2], "127.0.0.1", 0, 0.0, TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % server.port
    server.shutdown()
    server.server_close()


def stats(endpoint: str, reset: bool = False) -> dict[str, Any]:
    path = "/sparkserve-lab/stats/reset" if reset else "/sparkserve-lab/stats"
    request = urllib.request.Request(endpoint + path, method="POST" if reset else "GET", data=b"" if reset else None)
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def served(endpoint: str, expected: int, timeout: float = 30) -> int:
    """bytes_served once it reaches expected (or the deadline passes): the double counts each block just
    after writing it, so a client can hold the whole body a moment before the last block is counted."""
    deadline = time.monotonic() + timeout
    while True:
        count = int(stats(endpoint)["bytes_served"])
        if count >= expected or time.monotonic() > deadline:
            return count
        time.sleep(0.01)


def run(endpoint: str | None, dest: Path, revision: str = SHA, repo: str = REPO,
        token: str | None = None) -> subprocess.CompletedProcess[str]:
    # As the weights role runs it: the node library on PYTHONPATH (mounted read-only into the container).
    node = dest.parent / "node"
    if not (node / "lib").is_dir():
        node_layout.install_library(node / "lib")
    env = node_layout.env(node, {k: v for k, v in os.environ.items() if not k.startswith("HF_")})
    env.update(HF_HOME=str(dest.parent / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1")
    if token is not None:
        env["HF_TOKEN"] = token
    argv = [sys.executable, str(SCRIPT), "--repo", repo, "--revision", revision, "--dest", str(dest)]
    if endpoint is not None:
        argv += ["--endpoint", endpoint]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def result_line(process: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout.strip().splitlines()[-1])


def model_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_download_writes_the_manifest(endpoint: str, model: Path, tmp_path: Path) -> None:
    stats(endpoint, reset=True)
    dest = tmp_path / "weights"
    result = result_line(run(endpoint, dest))
    files = model_files(model)
    total = sum(len(data) for data in files.values())
    assert result == {"repo": REPO, "revision": SHA, "files": len(files), "bytes": total, "downloaded": True}
    assert served(endpoint, total) == total
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data
    text = (dest / download.MANIFEST_NAME).read_text()
    manifest = json.loads(text)
    assert text == json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    assert manifest["format"] == 1 and manifest["repo"] == REPO and manifest["revision"] == SHA
    assert list(manifest["files"]) == sorted(files)
    for rel, data in files.items():
        source = "hub-lfs" if rel.endswith(".safetensors") else "computed"
        assert manifest["files"][rel] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                          "source": source}
    assert not list(dest.glob(download.MANIFEST_NAME + ".*"))  # no temporary file left
    # The revision's size, written at the start for the progress bar, is the one the project reads.
    assert json.loads((dest / download.EXPECTED_NAME).read_text()) == {"bytes": total}
    assert download.EXPECTED_NAME == weights.DOWNLOAD_NAME


def test_second_run_downloads_nothing(endpoint: str, tmp_path: Path) -> None:
    dest = tmp_path / "weights"
    result_line(run(endpoint, dest))
    manifest_mtime = (dest / download.MANIFEST_NAME).stat().st_mtime_ns
    stats(endpoint, reset=True)
    result = result_line(run(endpoint, dest))
    assert result["downloaded"] is False
    assert stats(endpoint) == {"bytes_served": 0, "by_repo": {}, "requests": 1}  # model info only
    assert (dest / download.MANIFEST_NAME).stat().st_mtime_ns == manifest_mtime


def test_damaged_files_are_fetched_again(endpoint: str, model: Path, tmp_path: Path) -> None:
    dest = tmp_path / "weights"
    result_line(run(endpoint, dest))
    shard = dest / SHARD
    shard.write_bytes(shard.read_bytes()[:1000])  # truncated
    config = dest / "config.json"
    config.write_bytes(config.read_bytes().upper())  # same size, other content
    stats(endpoint, reset=True)
    result = result_line(run(endpoint, dest))
    assert result["downloaded"] is True
    assert shard.read_bytes() == (model / SHARD).read_bytes()
    assert config.read_bytes() == (model / "config.json").read_bytes()
    fetched = (model / SHARD).stat().st_size + config.stat().st_size
    assert served(endpoint, fetched) == fetched


def test_a_missing_manifest_is_written_without_fetching(endpoint: str, tmp_path: Path) -> None:
    dest = tmp_path / "weights"
    result_line(run(endpoint, dest))
    manifest = (dest / download.MANIFEST_NAME).read_text()
    (dest / download.MANIFEST_NAME).unlink()
    stats(endpoint, reset=True)
    assert result_line(run(endpoint, dest))["downloaded"] is True
    assert (dest / download.MANIFEST_NAME).read_text() == manifest
    assert stats(endpoint)["bytes_served"] == 0


def test_a_disk_without_room_for_the_revision_exits_5_before_fetching(endpoint: str, tmp_path: Path,
                                                                     small_disk: Any) -> None:
    dest = small_disk(1024) / "tiny"  # 1 MiB free; the revision is 3 MiB
    done = run(endpoint, dest)
    assert done.returncode == 5, done.stderr
    assert "no room for 8 file(s) of acme/tiny at revision %s under %s: 3.0 MiB still to write" % (SHA, dest) \
        in done.stderr, done.stderr
    assert not dest.exists()  # nothing written, not even the folder


def test_unknown_revision_exits_3_naming_it(endpoint: str, tmp_path: Path) -> None:
    revision = "0badc0de" * 5
    process = run(endpoint, tmp_path / "weights", revision=revision)
    assert process.returncode == 3 and process.stdout == ""
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1 and revision in lines[0] and REPO in lines[0]


def test_unknown_repo_exits_3(endpoint: str, tmp_path: Path) -> None:
    process = run(endpoint, tmp_path / "weights", repo="acme/nothing")
    assert process.returncode == 3 and "acme/nothing" in process.stderr


@pytest.mark.parametrize("repo, revision", [(REPO, "main"), (REPO, SHA.upper()), (REPO, SHA[:12]),
                                            ("tiny", SHA), ("acme/tiny/x", SHA)])
def test_bad_arguments_exit_2(repo: str, revision: str, tmp_path: Path) -> None:
    process = run("http://127.0.0.1:9", tmp_path / "weights", revision=revision, repo=repo)
    assert process.returncode == 2 and process.stdout == ""


def test_gated_repo_without_token_exits_4(endpoint: str, tmp_path: Path) -> None:
    process = run(endpoint, tmp_path / "weights", repo=GATED)
    assert process.returncode == 4 and process.stdout == ""
    assert "weights_hf_token" in process.stderr and "HF_TOKEN" in process.stderr
    assert TOKEN not in process.stderr


def test_gated_repo_with_a_wrong_token_exits_4_without_printing_it(endpoint: str, tmp_path: Path) -> None:
    wrong = "hf_notTheRightOne0000"
    process = run(endpoint, tmp_path / "weights", repo=GATED, token=wrong)
    assert process.returncode == 4
    assert wrong not in process.stdout + process.stderr and "weights_hf_token" in process.stderr


def test_gated_repo_with_the_token(endpoint: str, model: Path, tmp_path: Path) -> None:
    dest = tmp_path / "weights"
    process = run(endpoint, dest, repo=GATED, token=TOKEN)
    assert result_line(process)["downloaded"] is True
    assert TOKEN not in process.stdout + process.stderr
    assert (dest / SHARD).read_bytes() == (model / SHARD).read_bytes()
    again = run(endpoint, dest, repo=GATED, token=TOKEN)
    assert result_line(again)["downloaded"] is False and TOKEN not in again.stdout + again.stderr


def test_unreachable_hub_exits_5(tmp_path: Path) -> None:
    process = run("http://127.0.0.1:9", tmp_path / "weights")
    assert process.returncode == 5 and process.stdout == ""
    assert len(process.stderr.strip().splitlines()) == 1


class Sibling:
    """What model info's siblings hold."""

    def __init__(self, rfilename: str, size: int, blob_id: str | None = None, lfs: Any = None) -> None:
        self.rfilename, self.size, self.blob_id, self.lfs = rfilename, size, blob_id, lfs


class Lfs:
    def __init__(self, size: int, sha256: str) -> None:
        self.size, self.sha256 = size, sha256


def test_manifest_leaves_out_its_own_and_the_clients_files(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    siblings = [Sibling("a.json", 2), Sibling(".sparkserve-x", 1), Sibling(".cache/huggingface/y", 1),
                Sibling("sub/.sparkserve-partial/z", 1), Sibling("w.safetensors", 9, lfs=Lfs(9, "ab" * 32))]
    files = download.repo_files(siblings)
    assert [f.path for f in files] == ["a.json", "w.safetensors"]
    manifest = download.build_manifest(REPO, SHA, tmp_path, files)
    assert manifest["files"] == {
        "a.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest(), "source": "computed"},
        "w.safetensors": {"size": 9, "sha256": "ab" * 32, "source": "hub-lfs"}}
    assert download.in_manifest("sub/.cache/z") and not download.in_manifest(".sparkserve-manifest.json")
    assert weights.validate_manifest(json.loads(download.manifest_text(manifest))) == manifest


def test_the_manifest_of_a_download_is_one_the_project_reads(endpoint: str, tmp_path: Path) -> None:
    dest = tmp_path / "weights"
    result_line(run(endpoint, dest))
    manifest = weights.load_manifest(str(dest / download.MANIFEST_NAME))
    report = weights.verify(str(dest), manifest, use_cache=False, write_cache=False)
    assert report["ok"] == list(manifest["files"])
    assert not report["missing"] and not report["corrupt"] and not report["unexpected"]
