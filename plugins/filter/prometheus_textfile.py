"""Metric families as the text a node exporter's textfile collector reads (a NAME.prom file)."""

from __future__ import annotations

from typing import Any, Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.textfile import (
    MetricFamily,
    MetricSample,
    exposition_text,
)

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
    A family with no samples keeps its C(# HELP) and C(# TYPE) lines.
  - >-
    Refused, naming the family: a metric or label name Prometheus does not allow, an unknown type, a counter
    whose name does not end in C(_total), a value that is not a number (a number written as text counts).
    NaN and infinities are written as Prometheus spells them (C(NaN), C(+Inf), C(-Inf)).
  - >-
    The text is the one the node programs write (the memory guard, the flusher, the supervisor): both come
    from the node library's C(textfile) module (plugins/module_utils/node/textfile.py).
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
  description: The exposition text, newline-terminated (empty when there is no family).
  type: str
"""

def _samples(name: Any, samples: Any) -> list[MetricSample]:
    if not isinstance(samples, list):
        raise AnsibleFilterError("prometheus_textfile: %s has samples %r; give a list" % (name, samples))
    converted: list[MetricSample] = []
    for sample in samples:
        if not isinstance(sample, Mapping):
            raise AnsibleFilterError("prometheus_textfile: a sample of %s is %r; give {labels, value}"
                                     % (name, sample))
        labels, value = sample.get("labels") or {}, sample.get("value")
        if not isinstance(labels, Mapping):
            raise AnsibleFilterError("prometheus_textfile: %s has labels %r; give a mapping" % (name, labels))
        if isinstance(value, str):  # a number templated into text
            try:
                value = float(value)
            except ValueError:
                pass
        converted.append((labels, value))  # type: ignore[arg-type]  # exposition_text refuses what is no number
    return converted


def _family(family: Any) -> MetricFamily:
    if not isinstance(family, Mapping):
        raise AnsibleFilterError("prometheus_textfile: each family is a mapping {name, type, help, samples}, "
                                 "not %r" % (family,))
    name = family.get("name")
    return MetricFamily(name, family.get("type", "gauge"), str(family.get("help") or ""),  # type: ignore[arg-type]
                        _samples(name, family.get("samples") or []))


def prometheus_textfile(families: Any) -> str:
    """The exposition text of FAMILIES (see DOCUMENTATION)."""
    if not isinstance(families, list):
        raise AnsibleFilterError("prometheus_textfile: give a list of metric families, not %r" % (families,))
    try:
        return exposition_text([_family(family) for family in families])
    except ValueError as err:
        raise AnsibleFilterError("prometheus_textfile: %s" % err) from None


class FilterModule:
    """sparkserve's textfile metrics."""

    def filters(self) -> dict[str, Any]:
        return {"prometheus_textfile": prometheus_textfile}
