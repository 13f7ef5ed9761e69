"""Tests of the lab double's SGLang command line: ``python3 -m sglang.launch_server`` (lab/engine/sglang).

Its flags, and real ranks on 127.0.0.1 started the way the engine role starts
a recipe of engine ``sglang``: the command line recipe/render.py renders.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import make_tiny_model
from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.render import render_rank
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import validate_recipe
from sglang import launch_server

ENGINE = Path(__file__).resolve().parents[2] / "lab/engine"

FAST = {"VLLM_DOUBLE_TTFT_BASE_MS": "5", "VLLM_DOUBLE_TTFT_PER_1K_MS": "0", "VLLM_DOUBLE_ITL_MS": "1",
        "VLLM_DOUBLE_HEARTBEAT_S": "0.2", "VLLM_DOUBLE_HEARTBEAT_TIMEOUT_S": "3"}
COMMIT = "1b" * 20
IMAGE = "registry:5000/sparkserve/engine@sha256:" + "0a" * 32


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_sglang(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *args], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PYTHONPATH": str(ENGINE), **(env or {})})


def sglang_recipe(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "t", "engine": "sglang", "image": IMAGE,
        "model": {"repo": "sparkserve-lab/tiny-model", "revision": COMMIT, "served_name": "tiny"},
        "parallel": {"tensor": 2},
        "kv_cache": {"dtype": "fp8_e4m3", "block_size": 16},
        "engine_args": {"context-length": 2048, "mem-fraction-static": 0.8, "max-running-requests": 8,
                        "chunked-prefill-size": 2048, "cuda-graph-bs-decode": [1, 2, 4], "enable-metrics": True,
                        "trust-remote-code": True, "random-seed": 7},
    }
    data.update(changes)
    recipe, errors = validate_recipe(data, "t")
    assert errors == []
    return recipe


# --- command line ----------------------------------------------------------


def test_the_rendered_command_line_is_accepted_on_every_rank() -> None:
    recipe = sglang_recipe()
    for rank in (0, 1):
        argv = render_rank(recipe, "d", rank, 2, "10.77.1.11")["argv"]
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        args, problems, ns = launch_server.parse_args(argv[3:])
        assert problems == []
        assert (args.node_rank, args.nnodes, args.tensor_parallel_size) == (rank, 2, 2)
        assert (args.master_addr, args.master_port) == ("10.77.1.11", 29501)
        assert args.headless is (rank > 0) and args.served_name == "tiny" and args.model == "/models/tiny"
        assert args.max_model_len == 2048 and args.block_size == 16 and args.kv_cache_dtype == "fp8_e4m3"
        assert args.max_num_seqs == 8 and args.seed == 7 and ns.enable_metrics is True
        assert ns.cuda_graph_bs_decode == [1, 2, 4]
    head = render_rank(recipe, "d", 0, 2, "10.77.1.11")["argv"]
    args, _, _ = launch_server.parse_args(head[3:])
    assert (args.host, args.port) == ("127.0.0.1", 8000)


def test_defaults_ipv6_rendezvous_and_speculative_flags() -> None:
    args, problems, ns = launch_server.parse_args(["--model-path", "/m"])
    assert problems == [] and (args.host, args.port, args.nnodes, args.node_rank) == ("127.0.0.1", 30000, 1, 0)
    assert args.served_names == ("/m",) and ns.enable_metrics is False and args.disable_log_requests is True
    args, problems, _ = launch_server.parse_args([
        "--model-path", "/m", "--nnodes", "2", "--node-rank", "1", "--tp-size", "2", "--dist-init-addr",
        "[fd00::1]:29501", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        "--speculative-draft-model-path", "/models/draft"])
    assert problems == [] and (args.master_addr, args.master_port) == ("fd00::1", 29501)
    assert args.speculative_config == {"method": "EAGLE", "num_speculative_tokens": 3, "model": "/models/draft"}
    assert args.num_speculative_tokens == 3


@pytest.mark.parametrize("words, message", [
    (["--bogus-flag", "1"], "unrecognized arguments: --bogus-flag"),
    (["--tp", "2"], "unrecognized arguments: --tp"),  # no prefix expansion
    (["--kv-cache-dtype", "fp8"], "argument --kv-cache-dtype: invalid choice: 'fp8'"),
    (["--dist-init-addr", "nohost"], "argument --dist-init-addr: invalid address"),
    (["--headless"], "unrecognized arguments: --headless"),  # a vLLM flag
])
def test_bad_flags_exit_2_like_argparse(words: list[str], message: str) -> None:
    result = run_sglang("--model-path", "/models/tiny", *words)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.startswith("usage: python3 -m sglang.launch_server")


@pytest.mark.parametrize("words, problem", [
    (["--nnodes", "2", "--tp-size", "2"], "--dist-init-addr is needed with --nnodes 2"),
    (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"], "--node-rank is 2"),
    (["--nnodes", "3", "--tp-size", "2", "--dist-init-addr", "h:1"], "not a multiple of --nnodes 3"),
    (["--mem-fraction-static", "1.5"], "--mem-fraction-static is 1.5"),
    (["--speculative-algorithm", "NEXTN"], "needs --speculative-num-steps"),
])
def test_inconsistent_flags_are_reported(words: list[str], problem: str) -> None:
    _, problems, _ = launch_server.parse_args(["--model-path", "/m", *words])
    assert any(problem in p for p in problems), problems


def test_inconsistent_flags_exit_1_with_a_log_line(tmp_path: Path) -> None:
    result = run_sglang("--model-path", str(tmp_path), "--nnodes", "2", "--node-rank", "1", "--tp-size", "2")
    assert result.returncode == 1
    assert "ERROR" in result.stdout and "[rank 1]" in result.stdout and "--dist-init-addr is needed" in result.stdout


def test_readme_documents_every_sglang_flag() -> None:
    readme = (ENGINE / "README.md").read_text(encoding="utf-8")
    for flag in launch_server.FLAGS:
        for name in flag.names:
            assert "`%s" % name in readme, name


# --- ranks on 127.0.0.1 ----------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    make_tiny_model.make_model(path, shards=2, shard_mib=1)
    return path


class Ranks:
    """`python3 -m sglang.launch_server` processes of one deployment, as recipe/render.py renders them."""

    def __init__(self, model: Path, logs: Path, nnodes: int, **engine_args: Any) -> None:
        self.port = free_port()
        master_port = free_port()
        recipe = sglang_recipe(parallel={"tensor": nnodes}, engine_args=engine_args,
                               launch={"api_port": self.port, "master_port": master_port},
                               model={"repo": "sparkserve-lab/tiny-model", "revision": COMMIT, "served_name": "tiny",
                                      "path_in_container": str(model)})
        self.renders = [render_rank(recipe, "lab", rank, nnodes, "127.0.0.1")
                        for rank in range(nnodes)]
        self.logs = logs
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, rank: int) -> subprocess.Popen[bytes]:
        render = self.renders[rank]
        argv = [sys.executable] + render["argv"][1:]  # python3 -m sglang.launch_server ...
        # What each node's fabric file adds: the engine's host-IP variable.
        fabric = {ENGINES["sglang"].host_ip_variable: "127.0.0.1"}
        env = {**os.environ, **FAST, **render["env"], **fabric, "PYTHONPATH": str(ENGINE)}
        with (self.logs / ("sglang-%d.log" % rank)).open("wb") as out:
            self.procs[rank] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        return self.procs[rank]

    def text(self, rank: int) -> str:
        return (self.logs / ("sglang-%d.log" % rank)).read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            conn.close()

    def wait_log(self, rank: int, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.text(rank):
            assert time.monotonic() < deadline, "rank %d never logged %r\n%s" % (rank, text, self.text(rank))
            time.sleep(0.05)

    def wait_health(self, status: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.get("/health")
                if last[0] == status:
                    return
            except OSError as exc:
                last = exc
            time.sleep(0.05)
        raise AssertionError("health never %d (last %r)\n%s" % (status, last,
                                                                "\n".join(self.text(r) for r in self.procs)))


@pytest.fixture
def ranks_factory(model: Path, tmp_path: Path) -> Iterator[Any]:
    made: list[Ranks] = []

    def make(nnodes: int, **engine_args: Any) -> Ranks:
        made.append(Ranks(model, tmp_path, nnodes, **engine_args))
        return made[-1]

    yield make
    for ranks in made:
        ranks.stop()


def sample(text: bytes, name: str) -> float:
    for line in text.decode().splitlines():
        if line.startswith(name + '{model_name="tiny"}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no %s in\n%s" % (name, text.decode()))


def test_two_ranks_serve_as_sglang_and_die_when_a_rank_goes(ranks_factory: Any) -> None:
    ranks: Ranks = ranks_factory(2, **{"enable-metrics": True, "context-length": 2048,
                                       "speculative-algorithm": "NEXTN", "speculative-num-steps": 3})
    worker = ranks.start(1)  # workers first
    ranks.wait_log(1, "waiting for the head")  # it runs, and retries the head
    head = ranks.start(0)
    ranks.wait_health(200)
    assert "SGLang lab double" in ranks.text(0) and "(SGLANG_HOST_IP): 127.0.0.1" in ranks.text(1)
    assert "joined the head at 127.0.0.1:" in ranks.text(1)

    status, data = ranks.get("/v1/models")
    [entry] = json.loads(data)["data"]
    assert status == 200 and entry["id"] == "tiny" and entry["owned_by"] == "sglang" and entry["max_model_len"] == 2048
    assert ranks.get("/health_generate")[0] == 200
    status, data = ranks.get("/get_model_info")
    assert status == 200 and json.loads(data)["is_generation"] is True

    status, answer = ranks.post("/v1/completions", {"model": "tiny", "prompt": "The capital of France is",
                                                    "max_tokens": 6, "ignore_eos": True, "temperature": 0})
    assert status == 200 and answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    status, answer = ranks.post("/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "ignore_eos": True,
                                                         "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and answer["choices"][0]["message"]["role"] == "assistant"

    # The engine counts a request as done once its answer is out: wait until it has counted both.
    deadline = time.monotonic() + 30
    while True:
        status, text = ranks.get("/metrics")
        if (status != 200 or sample(text, "sglang:num_requests_total") >= 2) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 200 and b"vllm:" not in text
    assert sample(text, "sglang:prompt_tokens_total") == 6 and sample(text, "sglang:generation_tokens_total") == 8
    assert sample(text, "sglang:num_requests_total") == 2 and sample(text, "sglang:num_running_reqs") == 0
    assert sample(text, "sglang:spec_accept_length") >= 1

    worker.kill()
    ranks.wait_health(503)
    assert "node rank 1" in json.loads(ranks.get("/health")[1])["error"]
    assert ranks.get("/v1/models")[0] == 200  # the same trap as vLLM's
    head.send_signal(signal.SIGTERM)
    assert head.wait(timeout=30) == 0


def test_metrics_only_with_enable_metrics(ranks_factory: Any) -> None:
    ranks: Ranks = ranks_factory(1)
    ranks.start(0)
    ranks.wait_health(200)
    assert ranks.get("/metrics")[0] == 404
    assert ranks.get("/health")[0] == 200
