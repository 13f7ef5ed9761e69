#!/usr/bin/python3
"""A Hugging Face Hub double for the sparkserve lab: serves model repos from a folder.

It answers what ``huggingface_hub`` (2.x) asks when it reads repo metadata and
downloads files over plain HTTP, so the real client and the project's weights
download program run against it unchanged (``endpoint=`` / ``HF_ENDPOINT``).
It never offers Xet storage. Standard library only.

Layout of ``--root``::

    ROOT/<org>/<name>/<40-hex revision>/...files   one folder per commit
    ROOT/<org>/<name>/refs/<branch>                optional: text file holding a revision
    ROOT/<org>/<name>/.gated                       optional: every request needs the token

Routes (repo = ``<org>/<name>``)::

    GET  /api/models/{repo}[/revision/{rev}]   model info (``?blobs=true``: sizes, blob ids, LFS)
    GET  /api/models/{repo}/tree/{rev}[/{dir}] tree listing (``?recursive=true``)
    HEAD /{repo}/resolve/{rev}/{path}          file metadata headers
    GET  /{repo}/resolve/{rev}/{path}          file content (``Range`` gives 206)
    GET  /sparkserve-lab/stats                 bytes served, by repo, and hub requests
    POST /sparkserve-lab/stats/reset           zero the counters

``*.safetensors``, ``*.bin`` and files over 10 MiB are LFS files (ETag: the
sha256; blob id: the git sha1 of the LFS pointer); other files are git files
(ETag and blob id: the git blob sha1). Errors carry ``X-Error-Code`` and
``X-Error-Message`` as the Hub's do (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``).

Usage::

    hub_double.py --root DIR [--host 0.0.0.0] [--port 8080] [--rate-mib-s 0] [--token-file FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, Sequence
from urllib.parse import parse_qs, unquote, urlsplit

MIB = 1024 * 1024
LFS_MIN_BYTES = 10 * MIB
LFS_SUFFIXES = (".safetensors", ".bin")
CHUNK_BYTES = 64 * 1024
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)")
STATS_PATH = "/sparkserve-lab/stats"
STATS_RESET_PATH = "/sparkserve-lab/stats/reset"
GATED_MARKER = ".gated"


class HubError(Exception):
    """An error answered the way the Hub answers it: status, X-Error-Code, X-Error-Message."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.commit = commit
        self.headers = headers or {}


def repo_not_found(repo_id: str) -> HubError:
    return HubError(404, "RepoNotFound", "Repository not found: %s" % repo_id)


def revision_not_found(repo_id: str, revision: str) -> HubError:
    return HubError(404, "RevisionNotFound", "Invalid rev id: %s (repo %s)" % (revision, repo_id))


def entry_not_found(repo_id: str, path: str, commit: str) -> HubError:
    return HubError(404, "EntryNotFound", "Entry not found: %s in %s@%s" % (path, repo_id, commit), commit)


def not_found() -> HubError:
    return HubError(404, None, "Not found")


def git_blob_sha1_start(size: int) -> Any:
    """A sha1 object fed with git's blob header, ready for the content."""
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % size)
    return digest


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores in place of an LFS file."""
    return b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha256.encode(), size)


def git_blob_sha1(data: bytes) -> str:
    digest = git_blob_sha1_start(len(data))
    digest.update(data)
    return digest.hexdigest()


def is_lfs(rel_path: str, size: int) -> bool:
    """LFS files: weights by name, anything else by size."""
    return rel_path.endswith(LFS_SUFFIXES) or size > LFS_MIN_BYTES


@dataclass(frozen=True)
class FileInfo:
    """One file of one revision, as the Hub describes it."""

    rel_path: str
    path: Path
    size: int
    sha256: str
    git_sha1: str  # git blob sha1 of the content
    lfs: bool

    @property
    def pointer(self) -> bytes:
        return lfs_pointer(self.sha256, self.size)

    @property
    def blob_id(self) -> str:
        """The git object id of what git stores: the pointer for LFS files, else the content."""
        return git_blob_sha1(self.pointer) if self.lfs else self.git_sha1

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1

    def lfs_json(self, sha_key: str) -> dict[str, Any]:
        return {sha_key: self.sha256, "size": self.size, "pointerSize": len(self.pointer)}

    def sibling_json(self) -> dict[str, Any]:
        """An entry of model info's ``siblings`` with files metadata."""
        entry: dict[str, Any] = {"rfilename": self.rel_path, "size": self.size, "blobId": self.blob_id}
        if self.lfs:
            entry["lfs"] = self.lfs_json("sha256")
        return entry

    def tree_json(self) -> dict[str, Any]:
        """An entry of the tree listing."""
        entry: dict[str, Any] = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.rel_path}
        if self.lfs:
            entry["lfs"] = self.lfs_json("oid")
        return entry


class HashCache:
    """sha256 and git blob sha1 of files, computed once per (path, size, mtime)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._digests: dict[tuple[str, int, int], tuple[str, str]] = {}

    def digests(self, path: Path) -> tuple[str, str]:
        """(sha256, git blob sha1) of the file."""
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._digests.get(key)
        if cached is None:
            cached = self._compute(path, stat.st_size)
            with self._lock:
                self._digests[key] = cached
        return cached

    @staticmethod
    def _compute(path: Path, size: int) -> tuple[str, str]:
        sha256 = hashlib.sha256()
        sha1 = git_blob_sha1_start(size)
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(MIB), b""):
                sha256.update(block)
                sha1.update(block)
        return sha256.hexdigest(), sha1.hexdigest()


class Stats:
    """Bytes of file content served (GET bodies), in total and by repo, and hub requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._bytes = 0
            self._by_repo: dict[str, int] = {}
            self._requests = 0

    def add_request(self) -> None:
        with self._lock:
            self._requests += 1

    def add_bytes(self, repo_id: str, count: int) -> None:
        with self._lock:
            self._bytes += count
            self._by_repo[repo_id] = self._by_repo.get(repo_id, 0) + count

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"bytes_served": self._bytes, "by_repo": dict(sorted(self._by_repo.items())),
                    "requests": self._requests}


def safe_rel_path(segments: Sequence[str]) -> str:
    """Join decoded URL path segments into a repo-relative path; refuse empty, '.' and '..' parts."""
    parts = "/".join(segments).split("/")
    if any(part in ("", ".", "..") or "\\" in part or "\0" in part for part in parts):
        raise not_found()
    return "/".join(parts)


class Store:
    """The repos under the root folder, with what the Hub computes about them."""

    def __init__(self, root: Path, token: str | None) -> None:
        self.root = root
        self.token = token
        self.hashes = HashCache()

    def repo_dir(self, repo_id: str) -> Path:
        org, _, name = repo_id.partition("/")
        if not (NAME_RE.fullmatch(org) and NAME_RE.fullmatch(name)) or ".." in repo_id:
            raise repo_not_found(repo_id)
        path = self.root / org / name
        if not path.is_dir():
            raise repo_not_found(repo_id)
        return path

    def check_access(self, repo_id: str, repo_dir: Path, authorization: str | None) -> None:
        """A gated repo needs ``Authorization: Bearer <token>``: 401 without one, 403 with a wrong one."""
        if not (repo_dir / GATED_MARKER).exists():
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise HubError(401, "GatedRepo", "Access to model %s is restricted. You must have access to it and be "
                           "authenticated to access it. Please log in." % repo_id)
        if self.token is None or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise HubError(403, "GatedRepo", "Access to model %s is restricted and you are not in the authorized "
                           "list." % repo_id)

    def resolve(self, repo_id: str, repo_dir: Path, revision: str) -> str:
        """The commit a revision names: a commit folder, or a ref file holding one."""
        if COMMIT_RE.fullmatch(revision):
            if (repo_dir / revision).is_dir():
                return revision
            raise revision_not_found(repo_id, revision)
        parts = revision.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise revision_not_found(repo_id, revision)
        ref = repo_dir.joinpath("refs", *parts)
        try:
            commit = ref.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise revision_not_found(repo_id, revision) from None
        if not COMMIT_RE.fullmatch(commit) or not (repo_dir / commit).is_dir():
            raise revision_not_found(repo_id, revision)
        return commit

    def file_paths(self, commit_dir: Path) -> list[str]:
        """Every file of a revision, as sorted POSIX paths relative to its folder."""
        found = []
        for folder, dirs, files in os.walk(commit_dir):
            dirs.sort()
            base = Path(folder).relative_to(commit_dir)
            found.extend((base / name).as_posix() for name in files if (Path(folder) / name).is_file())
        return sorted(found)

    def file_info(self, commit_dir: Path, rel_path: str) -> FileInfo | None:
        path = commit_dir / rel_path
        if not path.is_file():
            return None
        sha256, git_sha1 = self.hashes.digests(path)
        size = path.stat().st_size
        return FileInfo(rel_path, path, size, sha256, git_sha1, is_lfs(rel_path, size))

    def files(self, commit_dir: Path) -> list[FileInfo]:
        infos = (self.file_info(commit_dir, rel) for rel in self.file_paths(commit_dir))
        return [info for info in infos if info is not None]


def model_info_json(store: Store, repo_id: str, repo_dir: Path, commit: str, blobs: bool) -> dict[str, Any]:
    """The body of ``/api/models/{repo}/revision/{rev}``."""
    commit_dir = repo_dir / commit
    if blobs:
        siblings = [info.sibling_json() for info in store.files(commit_dir)]
    else:
        siblings = [{"rfilename": rel} for rel in store.file_paths(commit_dir)]
    gated = (repo_dir / GATED_MARKER).exists()
    return {"_id": commit, "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0], "sha": commit,
            "private": False, "gated": "manual" if gated else False, "disabled": False, "tags": [],
            "siblings": siblings}


def tree_json(store: Store, commit_dir: Path, under: str, recursive: bool) -> list[dict[str, Any]]:
    """The body of ``/api/models/{repo}/tree/{rev}[/{dir}]``: folders first, then files, as the Hub lists."""
    prefix = under + "/" if under else ""
    if under and not (commit_dir / under).is_dir():
        raise not_found()
    folders: set[str] = set()
    files: list[FileInfo] = []
    for rel in store.file_paths(commit_dir):
        if not rel.startswith(prefix):
            continue
        parts = rel[len(prefix):].split("/")
        if len(parts) > 1:
            depth = len(parts) - 1 if recursive else 1
            folders.update(prefix + "/".join(parts[:n]) for n in range(1, depth + 1))
            if not recursive:
                continue
        info = store.file_info(commit_dir, rel)
        if info is not None:
            files.append(info)
    folder_entries = [{"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0, "path": path}
                      for path in sorted(folders)]
    return folder_entries + [info.tree_json() for info in files]


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single ``Range: bytes=`` header; None for no or an unusable header.

    Raises HubError 416 when the range starts past the end.
    """
    match = RANGE_RE.fullmatch((header or "").strip())
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first_text, last_text = match.groups()
    if first_text == "":
        first, last = max(size - int(last_text), 0), size - 1
    else:
        first = int(first_text)
        last = min(int(last_text), size - 1) if last_text else size - 1
    if first >= size or first > last:
        raise HubError(416, None, "Requested range not satisfiable",
                       headers={"Content-Range": "bytes */%d" % size})
    return first, last


def is_true(values: list[str] | None) -> bool:
    return bool(values) and values[-1].lower() in ("1", "true", "yes")


class HubServer(ThreadingHTTPServer):
    """The HTTP server; handlers reach the store, the stats and the rate limit through it."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], store: Store, rate_bytes_s: float) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.stats = Stats()
        self.rate_bytes_s = rate_bytes_s

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class Handler(BaseHTTPRequestHandler):
    """One request: route it, answer it, log one line."""

    server: HubServer
    protocol_version = "HTTP/1.1"
    server_version = "sparkserve-hub-double/1"

    def do_GET(self) -> None:
        self.handle_request("GET")

    def do_HEAD(self) -> None:
        self.handle_request("HEAD")

    def do_POST(self) -> None:
        self.handle_request("POST")

    def handle_request(self, method: str) -> None:
        started = time.monotonic()
        self.status = 0
        self.body_bytes = 0
        try:
            self.drain_request_body()
            self.route(method)
        except HubError as error:
            self.send_error_json(error)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.log_line(method, time.monotonic() - started)

    def drain_request_body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > 0:
            self.rfile.read(length)

    def route(self, method: str) -> None:
        split = urlsplit(self.path)
        query = parse_qs(split.query)
        raw = split.path
        if raw in (STATS_PATH, STATS_RESET_PATH):  # exact paths: an org may be called sparkserve-lab
            self.route_lab(method, raw)
            return
        self.server.stats.add_request()
        segments = [unquote(part) for part in raw.split("/")[1:]]
        if segments[:2] == ["api", "models"] and len(segments) >= 4 and method == "GET":
            self.route_api(segments[2] + "/" + segments[3], segments[4:], query)
        elif len(segments) >= 5 and segments[2] == "resolve" and method in ("GET", "HEAD"):
            self.serve_file(method, segments[0] + "/" + segments[1], segments[3], segments[4:])
        else:
            raise not_found()

    def route_lab(self, method: str, path: str) -> None:
        stats = self.server.stats
        if path == STATS_PATH and method == "GET":
            self.send_json(200, stats.snapshot())
        elif path == STATS_RESET_PATH and method == "POST":
            stats.reset()
            self.send_json(200, stats.snapshot())
        else:
            raise not_found()

    def open_repo(self, repo_id: str) -> Path:
        store = self.server.store
        repo_dir = store.repo_dir(repo_id)
        store.check_access(repo_id, repo_dir, self.headers.get("Authorization"))
        return repo_dir

    def route_api(self, repo_id: str, rest: list[str], query: dict[str, list[str]]) -> None:
        store = self.server.store
        repo_dir = self.open_repo(repo_id)
        if not rest:
            commit = store.resolve(repo_id, repo_dir, "main")
            self.send_json(200, model_info_json(store, repo_id, repo_dir, commit, is_true(query.get("blobs"))))
        elif rest[0] == "revision" and len(rest) == 2:
            commit = store.resolve(repo_id, repo_dir, rest[1])
            self.send_json(200, model_info_json(store, repo_id, repo_dir, commit, is_true(query.get("blobs"))))
        elif rest[0] == "tree" and len(rest) >= 2:
            commit = store.resolve(repo_id, repo_dir, rest[1])
            under = safe_rel_path(rest[2:]) if rest[2:] else ""
            body = tree_json(store, repo_dir / commit, under, is_true(query.get("recursive")))
            self.send_json(200, body)
        else:
            raise not_found()

    def serve_file(self, method: str, repo_id: str, revision: str, path_segments: list[str]) -> None:
        store = self.server.store
        repo_dir = self.open_repo(repo_id)
        commit = store.resolve(repo_id, repo_dir, revision)
        rel_path = safe_rel_path(path_segments)
        info = store.file_info(repo_dir / commit, rel_path)
        if info is None:
            raise entry_not_found(repo_id, rel_path, commit)
        span = parse_range(self.headers.get("Range"), info.size) if method == "GET" else None
        first, last = span if span is not None else (0, info.size - 1)
        self.send_response(206 if span is not None else 200)
        self.send_file_headers(info, commit)
        if span is not None:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, info.size))
        self.send_header("Content-Length", str(last - first + 1 if method == "GET" else info.size))
        self.end_headers()
        if method == "GET":
            self.send_body(repo_id, info.path, first, last - first + 1)

    def send_file_headers(self, info: FileInfo, commit: str) -> None:
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", '"%s"' % info.etag)
        if info.lfs:
            self.send_header("X-Linked-Etag", '"%s"' % info.sha256)
            self.send_header("X-Linked-Size", str(info.size))
        self.send_header("Content-Disposition", 'inline; filename="%s"' % info.rel_path.rsplit("/", 1)[-1])

    def send_body(self, repo_id: str, path: Path, offset: int, count: int) -> None:
        """Write count bytes of the file from offset, at most at the rate limit; count what was sent."""
        rate = self.server.rate_bytes_s
        started = time.monotonic()
        sent = 0
        with path.open("rb") as stream:
            stream.seek(offset)
            while sent < count:
                block = stream.read(min(CHUNK_BYTES, count - sent))
                if not block:
                    break
                self.wfile.write(block)
                sent += len(block)
                self.body_bytes += len(block)
                self.server.stats.add_bytes(repo_id, len(block))
                if rate > 0:
                    time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))
        if sent < count:
            self.close_connection = True  # the file shrank: the client sees a short body

    def send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.body_bytes += len(data)

    def send_error_json(self, error: HubError) -> None:
        data = b"" if self.command == "HEAD" else json.dumps({"error": error.message}).encode("utf-8")
        self.send_response(error.status)
        if error.code is not None:
            self.send_header("X-Error-Code", error.code)
        self.send_header("X-Error-Message", error.message)
        if error.commit is not None:
            self.send_header("X-Repo-Commit", error.commit)
        for name, value in error.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.body_bytes += len(data)

    def send_response(self, code: int, message: str | None = None) -> None:
        self.status = code
        super().send_response(code, message)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Silenced: handle_request logs one line per request itself."""

    def log_line(self, method: str, seconds: float) -> None:
        """Time, client, method, path, status, body bytes, seconds; never a request header."""
        sys.stderr.write("%s %s %s %s %d %d %.3fs\n" % (
            time.strftime("%Y-%m-%dT%H:%M:%S"), self.client_address[0], method, self.path.split("?")[0],
            self.status, self.body_bytes, seconds))


def make_server(root: Path | str, host: str = "127.0.0.1", port: int = 0, rate_mib_s: float = 0.0,
                token: str | None = None) -> HubServer:
    """A bound, not yet serving, hub double (port 0: any free port; see ``.port``)."""
    store = Store(Path(root), token)
    return HubServer((host, port), store, rate_mib_s * MIB)


def read_token(path: str | None) -> str | None:
    if path is None:
        return None
    token = Path(path).read_text(encoding="utf-8").strip()
    return token or None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Serve model repos from a folder as the Hugging Face Hub does.")
    parser.add_argument("--root", required=True, help="folder of ORG/NAME/<revision>/ repos")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument("--rate-mib-s", type=float, default=0.0,
                        help="per-response limit of file content, MiB/s (default 0: unlimited)")
    parser.add_argument("--token-file", help="file holding the token gated repos (ROOT/ORG/NAME/.gated) need")
    args = parser.parse_args(argv)
    if args.rate_mib_s < 0:
        parser.error("--rate-mib-s must be 0 or more")
    if not Path(args.root).is_dir():
        parser.error("--root %s is not a folder" % args.root)
    try:
        args.token = read_token(args.token_file)
    except OSError as error:
        parser.error("cannot read --token-file: %s" % error.strerror)
    return args


def stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server = make_server(args.root, args.host, args.port, args.rate_mib_s, args.token)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    sys.stderr.write("hub double: serving %s on http://%s:%d (rate %s, token %s)\n" % (
        args.root, args.host, server.port, "%g MiB/s" % args.rate_mib_s if args.rate_mib_s else "unlimited",
        "set" if args.token else "none"))
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
