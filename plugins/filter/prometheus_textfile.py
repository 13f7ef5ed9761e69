"""Metric families as the text a node exporter's textfile collector reads (a NAME.prom file)."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: prometheus_textfile
short_description: Metric families as Prometheus's text exposition format, for a textfile collector
version_added: "0.3.0"
description:
  - >-
    Turns a list of metric families into the text a node exporter's textfile collector reads: per family a
    C(# HELP) and a C(# TYPE) line, then one line per sample, labels sorted by name, values escaped; the text
    ends with a newline. sparkserve's stages write it into C(sparkserve_metrics_dir) with
    M(sparkserve.deploy.node_files), which writes it atomically.
  - >-
    A family is C({name, type, help, samples}); C(type) is C(gauge), C(counter) or C(untyped); each sample is
    C({labels, value}) with C(labels) a mapping of strings and C(value) a number (a boolean counts as 1 or 0).
    A family with no samples is left out.
  - >-
    Refused, naming the family: a metric or label name Prometheus does not allow, an unknown type, a counter
    whose name does not end in C(_total), a value that is not a finite number.
options:
  _input:
    description: The metric families, in the order they are written.
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
content: >-
  {{ [{'name': 'sparkserve_weights_verified_bytes', 'type': 'gauge', 'help': 'Bytes verified.',
       'samples': [{'labels': {'repo': 'org/model', 'revision': 'abc'}, 'value': 1024}]}]
     | sparkserve.deploy.prometheus_textfile }}
"""

RETURN = r"""
_value:
  description: The exposition text, newline-terminated (empty when no family has a sample).
  type: str
"""

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TYPES = ("gauge", "counter", "untyped")


def _escape(value: str, quote: bool) -> str:
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
    return escaped.replace('"', '\\"') if quote else escaped


def _number(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return repr(int(value)) if float(value).is_integer() and abs(value) < 2 ** 53 else repr(float(value))
    if isinstance(value, str):
        try:
            return _number(float(value), where)
        except ValueError:
            pass
    raise AnsibleFilterError("prometheus_textfile: %s has the value %r; give a finite number" % (where, value))


def _labels(labels: Any, where: str) -> str:
    if labels in (None, {}):
        return ""
    if not isinstance(labels, Mapping):
        raise AnsibleFilterError("prometheus_textfile: %s has labels %r; give a mapping" % (where, labels))
    parts = []
    for key in sorted(labels):
        if not isinstance(key, str) or not _LABEL_NAME.match(key) or key.startswith("__"):
            raise AnsibleFilterError("prometheus_textfile: %s has the label name %r, which Prometheus does not "
                                     "allow" % (where, key))
        parts.append('%s="%s"' % (key, _escape(str(labels[key]), quote=True)))
    return "{" + ",".join(parts) + "}"


def _family(family: Any) -> list[str]:
    if not isinstance(family, Mapping):
        raise AnsibleFilterError("prometheus_textfile: each family is a mapping {name, type, help, samples}, "
                                 "not %r" % (family,))
    name, kind = family.get("name"), family.get("type", "gauge")
    if not isinstance(name, str) or not _METRIC_NAME.match(name):
        raise AnsibleFilterError("prometheus_textfile: %r is not a metric name Prometheus allows" % (name,))
    if kind not in TYPES:
        raise AnsibleFilterError("prometheus_textfile: %s has the type %r; give one of %s"
                                 % (name, kind, ", ".join(TYPES)))
    if kind == "counter" and not name.endswith("_total"):
        raise AnsibleFilterError("prometheus_textfile: %s is a counter; its name must end in _total" % name)
    samples = family.get("samples") or []
    if not isinstance(samples, list):
        raise AnsibleFilterError("prometheus_textfile: %s has samples %r; give a list" % (name, samples))
    if not samples:
        return []
    lines = ["# HELP %s %s" % (name, _escape(str(family.get("help") or name), quote=False)),
             "# TYPE %s %s" % (name, kind)]
    for sample in samples:
        if not isinstance(sample, Mapping):
            raise AnsibleFilterError("prometheus_textfile: a sample of %s is %r; give {labels, value}"
                                     % (name, sample))
        lines.append("%s%s %s" % (name, _labels(sample.get("labels"), name), _number(sample.get("value"), name)))
    return lines


def prometheus_textfile(families: Any) -> str:
    """The exposition text of FAMILIES (see DOCUMENTATION)."""
    if not isinstance(families, list):
        raise AnsibleFilterError("prometheus_textfile: give a list of metric families, not %r" % (families,))
    lines = [line for family in families for line in _family(family)]
    return "\n".join(lines) + "\n" if lines else ""


class FilterModule:
    """sparkserve's textfile metrics."""

    def filters(self) -> dict[str, Any]:
        return {"prometheus_textfile": prometheus_textfile}
