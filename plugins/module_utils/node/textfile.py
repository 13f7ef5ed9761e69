"""node_exporter's textfile: the one way sparkserve writes Prometheus' text exposition format.

The memory guard, the flusher and the supervisor write their figures with TextfileWriter; the stages write
theirs with the prometheus_textfile filter (plugins/filter), which renders its families with exposition_text
and has node_files write them. Which families a program writes stays in the program.

The text: per family a ``# HELP`` and a ``# TYPE`` line, then one line per sample, its labels sorted by name,
label values and help escaped; a family with no sample keeps its ``# HELP`` and ``# TYPE`` (the figure is
known, its value is not); the text ends with a newline (it is empty when there is no family). Refused
(ValueError, naming the family): a metric or label name Prometheus does not allow, a type other than gauge,
counter or untyped, a counter whose name does not end in ``_total``, a value that is not a number. Values: a
whole number without a fraction (an int stays exact however large, a whole float up to 2**53), others as
Python writes floats, and NaN, +Inf and -Inf as Prometheus spells them.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass
from typing import List, Mapping, Sequence, Tuple

from .files import write_atomic

__all__ = ["KINDS", "MetricFamily", "MetricSample", "TextfileWriter", "escape_label_value", "exposition_text",
           "metric_value"]

KINDS = ("gauge", "counter", "untyped")
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# One sample of a family: its labels (name -> value) and its value.
MetricSample = Tuple[Mapping[str, str], float]


@dataclass(frozen=True)
class MetricFamily:
    """One family of Prometheus' text exposition format: name, type (gauge, counter or untyped), help, samples."""

    name: str
    kind: str
    help: str
    samples: Sequence[MetricSample]


def escape_label_value(value: str) -> str:
    """A label value as the text format quotes it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_value(value: float) -> str:
    """A sample value: whole numbers without a fraction, the others as Python writes floats."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if not isinstance(value, (int, float)):
        raise ValueError(f"the value {value!r} is not a number")
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, int) or (value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    return repr(float(value))


def _labels(family: MetricFamily, labels: Mapping[str, str]) -> str:
    pairs = []
    for key in sorted(labels):
        if not isinstance(key, str) or not LABEL_NAME.fullmatch(key) or key.startswith("__"):
            raise ValueError(f"{family.name} has the label name {key!r}, which Prometheus does not allow")
        pairs.append(f'{key}="{escape_label_value(str(labels[key]))}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _family_lines(family: MetricFamily) -> List[str]:
    if not isinstance(family.name, str) or not METRIC_NAME.fullmatch(family.name):
        raise ValueError(f"{family.name!r} is not a metric name Prometheus allows")
    if family.kind not in KINDS:
        raise ValueError(f"{family.name} has the type {family.kind!r}; give one of {', '.join(KINDS)}")
    if family.kind == "counter" and not family.name.endswith("_total"):
        raise ValueError(f"{family.name} is a counter; its name must end in _total")
    help_text = (family.help or family.name).replace("\\", "\\\\").replace("\n", "\\n")
    lines = [f"# HELP {family.name} {help_text}", f"# TYPE {family.name} {family.kind}"]
    for labels, value in family.samples:
        try:
            text = metric_value(value)
        except ValueError:
            raise ValueError(f"{family.name} has the value {value!r}; give a number") from None
        lines.append(f"{family.name}{_labels(family, labels)} {text}")
    return lines


def exposition_text(families: Sequence[MetricFamily]) -> str:
    """The text of these families (see the module's docstring); ValueError naming a family Prometheus refuses."""
    lines = [line for family in families for line in _family_lines(family)]
    return "\n".join(lines) + "\n" if lines else ""


class TextfileWriter:
    """The metrics file node_exporter's textfile collector reads, replaced whole at each write.

    The text goes to a hidden temporary file in the same folder (mode 0644), renamed onto PATH (files.write_atomic):
    a scrape never sees half a file, and the collector, which reads ``*.prom`` only, never the temporary one.
    The folder is not created. A write or removal that fails (a missing folder, a full disk) is logged to stderr
    once, and again only after a write succeeded; the program carries on without its metrics. ``who`` starts
    each such line (``memguard glm53``).
    """

    def __init__(self, path: str, who: str) -> None:
        self.path = path
        self.who = who
        self.failing = False

    def write(self, families: Sequence[MetricFamily]) -> bool:
        """Replace the file; False when it could not be written."""
        try:
            # Rewritten every few seconds and worthless after a crash: not flushed to disk.
            write_atomic(self.path, exposition_text(families), 0o644, sync=False)
        except (OSError, ValueError) as err:
            self.failed("write", err)
            return False
        self.failing = False
        return True

    def remove(self) -> None:
        """Remove the file (a stopped program leaves no figures); a file already gone is fine."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as err:
            self.failed("remove", err)

    def failed(self, what: str, err: Exception) -> None:
        """Say on stderr that WHAT (write or remove) failed, unless it was said already and no write succeeded since."""
        if not self.failing:
            why = getattr(err, "strerror", None) or str(err)
            print(f"{self.who}: cannot {what} the metrics file {self.path}: {why}; carrying on without it",
                  file=sys.stderr, flush=True)
        self.failing = True
