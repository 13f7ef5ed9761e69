"""Latency and KV-cache metrics of the lab double: vLLM's and SGLang's histograms and gauges.

The time to first token, inter-token and end-to-end latency histograms, the
KV cache usage gauge (``vllm:kv_cache_usage_perc``, ``sglang:token_usage``),
``vllm:num_preemptions_total`` and ``sglang:gen_throughput``: on the Api's
steps with a clock that moves only by sleeps (exact values), and over HTTP
on a head served in this process (``app.run_head``, real requests).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from sglang import launch_server
from vllm_double import app, cli, server
from vllm_double.cli import ServeArgs
from vllm_double.knobs import Knobs
from vllm_double.logs import Logger
from vllm_double.metrics import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TTFT_BUCKETS,
    Histogram,
    Metrics,
)
from vllm_double.openai_api import parse_request
from vllm_double.state import EngineState

ENGINE = Path(__file__).resolve().parents[2] / "lab/engine"

MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 4
CAPACITY = MAX_MODEL_LEN * MAX_NUM_SEQS  # the double's KV capacity in tokens
HISTOGRAMS = {"time_to_first_token_seconds": TTFT_BUCKETS, "inter_token_latency_seconds": ITL_BUCKETS,
              "e2e_request_latency_seconds": E2E_BUCKETS}
VLLM_LABELS = {"model_name": "tiny", "engine": "0"}
SGLANG_LABELS = {"model_name": "tiny"}

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


# --- reading the exposition ----------------------------------------------------


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition: name, labels, value."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        assert match is not None, line
        name, labels, value = match.groups()
        out.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return out


def value(text: str, name: str) -> float:
    [found] = [v for n, _, v in parse(text) if n == name]
    return found


def histogram(text: str, name: str, bounds: tuple[float, ...], labels: dict[str, str]) -> tuple[float, int]:
    """Check one histogram's shape (TYPE, labels, cumulative buckets ending in +Inf = _count); its sum and count."""
    assert "# TYPE %s histogram" % name in text.splitlines()
    buckets = [(lab, v) for n, lab, v in parse(text) if n == name + "_bucket"]
    assert [lab.pop("le") for lab, _ in buckets] == [repr(float(b)) for b in bounds] + ["+Inf"]
    assert all(lab == labels for lab, _ in buckets)
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "buckets are cumulative"
    [(sum_labels, total)] = [(lab, v) for n, lab, v in parse(text) if n == name + "_sum"]
    [(count_labels, count)] = [(lab, v) for n, lab, v in parse(text) if n == name + "_count"]
    assert sum_labels == count_labels == labels
    assert counts[-1] == count and count == int(count)
    return total, int(count)


# --- the Histogram and the Api's steps, exactly ------------------------------------


def test_histogram_buckets_are_inclusive_upper_bounds_and_cumulative() -> None:
    hist = Histogram((0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 1.0, 3.0):
        hist.observe(seconds)
    labels = [("model_name", "tiny")]
    assert hist.lines("x:t", "help", labels) == [
        "# HELP x:t help", "# TYPE x:t histogram",
        'x:t_bucket{model_name="tiny",le="0.1"} 2.0', 'x:t_bucket{model_name="tiny",le="1.0"} 4.0',
        'x:t_bucket{model_name="tiny",le="+Inf"} 5.0', 'x:t_sum{model_name="tiny"} 4.65',
        'x:t_count{model_name="tiny"} 5.0']


class FakeClock:
    """``time`` for server.py: monotonic() moves only by sleep()."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_steps_record_ttft_from_arrival_each_gap_and_hold_kv_until_they_end(monkeypatch: pytest.MonkeyPatch) -> None:
    knobs = Knobs(ttft_base_ms=150, ttft_per_1k_ms=100, itl_ms=20)
    log = Logger(0)
    metrics = Metrics("tiny", 0, CAPACITY)
    api = server.Api(cli.parse_args(["serve", "/m"]), knobs, EngineState(1, log), metrics, log, MAX_MODEL_LEN)
    req = parse_request({"prompt": "word " * 500, "max_tokens": 11, "ignore_eos": True}, False, ("tiny",),
                        MAX_MODEL_LEN, 0)
    _, _, steps = api.plan(req)
    clock = FakeClock()
    monkeypatch.setattr(server, "time", clock)
    held = []
    # Arrived 50 ms before its steps start (a wait for a slot, say): TTFT = 50 + 150 + 100 x 0.5 = 250 ms.
    for step in api.run_steps(req, steps, arrived=clock.now - 0.05):
        held.append(metrics.kv_tokens)
        assert step.tokens == 1
    assert held == [500 + n for n in range(1, 12)]  # the prompt and the output so far
    assert metrics.kv_tokens == 0, "given back once the steps end"
    text = metrics.render()
    total, count = histogram(text, "vllm:time_to_first_token_seconds", TTFT_BUCKETS, VLLM_LABELS)
    assert count == 1 and total == pytest.approx(0.25)
    total, count = histogram(text, "vllm:inter_token_latency_seconds", ITL_BUCKETS, VLLM_LABELS)
    assert count == 10 and total == pytest.approx(0.2)
    assert 'vllm:inter_token_latency_seconds_bucket{model_name="tiny",engine="0",le="0.01"} 0.0' in text
    assert 'vllm:inter_token_latency_seconds_bucket{model_name="tiny",engine="0",le="0.025"} 10.0' in text
    assert value(text, "vllm:kv_cache_usage_perc") == 0.0

    # A consumer that stops early (a client gone mid-stream) gives the KV back when it closes the steps.
    run = api.run_steps(req, steps)
    next(run)
    next(run)
    assert metrics.kv_tokens == 502
    assert value(metrics.render(), "vllm:kv_cache_usage_perc") == pytest.approx(502 / CAPACITY)
    run.close()
    assert metrics.kv_tokens == 0


# --- a head served in this process, over HTTP ----------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Head:
    """``app.run_head`` on a thread, with the dummy load format (no weights read), and an HTTP client."""

    def __init__(self, args: ServeArgs, knobs: Knobs, flavor: app.Flavor) -> None:
        self.port = args.port
        self.stop = threading.Event()
        self.thread = threading.Thread(target=app.run_head,
                                       args=(args, knobs, Logger(0), self.stop, MAX_MODEL_LEN, flavor), daemon=True)
        self.thread.start()
        eventually(lambda: self.health() == 200)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def health(self) -> int:
        try:
            return self.request("GET", "/health")[0]
        except OSError:
            return 0

    def metrics(self) -> str:
        status, data = self.request("GET", "/metrics")
        assert status == 200
        return data.decode()

    def complete(self, path: str, body: dict[str, Any]) -> bytes:
        status, data = self.request("POST", path, {"model": "tiny", **body})
        assert status == 200, data
        return data

    def in_background(self, path: str, body: dict[str, Any]) -> threading.Thread:
        thread = threading.Thread(target=self.complete, args=(path, body), daemon=True)
        thread.start()
        return thread


def eventually(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.02)


@pytest.fixture
def start_head() -> Iterator[Callable[..., Head]]:
    heads: list[Head] = []

    def start(knobs: Knobs, *flags: str, sglang: bool = False) -> Head:
        port = free_port()
        common = ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--load-format", "dummy"]
        if sglang:
            args, problems, _ = launch_server.parse_args(["--model-path", "/models/tiny", "--enable-metrics",
                                                          "--max-running-requests", str(MAX_NUM_SEQS),
                                                          *common, *flags])
            flavor = app.Flavor(engine="sglang", title="SGLang lab double", metrics_enabled=True,
                                make_metrics=launch_server.SGLangMetrics)
        else:
            args = cli.parse_args(["serve", "/models/tiny", "--max-num-seqs", str(MAX_NUM_SEQS), *common, *flags])
            problems, flavor = cli.check_args(args), app.VLLM
        assert problems == []
        heads.append(Head(args, knobs, flavor))
        return heads[-1]

    yield start
    for head in heads:
        head.close()


def test_vllm_histograms_count_every_request_and_step(start_head: Callable[..., Head]) -> None:
    head = start_head(Knobs(ttft_base_ms=20, ttft_per_1k_ms=0, itl_ms=5))
    head.complete("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6, "ignore_eos": True})
    head.complete("/v1/completions", {"prompt": "a b", "max_tokens": 4, "ignore_eos": True, "stream": True})
    head.complete("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                           "ignore_eos": True})
    # A request counts as finished once its answer is out: wait until all three have.
    eventually(lambda: histogram(head.metrics(), "vllm:e2e_request_latency_seconds", E2E_BUCKETS,
                                 VLLM_LABELS)[1] == 3)
    text = head.metrics()
    assert "sglang:" not in text
    ttft_sum, ttft_count = histogram(text, "vllm:time_to_first_token_seconds", TTFT_BUCKETS, VLLM_LABELS)
    itl_sum, itl_count = histogram(text, "vllm:inter_token_latency_seconds", ITL_BUCKETS, VLLM_LABELS)
    e2e_sum, e2e_count = histogram(text, "vllm:e2e_request_latency_seconds", E2E_BUCKETS, VLLM_LABELS)
    assert ttft_count == e2e_count == 3
    assert itl_count == 5 + 3 + 2 == value(text, "vllm:generation_tokens_total") - 3  # steps after the first token
    assert 3 * 0.020 <= ttft_sum < 3 * 1.0  # 20 ms each in the double, plus a little HTTP
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="tiny",engine="0",le="0.01"} 0.0' in text
    assert 10 * 0.005 * 0.5 <= itl_sum < 10 * 0.005 + 1.0
    assert e2e_sum >= ttft_sum + itl_sum - 1e-9 and e2e_sum < 3 * 2.0  # a request's steps lie within its e2e
    assert value(text, "vllm:kv_cache_usage_perc") == 0.0 and value(text, "vllm:num_preemptions_total") == 0.0
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"):
        [labels] = [lab for n, lab, _ in parse(text) if n == name]
        assert labels == VLLM_LABELS
    assert "# TYPE vllm:kv_cache_usage_perc gauge" in text and "# TYPE vllm:num_preemptions_total counter" in text


def test_vllm_itl_counts_steps_not_tokens_with_speculative_decoding(start_head: Callable[..., Head]) -> None:
    head = start_head(Knobs(ttft_base_ms=5, ttft_per_1k_ms=0, itl_ms=2, accept=(1.0, 1.0, 0.0)),
                      "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}')
    head.complete("/v1/completions", {"prompt": "x y z", "max_tokens": 10, "ignore_eos": True})
    eventually(lambda: value(head.metrics(), "vllm:e2e_request_latency_seconds_count") == 1)
    text = head.metrics()
    _, itl_count = histogram(text, "vllm:inter_token_latency_seconds", ITL_BUCKETS, VLLM_LABELS)
    # 10 tokens: the first, then 3 steps of 1 + 2 accepted drafts.
    assert itl_count == value(text, "vllm:spec_decode_num_drafts_total") == 3
    assert value(text, "vllm:generation_tokens_total") == 10


def test_vllm_kv_cache_usage_while_a_request_runs(start_head: Callable[..., Head]) -> None:
    head = start_head(Knobs(ttft_base_ms=5, ttft_per_1k_ms=0, itl_ms=50))
    prompt = "word " * 100
    request = head.in_background("/v1/completions", {"prompt": prompt, "max_tokens": 30, "ignore_eos": True})
    eventually(lambda: value(head.metrics(), "vllm:generation_tokens_total") >= 2)
    text = head.metrics()
    generated = value(text, "vllm:generation_tokens_total")
    assert value(text, "vllm:num_requests_running") == 1
    usage = value(text, "vllm:kv_cache_usage_perc")
    assert (100 + generated) / CAPACITY <= usage <= (100 + 30) / CAPACITY  # the prompt and the output so far
    request.join(timeout=30)
    eventually(lambda: value(head.metrics(), "vllm:num_requests_running") == 0)
    text = head.metrics()
    assert value(text, "vllm:kv_cache_usage_perc") == 0.0
    assert histogram(text, "vllm:inter_token_latency_seconds", ITL_BUCKETS, VLLM_LABELS)[1] == 29


def test_sglang_flavour_has_its_names_usage_and_throughput(start_head: Callable[..., Head]) -> None:
    head = start_head(Knobs(ttft_base_ms=5, ttft_per_1k_ms=0, itl_ms=40), sglang=True)
    idle = head.metrics()
    assert value(idle, "sglang:token_usage") == 0.0 and value(idle, "sglang:gen_throughput") == 0.0
    request = head.in_background("/v1/completions", {"prompt": "a b c d", "max_tokens": 25, "ignore_eos": True,
                                                     "stream": True})
    eventually(lambda: value(head.metrics(), "sglang:generation_tokens_total") >= 3)
    busy = head.metrics()
    assert 0 < value(busy, "sglang:token_usage") <= (4 + 25) / CAPACITY
    assert 0 < value(busy, "sglang:gen_throughput") <= 1000 / 40 * 2  # about 25 tokens per second
    request.join(timeout=30)
    eventually(lambda: value(head.metrics(), "sglang:num_requests_total") == 1)
    text = head.metrics()
    assert "vllm:" not in text and 'engine="' not in text
    assert value(text, "sglang:token_usage") == 0.0 and value(text, "sglang:gen_throughput") == 0.0
    for suffix, bounds in HISTOGRAMS.items():
        total, count = histogram(text, "sglang:" + suffix, bounds, SGLANG_LABELS)
        assert count == (24 if suffix.startswith("inter_token") else 1) and total > 0
    assert histogram(text, "sglang:inter_token_latency_seconds", ITL_BUCKETS, SGLANG_LABELS)[0] >= 24 * 0.040 * 0.5
    for name in ("sglang:token_usage", "sglang:gen_throughput"):
        [labels] = [lab for n, lab, _ in parse(text) if n == name]
        assert labels == SGLANG_LABELS
        assert "# TYPE %s gauge" % name in text


def test_sglang_names_only_in_the_sglang_flavour() -> None:
    vllm = Metrics("tiny", 2, CAPACITY).render()
    sglang = launch_server.SGLangMetrics("tiny", 2, CAPACITY).render()
    assert "sglang:" not in vllm and "vllm:" not in sglang
    for suffix in HISTOGRAMS:
        assert "# TYPE vllm:%s histogram" % suffix in vllm and "# TYPE sglang:%s histogram" % suffix in sglang
    for name in ("sglang:token_usage", "sglang:gen_throughput"):
        assert "# TYPE %s gauge" % name in sglang
    assert "vllm:kv_cache_usage_perc" in vllm and "vllm:num_preemptions_total" in vllm
