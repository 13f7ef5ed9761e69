"""Tests for the Hub double (lab/hub/hub_double.py), driven by the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

from tests.scripts import ROOT, load_script

hub: ModuleType = load_script("lab/hub/hub_double.py", "sparkserve_hub_double")

REPO = "acme/tiny"
GATED = "acme/gated"
SHA = "5eed" * 10
TOKEN = "hf_labSECRETtoken0123456789"
SHARD = "model-00002-of-00003.safetensors"


def make_hub_root(root: Path) -> Path:
    """ROOT/acme/tiny/<SHA>/ (3 shards of 1 MiB) with refs/main, and acme/gated, a gated copy; the model folder."""
    model = root / REPO / SHA
    subprocess.run([sys.executable, str(ROOT / "lab/engine/make_tiny_model.py"), str(model),
                    "--shards", "3", "--shard-mib", "1"], check=True, capture_output=True)
    (root / REPO / "refs").mkdir()
    (root / REPO / "refs" / "main").write_text(SHA + "\n")
    shutil.copytree(root / REPO, root / GATED)
    (root / GATED / ".gated").touch()
    return model


def model_files(model: Path) -> dict[str, bytes]:
    return {p.relative_to(model).as_posix(): p.read_bytes() for p in sorted(model.rglob("*")) if p.is_file()}


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Running:
    """A double serving on 127.0.0.1 in a thread."""

    def __init__(self, root: Path, rate_mib_s: float = 0.0, token: str | None = TOKEN) -> None:
        self.server = hub.make_server(root, "127.0.0.1", 0, rate_mib_s, token)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = "http://127.0.0.1:%d" % self.server.port

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.endpoint + "/sparkserve-lab/stats") as response:
            return json.load(response)

    def served(self, expected: int, timeout: float = 30) -> dict[str, Any]:
        """The stats once bytes_served reaches expected (or the deadline passes).

        A handler counts each block just after writing it, so the client can hold the whole body a moment
        before the last block is counted.
        """
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if stats["bytes_served"] >= expected or time.monotonic() > deadline:
                return stats
            time.sleep(0.01)

    def reset(self) -> None:
        request = urllib.request.Request(self.endpoint + "/sparkserve-lab/stats/reset", method="POST", data=b"")
        with urllib.request.urlopen(request) as response:
            assert json.load(response)["bytes_served"] == 0


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hub_root(tmp_path_factory.mktemp("hub"))


@pytest.fixture(scope="module")
def double(model: Path) -> Iterator[Running]:
    running = Running(model.parents[2])
    yield running
    running.stop()


@pytest.fixture
def api(double: Running) -> HfApi:
    return HfApi(endpoint=double.endpoint, token=False)


def fetch(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, Any, bytes]:
    """(status, headers, body) of a request, errors included."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def test_model_info_gives_sizes_blob_ids_and_lfs_sha256(api: HfApi, model: Path) -> None:
    info = api.model_info(REPO, revision=SHA, files_metadata=True)
    assert info.sha == SHA and info.id == REPO
    files = model_files(model)
    assert [s.rfilename for s in info.siblings] == sorted(files)
    for sibling in info.siblings:
        data = files[sibling.rfilename]
        assert sibling.size == len(data)
        if sibling.rfilename.endswith(".safetensors"):
            assert sibling.lfs is not None
            assert sibling.lfs.sha256 == hashlib.sha256(data).hexdigest() and sibling.lfs.size == len(data)
            pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (
                sibling.lfs.sha256.encode(), len(data))
            assert sibling.lfs.pointer_size == len(pointer) and sibling.blob_id == git_sha1(pointer)
        else:
            assert sibling.lfs is None and sibling.blob_id == git_sha1(data)


def test_main_resolves_through_refs(api: HfApi) -> None:
    assert api.model_info(REPO, revision="main").sha == SHA
    assert api.model_info(REPO).sha == SHA


def test_snapshot_download_is_byte_identical_and_counted(double: Running, model: Path, tmp_path: Path) -> None:
    double.reset()
    out = tmp_path / "out"
    snapshot_download(REPO, revision=SHA, local_dir=out, endpoint=double.endpoint, cache_dir=tmp_path / "cache",
                      token=False)
    files = model_files(model)
    assert {k: v for k, v in model_files(out).items() if not k.startswith(".cache/")} == files
    total = sum(len(data) for data in files.values())
    stats = double.served(total)
    assert stats["bytes_served"] == total
    assert stats["by_repo"] == {REPO: total}
    snapshot_download(REPO, revision=SHA, local_dir=out, endpoint=double.endpoint, cache_dir=tmp_path / "cache",
                      token=False)
    assert double.stats()["bytes_served"] == total


def test_unknown_revision_and_repo_raise_the_clients_errors(api: HfApi, double: Running, tmp_path: Path) -> None:
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="f" * 40, files_metadata=True)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="f" * 40, local_dir=tmp_path, endpoint=double.endpoint,
                        token=False)
    with pytest.raises(RepositoryNotFoundError) as raised:
        api.model_info("acme/nothing", revision=SHA)
    assert not isinstance(raised.value, GatedRepoError)


def test_head_headers_are_the_hubs(double: Running, model: Path) -> None:
    data = (model / SHARD).read_bytes()
    status, headers, body = fetch("%s/%s/resolve/%s/%s" % (double.endpoint, REPO, SHA, SHARD), method="HEAD")
    assert status == 200 and body == b""
    assert headers["X-Repo-Commit"] == SHA
    assert headers["ETag"] == headers["X-Linked-Etag"] == '"%s"' % hashlib.sha256(data).hexdigest()
    assert headers["X-Linked-Size"] == headers["Content-Length"] == str(len(data))
    assert not any(name.lower().startswith("x-xet") for name in headers)
    config = (model / "config.json").read_bytes()
    status, headers, _ = fetch("%s/%s/resolve/main/config.json" % (double.endpoint, REPO), method="HEAD")
    assert headers["ETag"] == '"%s"' % git_sha1(config) and "X-Linked-Etag" not in headers
    status, headers, _ = fetch("%s/%s/resolve/%s/nothing.json" % (double.endpoint, REPO, SHA), method="HEAD")
    assert status == 404 and headers["X-Error-Code"] == "EntryNotFound" and headers["X-Repo-Commit"] == SHA


@pytest.mark.parametrize("path", ["..%2Frefs%2Fmain", "%2e%2e/refs/main", "x/..%2F..%2Frefs/main"])
def test_paths_cannot_leave_the_revision(double: Running, path: str) -> None:
    """ROOT/acme/tiny/refs/main exists: the double must not serve it as a file of the revision."""
    status, headers, _ = fetch("%s/%s/resolve/%s/%s" % (double.endpoint, REPO, SHA, path))
    assert status == 404


def test_range_requests_resume_a_file(double: Running, model: Path) -> None:
    data = (model / SHARD).read_bytes()
    url = "%s/%s/resolve/%s/%s" % (double.endpoint, REPO, SHA, SHARD)
    double.reset()
    status, headers, body = fetch(url, {"Range": "bytes=1000-"})
    assert status == 206 and body == data[1000:]
    assert headers["Content-Range"] == "bytes 1000-%d/%d" % (len(data) - 1, len(data))
    assert double.served(len(data) - 1000)["bytes_served"] == len(data) - 1000
    status, _, body = fetch(url, {"Range": "bytes=10-19"})
    assert status == 206 and body == data[10:20]
    status, headers, _ = fetch(url, {"Range": "bytes=%d-" % len(data)})
    assert status == 416 and headers["Content-Range"] == "bytes */%d" % len(data)


def test_client_resumes_after_a_dropped_connection(double: Running, model: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The first GET of the shard stops half way; the client asks for the rest with a Range.

    The client writes what it received in chunks of DOWNLOAD_CHUNK_SIZE (10 MiB) and resumes from the last
    whole chunk; smaller chunks let a 1 MiB shard show it. (huggingface_hub 2.x never reuses a partial file of
    an earlier run: each download writes a fresh temporary file.)
    """
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    ranges: list[str | None] = []
    send_body = hub.Handler.send_body

    def flaky(handler: Any, repo_id: str, path: Path, offset: int, count: int) -> None:
        ranges.append(handler.headers.get("Range"))
        if len(ranges) == 1:
            send_body(handler, repo_id, path, offset, count // 2)
            handler.close_connection = True
        else:
            send_body(handler, repo_id, path, offset, count)

    monkeypatch.setattr(hub.Handler, "send_body", flaky)
    data = (model / SHARD).read_bytes()
    double.reset()
    path = hf_hub_download(REPO, SHARD, revision=SHA, local_dir=tmp_path, endpoint=double.endpoint, token=False)
    assert Path(path).read_bytes() == data
    half = len(data) // 2
    resumed = half - half % (64 * 1024)  # the last whole chunk the client wrote
    assert ranges == [None, "bytes=%d-" % resumed]
    assert double.served(half + len(data) - resumed)["bytes_served"] == half + len(data) - resumed


def test_rate_limit_slows_a_response(model: Path) -> None:
    slow = Running(model.parents[2], rate_mib_s=4.0)
    try:
        started = time.monotonic()
        status, _, body = fetch("%s/%s/resolve/%s/%s" % (slow.endpoint, REPO, SHA, SHARD))
        elapsed = time.monotonic() - started
    finally:
        slow.stop()
    assert status == 200 and len(body) > hub.MIB
    assert elapsed >= 0.2


def test_gated_repo_needs_the_token(double: Running, tmp_path: Path) -> None:
    with pytest.raises(GatedRepoError):
        HfApi(endpoint=double.endpoint, token=False).model_info(GATED, revision=SHA)
    with pytest.raises(GatedRepoError):
        HfApi(endpoint=double.endpoint, token="hf_wrong").model_info(GATED, revision=SHA)
    status, headers, _ = fetch("%s/%s/resolve/%s/config.json" % (double.endpoint, GATED, SHA), method="HEAD")
    assert status == 401 and headers["X-Error-Code"] == "GatedRepo"
    assert HfApi(endpoint=double.endpoint, token=TOKEN).model_info(GATED, revision=SHA).sha == SHA
    path = hf_hub_download(GATED, "config.json", revision=SHA, local_dir=tmp_path, endpoint=double.endpoint,
                           token=TOKEN)
    assert Path(path).is_file()


def test_log_lines_never_show_the_token(double: Running, capfd: pytest.CaptureFixture[str]) -> None:
    fetch("%s/%s/resolve/%s/config.json" % (double.endpoint, GATED, SHA), {"Authorization": "Bearer " + TOKEN})
    line = "GET /%s/resolve/%s/config.json 200" % (GATED, SHA)
    err = ""
    deadline = time.monotonic() + 30
    while line not in err:  # the handler thread logs after the body: wait for its line
        assert time.monotonic() < deadline, err
        time.sleep(0.01)
        err += capfd.readouterr().err
    assert TOKEN not in err


def test_hashes_are_computed_once(model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[Path] = []
    compute = hub.HashCache._compute
    monkeypatch.setattr(hub.HashCache, "_compute", staticmethod(lambda p, s: calls.append(p) or compute(p, s)))
    cache = hub.HashCache()
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    first = cache.digests(path)
    assert cache.digests(path) == first and len(calls) == 1
    path.write_bytes(b"abcd")
    assert cache.digests(path) != first and len(calls) == 2


def test_stats_reset_and_unknown_routes(double: Running) -> None:
    double.reset()
    assert double.stats() == {"bytes_served": 0, "by_repo": {}, "requests": 0}
    status, _, _ = fetch(double.endpoint + "/api/spaces/x/y")
    assert status == 404 and double.stats()["requests"] == 1


def test_cli_runs_on_the_standard_library_alone(model: Path) -> None:
    """``python3 -I -S``: no site-packages; --port 0 picks a port the start line names."""
    process = subprocess.Popen([sys.executable, "-I", "-S", str(ROOT / "lab/hub/hub_double.py"), "--root",
                                str(model.parents[2]), "--host", "127.0.0.1", "--port", "0"],
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        status, _, body = fetch("http://127.0.0.1:%d/api/models/%s/revision/main" % (port, REPO))
        assert status == 200 and json.loads(body)["sha"] == SHA
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0


def test_an_org_named_like_the_stats_route_is_served(tmp_path: Path) -> None:
    """The lab's own model lives under the org sparkserve-lab; only the exact stats paths are the double's."""
    model = make_hub_root(tmp_path / "hub")
    shutil.copytree(tmp_path / "hub" / REPO, tmp_path / "hub" / "sparkserve-lab" / "tiny-model")
    running = Running(tmp_path / "hub")
    try:
        path = hf_hub_download("sparkserve-lab/tiny-model", "config.json", revision=SHA, endpoint=running.endpoint,
                               cache_dir=str(tmp_path / "cache"))
        assert Path(path).read_bytes() == (model / "config.json").read_bytes()
        size = len((model / "config.json").read_bytes())
        assert running.served(size)["by_repo"] == {"sparkserve-lab/tiny-model": size}
    finally:
        running.stop()
