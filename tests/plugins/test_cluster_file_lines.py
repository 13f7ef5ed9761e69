"""plugin_utils/cluster_file_lines.py: the line of the field each cluster-file problem is about."""

from __future__ import annotations

import textwrap

import pytest

from ansible_collections.sparkserve.deploy.plugins.plugin_utils.cluster_file_lines import field_lines, locate

TEXT = textwrap.dedent("""\
    plugin: sparkserve.deploy.spark_cluster
    recipe: lab-tp2
    management_subnet: 192.168.1.0/24
    fabric:
      mtu: 20000
      twins:
        - {interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 192.168.100.0/24}
        - {interface: enP2p1s0f1np1, rdma_device: roceP2p1s0f1, subnet: 192.168.101.0/24}
    nodes:
      - name: spark-a
        address: 192.168.1.21
      - name: spark b
        adress: 192.168.1.22
    vars:
      colour: blue
    """)


@pytest.mark.parametrize("message,line", [
    ("fabric MTU 20000 is outside 1280..9216; ...", 5),
    ("subnet '192.168.101.0/33' of twin 2 (enP2p1s0f1np1) is not a valid CIDR; ...", 8),
    ("nodes[1] has unknown key 'adress'; did you mean 'address'? ...", 13),
    ("nodes[0] has no name; ...", 10),
    ("spark-a: management address ... is empty; ...", 10),
    ("node name 'spark b' (name in a .sparks.yml, ...) has a space, ...", 12),
    ("management address 192.168.1.23 is used by spark-a and spark-c; ...", 10),
    ("2 nodes are marked head (spark-a, spark-c); mark exactly one ...", 10),
    ("the top level has unknown key 'management_subnet'; ...", 3),
    ("vars sets sparkserve_recipe, which the plugin computes; ...", 14),
    ("recipe is missing; ...", None),
])
def test_each_problem_is_placed_on_its_field_s_line(message: str, line: int | None) -> None:
    assert locate(message, field_lines(TEXT)) == line


def test_a_file_that_is_not_yaml_has_no_lines() -> None:
    assert field_lines("nodes: [unclosed\n") == {}
    assert locate("fabric MTU 1 is outside ...", {}) is None
