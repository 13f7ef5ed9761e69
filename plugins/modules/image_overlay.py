#!/usr/bin/python
"""Make a recipe's patched engine files on a node, from the pinned image, verified before and after."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_overlay
short_description: Patch source files of a pinned engine image into an overlay folder, verified before and after
version_added: "0.1.0"
description:
  - For each file, reads the original out of the image, checks its sha256, applies the recipe's unified diff at
    zero fuzz and zero offset (every context and removed line must match exactly, at the very line the hunk header
    states; nothing is searched for), checks the result's sha256 and writes the result to I(dest) followed by the
    file's path inside the image (C(/usr/lib/x.py) becomes C(DEST/usr/lib/x.py)).
  - The engine role bind-mounts each result read-only over its path in the container; the module returns the
    mount strings (C(HOST_PATH:PATH:ro)).
  - When every result is already in I(dest) with its I(result_sha256), docker is not called at all.
  - Otherwise the originals are read from a container that is created with C(--pull never), C(--network none) and
    C(--entrypoint /bin/true) and never started (C(docker cp CID:PATH -)), and that is always removed afterwards.
  - Nothing is written unless every file passes every check; a failure names the file and the hashes, or the hunk,
    line and expected against found line of a patch that does not apply.
  - Results are written atomically (a temporary file renamed over the result), mode 0644, folders 0755.
  - Files in I(dest) that are not in I(files) (overlays of an older set) are removed and reported. I(dest) carries a
    marker file, C(.sparkserve-overlay); the module refuses to remove anything from a folder without it, so a
    mistaken I(dest) such as C(/var/lib) is never emptied.
  - Check mode reads the image and checks everything, and writes and removes nothing. Diff mode shows each result
    that changes (before is the file in I(dest), or the image's original when there is none).
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  diff_mode:
    support: full
options:
  image:
    description: The engine image, pinned by digest (C(REPO@sha256:<64 hex>)), or by the local name the image
      stage gives it on every node (C(REPO:sha256-<64 hex>)).
    type: str
    required: true
  dest:
    description: The overlay folder on the node, one per deployment, e.g. C(/var/lib/sparkserve/overlays/<deployment>).
    type: path
    required: true
  files:
    description: The files to patch.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path of the file inside the image.
        type: str
        required: true
      original_sha256:
        description: sha256 of the file as the pinned image has it.
        type: str
        required: true
      patch:
        description:
          - The unified diff of this one file (its text, not a file name).
          - Exactly one of O(files[].patch) and O(files[].patch_file).
        type: str
      patch_file:
        description:
          - The unified diff of this one file as a file on the node, e.g. in its verified copy of the overlays
            repository; read on the node, so it never travels to the controller.
          - Exactly one of O(files[].patch) and O(files[].patch_file).
        type: path
      result_sha256:
        description: sha256 of the file once patched.
        type: str
        required: true
  docker:
    description: The docker client to run.
    type: str
    default: docker
notes:
  - Standard library only; runs with the node's python3.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Make the engine overlays of this deployment
  sparkserve.deploy.image_overlay:
    image: "{{ recipe.image }}"
    dest: "/var/lib/sparkserve/overlays/{{ deployment }}"
    files:
      - path: /usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/glm4_moe.py
        original_sha256: "{{ '0' * 64 }}"
        patch: "{{ lookup('file', 'recipes/patches/glm4_moe.diff') }}"
        result_sha256: "{{ '1' * 64 }}"
  register: overlay

- name: Mount them over the image's files
  ansible.builtin.debug:
    msg: "{{ overlay.mounts | map('regex_replace', '^', '-v ') | join(' ') }}"
"""

RETURN = r"""
results:
  description: Every file, in the order given, with where its result lies on the node.
  returned: success
  type: list
  elements: dict
  contains:
    path:
      description: The path inside the image.
      type: str
    host_path:
      description: The result on the node.
      type: str
    sha256:
      description: The result's sha256.
      type: str
written:
  description: Results written (in check mode, that would be written).
  returned: success
  type: list
  elements: str
removed:
  description: Files of dest not in the set, removed (in check mode, that would be removed).
  returned: success
  type: list
  elements: str
mounts:
  description: One C(HOST_PATH:PATH:ro) bind mount per file, for the engine container.
  returned: success
  type: list
  elements: str
  sample: ["/var/lib/sparkserve/overlays/lab/usr/lib/x.py:/usr/lib/x.py:ro"]
errors:
  description: Every problem found, one message each; the failure message joins them with newlines.
  returned: failure
  type: list
  elements: str
"""

import hashlib
import io
import json
import os
import posixpath
import re
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import write_atomic
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.images import pinned_ref
from ansible_collections.sparkserve.deploy.plugins.module_utils.unified_diff import PatchError, apply_patch

Runner = Callable[[Sequence[str]], Tuple[int, bytes, str]]

# docker create --pull never, of an image the node does not hold.
NO_SUCH_IMAGE = re.compile(r"no such image", re.IGNORECASE)
IMAGE_PATTERN = re.compile(r"^[^\s@]+(@sha256:|:sha256-)[0-9a-f]{64}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
MARKER = ".sparkserve-overlay"
MARKER_NOTE = ("Made by sparkserve.deploy.image_overlay: what each result was made from. Every file here "
               "that is not in the deployment's overlay set is removed.")
DOCKER_TIMEOUT_S = 600


class OverlayError(Exception):
    """The overlays cannot be made; nothing was written. ``errors`` holds one message per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.msg = "\n".join(errors)
        self.errors = errors


class ImageMissingError(OverlayError):
    """The node does not hold the image (docker create --pull never found none): the image stage brings it."""


@dataclass
class Entry:
    path: str
    original_sha256: str
    patch: str
    result_sha256: str
    host_path: str


@dataclass
class Outcome:
    changed: bool
    results: list[dict[str, str]]
    written: list[str]
    removed: list[str]
    mounts: list[str]
    diff: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def run(argv: Sequence[str]) -> tuple[int, bytes, str]:
    """Run a docker command; (exit status, stdout bytes, stderr text)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=DOCKER_TIMEOUT_S, check=False)
    except OSError as err:
        return 127, b"", str(err)
    except subprocess.TimeoutExpired:
        return 124, b"", f"{' '.join(argv)} took longer than {DOCKER_TIMEOUT_S} s"
    return done.returncode, done.stdout, done.stderr.decode("utf-8", "replace")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def host_path(dest: str, path: str) -> str:
    return os.path.join(dest, path.lstrip("/"))


def validate(image: str, dest: str, files: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every problem with the arguments, one message each."""
    errors = []
    if not IMAGE_PATTERN.match(image or ""):
        errors.append(f"image {image!r} is not pinned by digest; give REPO@sha256:<64 hex> "
                      "or its local name REPO:sha256-<64 hex>")
    if not dest.startswith("/") or posixpath.normpath(dest) != dest.rstrip("/") or dest.rstrip("/") == "" \
            or ":" in dest or "," in dest:
        errors.append(f"dest {dest!r} must be an absolute, normal path other than /, without ':' or ','")
    seen: set[str] = set()
    for item in files:
        path = item["path"]
        if not path.startswith("/") or posixpath.normpath(path) != path or path == "/" or ":" in path or "," in path:
            errors.append(f"{path!r}: give the absolute, normal path of a file inside the image, without ':' or ','")
        elif path in seen:
            errors.append(f"{path}: given twice")
        seen.add(path)
        for key in ("original_sha256", "result_sha256"):
            if not HEX64.match(item[key].lower()):
                errors.append(f"{path}: {key} {item[key]!r} is not a sha256 (64 hex digits)")
    return errors


def existing_sha256(dest: str, path: str) -> str | None:
    """sha256 of the result already under dest; None when absent or reached through a link or a non-folder."""
    current = dest
    parts = path.strip("/").split("/")
    try:
        for k, part in enumerate(parts):
            current = os.path.join(current, part)
            mode = os.lstat(current).st_mode
            last = k == len(parts) - 1
            if (last and not stat.S_ISREG(mode)) or (not last and not stat.S_ISDIR(mode)):
                return None
        with open(current, "rb") as handle:
            return sha256(handle.read())
    except OSError:
        return None


def find_stale(dest: str, keep: set[str]) -> list[str]:
    """Files and links under dest that are not results of the set (the marker aside), sorted."""
    if not os.path.lexists(dest):
        return []
    if not os.path.isdir(dest):
        raise OverlayError([f"dest {dest} is not a folder"])
    stale = []
    for root, dirs, names in os.walk(dest):
        for name in list(dirs):
            if os.path.islink(os.path.join(root, name)):
                stale.append(os.path.join(root, name))
                dirs.remove(name)
        for name in names:
            full = os.path.join(root, name)
            if full == os.path.join(dest, MARKER):
                continue
            if "/" + os.path.relpath(full, dest) not in keep:
                stale.append(full)
    return sorted(stale)


def read_tar_member(stream: bytes, path: str) -> bytes:
    """The one regular file of a ``docker cp CID:PATH -`` tar stream."""
    name = posixpath.basename(path)
    try:
        with tarfile.open(fileobj=io.BytesIO(stream), mode="r:*") as tar:
            for member in tar:
                if member.name.strip("/").removeprefix("./") != name:
                    continue
                if member.issym() or member.islnk():
                    raise ValueError(f"is a link in the image (to {member.linkname}); give the path of the file it "
                                     "points to, the one a bind mount would cover")
                if not member.isfile():
                    raise ValueError("is not a regular file in the image")
                handle = tar.extractfile(member)
                if handle is None:
                    raise ValueError("could not be read from docker cp's tar stream")
                return handle.read()
    except tarfile.TarError as err:
        raise ValueError(f"docker cp did not give a readable tar stream: {err}") from err
    raise ValueError(f"docker cp's tar stream holds no {name}")


def extract(image: str, paths: Sequence[str], docker: str,
            runner: Runner) -> tuple[dict[str, bytes], list[str], list[str]]:
    """Read files out of the image through a container that is never started; (contents, errors, warnings)."""
    rc, out, err = runner([docker, "create", "--pull", "never", "--network", "none", "--entrypoint", "/bin/true",
                           image])
    ids = out.decode("utf-8", "replace").split()
    if rc != 0 and NO_SUCH_IMAGE.search(err):
        raise ImageMissingError([f"the image {image} is not on this node: the image stage brings it before the "
                            "overlays (site.yml --tags image)"])
    if rc != 0 or not ids:
        raise OverlayError([f"could not create a container of {image} to read its files from: "
                            f"{err.strip() or f'exit status {rc}'}"])
    cid = ids[-1]
    contents: dict[str, bytes] = {}
    errors: list[str] = []
    warnings: list[str] = []
    try:
        for path in paths:
            rc, out, err = runner([docker, "cp", f"{cid}:{path}", "-"])
            if rc != 0:
                errors.append(f"{path}: could not be read from {image}: {err.strip() or f'exit status {rc}'}")
                continue
            try:
                contents[path] = read_tar_member(out, path)
            except ValueError as problem:
                errors.append(f"{path}: {problem}")
    finally:
        rc, _, err = runner([docker, "rm", "-f", cid])
        if rc != 0:
            warnings.append(f"could not remove the container {cid} made to read {image}: {err.strip()}; "
                            f"remove it with: {docker} rm -f {cid}")
    return contents, errors, warnings


def build(entries: Sequence[Entry], originals: Mapping[str, bytes]) -> tuple[dict[str, bytes], list[str]]:
    """Check each original, patch it at zero fuzz and check the result; (results, errors)."""
    results: dict[str, bytes] = {}
    errors: list[str] = []
    for entry in entries:
        if entry.path not in originals:
            continue  # extract() said why
        original = originals[entry.path]
        got = sha256(original)
        if got != entry.original_sha256:
            errors.append(f"{entry.path}: original sha256 is {got}, the recipe expects {entry.original_sha256}: "
                          "the image is not the one the overlay was made for")
            continue
        try:
            result = apply_patch(original, entry.patch)
        except PatchError as err:
            errors.append(f"{entry.path}: the patch does not apply at zero fuzz to the original "
                          f"(sha256 {got}): {err.msg}")
            continue
        made = sha256(result)
        if made != entry.result_sha256:
            errors.append(f"{entry.path}: the patched file's sha256 is {made}, the recipe expects "
                          f"{entry.result_sha256}")
            continue
        results[entry.path] = result
    return results, errors


def ensure_dirs(dest: str, folder: str) -> None:
    """Make folder and every missing folder between dest and it, mode 0755."""
    if not os.path.isdir(dest):
        os.makedirs(dest, mode=0o755, exist_ok=True)
        os.chmod(dest, 0o755)
    rel = os.path.relpath(folder, dest)
    current = dest
    for part in [] if rel == "." else rel.split(os.sep):
        current = os.path.join(current, part)
        if not os.path.isdir(current):
            os.mkdir(current, 0o755)
            os.chmod(current, 0o755)


def remove_stale(dest: str, paths: Sequence[str]) -> None:
    """Remove the files and links, then the folders they leave empty (dest itself stays)."""
    for path in paths:
        if os.path.lexists(path):
            os.unlink(path)
        folder = os.path.dirname(path)
        while folder != dest and folder.startswith(dest + os.sep) and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
            folder = os.path.dirname(folder)


def as_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def read_plain(path: str) -> bytes | None:
    try:
        if os.path.islink(path):
            return f"(a link to {os.readlink(path)})\n".encode()
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def provenance(image: str, entries: Sequence["Entry"]) -> dict[str, Any]:
    """What the results are made from, as the marker records it."""
    return {"note": MARKER_NOTE, "image": pinned_ref(image),
            "files": {e.path: {"original_sha256": e.original_sha256, "result_sha256": e.result_sha256,
                               "patch_sha256": hashlib.sha256(e.patch.encode() if isinstance(e.patch, str) else e.patch)
                               .hexdigest()} for e in entries}}


def recorded(marker: str) -> dict[str, Any]:
    """The marker's record; empty when it is unreadable or from an older format."""
    try:
        with open(marker, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def with_patch_texts(files: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The files, each with the text of its patch: read from its patch_file where it names one."""
    texts = []
    for entry in files:
        found = dict(entry)
        if found.get("patch_file"):
            try:
                with open(found["patch_file"], encoding="utf-8") as handle:
                    found["patch"] = handle.read()
            except (OSError, UnicodeDecodeError) as err:
                raise OverlayError([f"{found['path']}: cannot read its patch {found['patch_file']}: {err}"]) from err
        texts.append(found)
    return texts


def converge(image: str, dest: str, files: Sequence[Mapping[str, Any]], docker: str = "docker",
             check_mode: bool = False, runner: Runner = run, want_diff: bool = False) -> Outcome:
    """Bring dest to hold exactly the set's results; raise OverlayError (having written nothing) on any problem."""
    dest = dest.rstrip("/") or dest
    errors = validate(image, dest, files)
    if errors:
        raise OverlayError(errors)
    entries = [Entry(f["path"], f["original_sha256"].lower(), f["patch"], f["result_sha256"].lower(),
                     host_path(dest, f["path"])) for f in files]
    marker = os.path.join(dest, MARKER)
    has_marker = os.path.isfile(marker) and not os.path.islink(marker)
    wanted = provenance(image, entries)
    made_from = recorded(marker) if has_marker else {}
    # A result counts as done only when it has its hash AND was made from this image, original and patch:
    # a new image (or patch) is extracted and checked again, so an original that changed is caught.
    needed = [e for e in entries if existing_sha256(dest, e.path) != e.result_sha256
              or made_from.get("image") != pinned_ref(image)
              or (made_from.get("files") or {}).get(e.path) != wanted["files"][e.path]]
    stale = find_stale(dest, {e.path for e in entries})
    if stale and not has_marker:
        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        raise OverlayError([f"dest {dest} holds files that are not overlays of this set ({shown}) and has no "
                            f"{MARKER} marker: it was not made by image_overlay, and nothing is removed from it; "
                            "give each deployment a folder of its own"])
    marker_text = (json.dumps(wanted, indent=1, sort_keys=True) + "\n").encode()
    needs_marker = bool(entries) and read_plain(marker) != marker_text

    built: dict[str, bytes] = {}
    originals: dict[str, bytes] = {}
    warnings: list[str] = []
    if needed:
        try:
            originals, errors, warnings = extract(image, [e.path for e in needed], docker, runner)
        except ImageMissingError as missing:
            if not check_mode:
                raise
            # Check mode before the image stage ran: what would be written, checked once the image is there.
            return Outcome(changed=True, written=[e.host_path for e in needed], removed=stale,
                           results=[{"path": e.path, "host_path": e.host_path, "sha256": e.result_sha256}
                                    for e in entries],
                           mounts=[f"{e.host_path}:{e.path}:ro" for e in entries], diff=[],
                           warnings=[f"{missing.msg}; in check mode the overlays are not checked against it"])
        built, build_errors = build(needed, originals)
        errors += build_errors
        if errors:
            raise OverlayError(errors)

    diff = []
    if want_diff:
        for entry in needed:
            before = read_plain(entry.host_path)
            header = entry.host_path if before is not None else f"{image}:{entry.path} (the image's original)"
            diff.append({"before_header": header, "after_header": entry.host_path,
                         "before": as_text(before if before is not None else originals[entry.path]),
                         "after": as_text(built[entry.path])})
        for path in stale:
            diff.append({"before_header": path, "after_header": f"{path} (removed)",
                         "before": as_text(read_plain(path) or b""), "after": ""})

    if not check_mode:
        remove_stale(dest, stale)
        for entry in needed:
            ensure_dirs(dest, os.path.dirname(entry.host_path))
            write_atomic(entry.host_path, built[entry.path])
        if needs_marker:
            ensure_dirs(dest, dest)
            write_atomic(marker, marker_text)

    return Outcome(
        changed=bool(needed or stale or needs_marker),
        results=[{"path": e.path, "host_path": e.host_path, "sha256": e.result_sha256} for e in entries],
        written=[e.host_path for e in needed],
        removed=stale,
        mounts=[f"{e.host_path}:{e.path}:ro" for e in entries],
        diff=diff,
        warnings=warnings,
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "files": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "str", "required": True},
                    "original_sha256": {"type": "str", "required": True},
                    "patch": {"type": "str"},
                    "patch_file": {"type": "path"},
                    "result_sha256": {"type": "str", "required": True},
                },
                "mutually_exclusive": [["patch", "patch_file"]],
                "required_one_of": [["patch", "patch_file"]],
            },
            "docker": {"type": "str", "default": "docker"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        files = with_patch_texts(p["files"])
        outcome = converge(p["image"], p["dest"], files, p["docker"], module.check_mode, run, module._diff)
    except OverlayError as err:
        module.fail_json(msg=err.msg, errors=err.errors, changed=False)
    except OSError as err:
        module.fail_json(msg=f"could not write the overlays in {p['dest']}: {err}", changed=False)
    for warning in outcome.warnings:
        module.warn(warning)
    result: dict[str, Any] = {"changed": outcome.changed, "results": outcome.results, "written": outcome.written,
                              "removed": outcome.removed, "mounts": outcome.mounts}
    if module._diff and outcome.diff:
        result["diff"] = outcome.diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
