"""The node_exporter textfile that sparkserve's node programs write: one home for the memory guard, the flusher
and the supervisor.

Each of those programs (roles/memguard, roles/flusher and roles/supervisor, files/sparkserve-*.py) writes its
figures as Prometheus' text exposition format into a file that node_exporter's textfile collector reads. This
module holds what they share: a family of samples (MetricFamily), the exposition text (label and help
escaping, sample values) and the writer that replaces the file whole, says a failure once and removes the
file when the program stops. Which families a program writes stays in the program.

The roles install this file beside the programs, in sparkserve_programs_dir (the variable
sparkserve_node_library of roles/sparkserve names this source), and systemd runs each program as
``/usr/bin/python3 PROGRAM``: python puts the program's folder first on sys.path, so ``from
sparkserve_textfile import ...`` finds it there. It runs on the node's system python3 (3.10 or later on the
Sparks): standard library only, and no syntax newer than the programs use.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["MetricFamily", "MetricSample", "TextfileWriter", "escape_label_value", "exposition_text",
           "metric_value"]

# One sample of a family: its labels (name -> value) and its value.
MetricSample = tuple[Mapping[str, str], float]


@dataclass(frozen=True)
class MetricFamily:
    """One family of Prometheus' text exposition format: name, type (gauge or counter), help, samples."""

    name: str
    kind: str
    help: str
    samples: Sequence[MetricSample]


def escape_label_value(value: str) -> str:
    """A label value as the text format quotes it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_value(value: float) -> str:
    """A sample value: whole numbers without a fraction, the others as Python writes floats."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, int) or (value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    return repr(float(value))


def exposition_text(families: Sequence[MetricFamily]) -> str:
    """``# HELP`` and ``# TYPE`` of each family, then its samples; newline-terminated."""
    lines: list[str] = []
    for family in families:
        help_text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family.name} {help_text}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            pairs = ",".join(f'{key}="{escape_label_value(text)}"' for key, text in labels.items())
            lines.append(f"{family.name}{{{pairs}}} {metric_value(value)}" if pairs
                         else f"{family.name} {metric_value(value)}")
    return "\n".join(lines) + "\n"


class TextfileWriter:
    """The metrics file node_exporter's textfile collector reads, replaced whole at each write.

    The text goes to ``PATH.tmp.PID`` in the same folder (mode 0644), renamed onto PATH: a scrape
    never sees half a file.  The folder is not created.  A write or removal that fails (a missing
    folder, a full disk) is logged to stderr once, and again only after a write succeeded; the
    program carries on without its metrics.  ``who`` starts each such line (``memguard glm53``).
    """

    def __init__(self, path: str, who: str) -> None:
        self.path = path
        self.who = who
        self.failing = False

    def write(self, families: Sequence[MetricFamily]) -> bool:
        """Replace the file; False when it could not be written."""
        temporary = f"{self.path}.tmp.{os.getpid()}"
        try:
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    os.fchmod(out.fileno(), 0o644)
                    out.write(exposition_text(families))
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError, ValueError):
                    os.unlink(temporary)
                raise
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
