#!/usr/bin/python
"""Make a set of folders and files be on the node exactly as given, in one task."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_files
short_description: Make a set of folders and files be on the node exactly as given, in one task
version_added: "0.1.0"
description:
  - One task for what a role would otherwise write with one M(ansible.builtin.file),
    M(ansible.builtin.copy) or M(ansible.builtin.template) task per path (each one a round trip to every node).
  - Every directory of O(directories) is made (with its missing parents) and given its mode; an existing one
    only has its mode fixed.
  - Every file of O(files) is compared with its O(files[].content) (as UTF-8 bytes) and O(files[].mode). Only
    what differs is written. A file whose content differs is written whole and atomically (a temporary file in
    the same folder, fsync, then a rename over the old one), so it ends as a new regular file owned by the
    user the module runs as, with nothing of the old one kept (owner, links, extended attributes). A file
    whose content is right but whose mode is not only has its mode fixed.
  - A directory this module makes that is not listed in O(directories) (a missing parent of a listed
    directory or of a file) gets mode C(0755).
  - Files below a directory with O(directories[].prune) that match its pattern and are not listed, and the
    paths of O(absent), are removed after everything is written.
  - Every item is checked before anything is written; when one is refused the module fails naming it (never
    showing any content) and the node is left as it was. Refused are a path that is not absolute, a mode that
    is not a string of octal digits, content that is not text, a file whose path is an existing directory (or
    a link to one), fifo, socket or device, a directory whose path is an existing file, a path below an
    existing file or below a listed file, and a path listed twice with different content or mode.
  - Content is the text itself; render a template on the controller with
    C(lookup('ansible.builtin.template', ...)) or read a role file with
    C(lookup('ansible.builtin.file', ..., rstrip=false)) (the file lookup strips the trailing newline unless
    told not to).
  - Runs on the node's python3 with nothing but its standard library.
options:
  directories:
    description: Directories to make, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the directory.
        type: str
        required: true
      mode:
        description:
          - Its mode, a quoted string of octal digits such as V(0755) or V(2775).
          - A number is refused, as YAML may read an unquoted 0755 as the decimal 493.
        type: raw
        default: "0755"
      prune:
        description:
          - A file name pattern (C(*.py)); files below the directory, at any depth, whose name matches it and
            that O(files) does not list are removed, so that the directory holds what is listed and nothing
            left from before. Links matching it are removed too; folders are left.
        type: str
  files:
    description: Files to write, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: Absolute path of the file.
        type: str
        required: true
      content:
        description:
          - The whole content of the file, as text (written as UTF-8).
          - Anything that is not a string (a number, a list, a mapping) is refused; render it to text first.
        type: raw
        required: true
      mode:
        description: Its mode, a quoted string of octal digits such as V(0644) or V(0600).
        type: raw
        default: "0644"
  blocks:
    description:
      - Blocks of lines this module owns inside a file that others write too (C(~/.ssh/authorized_keys),
        C(~/.ssh/config)), as M(ansible.builtin.blockinfile) keeps them, between the lines
        C(# BEGIN MARKER) and C(# END MARKER).
      - The block replaces what is between the markers, or is added at the end of the file with its markers;
        the rest of the file is kept as it is. An empty O(blocks[].content) removes the block and its markers.
      - Each block becomes one file of O(files) (its whole new content), so the same checks, check mode and
        diff apply; a path may hold one block.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file; it is made when missing.
        type: str
        required: true
      marker:
        description: What the marker lines say after C(# BEGIN) and C(# END).
        type: str
        required: true
      content:
        description: The lines of the block, as text.
        type: str
        required: true
      mode:
        description: The file's mode; by default the mode it has, or V(0600) for a new file.
        type: raw
  absent:
    description:
      - Files (or links) that must not be on the node, removed when there. A path that is a directory, or
        that O(files) or O(directories) lists, is refused.
    type: list
    elements: str
    default: []
  units:
    description:
      - systemd units that run from these files, kept running in the same call when this call changed none
        of their O(units[].files); the round trip of an M(ansible.builtin.systemd_service) task with
        C(state=started) saved on a run that changes nothing.
      - Such a unit is started when it does not run (its C(ActiveState) is neither C(active), C(activating)
        nor C(reloading)), and enabled or disabled at boot as O(units[].enabled) says.
      - A unit one of whose files this call changed (or, in check mode, would change) is left as it is and
        named in RV(units_left), for its caller to reload systemd, check and restart it.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The unit's name, with its suffix (C(sparkserve-memguard.service)).
        type: str
        required: true
      enabled:
        description: Whether it starts at boot; left as it is when not given.
        type: bool
      files:
        description:
          - The paths of this call (of O(files), O(blocks) or O(directories)) the unit runs from; a path
            this call does not list is refused.
        type: list
        elements: str
        default: []
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    description: Writes nothing, starts nothing and reports what would change.
  diff_mode:
    support: full
    description: One entry per changed path; the content of a file before and after, as M(ansible.builtin.copy).
notes:
  - Owner and group are not managed; what is made belongs to the user the module runs as.
  - A file that is a symbolic link is replaced by a regular file; the link's target is left alone.
  - The mode of a listed directory that is a symbolic link to a directory is set on the directory it points to.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Write the fabric configuration of this node
  sparkserve.deploy.node_files:
    directories:
      - path: /etc/sparkserve
      - path: /etc/sparkserve/secrets
        mode: "0700"
    files:
      - dest: /etc/sparkserve/fabric.env
        content: "{{ lookup('ansible.builtin.template', 'etc/sparkserve/fabric.env.j2') }}"
      - dest: /etc/sparkserve/secrets/hf_token
        content: "{{ weights_hf_token }}\n"
        mode: "0600"
      - dest: /usr/local/sbin/sparkserve-health
        content: "{{ lookup('ansible.builtin.file', 'sparkserve-health', rstrip=false) }}"
        mode: "0755"
  notify: Restart ranks

- name: Keep the peers' keys in a block of authorized_keys, leaving the user's own lines alone
  sparkserve.deploy.node_files:
    blocks:
      - path: /root/.ssh/authorized_keys
        marker: sparkserve peers
        content: "{{ peer_keys | join('\\n') }}"
"""

RETURN = r"""
changed_paths:
  description:
    - Every directory and file made or changed (in check mode, that would be), in the order it was done.
    - Directories come first, in the order of O(directories), each after the missing parents made for it;
      then the files in the order of O(files), each after a missing parent made for it; then the files
      removed (those below a pruned directory, then those of O(absent)).
  returned: always
  type: list
  elements: str
  sample: ["/etc/sparkserve", "/etc/sparkserve/fabric.env"]
diff:
  description:
    - With C(--diff), one entry per changed path, in the order of RV(changed_paths).
    - A file's entry holds C(before) and C(after) (its content; C(before) is empty for a new file), and
      C(before_header) and C(after_header) (its path and mode). When only its mode changes, C(prepared)
      says so. When either content is larger than 104448 bytes, or the old content is not UTF-8 text,
      C(before) and C(after) are left out and C(dst_larger), C(src_larger) or C(dst_binary) says why,
      as M(ansible.builtin.copy) does.
    - A directory's entry holds C(before) and C(after) as mappings of C(path), C(state) and C(mode), as
      M(ansible.builtin.file) gives them, and its path as C(before_header) and C(after_header).
    - A removed file's entry holds C(before) (state C(file)) and C(after) (state C(absent)).
  returned: changed and in diff mode
  type: list
  elements: dict
  sample: [{"before_header": "/etc/sparkserve/fabric.env (mode 0644)", "after_header":
            "/etc/sparkserve/fabric.env (mode 0644)", "before": "MTU=1500\n", "after": "MTU=9000\n"}]
errors:
  description: One message per refused item (its index or path and what is wrong; never its content).
  returned: when an item is refused
  type: list
  elements: str
  sample: ["files[2] (etc/motd): the path is not absolute; give the full path from /"]
failed_path:
  description: The path whose change failed on the node (a read-only file system, a full disk...).
  returned: when a change failed
  type: str
units_changed:
  description: The units of O(units) started, enabled or disabled (in check mode, that would be), in order.
  returned: always
  type: list
  elements: str
  sample: ["sparkserve-memguard.service"]
units_left:
  description: The units of O(units) left to the caller, as one of their files changed (or would).
  returned: always
  type: list
  elements: str
  sample: []
"""

import fnmatch
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import with_block, write_atomic
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import Runner, run_command
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.units import UnitError
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.units import keep_running as keep_unit_running

# Three or four octal digits, with an optional leading zero: 644, 0644, 2775, 02775.
MODE_PATTERN = re.compile(r"^0?[0-7]{3,4}$")
DEFAULT_DIR_MODE = 0o755
# ansible.builtin.copy's limit (MAX_FILE_SIZE_FOR_DIFF) above which a file's content is left out of the diff.
MAX_DIFF_BYTES = 104448


class ItemError(Exception):
    """One or more items are refused; nothing was written. ``errors`` holds one message per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors
        self.msg = f"node_files refused {len(errors)} item(s), nothing was written: " + "; ".join(errors)


@dataclass
class Action:
    """One change to make: ``kind`` is mkdir, chmod (a directory or a file), write or remove."""

    kind: str
    path: str
    mode: int
    data: bytes = b""
    diff: dict[str, Any] = field(default_factory=dict)


@dataclass
class WantDir:
    path: str
    mode: int
    listed: bool
    prune: str | None = None


@dataclass
class WantFile:
    dest: str
    data: bytes
    mode: int


def mode_text(mode: int) -> str:
    return f"{mode:04o}"


def parse_mode(value: Any, what: str, errors: list[str]) -> int | None:
    """The mode a string of octal digits says; None (and a message in errors) when it is not one."""
    if not isinstance(value, str):
        errors.append(f"{what}: mode is a {type(value).__name__}, not a string; quote it, for example \"0644\"")
        return None
    if not MODE_PATTERN.match(value):
        errors.append(f"{what}: mode {value!r} is not a string of 3 or 4 octal digits, for example \"0644\"")
        return None
    return int(value, 8)


def normal_path(value: Any, what: str, errors: list[str]) -> str | None:
    """The path normalised (no //, /./, /../ or trailing /); None (and a message) when it is not absolute."""
    if not isinstance(value, str) or not value:
        errors.append(f"{what}: the path is empty")
        return None
    if "\0" in value:
        errors.append(f"{what}: the path holds a NUL character")
        return None
    if not os.path.isabs(value):
        errors.append(f"{what}: the path is not absolute; give the full path from /")
        return None
    path = os.path.normpath(value)
    if path.startswith("//"):  # POSIX keeps a leading //
        path = "/" + path.lstrip("/")
    return path


def parents(path: str) -> list[str]:
    """The ancestors of path, from the top (without / itself) down to its parent."""
    found = []
    current = os.path.dirname(path)
    while current not in ("/", ""):
        found.append(current)
        current = os.path.dirname(current)
    return list(reversed(found))


def read_items(directories: Sequence[Mapping[str, Any]], files: Sequence[Mapping[str, Any]]
               ) -> tuple[list[WantDir], list[WantFile]]:
    """Check the items on their own and against each other (nothing on the node yet); raise ItemError."""
    errors: list[str] = []
    dirs: dict[str, WantDir] = {}
    for index, item in enumerate(directories):
        what = f"directories[{index}] ({item.get('path')})"
        path = normal_path(item.get("path"), what, errors)
        mode = parse_mode(item.get("mode"), what, errors)
        prune = item.get("prune") or None
        if path is None or mode is None:
            continue
        if path == "/":
            errors.append(f"{what}: / cannot be listed")
        elif prune is not None and (not isinstance(prune, str) or "/" in prune):
            errors.append(f"{what}: prune {prune!r} is not a file name pattern such as \"*.py\"")
        elif path in dirs and dirs[path].mode != mode:
            errors.append(f"{what}: listed twice, with modes {mode_text(dirs[path].mode)} and {mode_text(mode)}")
        else:
            dirs.setdefault(path, WantDir(path, mode, True, prune))
    wanted: dict[str, WantFile] = {}
    for index, item in enumerate(files):
        what = f"files[{index}] ({item.get('dest')})"
        dest = normal_path(item.get("dest"), what, errors)
        mode = parse_mode(item.get("mode"), what, errors)
        content = item.get("content")
        if not isinstance(content, str):
            errors.append(f"{what}: content is a {type(content).__name__}, not text; render it to a string first "
                          "(for example with | to_nice_yaml, | to_json or | string)")
            continue
        if dest is None or mode is None:
            continue
        if isinstance(item.get("dest"), str) and item["dest"].endswith("/"):
            errors.append(f"{what}: the path ends with /, which names a directory; give the file's path")
            continue
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as err:
            errors.append(f"{what}: the content cannot be written as UTF-8 (character {err.start})")
            continue
        if dest in dirs:
            errors.append(f"{what}: the path is also listed in directories")
        elif dest in wanted and (wanted[dest].data != data or wanted[dest].mode != mode):
            errors.append(f"{what}: listed twice, with different content or mode")
        else:
            wanted.setdefault(dest, WantFile(dest, data, mode))
    for path in list(dirs) + list(wanted):
        for above in parents(path):
            if above in wanted:
                kind = "directory" if path in dirs else "file"
                errors.append(f"{kind} {path}: it is below {above}, which is listed as a file")
                break
    if errors:
        raise ItemError(errors)
    return list(dirs.values()), list(wanted.values())


def kind_of(st: os.stat_result) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a link"),
                       (stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device")):
        if test(st.st_mode):
            return name
    return "not a regular file"


def lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def stat_follow(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def as_text(data: bytes) -> str | None:
    """data as text when it is UTF-8 without NUL bytes; None when it looks binary."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def file_diff(dest: str, before: bytes | None, before_mode: int | None, after: bytes, mode: int
              ) -> dict[str, Any]:
    """A diff entry as ansible.builtin.copy gives one, with the modes in the headers."""
    entry: dict[str, Any] = {
        "before_header": dest if before_mode is None else f"{dest} (mode {mode_text(before_mode)})",
        "after_header": f"{dest} (mode {mode_text(mode)})",
    }
    before_text = "" if before is None else as_text(before)
    after_text = as_text(after)
    if before is not None and len(before) > MAX_DIFF_BYTES:
        entry["dst_larger"] = MAX_DIFF_BYTES
    if len(after) > MAX_DIFF_BYTES:
        entry["src_larger"] = MAX_DIFF_BYTES
    if before_text is None:
        entry["dst_binary"] = 1
    if after_text is None:
        entry["src_binary"] = 1
    if not any(key in entry for key in ("dst_larger", "src_larger", "dst_binary", "src_binary")):
        entry["before"] = before_text
        entry["after"] = after_text
    if before is not None and before == after and before_mode != mode:
        entry["prepared"] = (f"mode of {dest}: {mode_text(before_mode or 0)} -> {mode_text(mode)}\n")
    return entry


def dir_diff(path: str, before_mode: int | None, mode: int) -> dict[str, Any]:
    before: dict[str, Any] = {"path": path, "state": "absent"}
    if before_mode is not None:
        before = {"path": path, "state": "directory", "mode": mode_text(before_mode)}
    return {"before_header": path, "after_header": path, "before": before,
            "after": {"path": path, "state": "directory", "mode": mode_text(mode)}}


class Planner:
    """Compares the wanted items with the node and lists the actions, refusing what cannot be done."""

    def __init__(self, dirs: Sequence[WantDir]) -> None:
        self.listed = {d.path: d.mode for d in dirs}
        self.made: set[str] = set()  # directories the plan makes
        self.checked: set[str] = set()  # existing directories looked at already
        self.actions: list[Action] = []
        self.errors: list[str] = []

    def ensure_parents(self, path: str, what: str) -> bool:
        """Plan the missing ancestors of path; False (and a message) when one exists but is no directory."""
        for above in parents(path):
            if above in self.made or above in self.checked:
                continue
            st = stat_follow(above)
            if st is None:
                if lstat(above) is not None:
                    self.errors.append(f"{what}: {above} is a link to nothing; remove it or point it at a directory")
                    return False
                mode = self.listed.get(above, DEFAULT_DIR_MODE)
                self.made.add(above)
                self.actions.append(Action("mkdir", above, mode, diff=dir_diff(above, None, mode)))
            elif stat.S_ISDIR(st.st_mode):
                self.checked.add(above)
            else:
                self.errors.append(f"{what}: {above} exists and is {kind_of(st)}, not a directory")
                return False
        return True

    def directory(self, want: WantDir) -> None:
        what = f"directory {want.path}"
        if want.path in self.made or not self.ensure_parents(want.path, what):
            return
        st = stat_follow(want.path)
        if st is None:
            if lstat(want.path) is not None:
                self.errors.append(f"{what}: it is a link to nothing; remove it or point it at a directory")
                return
            self.made.add(want.path)
            self.actions.append(Action("mkdir", want.path, want.mode, diff=dir_diff(want.path, None, want.mode)))
            return
        if not stat.S_ISDIR(st.st_mode):
            self.errors.append(f"{what}: it exists and is {kind_of(st)}; remove it first")
            return
        self.checked.add(want.path)
        have = stat.S_IMODE(st.st_mode)
        if have != want.mode:
            self.actions.append(Action("chmod", want.path, want.mode, diff=dir_diff(want.path, have, want.mode)))

    def file(self, want: WantFile) -> None:
        what = f"file {want.dest}"
        if not self.ensure_parents(want.dest, what):
            return
        st = lstat(want.dest)
        if st is None:
            self.actions.append(Action("write", want.dest, want.mode, want.data,
                                       file_diff(want.dest, None, None, want.data, want.mode)))
            return
        if stat.S_ISLNK(st.st_mode):
            target = stat_follow(want.dest)
            if target is not None and stat.S_ISDIR(target.st_mode):
                self.errors.append(f"{what}: it is a link to a directory; remove it first")
                return
            link = f"(a link to {os.readlink(want.dest)})\n".encode()
            self.actions.append(Action("write", want.dest, want.mode, want.data,
                                       file_diff(want.dest, link, None, want.data, want.mode)))
            return
        if not stat.S_ISREG(st.st_mode):
            self.errors.append(f"{what}: it exists and is {kind_of(st)}; remove it first")
            return
        have_mode = stat.S_IMODE(st.st_mode)
        with open(want.dest, "rb") as handle:
            have = handle.read()
        if have != want.data:
            self.actions.append(Action("write", want.dest, want.mode, want.data,
                                       file_diff(want.dest, have, have_mode, want.data, want.mode)))
        elif have_mode != want.mode:
            self.actions.append(Action("chmod", want.dest, want.mode,
                                       diff=file_diff(want.dest, have, have_mode, want.data, want.mode)))


def removal(path: str) -> Action:
    return Action("remove", path, 0, diff={"before_header": path, "after_header": path,
                                           "before": {"path": path, "state": "file"},
                                           "after": {"path": path, "state": "absent"}})


def unlisted(want: WantDir, listed: set[str]) -> list[str]:
    """The files below WANT matching its prune pattern that are not listed, sorted."""
    found: list[str] = []
    if want.prune is None or not os.path.isdir(want.path):
        return found
    for folder, _, names in os.walk(want.path):
        found += [os.path.join(folder, name) for name in names
                  if fnmatch.fnmatchcase(name, want.prune) and os.path.join(folder, name) not in listed]
    return sorted(found)


def removals(dirs: Sequence[WantDir], wanted: Sequence[WantFile], absent: Sequence[Any]) -> list[Action]:
    """The files to remove: unlisted ones below a pruned directory, and those of ``absent`` that are there."""
    listed = {w.dest for w in wanted}
    errors: list[str] = []
    paths: list[str] = [path for want in dirs for path in unlisted(want, listed)]
    for index, value in enumerate(absent):
        what = f"absent[{index}] ({value})"
        path = normal_path(value, what, errors)
        if path is None:
            continue
        if path in listed or path in {d.path for d in dirs}:
            errors.append(f"{what}: the path is also listed to be kept")
        elif os.path.isdir(path) and not os.path.islink(path):
            errors.append(f"{what}: it is a directory; absent removes files")
        elif lstat(path) is not None and path not in paths:
            paths.append(path)
    if errors:
        raise ItemError(errors)
    return [removal(path) for path in paths]


def plan(directories: Sequence[Mapping[str, Any]], files: Sequence[Mapping[str, Any]],
         absent: Sequence[Any] = ()) -> list[Action]:
    """What must change for the node to hold the items; raise ItemError (the node untouched) on a bad item."""
    dirs, wanted = read_items(directories, files)
    planner = Planner(dirs)
    for want_dir in dirs:
        try:
            planner.directory(want_dir)
        except OSError as err:
            planner.errors.append(f"directory {want_dir.path}: cannot be read: {err.strerror}")
    for want_file in wanted:
        try:
            planner.file(want_file)
        except OSError as err:
            planner.errors.append(f"file {want_file.dest}: cannot be read: {err.strerror}")
    if planner.errors:
        raise ItemError(planner.errors)
    return planner.actions + removals(dirs, wanted, absent)


def apply(action: Action) -> None:
    if action.kind == "mkdir":
        try:
            os.mkdir(action.path, action.mode)
        except FileExistsError:
            # Made since the plan by another call on this node (two deployments' installs at once).
            if not os.path.isdir(action.path):
                raise
        os.chmod(action.path, action.mode)  # mkdir's mode is cut by the umask
    elif action.kind == "chmod":
        os.chmod(action.path, action.mode)
    elif action.kind == "remove":
        try:
            os.unlink(action.path)
        except FileNotFoundError:
            pass
    else:
        write_atomic(action.path, action.data, action.mode)


def block_files(blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each block as the file item that holds it: the file's whole new content and its mode."""
    items = []
    for block in blocks:
        path = block["path"]
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            mode = block.get("mode") or mode_text(stat.S_IMODE(os.stat(path).st_mode))
        except FileNotFoundError:
            text, mode = "", block.get("mode") or "0600"
        except (OSError, UnicodeDecodeError) as err:
            raise ItemError([f"blocks: {path} cannot be read as text: {err}"]) from None
        items.append({"dest": path, "content": with_block(text, block["marker"], block["content"]), "mode": mode})
    return items


def refused_unit_files(units: Sequence[Mapping[str, Any]], directories: Sequence[Mapping[str, Any]],
                       files: Sequence[Mapping[str, Any]]) -> list[str]:
    """One message per path of units[].files that this call does not list."""
    listed = {os.path.normpath(str(d["path"])) for d in directories} | {os.path.normpath(str(f["dest"])) for f in files}
    return [f"units[{index}] ({unit['name']}): files names {path}, which this call does not list"
            for index, unit in enumerate(units) for path in unit["files"]
            if os.path.normpath(str(path)) not in listed]


def split_units(units: Sequence[Mapping[str, Any]], changed_paths: Sequence[str]) -> tuple[list[Any], list[str]]:
    """The units to keep running, and the names of those left to the caller as one of their files changed."""
    changed = {os.path.normpath(path) for path in changed_paths}
    kept = [unit for unit in units if not changed & {os.path.normpath(str(p)) for p in unit["files"]}]
    return kept, [str(unit["name"]) for unit in units if unit not in kept]


def keep_running(units: Sequence[Mapping[str, Any]], check_mode: bool, runner: Runner) -> list[str]:
    """Start and enable (or disable) each unit as asked; the names of those that changed. UnitError."""
    return [str(unit["name"]) for unit in units
            if keep_unit_running(unit["name"], unit["enabled"], check_mode, runner)]


def main(runner: Runner = run_command) -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "str", "required": True},
                "mode": {"type": "raw", "default": "0755"},
                "prune": {"type": "str"},
            }},
            "files": {"type": "list", "elements": "dict", "default": [], "options": {
                "dest": {"type": "str", "required": True},
                "content": {"type": "raw", "required": True},
                "mode": {"type": "raw", "default": "0644"},
            }},
            "blocks": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "str", "required": True},
                "marker": {"type": "str", "required": True},
                "content": {"type": "str", "required": True},
                "mode": {"type": "raw"},
            }},
            "absent": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "dict", "default": [], "options": {
                "name": {"type": "str", "required": True},
                "enabled": {"type": "bool"},
                "files": {"type": "list", "elements": "str", "default": []},
            }},
        },
        supports_check_mode=True,
    )
    units = module.params["units"]
    try:
        files = list(module.params["files"]) + block_files(module.params["blocks"])
        refused = refused_unit_files(units, module.params["directories"], files)
        if refused:
            raise ItemError(refused)
        actions = plan(module.params["directories"], files, module.params["absent"])
    except ItemError as err:
        module.fail_json(msg=err.msg, errors=err.errors, changed=False, changed_paths=[])
    done: list[str] = []
    if not module.check_mode:
        for action in actions:
            try:
                apply(action)
            except OSError as err:
                module.fail_json(
                    msg=f"node_files could not {action.kind} {action.path}: {err.strerror}; the paths in "
                        "changed_paths were changed before it, the ones listed after it were not",
                    changed=bool(done), changed_paths=done, failed_path=action.path)
            done.append(action.path)
    changed_paths = [a.path for a in actions]
    kept, left = split_units(units, changed_paths)
    try:
        touched = keep_running(kept, module.check_mode, runner)
    except UnitError as err:
        module.fail_json(msg=f"node_files wrote its files, then: {err}", changed=bool(actions),
                         changed_paths=changed_paths, units_left=left)
    result: dict[str, Any] = {"changed": bool(actions) or bool(touched), "changed_paths": changed_paths,
                              "units_changed": touched, "units_left": left}
    if module._diff and actions:
        result["diff"] = [a.diff for a in actions]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
