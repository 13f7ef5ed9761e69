#!/usr/bin/python
"""Pull a model revision folder from an upstream node's rsync daemon, file by file, in manifest order."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_fetch
short_description: Pull the files of a model revision from an upstream node's rsync daemon, file by file
version_added: "0.1.0"
description:
  - Fetches the files of the manifest one at a time, in manifest order, each with its own rsync run. A
    node relaying to the next passes a file on as soon as it has it, while it is still receiving the
    next one, so a chain of nodes is pipelined.
  - The upstream serves only finished files (rsync writes a temporary name and renames it when done, and
    the upstream's daemon excludes C(.sparkserve-*)). A file the upstream does not have yet (rsync's
    C(link_stat) or C(change_dir ... No such file or directory), exit 23) is asked for again every
    O(poll_s) seconds, until O(wait_timeout_s) has passed for that file.
  - Each file is received in place into its own partial file, C(.sparkserve-partial/<name>) beside where
    it belongs (rsync C(--inplace) on that name), and renamed into place (mode 0644) once whole and of the
    manifest's size. Every byte that arrived is on disk under that known name, however the transfer ends (a
    dropped connection, a signal, a node losing power), and the next fetch resumes from it with rsync's delta
    transfer; the upstream never serves it (its daemon excludes C(.sparkserve-*)). A partial file larger
    than the manifest's size is removed first.
  - A dropped connection (rsync exit 10, 12, 30 or 35) is retried O(retries) times, each resuming from
    the partial file.
  - After each file its size is checked against the manifest; a file of another size fails the module
    (the upstream's copy is wrong - run M(sparkserve.deploy.weights_verify) there). Content is checked by
    M(sparkserve.deploy.weights_verify) afterwards.
  - The manifest must already be in place (the role copies it first); it is not fetched.
  - One fetch at a time per folder - a fetch finds what to fetch only once the one still running there (the
    background job of a run that was interrupted; the role runs this module with C(async)) has ended, under
    an exclusive lock on C(.sparkserve-fetch.lock) in the folder.
  - Before fetching, the files still to fetch (less what their partial files hold) must fit in the free space
    of the folder's file system; otherwise the module fails, naming what is needed and what is free, and
    fetches nothing.
  - In check mode reports what would be fetched and fetches nothing.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  source:
    description:
      - rsync URL of the upstream's copy of the revision folder, for example
        C(rsync://10.77.1.11:8730/weights/org/name/<revision>/).
    type: str
    required: true
  path:
    description: The local revision folder; created when missing.
    type: path
    required: true
  manifest:
    description: The local copy of the manifest; C(<path>/.sparkserve-manifest.json) when not given.
    type: path
  files:
    description:
      - Fetch only these files of the manifest (still in manifest order, and still only those missing or
        of another size locally). Not given, every file of the manifest that is missing locally or whose
        size differs is fetched.
    type: list
    elements: str
  wait_timeout_s:
    description: How long to wait, for each file, for the upstream to have it.
    type: int
    default: 1800
  poll_s:
    description: Seconds between asking the upstream again for a file it does not have yet.
    type: float
    default: 0.5
  bwlimit_kib:
    description: Bandwidth limit of each transfer in KiB/s (rsync's C(--bwlimit)); C(0) is none.
    type: int
    default: 0
  io_timeout_s:
    description: rsync's C(--timeout), the seconds a transfer may stall before rsync gives up (and it is retried).
    type: int
    default: 300
  retries:
    description: How many times a transfer that broke off (connection or timeout) is tried again.
    type: int
    default: 3
  rsync:
    description: The rsync program.
    type: str
    default: rsync
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Fetch the weights from this node's upstream in the relay
  sparkserve.deploy.weights_fetch:
    source: "rsync://10.77.1.11:8730/weights/zai-org/GLM-4.5-Air/a1b2c3d4e5f60718293a4b5c6d7e8f9012345678/"
    path: /srv/models/zai-org/GLM-4.5-Air/a1b2c3d4e5f60718293a4b5c6d7e8f9012345678
"""

RETURN = r"""
fetched:
  description: Files fetched, in the order fetched (in check mode, those that would be).
  returned: always
  type: list
  elements: str
bytes_fetched:
  description: The bytes of the files fetched (in check mode, of those that would be).
  returned: always
  type: int
seconds:
  description: Seconds the fetch took, waiting included.
  returned: always
  type: float
"""

import fcntl
import os
import re
import stat
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import room_problem
from ansible_collections.sparkserve.deploy.plugins.module_utils.weights import (
    MANIFEST_NAME,
    OUR_PREFIX,
    PARTIAL_DIR,
    load_manifest,
)

Runner = Callable[[Sequence[str]], tuple[int, str]]

NOT_THERE = re.compile(r"(link_stat|change_dir) .*failed: No such file or directory")
RSYNC_PARTIAL = 23
BROKEN_OFF = {10, 12, 30, 35}  # socket I/O, protocol stream, I/O timeout, daemon connection timeout
CONNECT_TIMEOUT_S = 30
# Held while a fetch runs in a folder (bookkeeping: never checked or transferred).
FETCH_LOCK_NAME = OUR_PREFIX + "fetch.lock"


class FetchError(Exception):
    """A file could not be fetched; the message says which and why."""

    def __init__(self, msg: str, fetched: Sequence[str]) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fetched = list(fetched)


@dataclass
class Outcome:
    fetched: list[str] = field(default_factory=list)
    bytes_fetched: int = 0
    seconds: float = 0.0


def run(argv: Sequence[str]) -> tuple[int, str]:
    """Run rsync; its exit status and its output (stdout and stderr)."""
    try:
        done = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    except OSError as err:
        return 127, f"cannot run {argv[0]}: {err}"
    return done.returncode, done.stdout.decode("utf-8", "replace")


def local_sizes(root: str, paths: Sequence[str]) -> dict[str, Optional[int]]:
    """The size of each file under root; None where there is no regular file."""
    sizes: dict[str, Optional[int]] = {}
    for relpath in paths:
        try:
            st = os.stat(os.path.join(root, relpath))
            sizes[relpath] = st.st_size if stat.S_ISREG(st.st_mode) else None
        except OSError:
            sizes[relpath] = None
    return sizes


def plan_fetch(files: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, Optional[int]],
               only: Optional[Sequence[str]] = None) -> list[str]:
    """The files to fetch, in manifest order: missing locally or of another size, among only when given.

    files is the manifest's files, sizes the local size of each (None: not there). Raises ValueError
    naming the files of only that the manifest does not have.
    """
    if only is not None:
        unknown = [p for p in only if p not in files]
        if unknown:
            raise ValueError(f"files not in the manifest: {', '.join(unknown)}")
    wanted = set(files if only is None else only)
    return [p for p, entry in files.items() if p in wanted and sizes.get(p) != entry["size"]]


def bytes_to_write(root: str, files: Mapping[str, Mapping[str, Any]], plan: Sequence[str]) -> int:
    """What the planned files still need on disk: each one's size less what its partial file already holds."""
    partials = {relpath: os.path.relpath(partial_path(root, relpath), root) for relpath in plan}
    held = local_sizes(root, list(partials.values()))
    return sum(max(0, files[relpath]["size"] - (held[partials[relpath]] or 0)) for relpath in plan)


def source_url(source: str, relpath: str) -> str:
    """The rsync address of one file of the upstream's folder."""
    return source.rstrip("/") + "/" + relpath


def partial_path(root: str, relpath: str) -> str:
    """Where one file of the folder is received before it is whole: .sparkserve-partial/ beside it."""
    parts = relpath.split("/")
    return os.path.join(root, *parts[:-1], PARTIAL_DIR, parts[-1])


def rsync_argv(rsync: str, source: str, relpath: str, root: str, bwlimit_kib: int = 0,
               io_timeout_s: int = 300) -> list[str]:
    """The rsync command that receives one file of the upstream's folder, in place, into its partial file."""
    argv = [rsync, "--times", "--inplace", f"--timeout={io_timeout_s}", f"--contimeout={CONNECT_TIMEOUT_S}"]
    if bwlimit_kib > 0:
        argv.append(f"--bwlimit={bwlimit_kib}")
    return argv + ["--", source_url(source, relpath), partial_path(root, relpath)]


def prepare_partial(partial: str, final: str, expected: int) -> None:
    """Make the partial file's folder and pick what the transfer resumes from.

    A file of the wrong size in the final place, with no partial file, becomes the partial file (rsync
    reuses what of it matches); a partial file already larger than the file can be is dropped.
    """
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    if not os.path.lexists(partial) and os.path.isfile(final):
        os.replace(final, partial)
    try:
        if os.stat(partial).st_size > expected:
            os.unlink(partial)
    except FileNotFoundError:
        pass


WEIGHTS_FILE_MODE = 0o644


def settle(partial: str, final: str) -> None:
    """Put the whole file in its place, readable by all, and remove the partial folder once it is empty.

    The mode is set here because rsync keeps the mode of a file it resumes in place: one whose transfer was
    killed keeps the 0600 rsync gave it while receiving, which the node's own rsync daemon (and so the
    nodes downstream in the relay) could not read.
    """
    os.chmod(partial, WEIGHTS_FILE_MODE)
    os.replace(partial, final)
    try:
        os.rmdir(os.path.dirname(partial))
    except OSError:
        pass  # other files of the folder are still being received


def not_there_yet(rc: int, output: str) -> bool:
    """rsync failed because the upstream does not have the file (yet)."""
    return rc == RSYNC_PARTIAL and NOT_THERE.search(output) is not None


def last_lines(output: str, count: int = 3) -> str:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return " / ".join(lines[-count:]) or "no output"


def fetch(source: str, root: str, files: Mapping[str, Mapping[str, Any]], plan: Sequence[str], *,
          wait_timeout_s: float = 1800, poll_s: float = 0.5, bwlimit_kib: int = 0, io_timeout_s: int = 300,
          retries: int = 3, rsync: str = "rsync", runner: Optional[Runner] = None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Fetch the planned files one by one, waiting for those the upstream does not have yet.

    Raises FetchError on a file that did not come within wait_timeout_s, one rsync refused, or one
    that came with a size other than the manifest's.
    """
    runner = runner or run
    started = clock()
    outcome = Outcome()
    for relpath in plan:
        expected = files[relpath]["size"]
        final = os.path.join(root, *relpath.split("/"))
        partial = partial_path(root, relpath)
        prepare_partial(partial, final, expected)
        argv = rsync_argv(rsync, source, relpath, root, bwlimit_kib, io_timeout_s)
        deadline = clock() + wait_timeout_s
        broken = 0
        while True:
            rc, output = runner(argv)
            if rc == 0:
                break
            if not_there_yet(rc, output):
                if clock() >= deadline:
                    raise FetchError(
                        f"{source_url(source, relpath)} did not appear upstream within {wait_timeout_s:g} s; "
                        "is the upstream node fetching it (or did its own fetch fail)?", outcome.fetched)
                sleep(poll_s)
                continue
            if rc in BROKEN_OFF and broken < retries:
                broken += 1
                sleep(min(poll_s * 2 ** broken, 10.0))
                continue
            raise FetchError(f"rsync of {source_url(source, relpath)} failed (exit {rc}): {last_lines(output)}",
                             outcome.fetched)
        got = os.path.getsize(partial) if os.path.isfile(partial) else None
        if got != expected:
            if got is not None:
                os.unlink(partial)  # the upstream's copy is wrong: nothing of it is worth resuming from
            raise FetchError(
                f"{relpath} came from {source} with size {got}, the manifest says {expected}; the upstream's "
                "copy is wrong (run weights_verify with remove_corrupt there)", outcome.fetched)
        settle(partial, final)
        outcome.fetched.append(relpath)
        outcome.bytes_fetched += expected
    outcome.seconds = round(clock() - started, 3)
    return outcome


def plan_or_fail(module: AnsibleModule, root: str) -> dict[str, Any]:
    """What would be fetched now (changed, fetched, bytes_fetched, seconds), with the plan and the manifest's files."""
    p = module.params
    try:
        manifest = load_manifest(p["manifest"] or os.path.join(root, MANIFEST_NAME))
        files = manifest["files"]
        plan = plan_fetch(files, local_sizes(root, list(files)), p["files"])
    except ValueError as err:
        module.fail_json(msg=str(err))
    return {"changed": bool(plan), "fetched": plan, "bytes_fetched": sum(files[f]["size"] for f in plan),
            "seconds": 0.0, "plan": plan, "files": files}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "source": {"type": "str", "required": True},
            "path": {"type": "path", "required": True},
            "manifest": {"type": "path"},
            "files": {"type": "list", "elements": "str"},
            "wait_timeout_s": {"type": "int", "default": 1800},
            "poll_s": {"type": "float", "default": 0.5},
            "bwlimit_kib": {"type": "int", "default": 0},
            "io_timeout_s": {"type": "int", "default": 300},
            "retries": {"type": "int", "default": 3},
            "rsync": {"type": "str", "default": "rsync"},
        },
        supports_check_mode=True,
    )
    p = module.params
    root = p["path"]
    for name in ("wait_timeout_s", "bwlimit_kib", "retries"):
        if p[name] < 0:
            module.fail_json(msg=f"{name} {p[name]} must be 0 or more")
    if p["poll_s"] <= 0 or p["io_timeout_s"] <= 0:
        module.fail_json(msg="poll_s and io_timeout_s must be more than 0")
    if not (p["source"].startswith("rsync://") or "::" in p["source"]):
        module.fail_json(msg=f"source {p['source']} is not an rsync daemon address (rsync://HOST:PORT/MODULE/...)")
    if module.check_mode:
        would = plan_or_fail(module, root)
        del would["plan"], would["files"]
        module.exit_json(**would)
    try:
        os.makedirs(root, exist_ok=True)
        lock = open(os.path.join(root, FETCH_LOCK_NAME), "a", encoding="utf-8")
    except OSError as err:
        module.fail_json(msg=f"cannot write under {root}: {err}", changed=False, fetched=[], bytes_fetched=0)
    # A fetch of this folder still running (the background job of a run that was interrupted) ends first;
    # this one then fetches only what that one left.
    fcntl.flock(lock, fcntl.LOCK_EX)
    would = plan_or_fail(module, root)
    plan, files = would.pop("plan"), would.pop("files")
    if not plan:
        module.exit_json(**would)
    no_room = room_problem(root, bytes_to_write(root, files, plan), f"{len(plan)} file(s) of this revision")
    if no_room:
        module.fail_json(msg=no_room, changed=False, fetched=[], bytes_fetched=0)
    try:
        outcome = fetch(p["source"], root, files, plan, wait_timeout_s=p["wait_timeout_s"], poll_s=p["poll_s"],
                        bwlimit_kib=p["bwlimit_kib"], io_timeout_s=p["io_timeout_s"], retries=p["retries"],
                        rsync=p["rsync"])
    except FetchError as err:
        module.fail_json(msg=err.msg, changed=bool(err.fetched), fetched=err.fetched,
                         bytes_fetched=sum(files[f]["size"] for f in err.fetched))
    except OSError as err:
        module.fail_json(msg=f"cannot write under {root}: {err}", changed=False, fetched=[], bytes_fetched=0)
    module.exit_json(changed=bool(outcome.fetched), fetched=outcome.fetched, bytes_fetched=outcome.bytes_fetched,
                     seconds=outcome.seconds)


if __name__ == "__main__":
    main()
