"""The bench reads every engine's /metrics by the names of that engine's adapter, and names none itself.

A vLLM-shaped and an SGLang-shaped exposition, each read through its
adapter's ``metric_names``; detection of the engine from the first reading;
a toy adapter registered here (tests/bench/conftest.py) read by its own
names, with no change to the bench; and both lab doubles probed and measured.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils import engines as adapters
from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import METRIC_MEANINGS, Engine
from benchdouble import SPEC_TOKENS, Double
from sparkserve_bench import cli
from sparkserve_bench.client import Client
from sparkserve_bench.engines import detect_engine, metrics_of, names
from sparkserve_bench.errors import BenchError
from sparkserve_bench.promparse import MEANINGS, parse_exposition
from sparkserve_bench.runner import RunOptions, run_bench
from sparkserve_bench.suites import parse_suites

VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:num_requests_running{model_name="m",engine="0"} 0.0
vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 100.0
vllm:spec_decode_num_drafts_total{model_name="m",engine="1"} 100.0
vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 600.0
vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="1"} 600.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 250.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="1"} 250.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="0",position="0"} 160.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="1",position="0"} 160.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="0",position="1"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="1",position="1"} 90.0
vllm:cache_config_info{block_size="2304",cache_dtype="fp8",num_gpu_blocks="1243"} 1.0
"""
VLLM_BEFORE = """vllm:spec_decode_num_drafts_total{engine="0"} 0.0
vllm:spec_decode_num_draft_tokens_total{engine="0"} 0.0
vllm:spec_decode_num_accepted_tokens_total{engine="0"} 0.0
"""
SGLANG_METRICS = """# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:num_running_reqs{model_name="m"} 0.0
sglang:generation_tokens_total{model_name="m"} 4000.0
sglang:spec_accept_length{model_name="m"} 2.5
"""
TOY_METRICS = """toy_verify_steps_total 40
toy_proposed_tokens_total 160
toy_kept_tokens_total 70
toy_kept_tokens_at_total{position="0"} 35
toy_kept_tokens_at_total{position="1"} 20
toy_kept_tokens_at_total{position="2"} 15
toy_mean_tokens_per_step 2.75
toy_kv_pool_info{num_gpu_blocks="10",block_size="64"} 1
"""


def read(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return parse_exposition(text)


def test_every_meaning_an_adapter_names_is_a_known_one() -> None:
    """A meaning no reader knows would be silently ignored: an adapter's mistake, caught here; the bench
    reads only known meanings."""
    assert names() == sorted(adapters.ENGINES) and {"vllm", "sglang"} <= set(names())
    assert set(MEANINGS) <= set(METRIC_MEANINGS)
    for name, adapter in adapters.ENGINES.items():
        assert set(adapter.metric_names) <= set(METRIC_MEANINGS), (name, sorted(adapter.metric_names))
        assert metrics_of(name).names == dict(adapter.metric_names)
    with pytest.raises(BenchError, match="engine 'nonesuch' has no adapter; the engines are: .*sglang.*vllm"):
        metrics_of("nonesuch")


def test_a_vllm_exposition_is_read_by_the_vllm_adapter_names() -> None:
    vllm = metrics_of("vllm")
    before, after = vllm.spec_counters(read(VLLM_BEFORE)), vllm.spec_counters(read(VLLM_METRICS))
    assert before is not None and after is not None
    delta = after.minus(before).summary()
    assert delta["source"] == "vllm" and delta["drafts"] == 200 and delta["accepted_tokens"] == 500
    assert delta["accept_length"] == pytest.approx(3.5) and delta["accept_rate"] == pytest.approx(500 / 1200)
    assert delta["accepted_per_position"] == [320, 180]
    assert delta["acceptance_per_position"] == pytest.approx([1.6, 0.9])
    assert delta["accept_length_gauge"] is None and "note" not in delta
    assert vllm.server_facts(read(VLLM_METRICS)) == {"kv_blocks": 1243, "block_size": 2304, "kv_tokens": 2863872}
    assert vllm.spec_counters(read('vllm:num_requests_running{engine="0"} 0\n')) is None
    # Not the SGLang adapter's names: nothing of vLLM's exposition is read through them.
    sglang = metrics_of("sglang")
    assert sglang.spec_counters(read(VLLM_METRICS)) is None and sglang.server_facts(read(VLLM_METRICS)) == {}


def test_an_sglang_exposition_is_read_by_the_sglang_adapter_names() -> None:
    sglang = metrics_of("sglang")
    first = sglang.spec_counters(read(SGLANG_METRICS))
    later = sglang.spec_counters(read(SGLANG_METRICS.replace(" 2.5", " 2.75")))
    assert first is not None and later is not None
    # The gauge is an average since start: a run records it as read afterwards, never a difference.
    summary = later.minus(first).summary()
    assert summary["source"] == "sglang" and summary["accept_length"] == 2.75
    assert summary["accept_length_gauge"] == 2.75 and summary["accept_rate"] is None
    assert summary["acceptance_per_position"] is None and "averaged since the server started" in summary["note"]
    assert first.plus(later).summary()["accept_length"] == 2.75
    assert sglang.server_facts(read(SGLANG_METRICS)) == {}
    assert metrics_of("vllm").spec_counters(read(SGLANG_METRICS)) is None


def test_detection_picks_the_engine_whose_metrics_are_present() -> None:
    found = detect_engine(read(VLLM_METRICS))
    assert found is not None and found.engine == "vllm"
    found = detect_engine(read(SGLANG_METRICS))
    assert found is not None and found.engine == "sglang"
    assert detect_engine(read("process_cpu_seconds_total 1.5\n")) is None
    assert detect_engine({}) is None
    # The engine with more of its metrics present wins; as many of two engines is refused.
    found = detect_engine(read(VLLM_METRICS + SGLANG_METRICS))
    assert found is not None and found.engine == "vllm"
    with pytest.raises(BenchError, match=r"several engines \(sglang, vllm\); pass --engine"):
        detect_engine(read('vllm:cache_config_info{block_size="16",num_gpu_blocks="1"} 1\n'
                           "sglang:spec_accept_length 2.0\n"))


def test_a_registered_toy_engine_is_read_by_its_own_names(toy_engine: Engine) -> None:
    """A third engine is one adapter: detection, reading, the facts and --engine take it with no bench change."""
    toy = toy_engine.name
    assert toy in names()
    found = detect_engine(read(TOY_METRICS + 'vllm:num_requests_running{engine="0"} 0\n'))
    assert found is not None and found.engine == toy and found.names == dict(toy_engine.metric_names)
    before = found.spec_counters(read(TOY_METRICS.replace("_total 40", "_total 0").replace("_total 160", "_total 0")
                                      .replace("_total 70", "_total 0")
                                      .replace(" 35", " 0").replace(" 20", " 0").replace(" 15", " 0")))
    after = found.spec_counters(read(TOY_METRICS))
    assert before is not None and after is not None
    summary = after.minus(before).summary()
    assert summary["source"] == toy and (summary["drafts"], summary["draft_tokens"]) == (40, 160)
    assert summary["accept_length"] == pytest.approx(1 + 70 / 40) and summary["accept_rate"] == pytest.approx(70 / 160)
    assert summary["accepted_per_position"] == [35, 20, 15]
    assert summary["acceptance_per_position"] == pytest.approx([35 / 40, 20 / 40, 15 / 40])
    assert summary["accept_length_gauge"] == 2.75  # the engine's own gauge, kept beside the counters
    assert found.server_facts(read(TOY_METRICS)) == {"kv_blocks": 10, "block_size": 64, "kv_tokens": 640}
    # Neither built-in adapter reads the toy's exposition.
    assert all(metrics_of(name).spec_counters(read(TOY_METRICS)) is None for name in ("vllm", "sglang"))
    args = cli.build_parser().parse_args(["run", "--base-url", "http://h:1", "--model", "m", "--suites", "s",
                                          "--out", "o", "--engine", toy])
    assert args.engine == toy


def test_the_cli_offers_the_registered_engines(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", "--base-url", "http://h:1", "--model", "m", "--suites", "s", "--out", "o"]
    assert cli.build_parser().parse_args(base).engine is None
    assert cli.build_parser().parse_args(base + ["--engine", "sglang"]).engine == "sglang"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(base + ["--engine", "nonesuch"])
    assert "invalid choice: 'nonesuch'" in capsys.readouterr().err


async def _probe(url: str, engine: str | None) -> Any:
    async with Client(url) as client:
        return await client.probe("tiny", engine)


def test_the_vllm_double_is_detected_and_read_only_by_its_engine(double_a: Double) -> None:
    server = asyncio.run(_probe(double_a.url, None))
    assert server.engine is not None and server.engine.engine == "vllm" and server.engine_detected
    assert server.spec_decode_metrics
    # Given the wrong engine, its names find nothing: the deployment's engine decides, not a guess.
    server = asyncio.run(_probe(double_a.url, "sglang"))
    assert server.engine is not None and server.engine.engine == "sglang" and not server.engine_detected
    assert not server.spec_decode_metrics and server.facts == {}


def test_the_sglang_double_is_measured_through_its_adapter(sglang_double: Double) -> None:
    suites = parse_suites([{"name": "spec", "kind": "cells",
                            "primary": [{"cell": "c2", "concurrency": 2, "max_tokens": 40, "runs": 2}]}])
    for engine in (None, "sglang"):
        options = RunOptions(base_url=sglang_double.url, model="tiny", suites=suites, context={}, seed=3,
                             warmup_requests=1, warmup_tokens=8, engine=engine)
        results = asyncio.run(run_bench(options))
        server = results["server"]
        assert server["engine"] == "sglang" and server["engine_detected"] is (engine is None)
        assert server["spec_decode_metrics"] is True
        [cell] = results["cells"]
        assert cell["errors"] == 0
        spec, metrics = cell["spec_decode"], cell["metrics"]
        assert spec["source"] == "sglang" and spec["drafts"] == 0 and "note" in spec
        assert 1 < metrics["accept_length"] <= 1 + SPEC_TOKENS
        assert metrics["accept_length"] == spec["accept_length_gauge"]
        assert metrics["accept_rate"] is None and metrics["acceptance_per_position"] is None
