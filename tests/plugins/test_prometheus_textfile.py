"""The prometheus_textfile filter: what a node exporter's textfile collector reads."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.filter.prometheus_textfile import (
    FilterModule,
    prometheus_textfile,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.node import textfile

WEIGHTS = [
    {"name": "sparkserve_weights_verified_bytes", "type": "gauge", "help": "Bytes of the revision verified.",
     "samples": [{"labels": {"revision": "abc", "repo": "org/model"}, "value": 1024},
                 {"labels": {"repo": 'a "quoted"\\name\n', "revision": "def"}, "value": 2.5}]},
    {"name": "sparkserve_flusher_passes_total", "type": "counter", "help": "Passes.\nTwo lines.",
     "samples": [{"labels": {}, "value": True}]},
    {"name": "sparkserve_empty", "type": "gauge", "help": "No sample: its HELP and TYPE stay.", "samples": []},
]


def test_families_become_the_exposition_text_with_sorted_escaped_labels() -> None:
    assert prometheus_textfile(WEIGHTS) == (
        "# HELP sparkserve_weights_verified_bytes Bytes of the revision verified.\n"
        "# TYPE sparkserve_weights_verified_bytes gauge\n"
        'sparkserve_weights_verified_bytes{repo="org/model",revision="abc"} 1024\n'
        'sparkserve_weights_verified_bytes{repo="a \\"quoted\\"\\\\name\\n",revision="def"} 2.5\n'
        "# HELP sparkserve_flusher_passes_total Passes.\\nTwo lines.\n"
        "# TYPE sparkserve_flusher_passes_total counter\n"
        "sparkserve_flusher_passes_total 1\n"
        "# HELP sparkserve_empty No sample: its HELP and TYPE stay.\n"
        "# TYPE sparkserve_empty gauge\n")
    assert FilterModule().filters()["prometheus_textfile"] is prometheus_textfile
    assert prometheus_textfile([]) == ""


def test_the_text_is_the_node_programs_text_nan_and_infinities_included() -> None:
    """One behaviour: the filter's text is the node library's (what the guard, the flusher and the supervisor
    write), NaN and infinities written as Prometheus spells them, numbers given as text read as numbers."""
    families = [{"name": "x", "help": "X.", "samples": [{"labels": {"b": "2", "a": "1"}, "value": float("nan")},
                                                        {"labels": {"a": "3"}, "value": float("-inf")},
                                                        {"labels": {"a": "4"}, "value": "2.5"}]}]
    assert prometheus_textfile(families) == textfile.exposition_text([
        textfile.MetricFamily("x", "gauge", "X.", [({"a": "1", "b": "2"}, float("nan")),
                                                    ({"a": "3"}, float("-inf")), ({"a": "4"}, 2.5)])])
    assert prometheus_textfile(families).splitlines()[2:] == ['x{a="1",b="2"} NaN', 'x{a="3"} -Inf', 'x{a="4"} 2.5']


def test_promtool_reads_the_text_back() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run tools/setup-controller.sh (it installs Debian's prometheus)"
    done = subprocess.run([promtool, "check", "metrics"], input=prometheus_textfile(WEIGHTS[:2]), text=True,
                          capture_output=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(("families", "message"), [
    ({"name": "x"}, "give a list of metric families"),
    ([{"name": "bad-name", "samples": [{"value": 1}]}], "'bad-name' is not a metric name"),
    ([{"name": "x", "type": "histogram", "samples": [{"value": 1}]}], "x has the type 'histogram'"),
    ([{"name": "x", "type": "counter", "samples": [{"value": 1}]}], "x is a counter; its name must end in _total"),
    ([{"name": "x", "samples": [{"value": "many"}]}], "x has the value 'many'"),
    ([{"name": "x", "samples": [{"labels": {"bad-label": "1"}, "value": 1}]}], "the label name 'bad-label'"),
    ([{"name": "x", "samples": [{"labels": {"__name__": "y"}, "value": 1}]}], "the label name '__name__'"),
])
def test_what_prometheus_would_refuse_is_refused_naming_the_family(families: object, message: str) -> None:
    with pytest.raises(AnsibleFilterError, match=message.replace("(", r"\(").replace("[", r"\[")):
        prometheus_textfile(families)
