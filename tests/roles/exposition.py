"""Read back the node-exporter textfiles the memory guard, the flusher and the supervisor write.

A strict reader of the part of Prometheus' text exposition format they use: every family opens with
``# HELP`` then ``# TYPE``, its samples follow (no timestamps), label values are quoted with backslash,
double quote and newline escaped, and the text ends with a newline.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"({METRIC_NAME})(?:\{{(.*)\}})? (\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

Labels = dict[str, str]


@dataclass
class Family:
    name: str
    kind: str
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def value(self, **labels: str) -> float:
        """The value of the one sample with exactly these labels."""
        [value] = [v for found, v in self.samples if found == labels]
        return value


def parse_labels(text: str) -> Labels:
    labels: Labels = {}
    position = 0
    while position < len(text):
        match = LABEL.match(text, position)
        assert match is not None, f"bad labels at {text[position:]!r}"
        name, raw, _ = match.groups()
        assert name not in labels, f"label {name} twice"
        labels[name] = re.sub(r"\\[\\\"n]", lambda m: UNESCAPE[m.group(0)], raw)
        position = match.end()
    return labels


def parse(text: str) -> dict[str, Family]:
    """The families of a textfile, by name; asserts that the text is well formed."""
    assert text.endswith("\n"), "the text does not end with a newline"
    families: dict[str, Family] = {}
    current: Family | None = None
    lines = text[:-1].split("\n")
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert name not in families, f"{name} twice"
            assert index + 1 < len(lines) and lines[index + 1].startswith(f"# TYPE {name} "), \
                f"# HELP {name} not followed by its # TYPE"
            kind = lines[index + 1].split(" ")[3]
            assert kind in ("gauge", "counter"), kind
            assert help_text, f"{name} has an empty help"
            current = families[name] = Family(name, kind, help_text)
            index += 2
            continue
        assert not line.startswith("#"), f"unexpected line {line!r}"
        match = SAMPLE.fullmatch(line)
        assert match is not None, f"bad sample line {line!r}"
        name, labels, value = match.groups()
        assert current is not None and name == current.name, f"{name} outside its family"
        current.samples.append((parse_labels(labels or ""), float(value)))
        index += 1
    return families


def read(path: Path) -> dict[str, Family]:
    """Parse the file, after checking that it is mode 0644 and that no temporary file is left beside it."""
    assert (path.stat().st_mode & 0o777) == 0o644
    assert leftovers(path) == []
    return parse(path.read_text(encoding="utf-8"))


def leftovers(path: Path) -> list[str]:
    """Temporary files of the metrics file left in its folder: the node library's (.NAME.XXXX.tmp), and the
    PATH.tmp.PID of older releases."""
    return sorted(name for name in os.listdir(path.parent)
                  if name.startswith(f".{path.name}.") or name.startswith(f"{path.name}.tmp."))
