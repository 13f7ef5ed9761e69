"""The gateway_files filter plugin and its companions gateway_config_digest and gateway_listen_lines."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.filter import gateway_files as plugin
from ansible_collections.sparkserve.deploy.plugins.module_utils.gateway import config

SETTINGS = {"listen": "0.0.0.0", "port": 4000, "tls": False, "timeout_s": 3600, "max_body_mib": 64,
            "retry_after_s": 10, "log_dir": "/var/log/g", "state_dir": "/var/lib/g", "pid_file": "/run/g.pid",
            "user": "www-data"}
ROUTES = [{"deployment": "big", "models": ["glm"], "host": "127.0.0.1", "port": 8000}]


def test_the_digest_is_the_one_health_names_in_the_rendered_files() -> None:
    filters = plugin.FilterModule().filters()
    files = filters["gateway_files"](ROUTES, [{"name": "alice", "key": "alice-key-0123456789abcdef"}], SETTINGS)
    digest = filters["gateway_config_digest"](files)
    assert set(files) == {config.CONFIG_FILE, config.ROUTES_FILE}
    assert f"add_header {config.CONFIG_HEADER} {digest} always;" in files[config.CONFIG_FILE]
    opened = filters["gateway_files"](ROUTES, [], SETTINGS)  # no key: loopback only, another configuration
    assert filters["gateway_config_digest"](opened) != digest


def test_listen_lines_change_with_where_it_listens_and_not_with_the_keys() -> None:
    filters = plugin.FilterModule().filters()
    lines = filters["gateway_listen_lines"]
    keyed = filters["gateway_files"](ROUTES, [{"name": "alice", "key": "alice-key-0123456789abcdef"}], SETTINGS)
    other = filters["gateway_files"](ROUTES, [{"name": "bob", "key": "bob-key-0123456789abcdefgh"}], SETTINGS)
    opened = filters["gateway_files"](ROUTES, [], SETTINGS)
    assert lines(keyed[config.CONFIG_FILE]) == ["listen 0.0.0.0:4000;"] == lines(other[config.CONFIG_FILE])
    assert lines(opened[config.CONFIG_FILE]) == ["listen 127.0.0.1:4000;"]
    # As the role reads the one in place: the whole file, or nothing where there is none yet.
    assert lines("  # listen 1.2.3.4:1;\n    listen [::]:4000 ipv6only=off;\n") == ["listen [::]:4000 ipv6only=off;"]
    assert lines("") == []


@pytest.mark.parametrize("files", [{}, {config.CONFIG_FILE: "events {}\n"}])
def test_files_gateway_files_did_not_render_are_refused(files: dict[str, str]) -> None:
    with pytest.raises(AnsibleFilterError, match="the files hold no nginx.conf that gateway_files rendered"):
        plugin.gateway_config_digest(files)


def test_bad_settings_name_every_problem() -> None:
    with pytest.raises(AnsibleFilterError, match="the gateway's settings: "):
        plugin.gateway_files(ROUTES + ROUTES, [], SETTINGS)
