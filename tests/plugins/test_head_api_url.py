"""The head_api_url filter: where the head reaches a deployment's API."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.filter.head_api_url import FilterModule

head_api_url = FilterModule().filters()["head_api_url"]
WILDCARDS = ["0.0.0.0", "::"]


@pytest.mark.parametrize("host,url", [
    ("0.0.0.0", "http://127.0.0.1:8000"),
    ("::", "http://127.0.0.1:8000"),
    ("127.0.0.1", "http://127.0.0.1:8000"),
    ("10.77.1.11", "http://10.77.1.11:8000"),
    ("fd00::1", "http://[fd00::1]:8000"),
    ("spark-a", "http://spark-a:8000"),
])
def test_the_head_reaches_the_api_where_it_listens(host: str, url: str) -> None:
    assert head_api_url({"api_host": host, "api_port": 8000}, WILDCARDS) == url


def test_a_launch_without_host_or_port_is_an_error() -> None:
    with pytest.raises(AnsibleFilterError, match="needs a launch section with api_host and api_port"):
        head_api_url({"api_port": 8000}, WILDCARDS)
