"""How the bench role reaches the deployment's API from the controller, by where the API listens: through an ssh
tunnel to the head when it listens on one address (the head's loopback, or its fabric address while the gateway
runs on another node: the controller may not reach the fabric at all), directly at the head's address when it
listens on every interface.

The role's tasks do not run: a play that lists the role reads its variables (its defaults, its vars, and the
sparkserve role's it depends on) for three recipes that differ in launch.api_host alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.roles.test_shared_paths import local_vars, run_play


def reach(tmp_path: Path, api_host: str) -> dict[str, Any]:
    out = tmp_path / "reach.json"
    play = [{
        "name": "Read how the bench reaches the API",
        "hosts": "sparks",
        "gather_facts": False,
        "roles": ["bench"],
        "tasks": [{
            "name": "Write the tunnel, the URL and the tunnel's forward",
            "ansible.builtin.copy": {
                "content": "{{ {'tunnel': __bench_tunnel, 'url': __bench_url, 'forward': __bench_tunnel_tag}"
                           " | to_json }}",
                "dest": str(out),
                "mode": "0644",
            },
            "delegate_to": "localhost",
            "tags": ["probe"],
        }],
    }]
    recipe = {"name": "lab-tp2", "launch": {"api_host": api_host, "api_port": 8000}}
    inventory = {"sparks": {"hosts": {"spark-1": {"ansible_host": "192.0.2.11"}},
                            "vars": local_vars(recipe_deployment="dep", bench_recipe=recipe,
                                               sparkserve_head="spark-1")}}
    done = run_play(tmp_path, play, inventory, "--tags", "probe", "--skip-tags", "always")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("api_host", ["127.0.0.1", "10.77.1.11"])
def test_an_api_on_one_address_of_the_head_is_reached_through_the_tunnel(tmp_path: Path, api_host: str) -> None:
    assert reach(tmp_path, api_host) == {"tunnel": True, "url": "http://127.0.0.1:18000",
                                         "forward": f"127.0.0.1:18000:{api_host}:8000"}


def test_an_api_on_every_interface_is_reached_at_the_head_s_address(tmp_path: Path) -> None:
    found = reach(tmp_path, "0.0.0.0")
    assert (found["tunnel"], found["url"]) == (False, "http://192.0.2.11:8000")
