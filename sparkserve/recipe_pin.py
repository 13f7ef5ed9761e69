"""`sparkserve recipe pin`: a recipe's image tag to its digest and its repositories' branches to their commits.

What floats in a recipe: ``image: REPO:TAG`` (no digest yet), and any Hugging Face repository of it (``model``,
a draft model, the overlays' source) whose ``revision`` is a branch or tag. Pinning asks the registry for the
tag's manifest digest (the Docker Registry HTTP API v2, with a token or basic credentials where the registry
asks for them) and the hub for the branch's commit (``GET /api/models/REPO/revision/BRANCH``), then writes
``image: REPO:TAG@sha256:DIGEST`` and ``revision: COMMIT`` with ``track: BRANCH`` beside it. The tag stays in
the image and the branch in ``track``, so a later ``--check`` asks again and says what has moved.

The file is edited in place, value by value (comments, order and quoting are kept); nothing else is touched.
No Spark is contacted. No credential is printed: errors name the registry or the hub, never a header.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import http.client
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Manifest media types, newest first: a multi-platform index is pinned as the index (each node pulls its own).
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "https://registry-1.docker.io"
DEFAULT_HUB = "https://huggingface.co"
TIMEOUT_S = 20.0


class PinError(Exception):
    """A value could not be pinned or checked: one sentence, naming the recipe's field."""


@dataclass(frozen=True)
class ImageRef:
    """A Docker reference taken apart: registry host, repository path, tag, digest."""

    registry: str
    path: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        rest, _, digest = text.partition("@")
        first, slash, remainder = rest.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, name = first, remainder
        else:
            registry, name = DOCKER_HUB, rest
        name, colon, tag = name.rpartition(":") if ":" in name else (name, "", "")
        if registry == DOCKER_HUB and "/" not in name:
            name = "library/" + name
        return cls(registry, name, tag if colon else None, digest or None)

    @property
    def repository(self) -> str:
        """The reference without tag or digest, as the recipe writes it."""
        if self.registry == DOCKER_HUB:
            return self.path.removeprefix("library/")
        return f"{self.registry}/{self.path}"

    def pinned(self, digest: str) -> str:
        """REPO:TAG@DIGEST; no tag is Docker's latest, written out so that --check knows what to follow."""
        return f"{self.repository}:{self.tag or 'latest'}@{digest}"


@dataclass
class Credentials:
    """Where pinning may need to log in: registry host -> (user, password), and the hub's token."""

    registries: dict[str, tuple[str, str]] = field(default_factory=dict)
    hub_token: str = ""

    @classmethod
    def from_vars(cls, data: Mapping[str, Any]) -> Credentials:
        """From the inventory's variables (a vault file): sparkserve_registry_credentials and weights_hf_token."""
        registries: dict[str, tuple[str, str]] = {}
        for host, entry in (data.get("sparkserve_registry_credentials") or {}).items():
            if not isinstance(entry, Mapping) or not entry.get("username") or not entry.get("password"):
                raise PinError(f"sparkserve_registry_credentials.{host} needs username and password")
            registries[str(host)] = (str(entry["username"]), str(entry["password"]))
        return cls(registries, str(data.get("weights_hf_token") or ""))


Fetch = Callable[[urllib.request.Request], tuple[int, Mapping[str, str], bytes]]


def http_fetch(request: urllib.request.Request) -> tuple[int, Mapping[str, str], bytes]:
    """(status, headers, body) of one request; an HTTP error status is an answer, not an exception."""
    try:
        with urllib.request.build_opener().open(request, timeout=TIMEOUT_S) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers.items()) if error.headers else {}, error.read() or b""


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, params = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', params))


@dataclass
class Resolver:
    """Asks registries and the hub what a tag or a branch points to now."""

    credentials: Credentials = field(default_factory=Credentials)
    registry_urls: Mapping[str, str] = field(default_factory=dict)  # host -> the URL the controller reaches it at
    hub_url: str = DEFAULT_HUB
    fetch: Fetch = http_fetch

    def registry_url(self, registry: str) -> str:
        if registry in self.registry_urls:
            return self.registry_urls[registry].rstrip("/")
        if registry == DOCKER_HUB:
            return DOCKER_HUB_API
        host = registry.rsplit(":", 1)[0]
        return f"{'http' if host in ('localhost', '127.0.0.1', '::1') else 'https'}://{registry}"

    def _get(self, url: str, headers: dict[str, str], where: str) -> tuple[int, Mapping[str, str], bytes]:
        try:
            return self.fetch(urllib.request.Request(url, headers=headers, method="GET"))
        except (OSError, http.client.HTTPException) as error:
            reason = error.reason if isinstance(error, urllib.error.URLError) else error
            raise PinError(f"{where} could not be reached ({reason})") from None

    def _authorize(self, ref: ImageRef, challenge: str, where: str) -> str:
        """The Authorization header a registry's 401 challenge asks for."""
        scheme, params = _challenge(challenge)
        login = self.credentials.registries.get(ref.registry)
        basic = "Basic " + base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode() if login else ""
        if scheme == "basic":
            if not basic:
                raise PinError(f"{where} asks for credentials; give them for {ref.registry} in "
                               "sparkserve_registry_credentials (kept in Ansible Vault, --credentials FILE)")
            return basic
        if scheme != "bearer" or "realm" not in params:
            raise PinError(f"{where} asked for an authentication it does not describe ({scheme})")
        query = {"service": params.get("service", ""), "scope": params.get("scope", f"repository:{ref.path}:pull")}
        url = params["realm"] + "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        status, _, body = self._get(url, {"Authorization": basic} if basic else {}, f"{where}'s token service")
        if status != 200:
            raise PinError(f"{where}'s token service answered HTTP {status}; "
                           + ("check the credentials for it" if basic else
                              f"give credentials for {ref.registry} in sparkserve_registry_credentials "
                              "(kept in Ansible Vault, --credentials FILE)"))
        try:
            token = json.loads(body).get("token") or json.loads(body).get("access_token")
        except ValueError:
            token = None
        if not token:
            raise PinError(f"{where}'s token service gave no token")
        return f"Bearer {token}"

    def image_digest(self, ref: ImageRef, field_name: str = "image") -> str:
        """The digest the registry gives the tag of REF now (its manifest's, as docker pull would pin it)."""
        tag = ref.tag or "latest"
        where = f"the registry {ref.registry}"
        url = f"{self.registry_url(ref.registry)}/v2/{ref.path}/manifests/{urllib.parse.quote(tag, safe='')}"
        headers = {"Accept": MANIFEST_TYPES, "User-Agent": "sparkserve"}
        status, answer, body = self._get(url, headers, where)
        if status == 401:
            challenge = next((v for k, v in answer.items() if k.lower() == "www-authenticate"), "")
            headers["Authorization"] = self._authorize(ref, challenge, where)
            status, answer, body = self._get(url, headers, where)
        if status == 404:
            raise PinError(f"{where} has no tag {tag} of {ref.repository} (recipe field {field_name}); "
                           "check the name and the tag")
        if status in (401, 403):
            raise PinError(f"{where} refused to show {ref.repository}:{tag} (HTTP {status}, recipe field "
                           f"{field_name}); give credentials that may pull it")
        if status != 200:
            raise PinError(f"{where} answered HTTP {status} for {ref.repository}:{tag} (recipe field {field_name})")
        named = next((v for k, v in answer.items() if k.lower() == "docker-content-digest"), "")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if named and named != digest:
            raise PinError(f"{where} named digest {named} for {ref.repository}:{tag} but sent a manifest whose "
                           f"digest is {digest}; not pinned")
        return digest

    def commit(self, repo: str, branch: str, field_name: str) -> str:
        """The commit BRANCH of the hub's REPO points to now."""
        url = "%s/api/models/%s/revision/%s" % (self.hub_url.rstrip("/"), urllib.parse.quote(repo, safe="/"),
                                                urllib.parse.quote(branch, safe=""))
        headers = {"Accept": "application/json", "User-Agent": "sparkserve"}
        if self.credentials.hub_token:
            headers["Authorization"] = f"Bearer {self.credentials.hub_token}"
        status, _, body = self._get(url, headers, f"the hub ({self.hub_url})")
        if status == 404:
            raise PinError(f"the hub has no revision {branch} of {repo} (recipe field {field_name}); "
                           "check the repository and the branch")
        if status in (401, 403):
            raise PinError(f"the hub refused {repo} (HTTP {status}, recipe field {field_name}): a gated or private "
                           "repository needs weights_hf_token (kept in Ansible Vault, --credentials FILE)")
        if status != 200:
            raise PinError(f"the hub answered HTTP {status} for {repo} at {branch} (recipe field {field_name})")
        try:
            sha = json.loads(body).get("sha")
        except (ValueError, AttributeError):
            sha = None
        if not isinstance(sha, str) or not _COMMIT.match(sha):
            raise PinError(f"the hub's answer for {repo} at {branch} names no commit (recipe field {field_name})")
        return sha


@dataclass(frozen=True)
class Pin:
    """One value of the recipe and what it becomes: ``follows`` is the tag or branch it was resolved from."""

    field: str
    follows: str
    before: str
    after: str
    node: yaml.ScalarNode
    add_track: yaml.ScalarNode | None = None  # the revision node after which `track: BRANCH` is added
    flow: bool = False  # the repository is written {repo: ..., revision: ...}

    @property
    def moved(self) -> bool:
        return self.before != self.after


def _scalar(mapping: yaml.MappingNode, key: str) -> tuple[yaml.ScalarNode, yaml.ScalarNode] | None:
    for key_node, value_node in mapping.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key and isinstance(value_node, yaml.ScalarNode):
            return key_node, value_node
    return None


def _repositories(node: yaml.Node, path: str) -> Iterator[tuple[str, yaml.MappingNode]]:
    """Every mapping below NODE with a `repo` and a `revision` (a Hugging Face repository), with its path."""
    if isinstance(node, yaml.MappingNode):
        if _scalar(node, "repo") and _scalar(node, "revision"):
            yield path, node
        for key_node, value_node in node.value:
            yield from _repositories(value_node, f"{path}.{key_node.value}" if path else str(key_node.value))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _repositories(item, f"{path}[{index}]")


def plan(text: str, resolver: Resolver) -> list[Pin]:
    """What pinning the recipe TEXT would write, value by value (moved or not)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as error:
        raise PinError(f"the recipe is not YAML: {error}") from None
    if not isinstance(root, yaml.MappingNode):
        raise PinError("the recipe is not a mapping of fields")
    pins: list[Pin] = []
    image = _scalar(root, "image")
    if image:
        ref = ImageRef.parse(image[1].value)
        if ref.tag or not ref.digest:
            digest = resolver.image_digest(ref)
            pins.append(Pin("image", f"{ref.repository}:{ref.tag or 'latest'}", image[1].value, ref.pinned(digest),
                            image[1]))
    for where, mapping in _repositories(root, ""):
        repo = _scalar(mapping, "repo")
        revision = _scalar(mapping, "revision")
        assert repo is not None and revision is not None
        track = _scalar(mapping, "track")
        branch = track[1].value if track else revision[1].value
        if _COMMIT.match(branch):
            continue  # a commit with nothing to follow
        commit = resolver.commit(repo[1].value, branch, f"{where}.revision")
        pins.append(Pin(f"{where}.revision", f"{repo[1].value}@{branch}", revision[1].value, commit, revision[1],
                        None if track else revision[1], bool(mapping.flow_style)))
    return pins


def _quoted(node: yaml.ScalarNode, value: str) -> str:
    return f"'{value}'" if node.style == "'" else f'"{value}"' if node.style == '"' else value


def apply(text: str, pins: list[Pin]) -> str:
    """TEXT with each pin's value written in place (and `track:` added beside a branch pinned the first time)."""
    edits: list[tuple[int, int, str]] = []
    for pin in pins:
        node = pin.node
        if pin.moved:
            edits.append((node.start_mark.index, node.end_mark.index, _quoted(node, pin.after)))
        if pin.add_track is not None and pin.flow:
            edits.append((pin.add_track.end_mark.index, pin.add_track.end_mark.index, f", track: {pin.before}"))
        elif pin.add_track is not None:
            branch = pin.before
            end = pin.add_track.end_mark.index
            if pin.add_track.start_mark.line != pin.add_track.end_mark.line or text[end:end + 1] not in ("\n", ""):
                line_end = text.find("\n", end)
                end = len(text) if line_end < 0 else line_end
            key_column = _key_column(text, pin.add_track)
            edits.append((end, end, f"\n{' ' * key_column}track: {branch}"))
    for start, end, value in sorted(edits, reverse=True):
        text = text[:start] + value + text[end:]
    return text


def _key_column(text: str, value: yaml.ScalarNode) -> int:
    """The column the `revision:` key of VALUE starts at."""
    line = text.splitlines()[value.start_mark.line]
    return len(line) - len(line.lstrip(" "))


def diff(name: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"{name} (now)", tofile=f"{name} (pinned)"))
