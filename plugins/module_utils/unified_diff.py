"""Parse unified diffs and apply them strictly: zero fuzz and zero offset.

A hunk applies only where its header says it does: every context line and
every removed line must be, byte for byte, the line of the original at the
stated position. Unlike GNU ``patch``, nothing is searched for: no offset (a
hunk that would match a few lines away is refused), no fuzz (no context line
is ever ignored), no whitespace leniency. When a hunk does not apply,
``PatchError`` names the hunk, the line of the original and the expected
against the found line.

Everything works on bytes, split at ``\\n`` only, so line endings (``\\r\\n``
included) are kept exactly. ``str`` arguments are encoded as UTF-8, and
``apply_patch`` given a ``str`` original returns a ``str``.

Accepted input: ``--- a/x`` / ``+++ b/x`` headers (a tab and a timestamp after
the name are ignored), ``diff --git`` and other preamble lines before them,
several hunks, and ``\\ No newline at end of file``. A patch text that does not
end in a newline is read as if it did (the marker line is how a diff says
that a file has no newline at its end).

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import AnyStr, Dict, List, Optional, Tuple, Union

Text = Union[bytes, str]

_HUNK_HEADER = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


class PatchError(ValueError):
    """A patch that cannot be read, or a hunk that does not apply at zero fuzz and zero offset."""

    def __init__(self, msg: str, hunk: Optional[int] = None, line: Optional[int] = None,
                 expected: Optional[bytes] = None, found: Optional[bytes] = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.hunk = hunk
        self.line = line
        self.expected = expected
        self.found = found


@dataclass
class Hunk:
    """One ``@@`` block: its number in the file's patch (from 1), its header and its lines.

    ``lines`` holds (tag, content) pairs, tag one of ``" "``, ``"-"``, ``"+"``; content keeps its
    line ending (none for a line marked ``\\ No newline at end of file``).
    """

    number: int
    header: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: List[Tuple[str, bytes]] = field(default_factory=list)

    @property
    def old_lines(self) -> List[bytes]:
        return [content for tag, content in self.lines if tag != "+"]

    @property
    def new_lines(self) -> List[bytes]:
        return [content for tag, content in self.lines if tag != "-"]


@dataclass
class FilePatch:
    """The patch of one file: its two header paths, its hunks and its own text (preamble included)."""

    old_path: str
    new_path: str
    hunks: List[Hunk]
    text: bytes

    @property
    def target(self) -> str:
        """The path the patch writes, without git's ``a/`` / ``b/`` prefix."""
        path = self.new_path if self.new_path != "/dev/null" else self.old_path
        old_git = self.old_path.startswith("a/") or self.old_path == "/dev/null"
        new_git = self.new_path.startswith("b/") or self.new_path == "/dev/null"
        if old_git and new_git and path[:2] in ("a/", "b/"):
            return path[2:]
        return path


def _as_bytes(data: Text) -> bytes:
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)


def split_lines(data: bytes) -> List[bytes]:
    """Split at ``\\n`` only, keeping every line's ending; the last line may have none."""
    lines = data.split(b"\n")
    out = [line + b"\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _show(line: Optional[bytes]) -> str:
    if line is None:
        return "the end of the file"
    return repr(line.decode("utf-8", "replace"))


def _header_path(rest: bytes) -> str:
    name = rest.rstrip(b"\r\n").split(b"\t", 1)[0].rstrip(b" ")
    text = name.decode("utf-8", "surrogateescape")
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        text = text[1:-1]
    return text


def _mark_no_newline(body: List[Tuple[str, bytes]], number: int, patch_line: int) -> None:
    if not body or not body[-1][1].endswith(b"\n"):
        raise PatchError(f"hunk {number}: patch line {patch_line}: '\\ No newline at end of file' "
                         "follows no line that has one", hunk=number)
    tag, content = body[-1]
    body[-1] = (tag, content[:-1])


def _parse_hunk(lines: List[bytes], i: int, number: int) -> Tuple[Hunk, int]:
    header = lines[i].rstrip(b"\r\n")
    match = _HUNK_HEADER.match(header)
    if not match:
        raise PatchError(f"hunk {number}: patch line {i + 1} is not a hunk header: {_show(lines[i])}", hunk=number)
    old_start, old_count, new_start, new_count = (
        int(match.group(1)), int(match.group(2) or 1), int(match.group(3)), int(match.group(4) or 1))
    hunk = Hunk(number, header.decode("utf-8", "replace"), old_start, old_count, new_start, new_count)
    old_left, new_left = old_count, new_count
    i += 1
    while old_left > 0 or new_left > 0:
        if i >= len(lines):
            raise PatchError(f"hunk {number} ({hunk.header}) is cut short: the patch ends {old_left} original "
                             f"and {new_left} patched line(s) early", hunk=number)
        line = lines[i]
        tag = line[:1]
        if tag == b"\\":
            _mark_no_newline(hunk.lines, number, i + 1)
            i += 1
            continue
        if tag == b" ":
            hunk.lines.append((" ", line[1:]))
            old_left, new_left = old_left - 1, new_left - 1
        elif line in (b"\n", b"\r\n"):  # a context line whose lone space an editor trimmed
            hunk.lines.append((" ", line))
            old_left, new_left = old_left - 1, new_left - 1
        elif tag == b"-":
            hunk.lines.append(("-", line[1:]))
            old_left -= 1
        elif tag == b"+":
            hunk.lines.append(("+", line[1:]))
            new_left -= 1
        else:
            raise PatchError(f"hunk {number} ({hunk.header}) is cut short at patch line {i + 1}: "
                             f"{_show(line)} is not a context, removed or added line", hunk=number)
        if old_left < 0 or new_left < 0:
            raise PatchError(f"hunk {number} ({hunk.header}) has more lines than its header counts "
                             f"(patch line {i + 1})", hunk=number)
        i += 1
    if i < len(lines) and lines[i][:1] == b"\\":
        _mark_no_newline(hunk.lines, number, i + 1)
        i += 1
    return hunk, i


def parse_patches(patch: Text) -> List[FilePatch]:
    """Every file's patch in a (possibly multi-file) unified diff, in order."""
    data = _as_bytes(patch)
    if data and not data.endswith(b"\n"):
        data += b"\n"
    lines = split_lines(data)
    files: List[FilePatch] = []
    preamble: Optional[int] = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"diff --git "):
            if preamble is not None:
                raise PatchError(f"patch line {preamble + 1}: {_show(lines[preamble])} changes no lines "
                                 "(a binary, mode-only or rename-only change cannot be applied here)")
            preamble = i
            i += 1
            continue
        if line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            start = preamble if preamble is not None else i
            old_path, new_path = _header_path(line[4:]), _header_path(lines[i + 1][4:])
            i += 2
            hunks: List[Hunk] = []
            while i < len(lines) and lines[i].startswith(b"@@ "):
                hunk, i = _parse_hunk(lines, i, len(hunks) + 1)
                hunks.append(hunk)
            if not hunks:
                raise PatchError(f"the patch of {new_path} has no hunks")
            files.append(FilePatch(old_path, new_path, hunks, b"".join(lines[start:i])))
            preamble = None
            continue
        if line.startswith(b"@@ "):
            raise PatchError(f"patch line {i + 1}: a hunk with no '--- ' / '+++ ' header before it")
        i += 1
    if preamble is not None:
        raise PatchError(f"patch line {preamble + 1}: {_show(lines[preamble])} changes no lines "
                         "(a binary, mode-only or rename-only change cannot be applied here)")
    if not files:
        raise PatchError("no unified diff found: no '--- ' / '+++ ' header followed by a hunk")
    return files


def parse_patch(patch: Text) -> FilePatch:
    """The patch of exactly one file; a diff that touches several files is refused."""
    files = parse_patches(patch)
    if len(files) != 1:
        raise PatchError(f"the patch touches {len(files)} files ({', '.join(f.target for f in files)}); "
                         "give one file's patch (split_patch splits a multi-file diff)")
    return files[0]


def split_patch(patch: Text) -> Dict[str, Text]:
    """Split a multi-file diff into one diff per file, keyed by target path (git's ``b/`` removed).

    Each value is that file's own text (its ``diff --git`` preamble included), of the input's type.
    """
    out: Dict[str, Text] = {}
    for file_patch in parse_patches(patch):
        if file_patch.target in out:
            raise PatchError(f"the patch touches {file_patch.target} twice")
        text = file_patch.text
        out[file_patch.target] = text.decode("utf-8", "surrogateescape") if isinstance(patch, str) else text
    return out


def _find_elsewhere(lines: List[bytes], block: List[bytes], skip: int) -> Optional[int]:
    if not block:
        return None
    for start in range(len(lines) - len(block) + 1):
        if start != skip and lines[start:start + len(block)] == block:
            return start
    return None


def apply_hunks(original: bytes, file_patch: FilePatch) -> bytes:
    """Apply a parsed patch to the original bytes at zero fuzz and zero offset."""
    lines = split_lines(original)
    out: List[bytes] = []
    pos = 0  # lines of the original consumed so far
    for hunk in file_patch.hunks:
        old = hunk.old_lines
        new = hunk.new_lines
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        where = f"hunk {hunk.number} ({hunk.header})"
        if start < 0 or (hunk.old_count and hunk.old_start < 1):
            raise PatchError(f"{where}: starts at line {hunk.old_start}, before the first line", hunk=hunk.number)
        if start < pos:
            raise PatchError(f"{where}: starts at line {start + 1}, before the end of the hunk ahead of it "
                             f"(line {pos}); hunks must be in order and must not overlap", hunk=hunk.number)
        if start > len(lines):
            raise PatchError(f"{where}: starts at line {start + 1}, past the end of the file "
                             f"({len(lines)} lines)", hunk=hunk.number, line=start + 1)
        for k, expected in enumerate(old):
            found = lines[start + k] if start + k < len(lines) else None
            if found != expected:
                msg = (f"{where}: line {start + k + 1}: expected {_show(expected)}, found {_show(found)} "
                       "(zero fuzz: every context and removed line must match exactly)")
                elsewhere = _find_elsewhere(lines, old, start)
                if elsewhere is not None:
                    msg += (f"; the hunk's lines are at line {elsewhere + 1} (offset {elsewhere - start:+d}), "
                            "but hunks apply at zero offset only: make the patch against this very file")
                raise PatchError(msg, hunk=hunk.number, line=start + k + 1, expected=expected, found=found)
        out.extend(lines[pos:start])
        out.extend(new)
        pos = start + len(old)
        unended = [k for k, content in enumerate(new) if not content.endswith(b"\n")]
        if unended and (unended != [len(new) - 1] or pos < len(lines)):
            raise PatchError(f"{where}: a patched line marked '\\ No newline at end of file' "
                             "is not the last line of the file", hunk=hunk.number)
    out.extend(lines[pos:])
    return b"".join(out)


def apply_patch(original: AnyStr, patch: Union[Text, FilePatch]) -> AnyStr:
    """Apply one file's unified diff to the original at zero fuzz and zero offset.

    Returns the patched content, ``str`` for a ``str`` original and ``bytes`` for bytes.
    Raises ``PatchError`` naming the hunk, the line and the expected against the found line.
    """
    file_patch = patch if isinstance(patch, FilePatch) else parse_patch(patch)
    result = apply_hunks(_as_bytes(original), file_patch)
    return result.decode("utf-8", "surrogateescape") if isinstance(original, str) else result
