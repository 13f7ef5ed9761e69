#!/usr/bin/env python3
"""Build a lab container image from a Debian root made with debootstrap.

There is no Docker Hub here, so every lab image starts as a Debian root:
``debootstrap`` makes it, a folder of files is laid over it, a few paths are
removed, and ``docker import`` turns the tree into an image.

The image tag is a hash of every input (the spec, the overlay files with
their modes, this program), so a second build with the same inputs finds the
image already there and does nothing.  The result is one JSON line on
stdout per spec, in the order given:
``{"image": "NAME:TAG", "built": true|false, "inputs_hash": ...}``.

Usage::

    build_image.py --spec lab/node/image.yml [--spec lab/engine/image.yml ...] [--dry-run]

Several specs are built at once: each missing image starts as soon as its
base is there (a base the specs share is built once), so the debootstrap
roots of different images download and install side by side.

The spec (YAML) of an image made from a Debian root::

    name: sparkserve-lab/node       # repository of the image
    suite: bookworm                 # Debian release
    variant: minbase                # debootstrap variant
    packages: [systemd, ...]        # --include list
    rootfs: rootfs                  # folder laid over the root (relative)
    remove: [etc/machine-id]        # globs removed after the overlay
    changes: ['CMD ["/sbin/init"]'] # docker import --change lines

or of an image built on another lab image with ``docker build``::

    name: sparkserve-lab/engine
    base: ../python/image.yml       # the spec of the image to build FROM
    dockerfile: Dockerfile          # in the spec's folder (the build context)

The Dockerfile gets the base image's reference as the build argument BASE;
the base's hash is part of this image's hash, and the base is built first.

The Debian mirror is the one this machine's apt uses (read from its sources),
so the build goes where the machine's own package installs go.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import yaml

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]

APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))


class SpecError(ValueError):
    """The image spec is missing a field or has a wrong one."""


@dataclass(frozen=True)
class ImageSpec:
    """What an image is built from."""

    name: str
    suite: str
    variant: str
    packages: tuple[str, ...]
    rootfs: Path | None
    remove: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()
    source: Path = field(default=Path("."))
    base: "ImageSpec | None" = None
    dockerfile: Path | None = None

    @classmethod
    def _load_derived(cls, path: Path, data: dict) -> "ImageSpec":
        """A spec built with docker build on top of another spec's image."""
        for key in ("name", "dockerfile"):
            if key not in data:
                raise SpecError(f"{path}: '{key}' is required with 'base'")
        dockerfile = path.parent / str(data["dockerfile"])
        if not dockerfile.is_file():
            raise SpecError(f"{path}: dockerfile {data['dockerfile']} does not exist")
        base_path = (path.parent / str(data["base"])).resolve()
        if base_path == path.resolve():
            raise SpecError(f"{path}: an image cannot be its own base")
        base = cls.load(base_path)
        return cls(name=str(data["name"]), suite=base.suite, variant="docker-build", packages=(),
                   rootfs=path.parent.resolve(), source=path, base=base, dockerfile=dockerfile)

    @classmethod
    def load(cls, path: Path) -> "ImageSpec":
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise SpecError(f"{path}: an image spec is a mapping")
        if "base" in data:
            return cls._load_derived(path, data)
        for key in ("name", "suite", "packages"):
            if key not in data:
                raise SpecError(f"{path}: '{key}' is required")
        if not re.fullmatch(r"[a-z0-9][a-z0-9._/-]*", str(data["name"])):
            raise SpecError(f"{path}: name '{data['name']}' is not a valid image repository")
        packages = data["packages"]
        if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
            raise SpecError(f"{path}: packages is a list of Debian package names")
        rootfs = data.get("rootfs")
        rootfs_path = (path.parent / rootfs).resolve() if rootfs else None
        if rootfs_path is not None and not rootfs_path.is_dir():
            raise SpecError(f"{path}: rootfs folder {rootfs} does not exist")
        return cls(
            name=str(data["name"]),
            suite=str(data["suite"]),
            variant=str(data.get("variant", "minbase")),
            packages=tuple(sorted(packages)),
            rootfs=rootfs_path,
            remove=tuple(data.get("remove", [])),
            changes=tuple(data.get("changes", [])),
            source=path,
        )


SKIPPED_NAMES = frozenset({"__pycache__", ".pytest_cache"})


def overlay_files(root: Path) -> list[Path]:
    """Every file, link and folder under root, sorted, relative to root (caches left out)."""
    found = [p.relative_to(root) for p in root.rglob("*") if not SKIPPED_NAMES.intersection(p.relative_to(root).parts)]
    return sorted(found, key=lambda p: p.as_posix())


def inputs_hash(spec: ImageSpec, program: Path = Path(__file__)) -> str:
    """A hash of everything the image is made from."""
    digest = hashlib.sha256()
    recipe = {
        "suite": spec.suite,
        "variant": spec.variant,
        "packages": list(spec.packages),
        "remove": list(spec.remove),
        "changes": list(spec.changes),
    }
    digest.update(json.dumps(recipe, sort_keys=True).encode())
    digest.update(program.read_bytes())
    if spec.base is not None:
        digest.update(b"base:" + inputs_hash(spec.base, program).encode())
    if spec.rootfs is not None:
        for rel in overlay_files(spec.rootfs):
            full = spec.rootfs / rel
            info = full.lstat()
            digest.update(rel.as_posix().encode() + b"\0")
            digest.update(f"{stat.S_IFMT(info.st_mode)}:{stat.S_IMODE(info.st_mode):o}\0".encode())
            if full.is_symlink():
                digest.update(os.readlink(full).encode())
            elif full.is_file():
                digest.update(full.read_bytes())
    return digest.hexdigest()


def apt_mirror(sources: Sequence[Path] = APT_SOURCES) -> str | None:
    """The Debian mirror this machine's apt uses, or None for debootstrap's default."""
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            line = line.strip()
            deb822 = re.match(r"URIs:\s*(\S+)", line)
            if deb822 and "security" not in deb822.group(1):
                return deb822.group(1)
            classic = re.match(r"deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if classic and "security" not in classic.group(2):
                return classic.group(1)
    return None


def run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=True, text=True, capture_output=True)


def image_exists(image: str, runner: Runner = run) -> bool:
    try:
        runner(["docker", "image", "inspect", "--format", "{{.Id}}", image])
    except subprocess.CalledProcessError:
        return False
    return True


def lay_overlay(src: Path, dest: Path) -> None:
    """Copy the overlay folder over the root, keeping modes and links."""
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*SKIPPED_NAMES))


def remove_paths(root: Path, patterns: Sequence[str]) -> list[str]:
    removed: list[str] = []
    for pattern in patterns:
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            raise SpecError(f"remove pattern '{pattern}' must stay inside the root")
        for hit in sorted(glob.glob(str(root / pattern))):
            path = Path(hit)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path.relative_to(root).as_posix())
    return removed


def image_ref(spec: ImageSpec) -> str:
    """The reference an image of this spec gets: its name and its inputs' hash."""
    return f"{spec.name}:{inputs_hash(spec)[:16]}"


def build_derived(spec: ImageSpec, tag: str, runner: Runner = run) -> str:
    """docker build the spec's folder on top of its base image."""
    assert spec.base is not None and spec.dockerfile is not None and spec.rootfs is not None
    image = f"{spec.name}:{tag}"
    runner(["docker", "build", "--quiet", "--build-arg", f"BASE={image_ref(spec.base)}",
            "--file", str(spec.dockerfile), "--tag", image, str(spec.rootfs)])
    return image


def build(spec: ImageSpec, tag: str, workdir: Path, runner: Runner = run) -> str:
    """Make the root, lay the overlay, import it; return the image reference."""
    if spec.base is not None:
        return build_derived(spec, tag, runner)
    image = f"{spec.name}:{tag}"
    root = workdir / "root"
    cmd = ["debootstrap", f"--variant={spec.variant}", "--include=" + ",".join(spec.packages), spec.suite, str(root)]
    mirror = apt_mirror()
    if mirror:
        cmd.append(mirror)
    runner(cmd)
    if spec.rootfs is not None:
        lay_overlay(spec.rootfs, root)
    remove_paths(root, spec.remove)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (root / cache).glob("*"):
            if entry.is_file():
                entry.unlink()
    tarball = workdir / "root.tar"
    runner(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(tarball), "."])
    imported = ["docker", "import"]
    for change in spec.changes:
        imported += ["--change", change]
    imported += [str(tarball), image]
    runner(imported)
    return image


def chain_of(spec: ImageSpec) -> list[ImageSpec]:
    """The spec's bases, the deepest first, then the spec itself."""
    return ([] if spec.base is None else chain_of(spec.base)) + [spec]


def missing_images(specs: Sequence[ImageSpec]) -> list[ImageSpec]:
    """The images of the specs' chains that are not built yet, each once, a base before what is built on it."""
    seen: set[str] = set()
    missing: list[ImageSpec] = []
    for spec in specs:
        for one in chain_of(spec):
            ref = image_ref(one)
            if ref not in seen:
                seen.add(ref)
                if not image_exists(ref):
                    missing.append(one)
    return missing


def build_in_scratch(spec: ImageSpec, base: "Future[str] | None", workdir: Path | None) -> str:
    """Wait for the base's build (its failure is this one's), then build the spec in a scratch folder."""
    if base is not None:
        base.result()
    with tempfile.TemporaryDirectory(prefix="sparkserve-image-", dir=workdir or "/var/tmp") as work:
        return build(spec, inputs_hash(spec)[:16], Path(work))


def build_all(missing: Sequence[ImageSpec], workdir: Path | None) -> None:
    """Build every missing image, at once where one does not wait on another's base; raise the first failure."""
    builds: dict[str, Future[str]] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(missing))) as pool:
        for one in missing:
            base = builds.get(image_ref(one.base)) if one.base is not None else None
            builds[image_ref(one)] = pool.submit(build_in_scratch, one, base, workdir)
        for future in builds.values():
            future.result()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, action="append", required=True,
                        help="image spec (YAML); repeat it to build several images at once")
    parser.add_argument("--dry-run", action="store_true", help="say what would be built, build nothing")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args(argv)
    try:
        specs = [ImageSpec.load(path) for path in args.spec]
    except (SpecError, OSError, yaml.YAMLError) as err:
        print(f"build_image: {err}", file=sys.stderr)
        return 2
    missing = missing_images(specs)
    if missing and not args.dry_run:
        try:
            if args.workdir is not None:
                args.workdir.mkdir(parents=True, exist_ok=True)
            build_all(missing, args.workdir)
        except subprocess.CalledProcessError as err:
            tail = (err.stderr or err.stdout or "").strip().splitlines()[-5:]
            print(f"build_image: {' '.join(err.cmd[:2])} failed (rc={err.returncode}): " + " | ".join(tail),
                  file=sys.stderr)
            return 1
    built = {image_ref(one) for one in missing}
    for spec in specs:
        full_hash = inputs_hash(spec)
        refs = {image_ref(one) for one in chain_of(spec)}
        print(json.dumps({"image": f"{spec.name}:{full_hash[:16]}", "inputs_hash": full_hash,
                          "built": bool(refs & built)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
