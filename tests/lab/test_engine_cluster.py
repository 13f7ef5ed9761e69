"""Multi-process tests of the vLLM lab double: real `vllm serve` ranks on 127.0.0.1.

Each test starts the ranks as subprocesses with free ports, and talks to the
head over HTTP as deployment tooling would.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import make_tiny_model

ENGINE = Path(__file__).resolve().parents[2] / "lab/engine"

VLLM = ENGINE / "bin/vllm"
FAST = {"VLLM_DOUBLE_TTFT_BASE_MS": "5", "VLLM_DOUBLE_TTFT_PER_1K_MS": "0", "VLLM_DOUBLE_ITL_MS": "1",
        "VLLM_DOUBLE_HEARTBEAT_S": "0.2", "VLLM_DOUBLE_HEARTBEAT_TIMEOUT_S": "3"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    make_tiny_model.make_model(path, shards=2, shard_mib=1)
    return path


class Rank:
    """One `vllm serve` process and its log."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen([str(VLLM), *argv], stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **env})

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Cluster:
    """Ranks of one deployment: same model, master port and API port."""

    def __init__(self, model: Path, nnodes: int, logs: Path, env: dict[str, str] | None = None) -> None:
        self.model = model
        self.nnodes = nnodes
        self.logs = logs
        self.env = {**FAST, **(env or {})}
        self.master_port = free_port()
        self.port = free_port()
        self.ranks: list[Rank] = []

    def start(self, rank: int, *extra: str, nnodes: int | None = None, env: dict[str, str] | None = None,
              name: str | None = None) -> Rank:
        nnodes = nnodes or self.nnodes
        argv = ["serve", str(self.model), "--served-model-name", "tiny", "--tensor-parallel-size", str(nnodes),
                "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                "--master-port", str(self.master_port)]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)] if rank == 0 else ["--headless"]
        started = Rank(argv + list(extra), {**self.env, **(env or {})}, self.logs / ("%s.log" % (name or rank)))
        self.ranks.append(started)
        return started

    def stop(self) -> None:
        for rank in self.ranks:
            rank.stop()

    # --- HTTP ------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                timeout: float = 10) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def get(self, path: str, **kwargs: Any) -> tuple[int, bytes]:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any, **kwargs: Any) -> tuple[int, Any]:
        status, data = self.request("POST", path, body, **kwargs)
        return status, json.loads(data) if data else None

    def wait_health(self, status: int = 200, timeout: float = 30) -> None:
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
        raise AssertionError("health never %d (last %r)\n%s" % (status, last, self.logs_text()))

    def logs_text(self) -> str:
        return "\n".join("--- %s\n%s" % (r.log.name, r.text()) for r in self.ranks)

    def stream(self, path: str, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> Iterator[tuple[float, Any]]:
        """(arrival time, parsed data) of each server-sent event."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("POST", path, body=json.dumps({**body, "stream": True}).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type", "").startswith("text/event-stream")
        try:
            while True:
                line = response.readline()
                if not line:
                    return
                if line.startswith(b"data: "):
                    payload = line[6:].strip().decode()
                    yield time.monotonic(), (payload if payload == "[DONE]" else json.loads(payload))
        finally:
            conn.close()


@pytest.fixture
def cluster_factory(model: Path, tmp_path: Path) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(nnodes: int, env: dict[str, str] | None = None) -> Cluster:
        made.append(Cluster(model, nnodes, tmp_path, env))
        return made[-1]

    yield make
    for cluster in made:
        cluster.stop()


def metric(text: bytes, name: str, **labels: str) -> float:
    wanted = ['model_name="tiny"', 'engine="0"'] + ['%s="%s"' % kv for kv in labels.items()]
    for line in text.decode().splitlines():
        if line.startswith(name + "{") and all(label in line for label in wanted):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no %s %s in\n%s" % (name, labels, text.decode()))


def eventually(condition: Callable[[], bool], cluster: Cluster, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never met\n" + cluster.logs_text())
        time.sleep(0.05)


def exits_nonzero_with(rank: Rank, text: str, timeout: float = 30) -> None:
    code = rank.wait(timeout)
    assert code not in (0, None), rank.text()
    assert text in rank.text(), rank.text()


# --- two ranks ----------------------------------------------------------------


def test_two_ranks_serve_stream_count_and_die_like_vllm(cluster_factory: Any) -> None:
    cluster: Cluster = cluster_factory(2, {"VLLM_DOUBLE_ACCEPT": "1,1,0"})
    worker = cluster.start(1)  # workers first, as the seeds start them
    eventually(lambda: "waiting for the head" in worker.text(), cluster)  # it runs, and retries the head
    head = cluster.start(0, "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}')
    cluster.wait_health(200)
    assert "joined the head at 127.0.0.1:%d as node rank 1 of 2" % cluster.master_port in worker.text()
    assert "loaded 2 shards, 2.0 MiB in" in head.text() and "loaded 2 shards" in worker.text()

    status, data = cluster.get("/v1/models")
    [entry] = json.loads(data)["data"]
    assert status == 200 and entry["id"] == "tiny" and entry["root"] == str(cluster.model)
    assert entry["max_model_len"] == 4096 and entry["owned_by"] == "vllm"

    before = cluster.get("/metrics")[1]
    status, answer = cluster.post("/v1/completions", {"model": "tiny", "prompt": "The capital of France is",
                                                      "max_tokens": 10, "ignore_eos": True, "temperature": 0})
    assert status == 200 and answer["object"] == "text_completion"
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15}
    assert len(answer["choices"][0]["text"].split()) == 10 and answer["choices"][0]["finish_reason"] == "length"
    after = cluster.get("/metrics")[1]
    # Positions 0 and 1 always accepted, 2 never: 1 prefill token, then 3 steps of 3 tokens.
    grew = {name: metric(after, name) - metric(before, name) for name in (
        "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")}
    assert grew == {"vllm:spec_decode_num_drafts_total": 3, "vllm:spec_decode_num_draft_tokens_total": 9,
                    "vllm:spec_decode_num_accepted_tokens_total": 6, "vllm:prompt_tokens_total": 5,
                    "vllm:generation_tokens_total": 10}
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert [metric(after, name, position=str(p)) for p in range(3)] == [3, 3, 0]

    events = [event for _, event in cluster.stream("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "say something"}], "max_tokens": 7, "ignore_eos": True,
        "stream_options": {"include_usage": True}})]
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-2])
    assert len(text.split()) == 7 and events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 7

    worker.proc.kill()
    cluster.wait_health(503)
    status, body = cluster.get("/health")
    assert "node rank 1" in json.loads(body)["error"]
    status, answer = cluster.post("/v1/completions", {"prompt": "still there?", "max_tokens": 1})
    assert status == 500 and "node rank 1" in answer["error"]["message"]
    assert cluster.get("/v1/models")[0] == 200  # the trap: models still answers
    assert head.proc.poll() is None and "engine dead: node rank 1 is gone" in head.text()


# --- three ranks --------------------------------------------------------------


def test_three_ranks_refuse_bad_joins_and_workers_exit_when_the_head_dies(cluster_factory: Any) -> None:
    cluster: Cluster = cluster_factory(3)
    head = cluster.start(0)  # head first, as sparkrun does
    first = cluster.start(1)
    cluster.wait_health(503)
    eventually(lambda: json.loads(cluster.get("/health")[1])["waiting_for_ranks"] == [2], cluster)
    assert "node rank 1 joined" in head.text() and cluster.get("/v1/models")[0] == 503
    twin = cluster.start(1, name="twin")
    stranger = cluster.start(5, "-tp", "6", nnodes=6, name="stranger")
    exits_nonzero_with(twin, "refused node rank 1: rank 1 has already joined")
    exits_nonzero_with(stranger, "refused node rank 5: rank 5 is out of range")
    assert cluster.get("/health")[0] == 503

    second = cluster.start(2)
    cluster.wait_health(200)
    status, answer = cluster.post("/v1/completions", {"prompt": "one two three", "max_tokens": 3})
    assert status == 200 and answer["usage"]["prompt_tokens"] == 3

    late = cluster.start(2, name="late")
    exits_nonzero_with(late, "the rendezvous is over")
    head.proc.kill()
    exits_nonzero_with(first, "lost the head at 127.0.0.1:%d" % cluster.master_port)
    exits_nonzero_with(second, "lost the head")


def test_a_worker_without_a_head_gives_up_after_the_join_timeout(cluster_factory: Any) -> None:
    cluster: Cluster = cluster_factory(2, {"VLLM_DOUBLE_JOIN_TIMEOUT_S": "1"})
    started = time.monotonic()
    worker = cluster.start(1)
    # Within exits_nonzero_with's 30 s: far below the default join timeout of 120 s, so the knob is honoured.
    exits_nonzero_with(worker, "could not reach the head at 127.0.0.1:%d" % cluster.master_port)
    assert time.monotonic() - started >= 1.0  # not before the join timeout
    assert "waiting for the head" in worker.text()


def test_a_head_without_its_workers_gives_up_after_the_ready_timeout(cluster_factory: Any) -> None:
    cluster: Cluster = cluster_factory(3, {"VLLM_ENGINE_READY_TIMEOUT_S": "2"})
    worker = cluster.start(2)  # already retrying (every 0.2 s) when the head starts: it joins well in time
    eventually(lambda: "waiting for the head" in worker.text(), cluster)
    head = cluster.start(0)
    exits_nonzero_with(head, "engine not ready after 2 s (VLLM_ENGINE_READY_TIMEOUT_S); "
                             "still waiting for node ranks [1]")
    assert "node rank 2 joined" in head.text()


def stops_on_sigterm(rank: Rank) -> None:
    rank.proc.send_signal(signal.SIGTERM)
    assert rank.wait() == 0  # within Rank.wait's 30 s
    assert "received SIGTERM; shutting down" in rank.text()


def test_sigterm_stops_a_worker_and_a_busy_head_with_exit_0(cluster_factory: Any) -> None:
    pair: Cluster = cluster_factory(2)
    pair_head = pair.start(0)
    worker = pair.start(1)
    pair.wait_health(200)
    stops_on_sigterm(worker)
    assert "worker stopped (exit 0)" in worker.text() and "lost the head" not in worker.text()
    assert pair_head.proc.poll() is None  # the worker stopped on its signal, not because its head went away
    # 4000 steps of 10 ms: the request would run 40 s, longer than Rank.wait gives the head to exit.
    single: Cluster = cluster_factory(1, {"VLLM_DOUBLE_ITL_MS": "10"})
    head = single.start(0)
    single.wait_health(200)
    outcome: list[Any] = []

    def long_request() -> None:
        try:
            outcome.append(single.post("/v1/completions", {"prompt": "go on", "max_tokens": 4000,
                                                           "ignore_eos": True}))
        except OSError as exc:
            outcome.append(exc)  # the head went away mid-request, as intended

    client = threading.Thread(target=long_request, daemon=True)
    client.start()
    eventually(lambda: b'vllm:num_requests_running{model_name="tiny",engine="0"} 1.0'
               in single.get("/metrics")[1], single)
    stops_on_sigterm(head)  # the stop must not wait for the request
    client.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], OSError), outcome  # cut off, never answered


def test_a_silent_worker_is_lost_after_the_heartbeat_timeout(cluster_factory: Any) -> None:
    cluster: Cluster = cluster_factory(2, {"VLLM_DOUBLE_HEARTBEAT_S": "0.1", "VLLM_DOUBLE_HEARTBEAT_TIMEOUT_S": "0.8"})
    head = cluster.start(0)
    worker = cluster.start(1)
    cluster.wait_health(200)
    until = time.monotonic() + 1.2  # at least longer than the timeout: heartbeats keep both sides alive
    while time.monotonic() < until:
        assert cluster.get("/health")[0] == 200 and worker.proc.poll() is None, cluster.logs_text()
        time.sleep(0.05)
    assert cluster.get("/health")[0] == 200 and worker.proc.poll() is None, cluster.logs_text()
    worker.proc.send_signal(signal.SIGSTOP)  # alive but silent, like a hung rank
    answers: list[int] = []
    asking = threading.Thread(target=lambda: answers.append(
        cluster.post("/v1/completions", {"prompt": "anyone?", "max_tokens": 2}, timeout=30)[0]))
    try:
        asking.start()
        cluster.wait_health(503)
        asking.join(30)
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    assert "node rank 1 is gone (no heartbeat)" in json.loads(cluster.get("/health")[1])["error"]
    assert "engine dead" in head.text()
    assert answers == [500], answers  # the completion waited for the stopped rank, then failed with the engine


def test_a_stopped_worker_holds_every_completion_until_it_runs_again(cluster_factory: Any) -> None:
    cluster: Cluster = cluster_factory(2, {"VLLM_DOUBLE_HEARTBEAT_TIMEOUT_S": "60"})
    cluster.start(0)
    worker = cluster.start(1)
    cluster.wait_health(200)
    assert cluster.post("/v1/completions", {"prompt": "warm", "max_tokens": 2})[0] == 200
    answers: list[int] = []
    worker.proc.send_signal(signal.SIGSTOP)
    try:
        asking = threading.Thread(target=lambda: answers.append(
            cluster.post("/v1/completions", {"prompt": "held", "max_tokens": 2}, timeout=60)[0]))
        asking.start()
        eventually(lambda: metric(cluster.get("/metrics")[1], "vllm:num_requests_running") == 1, cluster)
        asking.join(1)  # the stopped rank cannot answer the step, so the head cannot answer either
        assert asking.is_alive() and answers == [], (answers, cluster.logs_text())
        assert cluster.get("/health")[0] == 200  # not lost yet: the heartbeat timeout is a minute
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    asking.join(30)
    assert answers == [200], cluster.logs_text()


def test_a_busy_api_port_stops_the_head(cluster_factory: Any) -> None:
    cluster: Cluster = cluster_factory(1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        cluster.port = busy.getsockname()[1]
        head = cluster.start(0)
        exits_nonzero_with(head, "cannot listen on 127.0.0.1:%d for the API" % cluster.port)


def test_a_missing_shard_stops_the_head_naming_it(cluster_factory: Any, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    make_tiny_model.make_model(broken, shards=3, shard_mib=0.25)
    (broken / "model-00002-of-00003.safetensors").unlink()
    cluster: Cluster = cluster_factory(1)
    cluster.model = broken
    head = cluster.start(0)
    exits_nonzero_with(head, "missing shard model-00002-of-00003.safetensors")
    assert head.proc.returncode == 1 and "ERROR" in head.text()

    pair: Cluster = cluster_factory(2)
    head = pair.start(0)
    pair.model = broken  # only the worker's copy is incomplete
    worker = pair.start(1)
    exits_nonzero_with(worker, "weight loading failed: missing shard model-00002-of-00003.safetensors")
    exits_nonzero_with(head, "engine failed: node rank 1 failed: missing shard")


# --- one rank: stall and crash files ---------------------------------------------


def test_a_stall_file_hangs_completions_behind_a_green_health(cluster_factory: Any, tmp_path: Path) -> None:
    stall = tmp_path / "stall"
    cluster: Cluster = cluster_factory(1, {"VLLM_DOUBLE_STALL_FILE": str(stall)})
    head = cluster.start(0)
    cluster.wait_health(200)
    body = {"prompt": "one two three", "max_tokens": 3, "ignore_eos": True}
    assert cluster.post("/v1/completions", body)[0] == 200  # no file, no stall
    generated = metric(cluster.get("/metrics")[1], "vllm:generation_tokens_total")

    stall.touch()
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    for path, request in (("/v1/completions", body), ("/v1/chat/completions", chat)):
        # A request of 3 tokens answers in about 10 ms; stalled, it does not within a second (the stall lasts
        # until the file is removed, so the timeout is an upper bound on a call that blocks, not a race).
        with pytest.raises(TimeoutError):
            cluster.request("POST", path, request, timeout=1)
        assert cluster.get("/health")[0] == 200 and cluster.get("/v1/models")[0] == 200  # the trap
    assert "completions stalled: VLLM_DOUBLE_STALL_FILE (%s) exists" % stall in head.text()
    # The clients that gave up are seen to go, though the file is still there; no token was generated.
    eventually(lambda: metric(cluster.get("/metrics")[1], "vllm:num_requests_running") == 0, cluster)
    assert head.text().count("client went away") == 2
    assert metric(cluster.get("/metrics")[1], "vllm:generation_tokens_total") == generated

    answers: list[tuple[int, Any]] = []
    waiting = threading.Thread(target=lambda: answers.append(cluster.post("/v1/completions", body)))
    waiting.start()
    eventually(lambda: metric(cluster.get("/metrics")[1], "vllm:num_requests_running") == 1, cluster)
    assert cluster.get("/health")[0] == 200 and cluster.get("/v1/models")[0] == 200 and not answers
    stall.unlink()
    waiting.join(30)  # the stalled request answers once the file is gone
    assert len(answers) == 1 and answers[0][0] == 200 and answers[0][1]["usage"]["completion_tokens"] == 3
    assert "%s is gone: completions go on" % stall in head.text()
    status, answer = cluster.post("/v1/chat/completions", {**chat, "stream": False})
    assert status == 200 and answer["usage"]["completion_tokens"] == 3


def test_a_crash_file_fails_every_start_while_it_exists(cluster_factory: Any, tmp_path: Path) -> None:
    from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.vllm import ENGINE as VLLM_ENGINE

    crash = tmp_path / "crash"
    crash.touch()
    line = "RuntimeError: Engine core initialization failed (VLLM_DOUBLE_CRASH_FILE exists)"
    cluster: Cluster = cluster_factory(2, {"VLLM_DOUBLE_CRASH_FILE": str(crash)})
    for rank, name in ((0, "head"), (0, "head-again"), (1, "worker")):
        started = cluster.start(rank, name=name)
        assert started.wait() == 1, started.text()
        # Its one line: before anything else (source hashes, rendezvous, weights, API).
        [error] = started.text().splitlines()
        assert error.startswith("ERROR ") and error.endswith("[rank %d] %s" % (rank, line)), error
        assert any(re.search(pattern, error) for pattern in VLLM_ENGINE.fatal_log_patterns)
    crash.unlink()
    cluster.nnodes = 1  # without the file, a start goes on and serves
    head = cluster.start(0, name="head-after")
    cluster.wait_health(200)
    assert line not in head.text() and "loaded 2 shards" in head.text()


# --- one rank: timings, concurrency, API key, provenance ------------------------


def test_timings_concurrency_api_key_and_sources(cluster_factory: Any) -> None:
    # TTFT = 150 ms + 100 ms per 1000 prompt tokens x 500 = 200 ms; 20 ms per decode step.
    cluster: Cluster = cluster_factory(1, {"VLLM_DOUBLE_TTFT_BASE_MS": "150", "VLLM_DOUBLE_TTFT_PER_1K_MS": "100",
                                           "VLLM_DOUBLE_ITL_MS": "20"})
    head = cluster.start(0, "--api-key", "sesame", "--max-model-len", "2048")
    cluster.wait_health(200)
    key = {"Authorization": "Bearer sesame"}
    assert cluster.get("/v1/models")[0] == 401
    assert cluster.get("/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert cluster.get("/v1/models", headers=key)[0] == 200
    assert cluster.get("/health")[0] == 200 and cluster.get("/metrics")[0] == 200

    body = {"prompt": "word " * 500, "max_tokens": 11, "ignore_eos": True}
    sent = time.monotonic()
    events = list(cluster.stream("/v1/completions", body, headers=key))
    times = [t for t, event in events if event != "[DONE]" and event["choices"] and event["choices"][0]["text"]]
    assert len(times) == 11
    # Token i is due 200 ms + i x 20 ms after the request: none arrives before (1 ms for float rounding). The
    # schedule's exact times and their pacing are checked without a wall clock in test_engine.py.
    early = [(i, t - sent) for i, t in enumerate(times) if t - sent < 0.200 + 0.020 * i - 0.001]
    assert early == [], early
    assert all(b >= a for a, b in pairwise(times))

    answered: list[int] = []

    def one() -> None:
        status, answer = cluster.post("/v1/completions", body, headers=key)
        assert status == 200 and answer["usage"]["completion_tokens"] == 11
        answered.append(status)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answered) == 4

    # Four requests at once, not in turn: four streams of 2000 steps of 20 ms (40 s) that the test holds open
    # until the engine counts all four running together. Run in turn, the first would keep the rest waiting
    # past eventually's 30 s.
    held = []
    for _ in range(4):
        conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=10)
        conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json", **key},
                     body=json.dumps({"prompt": "go on", "max_tokens": 2000, "ignore_eos": True,
                                      "stream": True}).encode())
        held.append(conn)
    try:
        eventually(lambda: metric(cluster.get("/metrics")[1], "vllm:num_requests_running") == 4, cluster)
    finally:
        for conn in held:
            conn.close()
    eventually(lambda: metric(cluster.get("/metrics")[1], "vllm:num_requests_running") == 0, cluster)

    status, answer = cluster.post("/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "ignore_eos": True,
                                                           "messages": [{"role": "user", "content": "hi"}]},
                                  headers=key)
    assert status == 200 and answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert len(answer["choices"][0]["message"]["content"].split()) == 2
    assert answer["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}

    status, answer = cluster.post("/v1/chat/completions", {"model": "tiny", "max_tokens": 3000,
                                                           "messages": [{"role": "user", "content": "hi"}]},
                                  headers=key)
    assert status == 400 and "maximum context length is 2048" in answer["error"]["message"]
    status, answer = cluster.post("/v1/completions", {"model": "nope", "prompt": "x"}, headers=key)
    assert status == 404 and answer["error"]["type"] == "NotFoundError"

    status, data = cluster.get("/sparkserve/double/sources")
    files = json.loads(data)["files"]
    on_disk = {p.relative_to(ENGINE).as_posix(): p for p in sorted((ENGINE / "vllm_double").glob("*.py"))}
    assert status == 200 and set(on_disk) <= set(files) and "bin/vllm" in files
    for name, path in on_disk.items():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert files[name] == digest
        assert "source %s sha256=%s" % (name, digest) in head.text()
