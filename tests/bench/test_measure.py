"""What the client records against the double, as far as it does not depend on the machine's speed.

The double (benchdouble.KNOBS_A) answers every request after
TTFT_BASE_MS + TTFT_PER_1K_MS x prompt tokens / 1000, then one step every
ITL_MS, each step one chunk carrying 1 + the accepted drafts of 3 (position
i accepted with ACCEPT[i] while every earlier one was). The client knows
none of this: it only streams and reads /metrics.

How close the measured times come to the configured ones, and the client's
own CPU share, loop lag and chunk-rate ceiling, are machine-dependent:
tools/bench-client.py prints them. Here: counts, structure, exact identities
between the counters and the tokens, hard lower bounds on time (the double
never answers early), and acceptance in a cell whose random draws are seeded.
"""

from __future__ import annotations

import asyncio
import math
import urllib.request
from typing import Any

import pytest

from benchdouble import (
    ACCEPT,
    ITL_MS,
    SPEC_TOKENS,
    TTFT_BASE_MS,
    TTFT_PER_1K_MS,
    Double,
    expected_acceptance,
)
from sparkserve_bench.runner import RunOptions, run_bench
from sparkserve_bench.suites import parse_suites

SEED = 7
OUTPUT_TOKENS = 100
SEEDED_TOKENS = 150
DURATION_S = 0.5
# Clock slack between the client's perf_counter and the double's monotonic clock (the same clock on Linux).
EPSILON_S = 0.001

SUITES = [
    # Runs first: a fixed number of requests (8 at once, twice), so the prompts, made
    # from SEED, are the same on every run, and with them the double's acceptance
    # draws (seeded per request by its prompt). The sustained cells below send as many
    # requests as time allows, which moves every later prompt; nothing timed runs before.
    {"name": "seeded", "kind": "cells",
     "primary": [{"cell": "c8", "prompt": "prose", "concurrency": 8, "max_tokens": SEEDED_TOKENS, "runs": 2}]},
    {"name": "prefill", "contexts": [2000], "runs": 3},
    # Every answer takes at least TTFT_BASE_MS + ITL_MS x ceil(99 / 4) = 0.55 s on the
    # double's schedule, longer than DURATION_S: each closed loop sends exactly one.
    {"name": "single", "kind": "sustained", "concurrency": 1, "duration_s": DURATION_S, "max_tokens": OUTPUT_TOKENS},
    {"name": "eight", "kind": "sustained", "concurrency": 8, "duration_s": DURATION_S, "max_tokens": OUTPUT_TOKENS},
    {"name": "sixtyfour", "kind": "sustained", "concurrency": 64, "duration_s": DURATION_S,
     "max_tokens": OUTPUT_TOKENS},
]
SEEDED = "seeded/c8"
PREFILL = "prefill/ctx2000"
SUSTAINED = {"single/c1-ctx0": 1, "eight/c8-ctx0": 8, "sixtyfour/c64-ctx0": 64}
DECODING = {SEEDED: SEEDED_TOKENS, **{cell: OUTPUT_TOKENS for cell in SUSTAINED}}


@pytest.fixture(scope="module")
def results(double_a: Double) -> dict[str, Any]:
    options = RunOptions(base_url=double_a.url, model="tiny", suites=parse_suites(SUITES), context={}, seed=SEED,
                         warmup_requests=2, warmup_tokens=16)
    return asyncio.run(run_bench(options))


@pytest.fixture(scope="module")
def cells(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cell["id"]: cell for cell in results["cells"]}


def mean_prompt_tokens(cell: dict[str, Any]) -> float:
    """Over every request of the cell (each sample holds its run's mean and request count)."""
    samples = cell["samples"]
    return sum(s["prompt_tokens"] * s["requests"] for s in samples) / sum(s["requests"] for s in samples)


def test_every_cell_is_measured_with_every_request_answered(results: dict[str, Any],
                                                            cells: dict[str, dict[str, Any]]) -> None:
    assert [c["id"] for c in results["cells"]] == [SEEDED, PREFILL, *SUSTAINED]
    expected_requests = {SEEDED: 16, PREFILL: 3, **SUSTAINED}
    for cell_id, cell in cells.items():
        assert cell["errors"] == 0 and cell["error_examples"] == [], cell["error_examples"]
        assert cell["requests"] == expected_requests[cell_id], (cell_id, cell["requests"])
        assert cell["tokens_source"] == "usage"
        # Runs of a burst cell, one sample each; a sustained cell is one run.
        assert len(cell["samples"]) == cell["runs"] == (2 if cell_id == SEEDED else 3 if cell_id == PREFILL else 1)
        assert sum(s["requests"] for s in cell["samples"]) == cell["requests"]
        assert all(s["errors"] == 0 for s in cell["samples"])
        for name in ("ttft_ms", "latency_s", "request_tok_s"):
            assert cell["percentiles"][name]["n"] == cell["requests"], (cell_id, name)
    summary = results["summary"]
    assert (summary["cells"], summary["requests"], summary["errors"]) == (5, sum(expected_requests.values()), 0)
    assert {cells[c]["mode"] for c in SUSTAINED} == {"sustained"} and cells[SEEDED]["mode"] == "burst"


def test_output_tokens_come_from_usage_and_every_chunk_is_counted(cells: dict[str, dict[str, Any]]) -> None:
    """ignore_eos: every answer is max_tokens long; each engine step is one chunk the client times."""
    for cell_id, tokens in DECODING.items():
        cell = cells[cell_id]
        assert cell["metrics"]["output_tokens"] == tokens, cell_id
        assert all(s["output_tokens"] == tokens for s in cell["samples"])
        # One chunk for the first token plus one per decode step (= one draft each).
        chunks = cell["client"]["chunks"]
        assert chunks == cell["requests"] + cell["spec_decode"]["drafts"], (cell_id, chunks)
        assert cell["percentiles"]["itl_ms"]["n"] == chunks - cell["requests"]
    prefill = cells[PREFILL]
    assert prefill["metrics"]["output_tokens"] == 1 and prefill["client"]["chunks"] == 3
    assert prefill["percentiles"]["itl_ms"] is None and prefill["metrics"]["itl_ms"] is None


def test_spec_decode_counters_are_exactly_the_cells_own(cells: dict[str, dict[str, Any]]) -> None:
    """The /metrics deltas cover this cell's requests and nothing else (no warm-up, no other cell).

    A decode step drafts SPEC_TOKENS and emits 1 + the accepted ones, so the
    requests' tokens after the first equal drafts + accepted exactly.
    """
    for cell_id, tokens in DECODING.items():
        cell = cells[cell_id]
        spec, metrics = cell["spec_decode"], cell["metrics"]
        drafts, accepted = spec["drafts"], spec["accepted_tokens"]
        assert spec["source"] == "vllm" and drafts > 0
        assert accepted == cell["requests"] * (tokens - 1) - drafts, (cell_id, spec)
        assert spec["draft_tokens"] == SPEC_TOKENS * drafts
        # Position i counts only when every earlier one was accepted.
        per_position = spec["accepted_per_position"]
        assert len(per_position) == SPEC_TOKENS and sum(per_position) == accepted
        assert all(a >= b for a, b in zip(per_position, per_position[1:], strict=False)), per_position
        assert metrics["accept_length"] == pytest.approx(cell["requests"] * (tokens - 1) / drafts)
        assert 1 < metrics["accept_length"] <= 1 + SPEC_TOKENS
        assert metrics["accept_rate"] == pytest.approx(accepted / (SPEC_TOKENS * drafts))
        assert metrics["acceptance_per_position"] == pytest.approx([n / drafts for n in per_position])
    prefill = cells[PREFILL]
    assert prefill["spec_decode"]["drafts"] == 0 and prefill["metrics"]["accept_length"] is None


def test_seeded_acceptance_matches_the_configuration(cells: dict[str, dict[str, Any]]) -> None:
    """The seeded cell's draws are the same on every run, so this is deterministic.

    Its tolerance, four standard errors of a step's draws over this many
    drafts, is what nearly any seed would pass: a wrong reading of the
    counters (positions shifted, warm-up included, a missing engine) is far outside it.
    """
    cell = cells[SEEDED]
    drafts = cell["spec_decode"]["drafts"]
    length, rate, shares = expected_acceptance(SEEDED_TOKENS)
    reach = [math.prod(ACCEPT[:i]) for i in range(SPEC_TOKENS + 1)] + [0.0]  # P(positions before i accepted)
    runs = [reach[a] - reach[a + 1] for a in range(SPEC_TOKENS + 1)]  # P(a step accepts exactly a drafts)
    variance = sum(a * a * p for a, p in enumerate(runs)) - sum(a * p for a, p in enumerate(runs)) ** 2
    metrics = cell["metrics"]
    assert abs(metrics["accept_length"] - length) <= 4 * math.sqrt(variance / drafts), (metrics, length)
    assert abs(metrics["accept_rate"] - rate) <= 4 * math.sqrt(variance / drafts) / SPEC_TOKENS
    for measured, share in zip(metrics["acceptance_per_position"], shares, strict=True):
        assert abs(measured - share) <= 4 * math.sqrt(share * (1 - share) / drafts), (measured, shares)


def test_no_time_is_measured_below_what_the_double_waits(cells: dict[str, dict[str, Any]]) -> None:
    """Lower bounds only: the double sleeps until each step is due, so no figure can be shorter.

    A first chunk comes no sooner than the configured TTFT after the request
    was sent; a request ends no sooner than its last step, TTFT + ITL x its
    decode steps (its drafts). Gaps between chunks have no such bound: chunks
    that arrive together are read with one timestamp.
    """
    for cell_id, cell in cells.items():
        prompt_tokens = mean_prompt_tokens(cell)
        assert cell["percentiles"]["ttft_ms"]["min"] >= TTFT_BASE_MS - 1000 * EPSILON_S, cell_id
        ttft_s = (TTFT_BASE_MS + TTFT_PER_1K_MS * prompt_tokens / 1000) / 1000
        steps = cell["spec_decode"]["drafts"] / cell["requests"]
        floor_s = ttft_s + ITL_MS / 1000 * steps
        assert cell["percentiles"]["latency_s"]["mean"] >= floor_s - EPSILON_S, (cell_id, floor_s)
    for cell_id in SUSTAINED:
        assert cells[cell_id]["client"]["wall_s"] >= DURATION_S, cell_id
    for sample in cells[PREFILL]["samples"]:  # one request per run: its own prompt and TTFT
        ttft_s = (TTFT_BASE_MS + TTFT_PER_1K_MS * sample["prompt_tokens"] / 1000) / 1000
        assert sample["ttft_s"] >= ttft_s - EPSILON_S, sample


def test_prefill_reaches_its_context_and_reports_its_rate(cells: dict[str, dict[str, Any]]) -> None:
    cell = cells[PREFILL]
    metrics = cell["metrics"]
    # The double counts words as tokens; the calibrated filler lands on the context.
    assert abs(metrics["prompt_tokens"] - 2000) <= 20, metrics["prompt_tokens"]
    assert cell["speed_metric"] == "prefill_tok_s" and cell["context"] == 2000
    rates = sorted(s["prompt_tokens"] / s["ttft_s"] for s in cell["samples"])
    assert metrics["prefill_tok_s"] == pytest.approx(rates[1])  # the median of three runs


def test_the_client_reports_its_own_load(cells: dict[str, dict[str, Any]]) -> None:
    """Every cell carries what bench-client.py judges: CPU, chunks and loop lag (values machine-dependent)."""
    for cell_id, cell in cells.items():
        client = cell["client"]
        assert client["wall_s"] > 0 and client["cpu_s"] >= 0, cell_id
        assert client["cpu_share_of_one_core"] == pytest.approx(client["cpu_s"] / client["wall_s"], abs=1e-3)
        assert client["chunks_per_s"] == pytest.approx(client["chunks"] / client["wall_s"], rel=1e-3, abs=0.06)
        assert client["loop_lag_ms"]["n"] > 0 and client["loop_lag_ms"]["min"] >= 0


def test_results_say_how_prompts_were_made_and_the_server_was_warmed(results: dict[str, Any]) -> None:
    method = results["method"]
    assert "random 12-hex-digit nonce" in method["prompt_uniqueness"] and "prefix caching" in \
        method["prompt_uniqueness"]
    assert method["seed"] == SEED and method["warmup"]["requests"] == 2 and method["warmup"]["max_tokens"] == 16
    assert method["calibration"]["chat"]["source"] == "usage"
    assert method["calibration"]["chat"]["tokens_per_word"] == pytest.approx(1.0)
    assert set(method["definitions"]) >= {"tok_s", "ttft_s", "itl_ms", "tpot_ms", "accept_length"}
    assert results["server"]["spec_decode_metrics"] is True and results["server"]["max_model_len"] == 65536
    # No --engine: the vLLM double's metrics, found by the vLLM adapter's names in the first reading.
    assert results["server"]["engine"] == "vllm" and results["server"]["engine_detected"] is True
    assert results["server"]["models"] == ["tiny"]


def test_the_engine_generated_exactly_what_the_run_says_it_generated(double_a: Double) -> None:
    """summary.generated_tokens counts every completion the run sent (calibration, warm-up, cells): the
    engine's own generation counter grows by exactly that (what the monitoring compares after a bench)."""
    def generated() -> float:
        with urllib.request.urlopen(double_a.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode("utf-8")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:generation_tokens_total"))

    before = generated()
    options = RunOptions(base_url=double_a.url, model="tiny", context={}, seed=SEED, warmup_requests=2,
                         warmup_tokens=16, suites=parse_suites([
                             {"name": "small", "kind": "cells",
                              "primary": [{"cell": "c2", "prompt": "prose", "concurrency": 2, "max_tokens": 24}]}]))
    summary = asyncio.run(run_bench(options))["summary"]
    assert summary["sent_requests"] > summary["requests"] > 0
    assert summary["generated_tokens"] >= 2 * 16 + summary["requests"] * 24
    assert generated() - before == summary["generated_tokens"]
