"""What node_files must change for a node to hold its items: the plan, read from the node, before anything is
written (plugins/modules/node_files.py applies it). A bad item raises ItemError with every problem at once."""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

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
