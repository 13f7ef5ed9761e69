"""The engine adapters, and what adding a third engine takes: one adapter, nothing else.

A toy engine is defined here, registered, and then goes where vLLM and SGLang
go: the recipe's schema accepts it, validation applies its owned flags and its
own problems, the render builds its command line and carries its facts, the
recipe_render module returns them, the fabric environment names its host-IP
variable, and engine_ready readies it through its own paths against a fake.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, List, Mapping

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.filter.fabric_env import fabric_env
from ansible_collections.sparkserve.deploy.plugins.module_utils import engines
from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import Engine, Problem
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.render import engine_facts, render_rank
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import validate_recipe
from ansible_collections.sparkserve.deploy.plugins.modules import engine_ready, recipe_render

pytestmark = pytest.mark.usefixtures("as_module")

IMAGE = "registry.example:5000/toy@sha256:" + "a" * 64
COMMIT = "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5"
NODE = {"sparkserve_fabric_interfaces": ["enp1s0f1np1"], "sparkserve_rdma_devices": ["rocep1s0f1"],
        "sparkserve_fabric_ip": "10.77.1.12"}


class ToyServe(Engine):
    """An engine with its own program, flags, paths, dead pattern, cache and metrics."""

    name = "toyserve"
    owned_flags = {"weights": "model.path_in_container", "world": "the cluster's node count"}
    host_ip_variable = "TOY_HOST_IP"
    health_path = "/ping"
    models_path = "/toy/models"
    completions_path = "/toy/complete"
    metrics_path = "/toy/metrics"
    dead_health_pattern = "toy gave up"
    fatal_log_patterns = (r"toy panic",)
    load_progress_pattern = r"toy loaded (?P<done>\d+) of (?P<total>\d+)"
    cache_mounts = (("toy", "/var/cache/toy"),)
    metric_names = {"spec_accept_length": "toy:accept_length"}

    def launch_argv(self, recipe: Mapping[str, Any], rank: int, world_size: int, head_fabric_ip: str) -> List[str]:
        argv = ["toyserve", "--weights", recipe["model"]["path_in_container"], "--world", str(world_size),
                "--rank", str(rank), "--meet", "%s:%d" % (head_fabric_ip, recipe["launch"]["master_port"])]
        return argv + (["--listen", str(recipe["launch"]["api_port"])] if rank == 0 else [])

    def kv_words(self, kv: Mapping[str, Any]) -> List[str]:
        return ["--kv", str(kv["dtype"])] if kv.get("dtype") is not None else []

    def problems(self, recipe: Mapping[str, Any]) -> List[Problem]:
        kv = recipe.get("kv_cache") or {}
        if kv.get("block_size") is not None:
            return [("kv_cache.block_size", kv["block_size"], "toyserve has fixed blocks; remove it")]
        return []


@pytest.fixture
def toy() -> Iterator[Engine]:
    adapter = ToyServe()
    engines.register(adapter)
    yield adapter
    engines.unregister(adapter.name)


def recipe(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "t", "engine": "toyserve", "image": IMAGE,
                            "model": {"repo": "org/model", "revision": COMMIT, "served_name": "m"},
                            "parallel": {"tensor": 2}}
    data.update(changes)
    return data


def test_an_unregistered_engine_is_refused_with_the_registered_ones() -> None:
    errors = validate_recipe(recipe(), "t")[1]
    assert errors == ['recipe t: engine is "toyserve"; use one of: sglang, vllm.']


def test_the_toy_validates_with_its_owned_flags_and_its_own_problems(toy: Engine) -> None:
    checked, errors = validate_recipe(recipe(kv_cache={"dtype": "q8"}, engine_args={"threads": 4}), "t")
    assert errors == [] and checked["engine"] == "toyserve"
    errors = validate_recipe(recipe(kv_cache={"block_size": 16}, engine_args={"world": 3},
                                    env={"TOY_HOST_IP": "1.2.3.4"}), "t")[1]
    assert errors == [
        "recipe t: engine_args.world is 3; sparkserve sets --world from the cluster's node count; remove it from "
        "engine_args.",
        'recipe t: env.TOY_HOST_IP is "1.2.3.4"; the fabric stage sets TOY_HOST_IP on each node to the node\'s own '
        "fabric address (sparkserve_fabric_ip); remove it from env.",
        "recipe t: kv_cache.block_size is 16; toyserve has fixed blocks; remove it.",
    ]
    # vLLM's own flags mean nothing to the toy: they pass through as its engine_args.
    assert validate_recipe(recipe(engine_args={"tensor-parallel-size": 2}), "t")[1] == []


def test_the_toy_renders_its_command_line_and_facts(toy: Engine) -> None:
    checked, _ = validate_recipe(recipe(kv_cache={"dtype": "q8"}, engine_args={"threads": 4}, env={"A": "1"}), "t")
    head = render_rank(checked, "d", 0, 2, "10.77.1.11")
    assert head["argv"] == ["toyserve", "--weights", "/models/m", "--world", "2", "--rank", "0",
                            "--meet", "10.77.1.11:29501", "--listen", "8000", "--kv", "q8", "--threads", "4"]
    # Over several nodes every rank's NCCL says which network it chose (the launch reads it); the recipe's env after.
    assert head["env"] == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "A": "1"}
    assert render_rank(checked, "d", 0, 1, "")["env"] == {"A": "1"}
    assert head["endpoints"] == {"health": "/ping", "models": "/toy/models", "completions": "/toy/complete",
                                 "metrics": "/toy/metrics"}
    worker = render_rank(checked, "d", 1, 2, "10.77.1.11")
    assert "--listen" not in worker["argv"] and worker["endpoints"] == {}
    facts = engine_facts(checked)
    assert facts == {"name": "toyserve", "host_ip_variable": "TOY_HOST_IP", "endpoints": head["endpoints"],
                     "dead_health_pattern": "toy gave up", "fatal_log_patterns": ["toy panic"],
                     "load_progress_pattern": r"toy loaded (?P<done>\d+) of (?P<total>\d+)",
                     "cache_mounts": [{"name": "toy", "container_path": "/var/cache/toy"}],
                     "metric_names": {"spec_accept_length": "toy:accept_length"}}
    json.dumps(facts)
    assert fabric_env(NODE, facts["host_ip_variable"])["TOY_HOST_IP"] == "10.77.1.12"


def test_the_module_renders_the_toy(toy: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    args = {"recipe": recipe(), "name": "t", "deployment": "d", "world_size": 2,
            "ranks": [{"rank": 0, "head_fabric_ip": "10.77.1.11"}, {"rank": 1, "head_fabric_ip": "10.77.1.11"}]}
    with patch_module_args(args), pytest.raises(SystemExit):
        recipe_render.main()
    result = json.loads(capsys.readouterr().out)
    assert not result.get("failed"), result
    assert result["engine"]["name"] == "toyserve" and result["ranks"][1]["argv"][0] == "toyserve"


class ToyHandler(BaseHTTPRequestHandler):
    """The toy's API: its own paths; /ping says it gave up once the server's `dead` is set."""

    def _send(self, status: int, payload: Any) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's handler name)
        dead = self.server.dead.is_set()  # type: ignore[attr-defined]
        if self.path == "/ping":
            self._send(503, "toy gave up") if dead else self._send(200, "pong")
        elif self.path == "/toy/models":
            self._send(200, {"object": "list", "data": [{"id": "m"}]})
        else:
            self._send(404, "no such path")

    def do_POST(self) -> None:  # noqa: N802 (http.server's handler name)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path == "/toy/complete":
            self._send(200, {"choices": [{"text": " 4"}]})
        else:
            self._send(404, "no such path")

    def log_message(self, fmt: str, *args: Any) -> None:
        pass


@pytest.fixture
def toy_api() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ToyHandler)
    server.dead = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_engine_ready_readies_the_toy_through_its_facts(toy: Engine, toy_api: ThreadingHTTPServer) -> None:
    checked, _ = validate_recipe(recipe(), "t")
    facts = engine_facts(checked)
    params = {"url": "http://127.0.0.1:%d" % toy_api.server_port, "served_name": "m", "prompt": "2+2=",
              "api_key": None, "wait_s": 5.0, "poll_s": 0.1, "request_timeout_s": 5.0,
              "dead_if_health_body_matches": facts["dead_health_pattern"],
              "health_path": facts["endpoints"]["health"], "models_path": facts["endpoints"]["models"],
              "completions_path": facts["endpoints"]["completions"], "containers": [], "watch_every_s": 10.0}
    assert engine_ready.wait_ready(params)["ready"] is True
    toy_api.dead.set()  # type: ignore[attr-defined]
    with pytest.raises(engine_ready.EngineDeadError, match="toy gave up"):
        engine_ready.wait_ready(params)
