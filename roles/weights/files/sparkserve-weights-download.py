#!/usr/bin/python3
"""Download one model repo at a pinned revision to a node, and write its manifest.

Runs inside the engine container image (python3 and huggingface_hub). It asks
the Hub for the revision's files with their metadata, downloads them with
``snapshot_download(local_dir=DEST)`` unless every file is already there with
the right size and the manifest already matches, checks each file against the
Hub's metadata (the size; for git files also the git blob id), then writes
``DEST/.sparkserve-manifest.json`` atomically::

    {"format": 1, "repo": "org/name", "revision": "<40 hex>",
     "files": {"config.json": {"size": 123, "sha256": "<64 hex>", "source": "computed"},
               "model-00001-of-00004.safetensors": {"size": 8388608, "sha256": "<64 hex>",
                                                    "source": "hub-lfs"}}}

LFS files take sha256 and size from the Hub ("hub-lfs"); other files are hashed
here ("computed"). Paths under ``.cache/`` (the client's) and paths with a part
named ``.sparkserve-*`` (ours) are never in the manifest. A file of the wrong
size or content is removed first, so the client fetches it again; files the
client already fetched at this revision are not fetched again.

The token comes only from the environment variable ``HF_TOKEN`` and is never
printed. The last line on stdout is JSON:
``{"repo": ..., "revision": ..., "files": N, "bytes": N, "downloaded": BOOL}``
(``downloaded`` is false when nothing needed to change). Messages go to stderr.

Exit status: 0 ok, 2 bad arguments, 3 repo or revision not found, 4 access
refused (gated or private repo; no or bad token), 5 any other failure.

Usage::

    sparkserve-weights-download.py --repo ORG/NAME --revision 40HEX --dest DIR [--endpoint URL]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.utils import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    disable_progress_bars,
)

# The node library, mounted read-only at /sparkserve/lib with PYTHONPATH pointing there (roles/weights).
from sparkserve_node.files import room_problem, write_atomic

MANIFEST_NAME = ".sparkserve-manifest.json"
# The revision's size, written when the download starts (module_utils/weights.py DOWNLOAD_NAME reads it).
EXPECTED_NAME = ".sparkserve-download.json"
MANIFEST_FORMAT = 1
OUR_PREFIX = ".sparkserve-"
HUB_CACHE_DIR = ".cache"
SOURCE_LFS = "hub-lfs"
SOURCE_COMPUTED = "computed"
REVISION_RE = re.compile(r"[0-9a-f]{40}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
HASH_BLOCK = 1024 * 1024
TOKEN_HINT = ("set the token with the Ansible Vault variable weights_hf_token, "
              "or the environment variable HF_TOKEN on the controller")

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_AUTH = 4
EXIT_FAILED = 5


class DownloadError(Exception):
    """A failure with its exit status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Options:
    repo: str
    revision: str
    dest: Path
    endpoint: str | None
    token: str | None


@dataclass(frozen=True)
class RepoFile:
    """A file of the revision as the Hub describes it."""

    path: str  # POSIX, relative to the repo root
    size: int
    blob_id: str | None  # git object id (for git files: of the content)
    lfs_sha256: str | None  # set for LFS files

    @property
    def is_lfs(self) -> bool:
        return self.lfs_sha256 is not None


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> Options:
    """Options from the command line; the token from HF_TOKEN. Exits 2 on bad arguments."""
    parser = argparse.ArgumentParser(description="Download a model repo at a pinned revision and write its manifest.")
    parser.add_argument("--repo", required=True, help="ORG/NAME")
    parser.add_argument("--revision", required=True, help="commit sha, 40 lowercase hex characters")
    parser.add_argument("--dest", required=True, type=Path, help="folder to download into (created if missing)")
    parser.add_argument("--endpoint", help="Hub URL (default: HF_ENDPOINT or https://huggingface.co)")
    args = parser.parse_args(argv)
    if not REPO_RE.fullmatch(args.repo):
        parser.error("--repo must be ORG/NAME, got %r" % args.repo)
    if not REVISION_RE.fullmatch(args.revision):
        parser.error("--revision must be a commit sha (40 lowercase hex characters), got %r; "
                     "branch and tag names are refused" % args.revision)
    if args.dest.exists() and not args.dest.is_dir():
        parser.error("--dest %s exists and is not a folder" % args.dest)
    token = (os.environ if environ is None else environ).get("HF_TOKEN") or None
    return Options(args.repo, args.revision, args.dest, args.endpoint or None, token)


def in_manifest(rel_path: str) -> bool:
    """Whether a relative path may be part of the manifest: not the client's ``.cache/`` and no part of it
    named ``.sparkserve-*`` (ours), as the project's manifest reader requires."""
    if rel_path == HUB_CACHE_DIR or rel_path.startswith(HUB_CACHE_DIR + "/"):
        return False
    return not any(part.startswith(OUR_PREFIX) for part in rel_path.split("/"))


def repo_files(siblings: Iterable[Any]) -> list[RepoFile]:
    """The manifest's files from model info's siblings (with files metadata), sorted by path."""
    files = []
    for sibling in siblings:
        if not in_manifest(sibling.rfilename):
            continue
        if sibling.size is None:
            raise DownloadError(EXIT_FAILED, "the hub gave no size for %s" % sibling.rfilename)
        lfs = sibling.lfs
        if lfs is not None and not SHA256_RE.fullmatch(str(lfs.sha256)):
            raise DownloadError(EXIT_FAILED, "the hub gave no valid LFS sha256 for %s" % sibling.rfilename)
        files.append(RepoFile(sibling.rfilename, lfs.size if lfs is not None else sibling.size, sibling.blob_id,
                              lfs.sha256 if lfs is not None else None))
    return sorted(files, key=lambda f: f.path)


def digests(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file, read once."""
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(HASH_BLOCK), b""):
            sha256.update(block)
            sha1.update(block)
    return sha256.hexdigest(), sha1.hexdigest()


def local_path(dest: Path, rel_path: str) -> Path:
    return dest.joinpath(*rel_path.split("/"))


def file_problem(dest: Path, item: RepoFile) -> str | None:
    """Why the local copy of a file is not the Hub's (missing, size, content); None when it is.

    LFS files are checked by size only; git files also by their git blob id.
    """
    path = local_path(dest, item.path)
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != item.size:
        return "size %d, the hub says %d" % (size, item.size)
    if not item.is_lfs and item.blob_id is not None and digests(path)[1] != item.blob_id:
        return "content differs from git blob %s" % item.blob_id
    return None


def problems(dest: Path, files: Iterable[RepoFile]) -> dict[str, str]:
    """Files whose local copy is not the Hub's, with why."""
    found = {item.path: file_problem(dest, item) for item in files}
    return {path: why for path, why in found.items() if why is not None}


def manifest_entry(dest: Path, item: RepoFile) -> dict[str, Any]:
    if item.is_lfs:
        return {"size": item.size, "sha256": item.lfs_sha256, "source": SOURCE_LFS}
    path = local_path(dest, item.path)
    return {"size": path.stat().st_size, "sha256": digests(path)[0], "source": SOURCE_COMPUTED}


def build_manifest(repo: str, revision: str, dest: Path, files: Iterable[RepoFile]) -> dict[str, Any]:
    """The manifest of the files as they are in dest."""
    entries = {item.path: manifest_entry(dest, item) for item in sorted(files, key=lambda f: f.path)}
    return {"format": MANIFEST_FORMAT, "repo": repo, "revision": revision, "files": entries}


def manifest_text(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


def read_manifest(dest: Path) -> str | None:
    try:
        return (dest / MANIFEST_NAME).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def write_manifest(dest: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically (the node library's write_atomic: a hidden temporary file, then a rename)."""
    write_atomic(str(dest / MANIFEST_NAME), manifest_text(manifest))


def redact(text: str, token: str | None) -> str:
    return text.replace(token, "<redacted>") if token else text


def is_auth_error(error: Exception) -> bool:
    """A gated repo, or a refusal (401, 403) that is not a plain 'not found'."""
    if isinstance(error, GatedRepoError):
        return True
    if isinstance(error, (RepositoryNotFoundError, RevisionNotFoundError)) or not isinstance(error, HfHubHTTPError):
        return False
    return getattr(error.response, "status_code", None) in (401, 403)


def hub_error(error: Exception, options: Options, endpoint: str) -> DownloadError:
    """The exit status and message of an error the Hub client raised."""
    where = "%s at revision %s" % (options.repo, options.revision)
    if is_auth_error(error):
        given = "the token in HF_TOKEN was refused" if options.token else "no token was given"
        return DownloadError(EXIT_AUTH, "access to %s on %s was refused (gated or private repo; %s): %s"
                             % (where, endpoint, given, TOKEN_HINT))
    if isinstance(error, RevisionNotFoundError):
        return DownloadError(EXIT_NOT_FOUND, "revision %s of repo %s not found on %s"
                             % (options.revision, options.repo, endpoint))
    if isinstance(error, RepositoryNotFoundError):
        hint = "" if options.token else " (if it is private or gated: %s)" % TOKEN_HINT
        return DownloadError(EXIT_NOT_FOUND, "repo %s not found on %s%s" % (options.repo, endpoint, hint))
    detail = " ".join(str(error).split())
    return DownloadError(EXIT_FAILED, "download of %s from %s failed: %s: %s"
                         % (where, endpoint, type(error).__name__, detail))


def fetch_files(api: HfApi, options: Options) -> list[RepoFile]:
    """The revision's files, from model info with files metadata."""
    info = api.model_info(options.repo, revision=options.revision, files_metadata=True,
                          token=options.token or False)
    if info.sha != options.revision:
        raise DownloadError(EXIT_FAILED, "the hub answered revision %s for %s" % (info.sha, options.revision))
    files = repo_files(info.siblings or [])
    if not files:
        raise DownloadError(EXIT_FAILED, "the hub lists no files for %s at revision %s"
                            % (options.repo, options.revision))
    return files


def download(options: Options, files: list[RepoFile], stale: dict[str, str]) -> None:
    """Remove wrong local copies, let the client fetch the rest, then check every file against the Hub."""
    for rel_path, why in sorted(stale.items()):
        if why != "missing":
            log("%s: %s; removing it to fetch it again" % (rel_path, why))
            local_path(options.dest, rel_path).unlink()
    snapshot_download(options.repo, revision=options.revision, local_dir=str(options.dest),
                      endpoint=options.endpoint, token=options.token or False)
    left = problems(options.dest, files)
    if left:
        path, why = sorted(left.items())[0]
        raise DownloadError(EXIT_FAILED, "%d file(s) of %s at revision %s do not match the hub after the download, "
                            "first %s: %s" % (len(left), options.repo, options.revision, path, why))


def bytes_to_write(dest: Path, files: list[RepoFile], stale: dict[str, str]) -> int:
    """What the download still needs on disk: the sizes of the files to fetch, less the wrong copies it removes
    first and what the client's unfinished files (``*.incomplete``) already hold."""
    needed = sum(item.size for item in files if item.path in stale)
    removed = sum(local_path(dest, rel_path).stat().st_size for rel_path, why in stale.items() if why != "missing")
    unfinished = sum(part.stat().st_size for part in (dest / ".cache" / "huggingface").rglob("*.incomplete"))
    return max(0, needed - removed - unfinished)


def write_expected(dest: Path, files: list[RepoFile]) -> None:
    """Say the revision's size, so the weights_progress module can show how far the download is."""
    part = dest / (EXPECTED_NAME + ".part")
    part.write_text(json.dumps({"bytes": sum(item.size for item in files)}), encoding="utf-8")
    part.replace(dest / EXPECTED_NAME)


def up_to_date(options: Options, files: list[RepoFile], stale: dict[str, str]) -> bool:
    """Every file in place with the right size (git files: content) and the manifest already right."""
    if stale:
        return False
    manifest = build_manifest(options.repo, options.revision, options.dest, files)
    return read_manifest(options.dest) == manifest_text(manifest)


def sync(options: Options) -> tuple[list[RepoFile], bool]:
    """Bring dest to the revision and write the manifest; (files, whether anything was done)."""
    files = fetch_files(HfApi(endpoint=options.endpoint), options)
    stale = problems(options.dest, files)
    if up_to_date(options, files, stale):
        return files, False
    # Before anything is written there (the folder too): a full disk is named as such, not as a failed write.
    no_room = room_problem(str(options.dest), bytes_to_write(options.dest, files, stale),
                           "%d file(s) of %s at revision %s" % (len(stale), options.repo, options.revision))
    if no_room:
        raise DownloadError(EXIT_FAILED, no_room)
    options.dest.mkdir(parents=True, exist_ok=True)
    write_expected(options.dest, files)
    log("fetching %s at revision %s into %s (%d of %d files missing or wrong)"
        % (options.repo, options.revision, options.dest, len(stale), len(files)))
    download(options, files, stale)
    write_manifest(options.dest, build_manifest(options.repo, options.revision, options.dest, files))
    return files, True


def run(options: Options) -> dict[str, Any]:
    """Sync dest; the fields of the result line. Raises DownloadError."""
    try:
        files, downloaded = sync(options)
    except DownloadError:
        raise
    except Exception as error:  # noqa: BLE001 (every client failure becomes an exit status and one line)
        raise hub_error(error, options, HfApi(endpoint=options.endpoint).endpoint) from None
    return {"repo": options.repo, "revision": options.revision, "files": len(files),
            "bytes": sum(item.size for item in files), "downloaded": downloaded}


def log(message: str) -> None:
    sys.stderr.write("sparkserve-weights-download: %s\n" % message)
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    disable_progress_bars()
    try:
        result = run(options)
    except DownloadError as error:
        log("error: " + redact(error.message, options.token))
        return error.status
    print(json.dumps(result), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
