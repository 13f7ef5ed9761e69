"""The engine image on a node: its local name, an image archive checked against the recipe, a pull by digest.

The image stage pulls the recipe's image once (``pull``), or loads it from an archive (``read_archive``,
``docker_archive_stream``), and relays it to the other nodes over the fabric; every node then holds it under
one local name (``local_ref``) that every container of the deployment runs, checked by image ID.

Why a local name: ``REPO@sha256:<digest>`` resolves only on a node that pulled it from a registry (Docker
keeps digests only for pulls); a node that received the image over the fabric holds the same image ID
(the digest of the image's config, which names every layer's content) but not that name.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import re
import socket
import tarfile
from dataclasses import dataclass
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional, Tuple
from urllib.parse import urlencode

from .process import run_command

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# REPO[:TAG]@sha256:<64 hex>, as recipes pin images (the tag, when given, is for people).
PINNED = re.compile(r"^(?P<repo>[^\s@]+?)(?::(?P<tag>[\w][\w.-]{0,127}))?@(?P<digest>sha256:[0-9a-f]{64})$")
# The local name's tag: the digest's algorithm and hex, as a tag may carry them.
LOCAL_TAG = re.compile(r"^[^\s@]+:sha256-[0-9a-f]{64}$")
LOCAL_SUFFIX = re.compile(r":sha256-([0-9a-f]{64})$")
# The digest's hex in either name.
DIGEST_HEX = re.compile(r"[@:]sha256[:-]([0-9a-f]{64})$")

# Media types of the manifests an archive or a registry may hold.
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")


class ImageError(Exception):
    """What went wrong, in one sentence for the person running the stage."""


def split_pinned(image: str) -> Tuple[str, str]:
    """The repository and the digest of REPO[:TAG]@sha256:<hex>; ImageError when it is not pinned by digest."""
    match = PINNED.match(image or "")
    if not match:
        raise ImageError(f"image {image!r} is not pinned by digest; give REPO@sha256:<64 hex>")
    return match.group("repo"), match.group("digest")


def local_ref(image: str) -> str:
    """The name every node holds the recipe's image under: REPO:sha256-<hex> for REPO[:TAG]@sha256:<hex>."""
    repo, digest = split_pinned(image)
    return f"{repo}:{digest.replace(':', '-')}"


def digest_hex(name: str) -> str:
    """The digest's hex in an image's name, as pinned (REPO[:TAG]@sha256:<hex>) or as every node holds it
    (REPO:sha256-<hex>); '' for a name with neither."""
    match = DIGEST_HEX.search(name or "")
    return match.group(1) if match else ""


def cache_key(image: str) -> str:
    """The name of the folder that holds the engine's caches for REPO[:TAG]@sha256:<hex>: sha256-<hex>.

    Compiled kernels (torch.compile, Triton, FlashInfer's JIT) are reused only by the image that made them:
    a cache reused across image changes is not reliable, so each image digest has its own folder.
    """
    return split_pinned(image)[1].replace(":", "-")


def pinned_ref(name: str) -> str:
    """REPO@sha256:<hex> for a local name REPO:sha256-<hex> (the same image); any other name as it is."""
    return LOCAL_SUFFIX.sub(r"@sha256:\1", name)


def registry_of(repo: str) -> str:
    """The registry a repository is pulled from (Docker's rule: a first part with a dot or a colon, or
    localhost, is a host; anything else is Docker Hub)."""
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def image_id_of(docker: str, name: str, runner: Any = run_command) -> Optional[str]:
    """The ID of the image a name resolves to on this node; None when it resolves to none."""
    rc, out, _ = runner([docker, "image", "inspect", "--format", "{{.Id}}", name], 60)
    return (out.strip() or None) if rc == 0 else None


def tag_image(docker: str, image_id: str, name: str, runner: Any = run_command) -> str:
    """Make name point at the image (docker tag); empty when done, else what docker said, in one line."""
    rc, out, err = runner([docker, "tag", image_id, name], 60)
    return "" if rc == 0 else f"docker tag {image_id} {name} failed: {' '.join((err or out).split())[:300]}"


def tag_diff(name: str, before: Optional[str], after: Optional[str]) -> Dict[str, str]:
    """What a name pointed at and points at, for --diff."""
    return {"before_header": name, "after_header": name,
            "before": f"{name} -> {before or 'nothing'}\n", "after": f"{name} -> {after or 'nothing'}\n"}


# --- archives -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchiveImage:
    """The one image of an archive, checked.

    image_id: the digest of its config (Docker's image ID); checked_by: ``digest`` (the archive holds the
    recipe's manifest, whose config is this one) or ``image_id`` (the config is the image_id asked for);
    layout: ``docker`` (``docker save``: a manifest.json) or ``oci`` (an OCI image layout alone);
    config and layers: the archive's member names docker load reads.
    """

    image_id: str
    checked_by: str
    layout: str
    config: str
    layers: Tuple[str, ...]


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob_name(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def _read_member(archive: tarfile.TarFile, members: Mapping[str, tarfile.TarInfo], name: str, path: str) -> bytes:
    info = members.get(name)
    handle = archive.extractfile(info) if info is not None else None
    if handle is None:
        raise ImageError(f"the image archive {path} lacks {name}; it is not a whole docker save or OCI archive")
    with handle:
        return handle.read()


def _json(data: bytes, what: str, path: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as err:
        raise ImageError(f"the image archive {path} has an unreadable {what}: {err}") from None


def _manifest_of(archive: tarfile.TarFile, members: Mapping[str, tarfile.TarInfo], path: str, digest: str,
                 platform: str) -> Optional[Dict[str, Any]]:
    """The image manifest the recipe's digest names, when the archive holds that blob (an index is followed to
    the manifest of this platform); None when it does not hold it. The blob's content is checked."""
    if _blob_name(digest) not in members:
        return None
    data = _read_member(archive, members, _blob_name(digest), path)
    if _sha256(data) != digest:
        raise ImageError(f"the image archive {path} holds a blob named {digest} whose content is not that digest")
    document = _json(data, "manifest", path)
    if document.get("mediaType") in _INDEX_TYPES or "manifests" in document:
        os_name, _, arch = platform.partition("/")
        for entry in document.get("manifests", []):
            wanted = entry.get("platform", {})
            if wanted.get("os") == os_name and wanted.get("architecture") == arch:
                return _manifest_of(archive, members, path, entry["digest"], platform)
        raise ImageError(f"the recipe's image {digest} is an index with no image for {platform}")
    return dict(document)


def read_archive(path: str, digest: str, image_id: str = "", platform: str = "linux/arm64") -> ArchiveImage:
    """Check an image archive (``docker save`` or OCI) against the recipe before anything is loaded.

    The archive must hold one image whose config is the recipe's: either it holds the recipe's manifest (by
    its digest, as an OCI archive copied from the registry does) and that manifest's config, or, when the
    recipe gives ``image_id``, the config whose digest is that ID. The config's bytes are hashed, and every
    layer docker load will read must be in the archive; docker load then checks each layer's content against
    the config.
    """
    if not DIGEST.match(digest):
        raise ImageError(f"the recipe's digest {digest!r} is not sha256:<64 hex>")
    if image_id and not DIGEST.match(image_id):
        raise ImageError(f"image_id {image_id!r} is not sha256:<64 hex> (docker image inspect --format "
                         "'{{.Id}}' IMAGE prints it)")
    try:
        archive = tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as err:
        raise ImageError(f"cannot read the image archive {path}: {err}") from None
    with archive:
        members = {info.name[2:] if info.name.startswith("./") else info.name: info
                   for info in archive.getmembers() if info.isfile()}
        manifest = _manifest_of(archive, members, path, digest, platform)
        if manifest is not None:
            config = manifest.get("config", {}).get("digest", "")
            layers = tuple(_blob_name(layer["digest"]) for layer in manifest.get("layers", []))
            config_name, checked_by = _blob_name(config), "digest"
            if image_id and config != image_id:
                raise ImageError(f"the image archive {path} holds the recipe's manifest {digest}, whose image ID is "
                                 f"{config}, not image_id {image_id}")
        elif "manifest.json" in members:
            entries = _json(_read_member(archive, members, "manifest.json", path), "manifest.json", path)
            if not isinstance(entries, list) or len(entries) != 1:
                raise ImageError(f"the image archive {path} holds {len(entries) if isinstance(entries, list) else 0} "
                                 "images; save the recipe's image alone (docker save IMAGE > FILE)")
            config_name = str(entries[0].get("Config", ""))
            layers = tuple(str(layer) for layer in entries[0].get("Layers") or [])
            checked_by = "image_id"
        else:
            raise ImageError(f"the image archive {path} holds neither the recipe's manifest {digest} nor a "
                             "docker save manifest.json")
        found = _sha256(_read_member(archive, members, config_name, path))
        if config_name.startswith("blobs/") and found != "sha256:" + config_name.rsplit("/", 1)[-1]:
            raise ImageError(f"the image archive {path} holds a config {config_name} whose content is {found}")
        if checked_by == "image_id":
            if not image_id:
                raise ImageError(f"the image archive {path} holds image {found} but not the recipe's manifest "
                                 f"{digest} (docker save does not keep it); set image_id to the image's ID "
                                 "(docker image inspect --format '{{.Id}}' IMAGE where it was pulled) to load it")
            if found != image_id:
                raise ImageError(f"the image archive {path} holds image {found}, not the recipe's image_id {image_id}")
        missing = [layer for layer in layers if layer not in members]
        if missing:
            raise ImageError(f"the image archive {path} lacks {len(missing)} of its image's layers ({missing[0]} ...)")
        return ArchiveImage(found, checked_by, "docker" if "manifest.json" in members else "oci", config_name, layers)


def docker_archive_stream(path: str, image: ArchiveImage, out: IO[bytes], chunk: int = 1 << 20) -> None:
    """Write to out what ``docker load`` takes: the archive itself when it has a manifest.json; else (an OCI
    layout alone, which docker load before 25 does not read) the archive's files followed by a manifest.json
    naming the checked config and layers."""
    with open(path, "rb") as source:
        if image.layout == "docker":
            while True:
                block = source.read(chunk)
                if not block:
                    return
                out.write(block)
    with tarfile.open(path, "r:*") as archive, tarfile.open(fileobj=out, mode="w|") as stream:
        for info in archive:
            handle = archive.extractfile(info) if info.isfile() else None
            stream.addfile(info, handle)
        manifest = json.dumps([{"Config": image.config, "RepoTags": None, "Layers": list(image.layers)}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        stream.addfile(info, io.BytesIO(manifest))


LOADED_ID = re.compile(r"Loaded image ID: (sha256:[0-9a-f]{64})")


def loaded_ids(output: str) -> List[str]:
    """The image IDs ``docker load`` said it loaded (it says them for images saved without a name)."""
    return LOADED_ID.findall(output)


# --- pulling by digest --------------------------------------------------------------------------------------


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over dockerd's unix socket."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._socket_path)
        self.sock = sock


def auth_header(auth: Optional[Mapping[str, str]], registry: str) -> Dict[str, str]:
    """The X-Registry-Auth header of a pull with these credentials (none without them); never logged."""
    if not auth or not auth.get("username"):
        return {}
    payload = {"username": auth["username"], "password": auth.get("password", ""),
               "serveraddress": auth.get("registry") or registry}
    return {"X-Registry-Auth": base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()}


def pull_failure(image: str, status: int, message: str) -> str:
    """One sentence for a pull the registry or dockerd refused."""
    repo, digest = split_pinned(image)
    registry = registry_of(repo)
    text = " ".join(message.split())
    lowered = text.lower()
    if "manifest unknown" in lowered or "not found" in lowered or status == 404:
        if "unauthorized" not in lowered and "denied" not in lowered:
            return (f"the registry {registry} has no image {repo}@{digest} (the recipe's `image`); check the "
                    f"digest (sparkserve recipe pin --check RECIPE) or push the image there ({text})")
    if "unauthorized" in lowered or "denied" in lowered or "authentication required" in lowered or status == 401:
        return (f"the registry {registry} refused to give {repo}@{digest}: it wants credentials that can read it "
                f"(image_registry_auth, from Ansible Vault) ({text})")
    return f"the pull of {repo}@{digest} from {registry} failed: {text}"


def _events(response: http.client.HTTPResponse) -> Iterator[Dict[str, Any]]:
    for line in response:
        line = line.strip()
        if line:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def pull(image: str, auth: Optional[Mapping[str, str]] = None, socket_path: str = "/var/run/docker.sock",
         timeout_s: float = 3600.0) -> None:
    """Pull REPO@sha256:<digest> through dockerd's API (the credentials travel in the request's header, never
    on disk); ImageError with one sentence when the registry or dockerd refuses it."""
    repo, digest = split_pinned(image)
    query = urlencode({"fromImage": repo, "tag": digest})
    connection = _UnixConnection(socket_path, timeout_s)
    try:
        connection.request("POST", f"/images/create?{query}", headers=auth_header(auth, registry_of(repo)))
        response = connection.getresponse()
        if response.status != 200:
            body = response.read().decode("utf-8", "replace")
            try:
                message = str(json.loads(body).get("message", body))
            except ValueError:
                message = body
            raise ImageError(pull_failure(image, response.status, message))
        for event in _events(response):
            if event.get("error"):
                raise ImageError(pull_failure(image, 200, str(event["error"])))
    except (OSError, http.client.HTTPException) as err:  # HTTPException: a stream cut short (IncompleteRead)
        raise ImageError(f"cannot ask dockerd ({socket_path}) to pull {repo}@{digest}: {err}") from None
    finally:
        connection.close()
