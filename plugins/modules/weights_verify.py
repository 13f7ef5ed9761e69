#!/usr/bin/python
"""Check a model revision folder against its manifest: sizes, sha256 (hashed in parallel, cached)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_verify
short_description: Check the files of a model revision folder against its manifest
version_added: "0.1.0"
description:
  - Reads the manifest (C(.sparkserve-manifest.json)) and checks every file it names under O(path). A file
    whose size differs is corrupt without being hashed; the others are hashed with sha256, one thread per
    core (large reads; hashing lets go of the interpreter lock), and compared.
  - Keeps a verify cache, C(.sparkserve-verify-cache.json) in O(path), keyed by relative path with the inode,
    size, modification time (ns) and sha256 of each file. A file whose inode, size and modification time
    match its entry is not hashed again. A corrupt or unreadable cache is ignored. Files modified in the
    last two seconds are not cached (they may still be being written). Writing the cache is not a change.
  - Files on disk that the manifest does not name are unexpected. Bookkeeping is never checked nor
    reported - paths under C(.cache/) (the hub client's) and paths with a component named C(.sparkserve-*).
  - O(remove_corrupt=true) deletes the corrupt files, so that a later M(sparkserve.deploy.weights_fetch)
    gets them again; that is the only change this module makes.
  - The classes named in O(fail_on) fail the module when not empty, naming the first few files (with
    expected and actual hashes or sizes). The verdict is on the files as found, before any removal.
  - In check mode nothing is removed and the verify cache is not written; C(changed) says whether
    something would be removed. Supports diff mode when it removes files (the file list before and after).
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  diff_mode:
    support: full
options:
  path:
    description: The revision folder, C(MODELS/<org>/<name>/<revision>).
    type: path
    required: true
  manifest:
    description: The manifest to check against; C(<path>/.sparkserve-manifest.json) when not given.
    type: path
  workers:
    description: Threads hashing at once; C(0) is one per core.
    type: int
    default: 0
  use_cache:
    description: Trust the verify cache for files whose inode, size and modification time match. With
      C(false) every file is hashed (the fresh hashes are still recorded).
    type: bool
    default: true
  remove_corrupt:
    description: Delete corrupt files (a size or sha256 that differs from the manifest).
    type: bool
    default: false
  fail_on:
    description: Fail when any of these classes is not empty.
    type: list
    elements: str
    choices: [missing, corrupt, unexpected]
    default: [missing, corrupt]
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Drop the corrupt files before fetching
  sparkserve.deploy.weights_verify:
    path: /srv/models/zai-org/GLM-4.5-Air/a1b2c3d4e5f60718293a4b5c6d7e8f9012345678
    remove_corrupt: true
    fail_on: []

- name: Every file of the revision is there and intact
  sparkserve.deploy.weights_verify:
    path: /srv/models/zai-org/GLM-4.5-Air/a1b2c3d4e5f60718293a4b5c6d7e8f9012345678
"""

RETURN = r"""
ok_count:
  description: Files whose size and sha256 match the manifest.
  returned: always
  type: int
missing:
  description: Files the manifest names that are not on disk, in manifest order.
  returned: always
  type: list
  elements: str
corrupt:
  description:
    - Files that differ from the manifest, in manifest order. C(reason) is C(size) (found without hashing),
      C(sha256), C(not a regular file) or C(unreadable ...).
  returned: always
  type: list
  elements: dict
  sample: [{path: model-00001-of-00004.safetensors, reason: sha256, expected: "9f86...", actual: "60303...",
            expected_size: 8388608, actual_size: 8388608}]
unexpected:
  description: Files on disk that the manifest does not name (bookkeeping left out), sorted.
  returned: always
  type: list
  elements: str
hashed_bytes:
  description: Bytes hashed by this run (0 when every file came from the verify cache).
  returned: always
  type: int
cached:
  description: Files whose hash came from the verify cache.
  returned: always
  type: int
removed:
  description: Corrupt files deleted (in check mode, those that would be).
  returned: always
  type: list
  elements: str
bytes_total:
  description: The bytes of all the files the manifest names.
  returned: always
  type: int
"""

import os
from typing import Any, Optional, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.weights import (
    MANIFEST_NAME,
    describe_corrupt,
    files_on_disk,
    load_manifest,
    verify,
)

CLASSES = ("missing", "corrupt", "unexpected")
SHOWN = 5


def removable(corrupt: Sequence[dict[str, Any]]) -> list[str]:
    """The corrupt files that deleting helps: those with the wrong size or content."""
    return [entry["path"] for entry in corrupt if entry["reason"] in ("size", "sha256")]


def remove(root: str, paths: Sequence[str]) -> list[str]:
    """Delete these files under root; return those that are gone now (already gone counts)."""
    gone = []
    for relpath in paths:
        try:
            os.unlink(os.path.join(root, relpath))
        except FileNotFoundError:
            pass
        except OSError:
            continue
        gone.append(relpath)
    return gone


def failure_message(result: dict[str, Any], fail_on: Sequence[str], root: str) -> Optional[str]:
    """What is wrong, for the classes in fail_on; None when they are all empty."""
    parts = []
    for name in CLASSES:
        if name not in fail_on or not result[name]:
            continue
        items = result[name]
        words = [describe_corrupt(i) for i in items[:SHOWN]] if name == "corrupt" else list(items[:SHOWN])
        more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
        parts.append(f"{len(items)} {name}: {', '.join(words)}{more}")
    if not parts:
        return None
    return f"{root} does not match its manifest: " + "; ".join(parts)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "manifest": {"type": "path"},
            "workers": {"type": "int", "default": 0},
            "use_cache": {"type": "bool", "default": True},
            "remove_corrupt": {"type": "bool", "default": False},
            "fail_on": {"type": "list", "elements": "str", "choices": list(CLASSES),
                        "default": ["missing", "corrupt"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    root = p["path"]
    if p["workers"] < 0:
        module.fail_json(msg=f"workers {p['workers']} must be 0 (one per core) or more")
    try:
        manifest = load_manifest(p["manifest"] or os.path.join(root, MANIFEST_NAME))
    except ValueError as err:
        module.fail_json(msg=str(err))
    result = verify(root, manifest, p["workers"], p["use_cache"], write_cache=not module.check_mode)

    removed: list[str] = []
    diff: dict[str, str] = {}
    if p["remove_corrupt"]:
        targets = removable(result["corrupt"])
        if targets:
            before = files_on_disk(root)
            removed = targets if module.check_mode else remove(root, targets)
            after = [f for f in before if f not in removed]
            diff = {"before_header": root, "after_header": root,
                    "before": "".join(f + "\n" for f in before), "after": "".join(f + "\n" for f in after)}
            if not module.check_mode and len(removed) < len(targets):
                left = [t for t in targets if t not in removed]
                module.warn(f"could not remove {len(left)} corrupt file(s) under {root}: {', '.join(left[:SHOWN])}")

    out = {
        "changed": bool(removed),
        "ok_count": len(result["ok"]),
        "missing": result["missing"],
        "corrupt": result["corrupt"],
        "unexpected": result["unexpected"],
        "hashed_bytes": result["hashed_bytes"],
        "cached": result["cached"],
        "removed": removed,
        "bytes_total": result["bytes_total"],
    }
    if diff:
        out["diff"] = diff
    msg = failure_message(result, p["fail_on"], root)
    if msg:
        module.fail_json(msg=msg, **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
