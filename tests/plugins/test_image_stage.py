"""Tests for the image stage: the image's names, archives checked against the recipe (real docker save and OCI
tars), the pull through a dockerd double on a unix socket, the stage's plan (filters), and the modules image_pull,
image_archive and image_relay run with a docker double (and an ssh double for the relay) on real processes."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import os
import random
import socketserver
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional, cast
from urllib.parse import parse_qs, urlsplit

import pytest
from ansible.errors import AnsibleFilterError
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.filter import image as image_filter
from ansible_collections.sparkserve.deploy.plugins.module_utils.node import images
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.images import ArchiveImage, ImageError
from ansible_collections.sparkserve.deploy.plugins.modules import image_archive, image_pull, image_relay

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

HEX = "0123456789abcdef" * 4
REPO = "registry.example:5000/vllm/vllm-openai"
DIGEST = "sha256:" + HEX
IMAGE = f"{REPO}:v0.9.1@{DIGEST}"
LOCAL = f"{REPO}:sha256-{HEX}"
OTHER_ID = "sha256:" + "ee" * 32
PASSWORD = "pa55-w0rd-NEVER-LOGGED"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_path(digest: str) -> str:
    return "blobs/sha256/" + digest.split(":", 1)[1]


# --- names ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("image", "repo"), [
    (f"vllm/vllm-openai@{DIGEST}", "vllm/vllm-openai"),
    (f"vllm/vllm-openai:v0.9.1@{DIGEST}", "vllm/vllm-openai"),
    (f"nginx@{DIGEST}", "nginx"),
    (f"registry.example:5000/vllm/vllm-openai:v1@{DIGEST}", "registry.example:5000/vllm/vllm-openai"),
    (f"registry.example:5000/vllm/vllm-openai@{DIGEST}", "registry.example:5000/vllm/vllm-openai"),
    (f"localhost:5000/vllm:latest@{DIGEST}", "localhost:5000/vllm"),
])
def test_split_pinned_keeps_the_repository_and_the_digest(image: str, repo: str) -> None:
    assert images.split_pinned(image) == (repo, DIGEST)


@pytest.mark.parametrize("image", [
    "vllm/vllm-openai:latest", "vllm/vllm-openai", "", f"vllm/vllm-openai@sha256:{HEX[:63]}",
    f"vllm/vllm-openai@sha256:{HEX.upper()}", f"vllm/vllm-openai@sha512:{HEX}", f"@{DIGEST}",
    f"vllm/vllm-openai@{DIGEST}0", f"vllm openai@{DIGEST}",
])
def test_split_pinned_refuses_an_image_not_pinned_by_digest(image: str) -> None:
    with pytest.raises(ImageError) as err:
        images.split_pinned(image)
    assert str(err.value) == f"image {image!r} is not pinned by digest; give REPO@sha256:<64 hex>"


def test_local_ref_is_the_repository_tagged_with_the_digest() -> None:
    assert images.local_ref(IMAGE) == LOCAL
    assert images.local_ref(f"vllm/vllm-openai@{DIGEST}") == f"vllm/vllm-openai:sha256-{HEX}"
    assert images.LOCAL_TAG.match(images.local_ref(IMAGE))
    with pytest.raises(ImageError, match="not pinned by digest"):
        images.local_ref("vllm/vllm-openai:v0.9.1")


@pytest.mark.parametrize(("name", "found"), [
    (IMAGE, HEX), (f"vllm/vllm-openai@{DIGEST}", HEX), (LOCAL, HEX),
    ("vllm/vllm-openai:v0.9.1", ""), (DIGEST, ""),  # a tag alone; an image ID is not a digest
])
def test_the_digest_in_an_image_name_pinned_or_local(name: str, found: str) -> None:
    assert images.digest_hex(name) == found


def test_the_engine_caches_folder_is_named_by_the_digest_alone() -> None:
    assert images.cache_key(IMAGE) == f"sha256-{HEX}"
    assert images.cache_key(f"other/repo:v2@{DIGEST}") == images.cache_key(IMAGE)
    with pytest.raises(ImageError, match="not pinned by digest"):
        images.cache_key("vllm/vllm-openai:v0.9.1")


@pytest.mark.parametrize(("repo", "registry"), [
    ("vllm/vllm-openai", "docker.io"),
    ("nginx", "docker.io"),
    ("localhost", "docker.io"),  # a single name is a Docker Hub repository, even this one
    ("localhost/vllm", "localhost"),
    ("localhost:5000/vllm", "localhost:5000"),
    ("ghcr.io/org/vllm", "ghcr.io"),
    ("registry.example:5000/vllm/vllm-openai", "registry.example:5000"),
    ("nvcr.io/nvidia/vllm", "nvcr.io"),
])
def test_registry_of_follows_dockers_rule(repo: str, registry: str) -> None:
    assert images.registry_of(repo) == registry


def test_tag_diff_says_what_the_name_pointed_at() -> None:
    assert images.tag_diff(LOCAL, None, OTHER_ID) == {
        "before_header": LOCAL, "after_header": LOCAL,
        "before": f"{LOCAL} -> nothing\n", "after": f"{LOCAL} -> {OTHER_ID}\n"}
    assert images.tag_diff(LOCAL, DIGEST, OTHER_ID)["before"] == f"{LOCAL} -> {DIGEST}\n"


def test_image_id_of_asks_docker_image_inspect() -> None:
    calls: list[tuple[list[str], float]] = []

    def runner(answer: tuple[int, str, str]) -> Callable[[Any, float], tuple[int, str, str]]:
        def run(argv: Any, timeout: float) -> tuple[int, str, str]:
            calls.append((list(argv), timeout))
            return answer
        return run

    assert images.image_id_of("/usr/bin/docker", LOCAL, runner((0, f"{OTHER_ID}\n", ""))) == OTHER_ID
    assert calls == [(["/usr/bin/docker", "image", "inspect", "--format", "{{.Id}}", LOCAL], 60)]
    assert images.image_id_of("docker", LOCAL, runner((1, "", f"Error: No such image: {LOCAL}\n"))) is None
    assert images.image_id_of("docker", LOCAL, runner((0, "\n", ""))) is None
    assert images.image_id_of("docker", LOCAL, runner((127, "", "cannot run docker"))) is None


def test_loaded_ids_reads_what_docker_load_says() -> None:
    said = (f"Loaded image ID: {OTHER_ID}\nLoaded image: {LOCAL}\n"
            f"Loaded image ID: {DIGEST}\nLoaded image ID: sha256:abc\n")
    assert images.loaded_ids(said) == [OTHER_ID, DIGEST]
    assert images.loaded_ids("Loaded image: vllm:latest\n") == []


# --- archives ------------------------------------------------------------------------------------------------


@dataclass
class Img:
    """An image's config and its layers (uncompressed tars), as docker save and an OCI layout hold them."""

    config: bytes
    layers: list[bytes]

    @property
    def image_id(self) -> str:
        return sha(self.config)


def layer_tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_image(arch: str = "arm64", seed: int = 1, big: int = 0) -> Img:
    rng = random.Random(seed)
    layers = [layer_tar({"etc/os-release": f"ID=spark\nSEED={seed}\n".encode()}),
              layer_tar({"opt/vllm/model.py": b"print('model')\n" + rng.randbytes(big)}),
              layer_tar({"opt/vllm/VERSION": f"0.9.{seed}\n".encode()})]
    config = json.dumps({"architecture": arch, "os": "linux", "config": {"Entrypoint": ["vllm"]},
                         "rootfs": {"type": "layers", "diff_ids": [sha(layer) for layer in layers]}},
                        sort_keys=True).encode()
    return Img(config, layers)


def docker_save_members(image: Img, repo_tags: Optional[list[str]] = None) -> dict[str, bytes]:
    """What docker save writes for one image: each layer in a directory, the config, manifest.json."""
    members: dict[str, bytes] = {}
    layer_names = []
    for layer in image.layers:
        name = f"{hashlib.sha256(layer + b'dir').hexdigest()}/layer.tar"
        members[name.replace("layer.tar", "VERSION")] = b"1.0"
        members[name] = layer
        layer_names.append(name)
    config_name = image.image_id.split(":")[1] + ".json"
    members[config_name] = image.config
    members["manifest.json"] = json.dumps([{"Config": config_name, "RepoTags": repo_tags,
                                            "Layers": layer_names}]).encode()
    members["repositories"] = b"{}"
    return members


def manifest_of(image: Img, members: dict[str, bytes]) -> bytes:
    """An OCI image manifest of the image (gzip layers), its blobs added to members."""
    layers = []
    for layer in image.layers:
        data = gzip.compress(layer, mtime=0)
        members[blob_path(sha(data))] = data
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(data),
                       "size": len(data)})
    members[blob_path(image.image_id)] = image.config
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": image.image_id, "size": len(image.config)},
                           "layers": layers}).encode()
    members[blob_path(sha(manifest))] = manifest
    return manifest


def oci_members(image: Img) -> tuple[dict[str, bytes], str]:
    """An OCI image layout of one image (as skopeo copy ... oci-archive: writes it) and its manifest's digest."""
    members: dict[str, bytes] = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}'}
    manifest = manifest_of(image, members)
    members["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(manifest),
         "size": len(manifest)}]}).encode()
    return members, sha(manifest)


def oci_index_members(by_platform: dict[str, Img]) -> tuple[dict[str, bytes], str]:
    """An OCI layout whose recipe digest names an image index of several platforms, and that digest."""
    members: dict[str, bytes] = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}'}
    entries = []
    for platform, image in by_platform.items():
        manifest = manifest_of(image, members)
        os_name, arch = platform.split("/")
        entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(manifest),
                        "size": len(manifest), "platform": {"os": os_name, "architecture": arch}})
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": entries}).encode()
    members[blob_path(sha(index))] = index
    members["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": sha(index), "size": len(index)}]}).encode()
    return members, sha(index)


def write_tar(path: Path, members: dict[str, bytes], compress: bool = False, prefix: str = "") -> Path:
    """A tar of members, with a directory entry before the files of each directory, as tar writes them."""
    with tarfile.open(path, "w:gz" if compress else "w") as tar:
        made: set[str] = set()
        for name, data in members.items():
            parts = name.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                directory = "/".join(parts[:depth])
                if directory not in made:
                    made.add(directory)
                    info = tarfile.TarInfo(prefix + directory)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 1700000000
            tar.addfile(info, io.BytesIO(data))
    return path


def tar_files(data: bytes) -> dict[str, bytes]:
    """The files of a tar (any compression), in order."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        return {info.name: cast(IO[bytes], tar.extractfile(info)).read() for info in tar if info.isfile()}


def test_an_oci_archive_is_accepted_by_the_recipes_digest(tmp_path: Path) -> None:
    image = make_image()
    members, digest = oci_members(image)
    path = write_tar(tmp_path / "vllm.oci.tar", members)
    checked = images.read_archive(str(path), digest)
    layers = tuple(blob_path(sha(gzip.compress(layer, mtime=0))) for layer in image.layers)
    assert checked == ArchiveImage(image.image_id, "digest", "oci", blob_path(image.image_id), layers)
    # The same, with the image_id given too (it is the config's digest).
    assert images.read_archive(str(path), digest, image.image_id) == checked


def test_a_docker_save_archive_is_accepted_by_image_id(tmp_path: Path) -> None:
    image = make_image()
    members = docker_save_members(image, [f"{REPO}:v0.9.1"])
    path = write_tar(tmp_path / "vllm.tar", members)
    checked = images.read_archive(str(path), DIGEST, image.image_id)
    manifest = json.loads(members["manifest.json"])[0]
    assert checked == ArchiveImage(image.image_id, "image_id", "docker", manifest["Config"], tuple(manifest["Layers"]))


def test_a_gzip_docker_save_archive_is_accepted(tmp_path: Path) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar.gz", docker_save_members(image), compress=True)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    checked = images.read_archive(str(path), DIGEST, image.image_id)
    assert checked.image_id == image.image_id and checked.layout == "docker" and len(checked.layers) == 3


def test_members_named_with_a_leading_dot_slash_are_read(tmp_path: Path) -> None:
    image = make_image()
    docker = images.read_archive(str(write_tar(tmp_path / "d.tar", docker_save_members(image), prefix="./")),
                                 DIGEST, image.image_id)
    assert docker.image_id == image.image_id
    members, digest = oci_members(image)
    oci = images.read_archive(str(write_tar(tmp_path / "o.tar", members, prefix="./")), digest)
    assert oci.image_id == image.image_id and oci.checked_by == "digest"


@pytest.mark.parametrize("platform", ["linux/arm64", "linux/amd64"])
def test_an_index_is_followed_to_this_platforms_image(tmp_path: Path, platform: str) -> None:
    by_platform = {"linux/amd64": make_image("amd64", seed=2), "linux/arm64": make_image("arm64", seed=3)}
    members, digest = oci_index_members(by_platform)
    path = write_tar(tmp_path / "multi.tar", members)
    checked = images.read_archive(str(path), digest, platform=platform)
    wanted = by_platform[platform]
    assert checked.image_id == wanted.image_id and checked.checked_by == "digest" and checked.layout == "oci"
    assert checked.layers == tuple(blob_path(sha(gzip.compress(layer, mtime=0))) for layer in wanted.layers)
    assert by_platform["linux/amd64"].image_id != by_platform["linux/arm64"].image_id


def test_the_default_platform_is_arm64(tmp_path: Path) -> None:
    by_platform = {"linux/amd64": make_image("amd64", seed=2), "linux/arm64": make_image("arm64", seed=3)}
    members, digest = oci_index_members(by_platform)
    checked = images.read_archive(str(write_tar(tmp_path / "multi.tar", members)), digest)
    assert checked.image_id == by_platform["linux/arm64"].image_id


def test_an_index_without_this_platform_is_refused(tmp_path: Path) -> None:
    members, digest = oci_index_members({"linux/amd64": make_image("amd64", seed=2)})
    path = write_tar(tmp_path / "amd.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), digest, platform="linux/arm64")
    assert str(err.value) == f"the recipe's image {digest} is an index with no image for linux/arm64"


def test_a_docker_save_archive_without_image_id_is_refused_saying_to_set_it(tmp_path: Path) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image))
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), DIGEST)
    text = str(err.value)
    assert f"holds image {image.image_id} but not the recipe's manifest {DIGEST}" in text
    assert "set image_id to the image's ID" in text and "docker image inspect --format '{{.Id}}' IMAGE" in text


def test_a_docker_save_archive_of_another_image_is_refused(tmp_path: Path) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image))
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), DIGEST, OTHER_ID)
    assert str(err.value) == (f"the image archive {path} holds image {image.image_id}, not the recipe's image_id "
                              f"{OTHER_ID}")


def test_an_oci_manifest_whose_config_is_not_image_id_is_refused(tmp_path: Path) -> None:
    image = make_image()
    members, digest = oci_members(image)
    path = write_tar(tmp_path / "vllm.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), digest, OTHER_ID)
    assert str(err.value) == (f"the image archive {path} holds the recipe's manifest {digest}, whose image ID is "
                              f"{image.image_id}, not image_id {OTHER_ID}")


def test_an_archive_without_the_recipes_manifest_or_a_manifest_json_is_refused(tmp_path: Path) -> None:
    members, _ = oci_members(make_image())
    path = write_tar(tmp_path / "vllm.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), DIGEST)  # the recipe names another manifest
    assert str(err.value) == (f"the image archive {path} holds neither the recipe's manifest {DIGEST} nor a docker "
                              "save manifest.json")


def test_a_blob_whose_content_is_not_its_name_is_refused(tmp_path: Path) -> None:
    members, digest = oci_members(make_image())
    manifest = json.loads(members[blob_path(digest)])
    manifest["annotations"] = {"tampered": "yes"}  # same name, other content
    members[blob_path(digest)] = json.dumps(manifest).encode()
    path = write_tar(tmp_path / "vllm.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), digest)
    assert str(err.value) == f"the image archive {path} holds a blob named {digest} whose content is not that digest"


def test_a_config_blob_whose_content_is_not_its_name_is_refused(tmp_path: Path) -> None:
    image = make_image()
    members, digest = oci_members(image)
    tampered = image.config.replace(b'"vllm"', b'"/bin/sh"')
    assert tampered != image.config
    members[blob_path(image.image_id)] = tampered
    path = write_tar(tmp_path / "vllm.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), digest)
    assert str(err.value) == (f"the image archive {path} holds a config {blob_path(image.image_id)} whose content is "
                              f"{sha(tampered)}")


def test_a_blob_inside_an_index_whose_content_is_not_its_name_is_refused(tmp_path: Path) -> None:
    arm = make_image("arm64", seed=3)
    members, digest = oci_index_members({"linux/amd64": make_image("amd64", seed=2), "linux/arm64": arm})
    index = json.loads(members[blob_path(digest)])
    arm_manifest = index["manifests"][1]["digest"]
    members[blob_path(arm_manifest)] = members[blob_path(arm_manifest)] + b" "
    path = write_tar(tmp_path / "multi.tar", members)
    with pytest.raises(ImageError, match=f"holds a blob named {arm_manifest} whose content is not that digest"):
        images.read_archive(str(path), digest, platform="linux/arm64")


def test_a_missing_layer_is_refused_oci(tmp_path: Path) -> None:
    image = make_image()
    members, digest = oci_members(image)
    second = blob_path(sha(gzip.compress(image.layers[1], mtime=0)))
    del members[second]
    path = write_tar(tmp_path / "vllm.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), digest)
    assert str(err.value) == f"the image archive {path} lacks 1 of its image's layers ({second} ...)"


def test_a_missing_layer_is_refused_docker_save(tmp_path: Path) -> None:
    image = make_image()
    members = docker_save_members(image)
    layers = json.loads(members["manifest.json"])[0]["Layers"]
    del members[layers[0]], members[layers[2]]
    path = write_tar(tmp_path / "vllm.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), DIGEST, image.image_id)
    assert str(err.value) == f"the image archive {path} lacks 2 of its image's layers ({layers[0]} ...)"


def test_a_missing_config_is_refused(tmp_path: Path) -> None:
    image = make_image()
    members = docker_save_members(image)
    config_name = image.image_id.split(":")[1] + ".json"
    del members[config_name]
    path = write_tar(tmp_path / "vllm.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), DIGEST, image.image_id)
    assert str(err.value) == (f"the image archive {path} lacks {config_name}; it is not a whole docker save or OCI "
                              "archive")


def test_two_images_in_manifest_json_are_refused(tmp_path: Path) -> None:
    one, two = make_image(seed=1), make_image(seed=2)
    members = docker_save_members(one)
    other = docker_save_members(two)
    entries = json.loads(members["manifest.json"]) + json.loads(other["manifest.json"])
    members.update({k: v for k, v in other.items() if k != "manifest.json"})
    members["manifest.json"] = json.dumps(entries).encode()
    path = write_tar(tmp_path / "two.tar", members)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), DIGEST, one.image_id)
    assert str(err.value) == (f"the image archive {path} holds 2 images; save the recipe's image alone "
                              "(docker save IMAGE > FILE)")


def test_an_unreadable_manifest_json_is_refused(tmp_path: Path) -> None:
    members = docker_save_members(make_image())
    members["manifest.json"] = b"[{not json"
    path = write_tar(tmp_path / "vllm.tar", members)
    with pytest.raises(ImageError, match=f"the image archive {path} has an unreadable manifest.json: "):
        images.read_archive(str(path), DIGEST, OTHER_ID)


def test_what_is_not_a_tar_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "vllm.tar"
    path.write_bytes(b"this is not a tar archive at all\n" * 40)
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), DIGEST, OTHER_ID)
    assert str(err.value).startswith(f"cannot read the image archive {path}: ")
    with pytest.raises(ImageError, match="cannot read the image archive .*/absent.tar: "):
        images.read_archive(str(tmp_path / "absent.tar"), DIGEST)


@pytest.mark.parametrize("digest", ["", "sha256:abc", f"sha256:{HEX.upper()}", f"sha512:{HEX}", HEX,
                                    f"sha256:{HEX} ", f"sha256-{HEX}"])
def test_a_bad_digest_is_refused_before_the_archive_is_opened(tmp_path: Path, digest: str) -> None:
    absent = tmp_path / "absent.tar"
    with pytest.raises(ImageError) as err:
        images.read_archive(str(absent), digest)
    assert str(err.value) == f"the recipe's digest {digest!r} is not sha256:<64 hex>"


@pytest.mark.parametrize("image_id", ["sha256:abc", HEX, f"sha256:{HEX.upper()}", "latest"])
def test_a_bad_image_id_is_refused(tmp_path: Path, image_id: str) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image))
    with pytest.raises(ImageError) as err:
        images.read_archive(str(path), DIGEST, image_id)
    assert str(err.value).startswith(f"image_id {image_id!r} is not sha256:<64 hex>")


def test_an_archive_of_both_layouts_without_the_recipes_manifest_is_checked_by_image_id(tmp_path: Path) -> None:
    """Docker 25's docker save writes an OCI layout (of manifests it made) beside manifest.json."""
    image = make_image()
    members, _ = oci_members(image)
    config_name = blob_path(image.image_id)
    layers = [name for name in members if name.startswith("blobs/") and name != config_name
              and not members[name].startswith(b"{")]
    members["manifest.json"] = json.dumps([{"Config": config_name, "RepoTags": None, "Layers": layers}]).encode()
    path = write_tar(tmp_path / "docker25.tar", members)
    checked = images.read_archive(str(path), DIGEST, image.image_id)
    assert checked == ArchiveImage(image.image_id, "image_id", "docker", config_name, tuple(layers))
    edited = image.config + b"\n"
    members[config_name] = edited  # the config's name is a digest: its content is checked against it
    bad = write_tar(tmp_path / "bad.tar", members)
    with pytest.raises(ImageError, match=f"holds a config {config_name} whose content is {sha(edited)}"):
        images.read_archive(str(bad), DIGEST, sha(edited))


# --- what docker load is given ----------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_a_docker_save_archive_is_streamed_as_it_is(tmp_path: Path, compress: bool) -> None:
    image = make_image(big=50_000)
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image), compress=compress)
    checked = images.read_archive(str(path), DIGEST, image.image_id)
    out = io.BytesIO()
    images.docker_archive_stream(str(path), checked, out, chunk=4099)
    assert out.getvalue() == path.read_bytes()


@pytest.mark.parametrize("compress", [False, True])
def test_an_oci_layout_is_streamed_with_a_manifest_json_of_its_own(tmp_path: Path, compress: bool) -> None:
    image = make_image()
    members, digest = oci_members(image)
    path = write_tar(tmp_path / "vllm.oci.tar", members, compress=compress)
    checked = images.read_archive(str(path), digest)
    out = io.BytesIO()
    images.docker_archive_stream(str(path), checked, out)
    data = out.getvalue()
    with tarfile.open(path) as original, tarfile.open(fileobj=io.BytesIO(data)) as streamed:
        before = [(i.name, i.type, i.size, i.mode) for i in original.getmembers()]
        after = [(i.name, i.type, i.size, i.mode) for i in streamed.getmembers()]
    assert data[:2] != b"\x1f\x8b"  # a plain tar, whatever the archive's compression
    assert after[:-1] == before and after[-1][0] == "manifest.json"
    files = tar_files(data)
    assert {name: files[name] for name in members} == members  # every member, byte for byte
    layers = [blob_path(sha(gzip.compress(layer, mtime=0))) for layer in image.layers]
    assert json.loads(files["manifest.json"]) == [{"Config": blob_path(image.image_id), "RepoTags": None,
                                                   "Layers": layers}]
    # What docker load is given reads as a docker save archive of the same image, still holding the manifest.
    again = tmp_path / "streamed.tar"
    again.write_bytes(data)
    assert images.read_archive(str(again), digest) == ArchiveImage(image.image_id, "digest", "docker",
                                                                   blob_path(image.image_id), tuple(layers))
    assert images.read_archive(str(again), DIGEST, image.image_id).checked_by == "image_id"


def test_an_index_is_streamed_with_the_chosen_platforms_layers(tmp_path: Path) -> None:
    arm, amd = make_image("arm64", seed=3), make_image("amd64", seed=2)
    members, digest = oci_index_members({"linux/amd64": amd, "linux/arm64": arm})
    path = write_tar(tmp_path / "multi.tar", members)
    out = io.BytesIO()
    images.docker_archive_stream(str(path), images.read_archive(str(path), digest, platform="linux/arm64"), out)
    manifest = json.loads(tar_files(out.getvalue())["manifest.json"])
    assert manifest == [{"Config": blob_path(arm.image_id), "RepoTags": None,
                         "Layers": [blob_path(sha(gzip.compress(layer, mtime=0))) for layer in arm.layers]}]


# --- pulling through dockerd's API ------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: Message
    body: bytes

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.path).query)

    def auth(self) -> Optional[dict[str, str]]:
        header = self.headers.get("X-Registry-Auth")
        return None if header is None else cast(dict, json.loads(base64.urlsafe_b64decode(header)))


PROGRESS = [
    {"status": "Pulling from vllm/vllm-openai", "id": DIGEST},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "4f4fb700ef54"},
    {"status": "Downloading", "progressDetail": {"current": 1048576, "total": 4194304},
     "progress": "[=====>   ]  1.049MB/4.194MB", "id": "4f4fb700ef54"},
    {"status": "Pull complete", "progressDetail": {}, "id": "4f4fb700ef54"},
    {"status": f"Digest: {DIGEST}"},
    {"status": f"Status: Downloaded newer image for {REPO}@{DIGEST}"},
]


@dataclass
class DockerdScript:
    """What the dockerd double answers: a status and message (not 200), or a stream of events."""

    status: int = 200
    message: str = ""
    raw: Optional[bytes] = None  # a body that is not JSON, for a status that is not 200
    events: list[Any] = field(default_factory=lambda: list(PROGRESS))
    cut: bool = False  # the stream ends in the middle of a chunk, as when dockerd stops
    on_pull: Optional[Callable[[Request], None]] = None


class Dockerd(socketserver.UnixStreamServer):
    def __init__(self, path: str) -> None:
        self.requests: list[Request] = []
        self.script = DockerdScript()
        super().__init__(path, DockerdHandler)


class DockerdHandler(http.server.BaseHTTPRequestHandler):
    """dockerd's /images/create: a JSON error, or a chunked stream of JSON events, one a line."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        dockerd = cast(Dockerd, self.server)
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(self.command, self.path, self.headers, self.rfile.read(length) if length else b"")
        dockerd.requests.append(request)
        script = dockerd.script
        self.close_connection = True
        if script.status != 200:
            body = script.raw if script.raw is not None else json.dumps({"message": script.message}).encode()
            self.send_response(script.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if script.on_pull is not None:
            script.on_pull(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in script.events:
            line = (event if isinstance(event, bytes) else json.dumps(event).encode()) + b"\r\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        if script.cut:
            self.wfile.write(b'100\r\n{"status":"Downloading","id":"4f4f')
            return
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def dockerd() -> Iterator[Dockerd]:
    """A dockerd double on a unix socket (in a short directory: a socket's path is at most 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="dockerd-", dir="/tmp") as directory:
        server = Dockerd(os.path.join(directory, "docker.sock"))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)


def sock(server: Dockerd) -> str:
    return cast(str, server.server_address)


def test_auth_header_is_urlsafe_base64_json_with_the_registry() -> None:
    header = images.auth_header({"username": "bot", "password": PASSWORD}, "registry.example:5000")
    assert list(header) == ["X-Registry-Auth"]
    assert json.loads(base64.urlsafe_b64decode(header["X-Registry-Auth"])) == {
        "username": "bot", "password": PASSWORD, "serveraddress": "registry.example:5000"}
    given = images.auth_header({"username": "bot", "password": PASSWORD, "registry": "mirror.example"}, "docker.io")
    assert json.loads(base64.urlsafe_b64decode(given["X-Registry-Auth"]))["serveraddress"] == "mirror.example"
    assert images.auth_header(None, "docker.io") == {}
    assert images.auth_header({}, "docker.io") == {}
    assert images.auth_header({"username": "", "password": PASSWORD}, "docker.io") == {}


def test_a_pull_asks_dockerd_for_the_digest_with_the_credentials(dockerd: Dockerd) -> None:
    images.pull(IMAGE, {"username": "bot", "password": PASSWORD}, sock(dockerd), 10)  # returns: no error
    [request] = dockerd.requests
    assert request.method == "POST" and urlsplit(request.path).path == "/images/create"
    assert request.query == {"fromImage": [REPO], "tag": [DIGEST]}
    assert request.auth() == {"username": "bot", "password": PASSWORD, "serveraddress": "registry.example:5000"}


def test_a_pull_without_credentials_sends_no_auth_header(dockerd: Dockerd) -> None:
    images.pull(f"vllm/vllm-openai@{DIGEST}", None, sock(dockerd), 10)
    [request] = dockerd.requests
    assert request.headers.get("X-Registry-Auth") is None
    assert request.query == {"fromImage": ["vllm/vllm-openai"], "tag": [DIGEST]}


def test_a_digest_the_registry_lacks_is_one_sentence_naming_the_recipes_image(dockerd: Dockerd) -> None:
    said = f"manifest for {REPO}@{DIGEST} not found: manifest unknown: manifest unknown"
    dockerd.script = DockerdScript(status=404, message=said)
    with pytest.raises(ImageError) as err:
        images.pull(IMAGE, {"username": "bot", "password": PASSWORD}, sock(dockerd), 10)
    text = str(err.value)
    assert text == images.pull_failure(IMAGE, 404, said)
    assert text.startswith(f"the registry registry.example:5000 has no image {REPO}@{DIGEST} (the recipe's `image`)")
    assert "sparkserve recipe pin --check RECIPE" in text and said in text
    assert PASSWORD not in text and "\n" not in text


def test_refused_credentials_in_the_stream_are_the_credentials_sentence(dockerd: Dockerd) -> None:
    dockerd.script = DockerdScript(events=PROGRESS[:1] + [
        {"errorDetail": {"message": "unauthorized: authentication required"},
         "error": "unauthorized: authentication required"}])
    with pytest.raises(ImageError) as err:
        images.pull(IMAGE, {"username": "bot", "password": PASSWORD}, sock(dockerd), 10)
    text = str(err.value)
    assert text == (f"the registry registry.example:5000 refused to give {REPO}@{DIGEST}: it wants credentials that "
                    "can read it (image_registry_auth, from Ansible Vault) (unauthorized: authentication required)")
    assert PASSWORD not in text


def test_a_stream_of_progress_is_a_pull_done(dockerd: Dockerd) -> None:
    dockerd.script = DockerdScript(events=[b"not json", PROGRESS[0], b"[1, 2]", *PROGRESS[1:]])
    images.pull(IMAGE, None, sock(dockerd), 10)  # returns: no error
    assert len(dockerd.requests) == 1


def test_an_error_body_that_is_not_json_is_quoted(dockerd: Dockerd) -> None:
    dockerd.script = DockerdScript(status=500, raw=b"Internal Server Error: overlayfs:\n  no space left on device")
    with pytest.raises(ImageError) as err:
        images.pull(IMAGE, None, sock(dockerd), 10)
    assert str(err.value) == (f"the pull of {REPO}@{DIGEST} from registry.example:5000 failed: Internal Server Error: "
                              "overlayfs: no space left on device")


def test_a_pull_without_dockerd_says_so(tmp_path: Path) -> None:
    with pytest.raises(ImageError) as err:
        images.pull(IMAGE, None, str(tmp_path / "docker.sock"), 5)
    assert str(err.value).startswith(f"cannot ask dockerd ({tmp_path / 'docker.sock'}) to pull {REPO}@{DIGEST}: ")


def test_a_stream_cut_by_dockerd_is_an_image_error(dockerd: Dockerd) -> None:
    dockerd.script = DockerdScript(cut=True)
    with pytest.raises(ImageError) as err:
        images.pull(IMAGE, {"username": "bot", "password": PASSWORD}, sock(dockerd), 10)
    assert f"to pull {REPO}@{DIGEST}" in str(err.value) and PASSWORD not in str(err.value)


@pytest.mark.parametrize(("status", "message", "kind"), [
    (404, f"manifest for {REPO}@{DIGEST} not found: manifest unknown: manifest unknown", "missing"),
    (500, "manifest unknown", "missing"),
    (404, "pull access denied for vllm/vllm-openai, repository does not exist or may require 'docker login': "
          "denied: requested access to the resource is denied", "credentials"),
    (401, "Get https://registry.example:5000/v2/: no basic auth credentials", "credentials"),
    (500, "unauthorized: incorrect username or password", "credentials"),
    (500, "Get https://registry.example:5000/v2/: dial tcp: lookup registry.example: no such host", "other"),
])
def test_pull_failure_tells_a_missing_digest_from_refused_credentials(status: int, message: str, kind: str) -> None:
    text = images.pull_failure(IMAGE, status, message + "\n\n")
    expected = {"missing": "has no image", "credentials": "it wants credentials", "other": "failed: "}[kind]
    assert expected in text and "registry.example:5000" in text and f"{REPO}@{DIGEST}" in text
    assert sum(mark in text for mark in ("has no image", "it wants credentials", "failed: ")) == 1
    assert text.endswith(f"({message})" if kind != "other" else message)


# --- the plan: filters -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("image", "local"), [
    (IMAGE, LOCAL),
    (f"{REPO}@{DIGEST}", LOCAL),
    (f"vllm/vllm-openai:v0.9.1@{DIGEST}", f"vllm/vllm-openai:sha256-{HEX}"),
    (f"localhost:5000/vllm:nightly@{DIGEST}", f"localhost:5000/vllm:sha256-{HEX}"),
    (f"nvcr.io/nvidia/vllm@{DIGEST}", f"nvcr.io/nvidia/vllm:sha256-{HEX}"),
])
def test_image_local_name(image: str, local: str) -> None:
    assert image_filter.image_local_name(image) == local


@pytest.mark.parametrize("image", ["vllm/vllm-openai:v0.9.1", f"{REPO}@sha256:{HEX[:40]}", ""])
def test_image_local_name_refuses_an_unpinned_image(image: str) -> None:
    with pytest.raises(AnsibleFilterError, match="is not pinned by digest; give REPO@sha256:<64 hex>"):
        image_filter.image_local_name(image)
    with pytest.raises(AnsibleFilterError, match="is not pinned by digest; give REPO@sha256:<64 hex>"):
        image_filter.image_cache_key(image)


def test_image_cache_key() -> None:
    assert image_filter.image_cache_key(f"localhost:5000/vllm:nightly@{DIGEST}") == f"sha256-{HEX}"


def test_the_filters_are_registered() -> None:
    filters = image_filter.FilterModule().filters()
    assert filters == {"image_local_name": image_filter.image_local_name,
                       "image_cache_key": image_filter.image_cache_key, "image_source": image_filter.image_source,
                       "image_lacking": image_filter.image_lacking,
                       "image_held_everywhere": image_filter.image_held_everywhere}


ID = "sha256:" + "1d" * 32


def test_image_source_with_an_archive_is_the_first_in_order() -> None:
    held = {"spark-1": ["-", "-"], "spark-2": [ID, ID]}
    assert image_filter.image_source(["spark-1", "spark-2"], held, True) == "spark-1"
    assert image_filter.image_source(["spark-2", "spark-1"], held, True) == "spark-2"


def test_image_source_from_a_registry_is_the_first_holding_the_digest() -> None:
    held = {"spark-3": [ID, ID], "spark-1": ["-", "-"], "spark-2": [ID, "-"]}
    assert image_filter.image_source(["spark-1", "spark-2", "spark-3"], held) == "spark-2"  # order, not held's
    assert image_filter.image_source(["spark-1", "spark-3", "spark-2"], held) == "spark-3"
    # Holding the local name alone is not holding the digest: only a pull keeps it.
    assert image_filter.image_source(["spark-1", "spark-4"], {"spark-1": ["-", "-"], "spark-4": ["-", ID]}) == "spark-1"


def test_image_source_from_a_registry_is_the_first_when_none_holds_it() -> None:
    held = {"spark-1": ["-", "-"], "spark-2": ["-"], "spark-3": []}
    assert image_filter.image_source(["spark-2", "spark-1", "spark-3", "spark-9"], held) == "spark-2"
    assert image_filter.image_source(["spark-9", "spark-1"], {"spark-1": [ID]}) == "spark-1"  # spark-9: not probed


def test_image_source_of_no_host_is_an_error() -> None:
    with pytest.raises(AnsibleFilterError, match="no host in this play"):
        image_filter.image_source([], {"spark-1": [ID, ID]})
    with pytest.raises(AnsibleFilterError):
        image_filter.image_source([], {}, True)


def test_image_lacking_is_every_other_node_without_the_image_under_its_name() -> None:
    held = {"spark-1": [ID, ID], "spark-2": ["-", "-"], "spark-3": [ID, "-"], "spark-4": ["-", OTHER_ID],
            "spark-5": ["-", ID], "spark-6": ["-"], "spark-7": []}
    assert image_filter.image_lacking(held, "spark-1", ID) == ["spark-2", "spark-3", "spark-4", "spark-6", "spark-7"]
    # The source is left out, whatever it holds; spark-1 holds it.
    assert image_filter.image_lacking(held, "spark-2", ID) == ["spark-3", "spark-4", "spark-6", "spark-7"]
    assert image_filter.image_lacking({"spark-1": [ID, ID]}, "spark-1", ID) == []
    # Another image under the name: every node with it lacks this one.
    assert image_filter.image_lacking(held, "spark-1", OTHER_ID) == ["spark-2", "spark-3", "spark-5", "spark-6",
                                                                     "spark-7"]


def test_image_lacking_in_check_mode_before_a_pull_is_every_other_node() -> None:
    held = {"spark-1": ["-", "-"], "spark-2": ["-", "-"], "spark-3": [ID, ID]}
    assert image_filter.image_lacking(held, "spark-1", "") == ["spark-2", "spark-3"]


# --- the docker and ssh doubles -----------------------------------------------------------------------------

FAKE_DOCKER = r'''
import hashlib, io, json, os, sys, tarfile, time

state = os.environ["FAKE_DOCKER_STATE"]
os.makedirs(os.path.join(state, "images"), exist_ok=True)
argv = sys.argv[1:]
with open(os.path.join(state, "calls.log"), "a") as log:
    log.write(json.dumps(argv) + "\n")


def knob(name):
    path = os.path.join(state, name)
    return open(path).read().strip() if os.path.exists(path) else None


def tags():
    path = os.path.join(state, "tags.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def set_tag(name, image_id):
    new = tags()
    new[name] = image_id
    with open(os.path.join(state, "tags.json"), "w") as out:
        json.dump(new, out)


def canonical(name):  # dockerd looks a reference both tagged and digested up by its digest
    if "@" not in name:
        return name
    repo, digest = name.split("@", 1)
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: len(repo) - len(last)] + last.split(":")[0]
    return repo + "@" + digest


def resolve(name):
    if name.startswith("sha256:") and os.path.exists(os.path.join(state, "images", name[7:])):
        return name
    return tags().get(canonical(name))


def fail(message, rc=1):
    sys.stderr.write(message + "\n")
    sys.exit(rc)


command = argv[0]
if argv[:2] == ["image", "inspect"]:
    assert argv[2:4] == ["--format", "{{.Id}}"], argv
    found = resolve(argv[4])
    if not found:
        fail(f"Error: No such image: {argv[4]}")
    print(found)
elif command == "tag":
    found = resolve(argv[1])
    if not found:
        fail(f"Error response from daemon: No such image: {argv[1]}")
    if knob("tag_fails"):
        fail("Error response from daemon: mkdir /var/lib/docker/image/overlay2: read-only file system")
    set_tag(argv[2], knob("tag_as") or found)
elif command == "save":
    found = resolve(argv[1])
    if not found:
        fail(f"Error response from daemon: reference does not exist")
    with open(os.path.join(state, "images", found[7:]), "rb") as image:
        sys.stdout.buffer.write(image.read())
elif command == "load":
    if knob("load_hangs"):
        time.sleep(float(knob("load_hangs")))
    if knob("load_dies_after"):
        sys.stdin.buffer.read(int(knob("load_dies_after")))
        fail("Error processing tar file(exit status 1): unexpected EOF")
    data = sys.stdin.buffer.read()
    with open(os.path.join(state, "loaded.log"), "a") as log:
        log.write(f"{len(data)} {hashlib.sha256(data).hexdigest()}\n")
    if not data:
        fail("Error: requested load from stdin, but stdin is empty")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            files = {i.name.removeprefix("./"): tar.extractfile(i).read() for i in tar if i.isfile()}
        entries = json.loads(files["manifest.json"])
    except (tarfile.TarError, KeyError, ValueError) as err:
        fail(f"Error processing tar file: {err}")
    for entry in entries:
        for name in [entry["Config"], *entry["Layers"]]:
            if name not in files:
                fail(f"Error: open /var/lib/docker/tmp/docker-import-1/{name}: no such file or directory")
        image_id = "sha256:" + hashlib.sha256(files[entry["Config"]]).hexdigest()
        if not knob("load_forgets"):
            with open(os.path.join(state, "images", image_id[7:]), "wb") as image:
                image.write(data)
        for name in entry.get("RepoTags") or []:
            set_tag(name, image_id)
            print(f"Loaded image: {name}")
        if not entry.get("RepoTags"):
            print(f"Loaded image ID: {image_id}")
else:
    fail(f"docker: unknown command {argv}")
'''

FAKE_SSH = r'''
import json, os, shlex, sys

args = sys.argv[1:]
while args[0] == "-o":
    args = args[2:]
host, separator, command = args
assert separator == "--", args
root = os.environ["FAKE_SSH_ROOT"]
with open(os.path.join(root, "ssh.log"), "a") as log:
    log.write(json.dumps([host, command]) + "\n")
if not os.path.isdir(os.path.join(root, host)):
    sys.stderr.write(f"ssh: connect to host {host} port 22: Connection refused\n")
    sys.exit(255)
os.environ["FAKE_DOCKER_STATE"] = os.path.join(root, host)
argv = shlex.split(command)
os.execvp(argv[0], argv)
'''


def script(path: Path, body: str) -> str:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return str(path)


class Host:
    """A node's dockerd as the docker double keeps it: images (by ID, their saved bytes), tags, every call."""

    def __init__(self, state: Path) -> None:
        self.state = state
        (state / "images").mkdir(parents=True, exist_ok=True)

    def add(self, image_id: str, data: bytes, *names: str) -> None:
        (self.state / "images" / image_id[7:]).write_bytes(data)
        tags = self.tags()
        tags.update({name: image_id for name in names})
        (self.state / "tags.json").write_text(json.dumps(tags))

    def knob(self, name: str, value: str) -> None:
        (self.state / name).write_text(value)

    def tags(self) -> dict[str, str]:
        path = self.state / "tags.json"
        return cast(dict, json.loads(path.read_text())) if path.exists() else {}

    def images(self) -> dict[str, bytes]:
        return {"sha256:" + p.name: p.read_bytes() for p in (self.state / "images").iterdir()}

    def calls(self) -> list[list[str]]:
        path = self.state / "calls.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def verbs(self) -> list[str]:
        return [" ".join(argv[:2]) if argv[0] == "image" else argv[0] for argv in self.calls()]


@dataclass
class Doubles:
    docker: str
    ssh: list[str]
    root: Path
    here: Host

    def host(self, name: str) -> Host:
        return Host(self.root / name)


@pytest.fixture
def doubles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Doubles:
    """The docker double on this node (spark-1) and, through the ssh double, on its peers."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    root = tmp_path / "nodes"
    root.mkdir()
    monkeypatch.setenv("FAKE_SSH_ROOT", str(root))
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(root / "spark-1"))
    return Doubles(docker=script(bin_dir / "docker", FAKE_DOCKER),
                   ssh=[script(bin_dir / "ssh", FAKE_SSH), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"],
                   root=root, here=Host(root / "spark-1"))


def run_main(main: Callable[[], None], args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        main()
    out = capsys.readouterr().out
    result = cast(dict, json.loads(out))
    result["_raw"] = out
    return result


# --- image_pull ---------------------------------------------------------------------------------------------


def test_image_pull_keeps_the_password_out_of_its_output() -> None:
    """The password is no_log; the rest of auth is not, as Ansible masks a no_log value everywhere in the output
    (a registry or a username that is part of the image's name would be masked in every message)."""
    auth = image_pull.ARGUMENT_SPEC["auth"]
    assert auth["type"] == "dict" and auth["options"]["password"]["no_log"] is True
    assert not auth.get("no_log") and not auth["options"]["username"].get("no_log")
    assert not auth["options"]["registry"].get("no_log")


@pytest.fixture
def pulled_image(doubles: Doubles, dockerd: Dockerd) -> str:
    """The image dockerd's pull gives: the docker double then holds it under REPO@DIGEST."""
    image = make_image(seed=7)
    path = Path(tempfile.mkstemp(dir=doubles.root)[1])
    write_tar(path, docker_save_members(image))

    def on_pull(request: Request) -> None:
        name = f"{request.query['fromImage'][0]}@{request.query['tag'][0]}"
        doubles.here.add(image.image_id, path.read_bytes(), name)

    dockerd.script.on_pull = on_pull
    return image.image_id


def pull_args(doubles: Doubles, dockerd: Dockerd, **more: Any) -> dict[str, Any]:
    return {"image": IMAGE, "socket": sock(dockerd), "docker": doubles.docker, "timeout_s": 30, **more}


def test_image_pull_in_check_mode_pulls_and_tags_nothing(doubles: Doubles, dockerd: Dockerd, pulled_image: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(image_pull.main, pull_args(doubles, dockerd, _ansible_check_mode=True), capsys)
    assert out["changed"] is True and out["pulled"] is True and out["tagged"] is True and out["image_id"] is None
    assert dockerd.requests == [] and doubles.here.tags() == {}
    assert doubles.here.verbs() == ["image inspect"]


def test_image_pull_pulls_once_and_names_the_image(doubles: Doubles, dockerd: Dockerd, pulled_image: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(image_pull.main, pull_args(doubles, dockerd, auth={"username": "bot", "password": PASSWORD}), capsys)
    assert out.get("failed") is not True, out
    assert out["changed"] is True and out["pulled"] is True and out["tagged"] is True
    assert out["image_id"] == pulled_image
    assert out["diff"] == images.tag_diff(LOCAL, None, pulled_image)
    [request] = dockerd.requests
    assert request.query == {"fromImage": [REPO], "tag": [DIGEST]}
    assert request.auth() == {"username": "bot", "password": PASSWORD, "serveraddress": "registry.example:5000"}
    assert doubles.here.tags() == {f"{REPO}@{DIGEST}": pulled_image, LOCAL: pulled_image}
    assert doubles.here.calls()[-1] == ["tag", pulled_image, LOCAL]
    assert PASSWORD not in out["_raw"]
    # Run again: nothing to pull, nothing to name.
    again = run_main(image_pull.main, pull_args(doubles, dockerd), capsys)
    assert again["changed"] is False and again["pulled"] is False and again["tagged"] is False
    assert again["image_id"] == pulled_image and again["diff"] == {}
    assert len(dockerd.requests) == 1 and doubles.here.verbs().count("tag") == 1


def test_image_pull_names_an_image_it_holds_by_digest_without_pulling(doubles: Doubles, dockerd: Dockerd,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    doubles.here.add(ID, b"saved", f"{REPO}@{DIGEST}", LOCAL.replace(HEX, "0" * 64))
    checked = run_main(image_pull.main, pull_args(doubles, dockerd, _ansible_check_mode=True), capsys)
    assert checked["changed"] is True and checked["pulled"] is False and checked["tagged"] is True
    assert LOCAL not in doubles.here.tags()
    out = run_main(image_pull.main, pull_args(doubles, dockerd, local_name="vllm-local:pinned"), capsys)
    assert out["changed"] is True and out["pulled"] is False and out["tagged"] is True and out["image_id"] == ID
    assert dockerd.requests == [] and doubles.here.tags()["vllm-local:pinned"] == ID


def test_image_pull_moves_a_local_name_that_names_another_image(doubles: Doubles, dockerd: Dockerd,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    doubles.here.add(ID, b"saved", f"{REPO}@{DIGEST}")
    doubles.here.add(OTHER_ID, b"old", LOCAL)
    out = run_main(image_pull.main, pull_args(doubles, dockerd), capsys)
    assert out["tagged"] is True and out["diff"]["before"] == f"{LOCAL} -> {OTHER_ID}\n"
    assert doubles.here.tags()[LOCAL] == ID


def test_image_pull_of_a_missing_digest_fails_with_the_sentence(doubles: Doubles, dockerd: Dockerd,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    said = f"manifest for {REPO}@{DIGEST} not found: manifest unknown: manifest unknown"
    dockerd.script = DockerdScript(status=404, message=said)
    out = run_main(image_pull.main, pull_args(doubles, dockerd, auth={"username": "vllm", "password": PASSWORD,
                                                                      "registry": "registry.example:5000"}), capsys)
    assert out["failed"] is True and out["kind"] == "image_pull_failed" and out["pulled"] is False
    assert out["invocation"]["module_args"]["auth"]["password"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    assert "warnings" not in out, out["warnings"]
    # The sentence names the registry and the repository as they are: a username or a registry that is part of
    # the image's name is not masked (only the password is secret).
    assert out["msg"] == images.pull_failure(IMAGE, 404, said)
    assert out["msg"].startswith(f"the registry registry.example:5000 has no image {REPO}@{DIGEST}")
    assert PASSWORD not in out["_raw"]
    assert doubles.here.verbs() == ["image inspect"]


def test_image_pull_with_refused_credentials_fails_without_the_password(doubles: Doubles, dockerd: Dockerd,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    dockerd.script = DockerdScript(events=[{"status": "Pulling"}, {"error": "unauthorized: authentication required",
                                                                   "errorDetail": {"message": "unauthorized"}}])
    out = run_main(image_pull.main, pull_args(doubles, dockerd, auth={"username": "bot", "password": PASSWORD}), capsys)
    assert out["failed"] is True and out["kind"] == "image_pull_failed"
    assert "image_registry_auth" in out["msg"] and "registry.example:5000" in out["msg"]
    assert PASSWORD not in out["_raw"]
    assert dockerd.requests[0].auth() == {"username": "bot", "password": PASSWORD,
                                          "serveraddress": "registry.example:5000"}


def test_image_pull_when_dockerd_does_not_find_what_it_pulled(doubles: Doubles, dockerd: Dockerd,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(image_pull.main, pull_args(doubles, dockerd), capsys)  # no on_pull: nothing lands
    assert out["failed"] is True and out["kind"] == "image_pull_failed"
    assert out["msg"] == f"dockerd pulled {IMAGE} but does not find it"


def test_image_pull_fails_when_docker_tag_fails(doubles: Doubles, dockerd: Dockerd, pulled_image: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    doubles.here.knob("tag_fails", "1")
    out = run_main(image_pull.main, pull_args(doubles, dockerd), capsys)
    assert out["failed"] is True and out["kind"] == "image_tag_failed"
    assert out["msg"] == (f"docker tag {pulled_image} {LOCAL} failed: Error response from daemon: mkdir "
                          "/var/lib/docker/image/overlay2: read-only file system")


def test_image_pull_of_an_unpinned_image_is_refused(doubles: Doubles, dockerd: Dockerd,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(image_pull.main, pull_args(doubles, dockerd, image=f"{REPO}:latest"), capsys)
    assert out["failed"] is True and out["kind"] == "image_refused" and "not pinned by digest" in out["msg"]
    assert dockerd.requests == [] and doubles.here.calls() == []


def test_image_pull_without_dockerd_fails(doubles: Doubles, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(image_pull.main, {"image": IMAGE, "socket": str(tmp_path / "none.sock"), "docker": doubles.docker,
                                     "auth": {"username": "bot", "password": PASSWORD}}, capsys)
    assert out["failed"] is True and out["kind"] == "image_pull_failed" and "cannot ask dockerd" in out["msg"]
    assert PASSWORD not in out["_raw"]


# --- image_archive ------------------------------------------------------------------------------------------


def archive_args(doubles: Doubles, path: Path, **more: Any) -> dict[str, Any]:
    return {"path": str(path), "image": IMAGE, "docker": doubles.docker, "platform": "linux/arm64", **more}


def oci_archive(tmp_path: Path, image: Img) -> tuple[Path, str]:
    members, digest = oci_members(image)
    return write_tar(tmp_path / "vllm.oci.tar", members), f"{REPO}@{digest}"


def test_image_archive_refuses_a_wrong_archive_before_loading(doubles: Doubles, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = oci_archive(tmp_path, make_image())
    out = run_main(image_archive.main, archive_args(doubles, path), capsys)  # IMAGE names another digest
    assert out["failed"] is True and out["kind"] == "archive_refused"
    assert out["msg"] == (f"the image archive {path} holds neither the recipe's manifest {DIGEST} nor a docker save "
                          "manifest.json")
    assert doubles.here.calls() == []  # docker was not asked anything, least of all to load


def test_image_archive_refuses_a_docker_save_archive_of_another_image(doubles: Doubles, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(make_image()))
    out = run_main(image_archive.main, archive_args(doubles, path, image_id=OTHER_ID), capsys)
    assert out["kind"] == "archive_refused" and f"not the recipe's image_id {OTHER_ID}" in out["msg"]
    assert "load" not in doubles.here.verbs()


def test_image_archive_loads_an_oci_archive_once(doubles: Doubles, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    path, pinned = oci_archive(tmp_path, image)
    local = images.local_ref(pinned)
    out = run_main(image_archive.main, archive_args(doubles, path, image=pinned), capsys)
    assert out.get("failed") is not True, out
    assert out["changed"] is True and out["loaded"] is True and out["tagged"] is True
    assert out["image_id"] == image.image_id and out["checked_by"] == "digest"
    assert out["diff"] == images.tag_diff(local, None, image.image_id)
    assert doubles.here.verbs() == ["image inspect", "image inspect", "load", "image inspect", "tag"]
    assert doubles.here.tags() == {local: image.image_id}
    # docker load was given the layout and a manifest.json of its own.
    assert set(tar_files(doubles.here.images()[image.image_id])) == set(oci_members(image)[0]) | {"manifest.json"}
    again = run_main(image_archive.main, archive_args(doubles, path, image=pinned), capsys)
    assert again["changed"] is False and again["loaded"] is False and again["tagged"] is False
    assert doubles.here.verbs().count("load") == 1 and doubles.here.verbs().count("tag") == 1


@pytest.mark.parametrize("compress", [False, True])
def test_image_archive_loads_a_docker_save_archive_by_image_id(doubles: Doubles, tmp_path: Path, compress: bool,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image), compress=compress)
    out = run_main(image_archive.main, archive_args(doubles, path, image_id=image.image_id), capsys)
    assert out.get("failed") is not True, out
    assert out["changed"] is True and out["loaded"] is True and out["checked_by"] == "image_id"
    assert doubles.here.tags() == {LOCAL: image.image_id}
    assert doubles.here.images()[image.image_id] == path.read_bytes()  # the archive itself, as it is
    again = run_main(image_archive.main, archive_args(doubles, path, image_id=image.image_id), capsys)
    assert again["changed"] is False and doubles.here.verbs().count("load") == 1


def test_image_archive_in_check_mode_loads_nothing(doubles: Doubles, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image))
    out = run_main(image_archive.main, archive_args(doubles, path, image_id=image.image_id, _ansible_check_mode=True),
                   capsys)
    assert out["changed"] is True and out["loaded"] is True and out["tagged"] is True
    assert out["diff"] == images.tag_diff(LOCAL, None, image.image_id)
    assert doubles.here.verbs() == ["image inspect", "image inspect"] and doubles.here.tags() == {}


def test_image_archive_without_load_only_checks(doubles: Doubles, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    path, pinned = oci_archive(tmp_path, image)
    out = run_main(image_archive.main, archive_args(doubles, path, image=pinned, load=False), capsys)
    assert out["changed"] is False and out["image_id"] == image.image_id and out["loaded"] is False
    assert doubles.here.calls() == []


def test_image_archive_names_an_image_the_node_holds_without_loading(doubles: Doubles, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image))
    doubles.here.add(image.image_id, b"held before", "vllm:old")
    doubles.here.add(OTHER_ID, b"other", LOCAL)
    out = run_main(image_archive.main, archive_args(doubles, path, image_id=image.image_id), capsys)
    assert out["changed"] is True and out["loaded"] is False and out["tagged"] is True
    assert out["diff"]["before"] == f"{LOCAL} -> {OTHER_ID}\n"
    assert "load" not in doubles.here.verbs() and doubles.here.tags()[LOCAL] == image.image_id


def test_image_archive_chooses_the_platform_of_an_index(doubles: Doubles, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    arm, amd = make_image("arm64", seed=3), make_image("amd64", seed=2)
    members, digest = oci_index_members({"linux/amd64": amd, "linux/arm64": arm})
    path = write_tar(tmp_path / "multi.tar", members)
    out = run_main(image_archive.main, archive_args(doubles, path, image=f"{REPO}@{digest}", platform="linux/amd64"),
                   capsys)
    assert out.get("failed") is not True, out
    assert out["image_id"] == amd.image_id and set(doubles.here.images()) == {amd.image_id}


def test_image_archive_reports_what_docker_load_said(doubles: Doubles, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image(big=300_000)  # more than a pipe holds: docker load stops while it is being written to
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image))
    doubles.here.knob("load_dies_after", "4096")
    out = run_main(image_archive.main, archive_args(doubles, path, image_id=image.image_id), capsys)
    assert out["failed"] is True and out["kind"] == "archive_load_failed"
    assert out["msg"] == (f"docker load of {path} failed: Error processing tar file(exit status 1): unexpected EOF")
    assert doubles.here.tags() == {} and "tag" not in doubles.here.verbs()


def test_image_archive_fails_when_docker_load_does_not_load_the_image(doubles: Doubles, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image))
    doubles.here.knob("load_forgets", "1")
    out = run_main(image_archive.main, archive_args(doubles, path, image_id=image.image_id), capsys)
    assert out["kind"] == "archive_load_failed" and out["msg"].endswith(f"it did not load {image.image_id}")


def test_image_archive_fails_when_docker_tag_fails(doubles: Doubles, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    path = write_tar(tmp_path / "vllm.tar", docker_save_members(image))
    doubles.here.knob("tag_fails", "1")
    out = run_main(image_archive.main, archive_args(doubles, path, image_id=image.image_id), capsys)
    assert out["failed"] is True and out["kind"] == "image_tag_failed"
    assert out["msg"].startswith(f"docker tag {image.image_id} {LOCAL} failed: Error response from daemon: ")


# --- image_relay ----------------------------------------------------------------------------------------------


@pytest.fixture
def source(doubles: Doubles, tmp_path: Path) -> str:
    """This node holds an image (as docker save gives it: RepoTags null) too large for one pipe's buffer."""
    image = make_image(seed=5, big=400_000)
    path = write_tar(tmp_path / "saved.tar", docker_save_members(image))
    doubles.here.add(image.image_id, path.read_bytes(), "vllm/vllm-openai:v0.9.1")
    for peer in ("spark-2", "spark-3"):
        doubles.host(peer)
    return image.image_id


def test_send_relays_the_image_and_reads_its_name_back(doubles: Doubles, source: str) -> None:
    assert image_relay.send(source, LOCAL, "spark-2", doubles.ssh, doubles.docker, 60) == ""
    peer = doubles.host("spark-2")
    assert peer.images() == {source: doubles.here.images()[source]}  # every byte docker save gave
    assert peer.tags() == {LOCAL: source}
    assert peer.calls() == [["load"], ["tag", source, LOCAL], ["image", "inspect", "--format", "{{.Id}}", LOCAL]]
    assert doubles.here.calls() == [["save", source]]
    assert doubles.host("spark-3").calls() == []


def test_send_says_what_docker_load_said_when_it_dies_mid_stream(doubles: Doubles, source: str) -> None:
    doubles.host("spark-3").knob("load_dies_after", "8192")
    error = image_relay.send(source, LOCAL, "spark-3", doubles.ssh, doubles.docker, 60)
    assert error == "docker load there stopped: Error processing tar file(exit status 1): unexpected EOF"
    assert doubles.host("spark-3").tags() == {} and doubles.host("spark-3").images() == {}


def test_send_refuses_a_name_that_reads_back_as_another_image(doubles: Doubles, source: str) -> None:
    doubles.host("spark-2").knob("tag_as", OTHER_ID)
    error = image_relay.send(source, LOCAL, "spark-2", doubles.ssh, doubles.docker, 60)
    assert error == f"{LOCAL} there is {OTHER_ID} after the relay, not {source}"


def test_send_says_when_the_tag_fails(doubles: Doubles, source: str) -> None:
    doubles.host("spark-2").knob("load_forgets", "1")
    error = image_relay.send(source, LOCAL, "spark-2", doubles.ssh, doubles.docker, 60)
    assert error == f"docker tag {source} {LOCAL} failed: Error response from daemon: No such image: {source}"


def test_send_to_an_unreachable_peer_says_what_ssh_said(doubles: Doubles, source: str) -> None:
    error = image_relay.send(source, LOCAL, "spark-9", doubles.ssh, doubles.docker, 60)
    assert error == "docker load there stopped: ssh: connect to host spark-9 port 22: Connection refused"


def test_send_of_an_image_this_node_lacks_fails(doubles: Doubles, source: str) -> None:
    error = image_relay.send(OTHER_ID, LOCAL, "spark-2", doubles.ssh, doubles.docker, 60)
    assert error.startswith("docker ")
    assert doubles.host("spark-2").tags() == {}


def test_send_gives_up_after_its_timeout(doubles: Doubles, source: str) -> None:
    doubles.host("spark-2").knob("load_hangs", "20")
    started = time.monotonic()
    error = image_relay.send(source, LOCAL, "spark-2", doubles.ssh, doubles.docker, 1)
    assert error == "no end after 1 s"
    assert time.monotonic() - started < 10
    assert doubles.host("spark-2").tags() == {}


def relay_args(doubles: Doubles, image_id: str, peers: list[str], **more: Any) -> dict[str, Any]:
    return {"image_id": image_id, "local_name": LOCAL, "peers": peers, "ssh": doubles.ssh, "docker": doubles.docker,
            "timeout_s": 60, **more}


def test_relay_sends_to_every_peer(doubles: Doubles, source: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(image_relay.main, relay_args(doubles, source, ["spark-2", "spark-3", "spark-2"]), capsys)
    assert out.get("failed") is not True, out
    assert out["changed"] is True and out["sent"] == ["spark-2", "spark-3"] and out["unreached"] == []
    for peer in ("spark-2", "spark-3"):
        assert doubles.host(peer).tags() == {LOCAL: source}
        assert doubles.host(peer).verbs() == ["load", "tag", "image inspect"]


def test_relay_fails_naming_the_peer_it_did_not_reach(doubles: Doubles, source: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    doubles.host("spark-3").knob("load_dies_after", "8192")
    out = run_main(image_relay.main, relay_args(doubles, source, ["spark-2", "spark-3"]), capsys)
    assert out["failed"] is True and out["kind"] == "image_relay_failed" and out["changed"] is True
    assert out["sent"] == ["spark-2"]
    said = "docker load there stopped: Error processing tar file(exit status 1): unexpected EOF"
    assert out["unreached"] == [{"node": "spark-3", "error": said}]
    assert out["msg"] == f"the image {source[:19]} did not reach spark-3 over the fabric: {said} (run again to send it)"
    assert "spark-2" not in out["msg"]
    assert doubles.host("spark-2").tags() == {LOCAL: source} and doubles.host("spark-3").tags() == {}


def test_relay_in_check_mode_sends_nothing(doubles: Doubles, source: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(image_relay.main, relay_args(doubles, source, ["spark-2", "spark-3"], _ansible_check_mode=True),
                   capsys)
    assert out["changed"] is True and out["sent"] == ["spark-2", "spark-3"] and out["unreached"] == []
    assert doubles.here.calls() == [] and not (doubles.root / "ssh.log").exists()
    assert doubles.host("spark-2").calls() == [] and doubles.host("spark-3").calls() == []


def test_relay_to_no_peer_changes_nothing(doubles: Doubles, source: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(image_relay.main, relay_args(doubles, source, []), capsys)
    assert out["changed"] is False and out["sent"] == [] and doubles.here.calls() == []


def test_image_held_everywhere_only_when_every_node_holds_the_pulled_image_under_its_name() -> None:
    # The head pulled (the digest and the local name), the other received it over the fabric (the local name only).
    assert image_filter.image_held_everywhere({"spark-1": [ID, ID], "spark-2": ["-", ID]})
    assert image_filter.image_held_everywhere({"spark-1": [ID, ID]})
    # A node without it, or with another image under the name, or nobody holding the digest: something to bring.
    assert not image_filter.image_held_everywhere({"spark-1": [ID, ID], "spark-2": ["-", "-"]})
    assert not image_filter.image_held_everywhere({"spark-1": [ID, ID], "spark-2": ["-", OTHER_ID]})
    assert not image_filter.image_held_everywhere({"spark-1": [ID, "-"], "spark-2": ["-", ID]})
    assert not image_filter.image_held_everywhere({"spark-1": ["-", ID], "spark-2": ["-", ID]})
    assert not image_filter.image_held_everywhere({"spark-1": [ID], "spark-2": []})
    assert not image_filter.image_held_everywhere({})
