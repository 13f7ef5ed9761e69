"""Run suites against a server: check it, calibrate, warm it up, then measure every cell.

Order: probe (``/v1/models``, ``/metrics``), refuse cells that do not fit the
model's context, calibrate tokens per filler word (two tiny requests per API
that has a cell with a context), warm up (``warmup_requests`` real
completions, none measured), then block by block (a suite's
``repetitions``) every cell's ``runs``. Speculative-decoding counters, named
by the engine's adapter (promparse), are read before and after each run, so
only that run's requests count.

While a run is measured the client also measures itself: its process CPU
time against the wall time, and how late its event loop wakes (a 5 ms
ticker). A client that is the bottleneck shows a CPU share near one core and
a late loop; both are in every cell's ``client`` field.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from . import RESULTS_FORMAT, VERSION
from .client import Client, RequestResult, ServerInfo
from .errors import BenchError
from .promparse import SpecCounters
from .prompts import ASSUMED, HEADER_WORDS, Calibration, PromptMaker
from .stats import mean, reduce, summary
from .suites import Cell, Suite

LOOP_TICK_S = 0.005
SCALAR_METRICS = ("tok_s", "per_request_tok_s", "decode_tok_s", "prefill_tok_s", "ttft_s", "itl_ms", "tpot_ms",
                  "latency_s", "output_tokens", "prompt_tokens")
CALIBRATION_TASK = "Reply with one word."
CALIBRATION_WORDS = 400

PROMPT_UNIQUENESS = ("Every measured request starts with a random 12-hex-digit nonce, so no two requests share a "
                     "first KV block and prefix caching cannot serve one from another; only cells marked cached "
                     "reuse one prompt on purpose (primed by one unmeasured request).")
DEFINITIONS = {
    "tok_s": "output tokens of the run's requests / (last response end - first request sent); at concurrency > 1 "
             "the aggregate; request wall time, time to first token included",
    "per_request_tok_s": "mean over requests of output tokens / request wall time",
    "decode_tok_s": "mean over requests of (output tokens - 1) / (last chunk - first chunk)",
    "prefill_tok_s": "mean over requests of prompt tokens / time to first token",
    "ttft_s": "request sent to the first chunk carrying output (content, reasoning or text)",
    "itl_ms": "time between consecutive chunks carrying output: one engine step, which with speculative decoding "
              "carries 1 + accepted tokens",
    "tpot_ms": "time per output token after the first: (last chunk - first chunk) / (output tokens - 1)",
    "output_tokens": "usage.completion_tokens of the final chunk (stream_options.include_usage); without usage, "
                     "the chunks carrying output",
    "accept_length": "1 + accepted / drafts, from /metrics counter deltas over the cell's runs; for an engine "
                     "without draft counters, its accept-length gauge (averaged since it started) as read after "
                     "the cell",
    "accept_rate": "accepted / draft tokens",
    "acceptance_per_position": "accepted at draft position i / drafts (positions from 1)",
    "statistic": "each metric: the suite's report statistic (median by default) over a block's runs, then the "
                 "arithmetic mean over blocks (repetitions)",
}


@dataclass(frozen=True)
class RunOptions:
    base_url: str
    model: str
    suites: Sequence[Suite]
    context: dict[str, Any]
    api_key: str | None = None
    seed: int | None = None
    warmup_requests: int = 4
    warmup_tokens: int = 128
    timeout_s: float = 600.0
    log: Callable[[str], None] = lambda line: None
    # The deployment's engine (an adapter's name): /metrics is read by its metric names. None: the registered
    # engine whose metrics the first /metrics reading holds.
    engine: str | None = None


class LoopMonitor:
    """How late the event loop wakes a 5 ms sleeper: a busy client wakes late."""

    def __init__(self) -> None:
        self.lags_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            due = time.perf_counter() + LOOP_TICK_S
            await asyncio.sleep(LOOP_TICK_S)
            self.lags_s.append(max(0.0, time.perf_counter() - due))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


@dataclass
class RunSample:
    """One run of a cell."""

    block: int
    run: int
    requests: list[RequestResult]
    wall_s: float
    cpu_s: float
    loop_lags_s: list[float]
    spec: SpecCounters | None

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]


def request_body(cell: Cell, model: str, prompt: str, max_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                            "max_tokens": max_tokens or cell.max_tokens}
    if cell.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if cell.temperature is not None:
        body["temperature"] = cell.temperature
    if cell.ignore_eos:
        body["ignore_eos"] = True
    if cell.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": cell.thinking}
    if cell.reasoning_effort is not None:
        body["reasoning_effort"] = cell.reasoning_effort
    body.update(cell.extra_body)
    return body


def sample_metrics(requests: Sequence[RequestResult]) -> dict[str, float | None]:
    """The scalar metrics of one run (None where no request gives the value)."""
    ok = [r for r in requests if r.ok]
    out: dict[str, float | None] = {name: None for name in SCALAR_METRICS}
    if not ok:
        return out
    span = max(r.t_end for r in ok) - min(r.t_send for r in ok)
    tokens = sum(r.output_tokens for r in ok)
    out["tok_s"] = tokens / span if span > 0 else None
    out["per_request_tok_s"] = mean([r.output_tokens / r.latency_s for r in ok if r.latency_s > 0])
    out["latency_s"] = mean([r.latency_s for r in ok])
    out["output_tokens"] = mean([r.output_tokens for r in ok])
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    out["ttft_s"] = mean(ttfts) if ttfts else None
    prompts = [r.usage_prompt_tokens for r in ok if r.usage_prompt_tokens is not None]
    out["prompt_tokens"] = mean(prompts) if prompts else None
    prefill = [r.usage_prompt_tokens / r.ttft_s for r in ok
               if r.usage_prompt_tokens is not None and r.ttft_s is not None and r.ttft_s > 0]
    out["prefill_tok_s"] = mean(prefill) if prefill else None
    decoding = [r for r in ok if r.decode_s and r.decode_s > 0 and r.output_tokens > 1]
    if decoding:
        out["decode_tok_s"] = mean([(r.output_tokens - 1) / r.decode_s for r in decoding])  # type: ignore[operator]
        out["tpot_ms"] = mean([1000.0 * r.decode_s / (r.output_tokens - 1) for r in decoding])  # type: ignore[operator]
        out["itl_ms"] = mean([1000.0 * r.decode_s / (len(r.chunk_times) - 1) for r in decoding])  # type: ignore[operator]
    return out


def cell_result(cell: Cell, samples: Sequence[RunSample]) -> dict[str, Any]:
    """The results entry of a cell from all its runs."""
    per_sample = [sample_metrics(s.requests) for s in samples]
    metrics: dict[str, Any] = {}
    blocks = sorted({s.block for s in samples})
    for name in SCALAR_METRICS:
        block_values = []
        for block in blocks:
            values = [value for s, m in zip(samples, per_sample, strict=True)
                      if s.block == block and (value := m[name]) is not None]
            if values:
                block_values.append(reduce(values, cell.statistic))
        metrics[name] = mean(block_values) if block_values else None
    spec_total: SpecCounters | None = None
    for sample in samples:
        if sample.spec is not None:
            spec_total = sample.spec if spec_total is None else spec_total.plus(sample.spec)
    spec = spec_total.summary() if spec_total is not None else None
    if spec is not None:
        metrics["accept_length"] = spec["accept_length"]
        metrics["accept_rate"] = spec["accept_rate"]
        metrics["acceptance_per_position"] = spec["acceptance_per_position"]
    ok = [r for s in samples for r in s.ok]
    failed = [r for s in samples for r in s.requests if not r.ok]
    cpu = sum(s.cpu_s for s in samples)
    wall = sum(s.wall_s for s in samples)
    chunks = sum(len(r.chunk_times) for r in ok)
    lags = [lag * 1000.0 for s in samples for lag in s.loop_lags_s]
    return {
        "id": cell.id, "suite": cell.suite, "kind": cell.kind, "cell": cell.name, "mode": cell.mode,
        "concurrency": cell.concurrency, "context": cell.context,
        "temperature": "default" if cell.temperature is None else cell.temperature,
        "max_tokens": cell.max_tokens, "ignore_eos": cell.ignore_eos, "api": cell.api,
        "prompts": cell.family if cell.prompt is None else "literal", "cached": cell.cached,
        "duration_s": cell.duration_s, "runs": cell.runs, "repetitions": cell.repetitions,
        "statistic": cell.statistic, "speed_metric": cell.speed_metric,
        "metrics": metrics,
        "percentiles": {
            "ttft_ms": summary(1000.0 * r.ttft_s for r in ok if r.ttft_s is not None),
            "itl_ms": summary(1000.0 * gap for r in ok for gap in r.gaps_s()),
            "tpot_ms": summary(1000.0 * r.decode_s / (r.output_tokens - 1) for r in ok
                               if r.decode_s and r.output_tokens > 1),
            "latency_s": summary(r.latency_s for r in ok),
            "request_tok_s": summary(r.output_tokens / r.latency_s for r in ok if r.latency_s > 0),
            "decode_tok_s": summary((r.output_tokens - 1) / r.decode_s for r in ok
                                    if r.decode_s and r.output_tokens > 1),
        },
        "spec_decode": spec,
        "requests": len(ok) + len(failed), "errors": len(failed),
        "error_examples": sorted({r.error or "?" for r in failed})[:3],
        "tokens_source": "usage" if all(r.tokens_source == "usage" for r in ok) else "chunks",
        "samples": [{"block": s.block + 1, "run": s.run + 1, "requests": len(s.requests), "errors": len(s.requests)
                     - len(s.ok), "wall_s": round(s.wall_s, 4), **m} for s, m in zip(samples, per_sample, strict=True)],
        "client": {"cpu_s": round(cpu, 4), "wall_s": round(wall, 4),
                   "cpu_share_of_one_core": round(cpu / wall, 4) if wall > 0 else None,
                   "chunks": chunks, "chunks_per_s": round(chunks / wall, 1) if wall > 0 else None,
                   "cpu_us_per_chunk": round(1e6 * cpu / chunks, 2) if chunks else None,
                   "loop_lag_ms": summary(lags)},
    }


class Runner:
    """One benchmark run against one server."""

    def __init__(self, options: RunOptions, client: Client, server: ServerInfo) -> None:
        self.options = options
        self.client = client
        self.server = server
        self.seed = options.seed if options.seed is not None else int.from_bytes(os.urandom(4), "big")
        self.maker = PromptMaker(self.seed)
        self.calibration: dict[str, Calibration] = {}
        self.counter = 0

    # --- prompts ------------------------------------------------------------

    def prompt(self, cell: Cell, nonce: str | None = None) -> str:
        self.counter += 1
        task = self.maker.task(cell.family, cell.prompt, self.counter)
        calibration = self.calibration.get(cell.api, ASSUMED)
        return self.maker.build(task, calibration.filler_words(cell.context, len(task.split())), nonce)

    async def calibrate(self, api: str) -> Calibration:
        """Tokens per filler word on this server, from usage.prompt_tokens of two one-token requests."""
        probe = Cell(suite="calibration", kind="smoke", name=api, mode="burst", concurrency=1, context=0,
                     temperature=None, max_tokens=1, ignore_eos=False, api=api, family=None,
                     prompt=CALIBRATION_TASK, runs=1, repetitions=1, statistic="median", warmup=0)
        short = self.maker.build(CALIBRATION_TASK, 0)
        long = self.maker.build(CALIBRATION_TASK, CALIBRATION_WORDS)
        first, second = [await self.client.stream(api, request_body(probe, self.options.model, text))
                         for text in (short, long)]
        for result in (first, second):
            if not result.ok:
                raise BenchError("calibration request to %s failed: %s" % (self.client.root, result.error))
        if first.usage_prompt_tokens is None or second.usage_prompt_tokens is None:
            return ASSUMED
        per_word = (second.usage_prompt_tokens - first.usage_prompt_tokens) / (CALIBRATION_WORDS + HEADER_WORDS)
        if per_word <= 0:
            return ASSUMED
        overhead = first.usage_prompt_tokens - len(CALIBRATION_TASK.split()) * per_word
        return Calibration(tokens_per_word=per_word, overhead_tokens=overhead, source="usage")

    # --- phases ---------------------------------------------------------------

    async def warmup(self) -> dict[str, Any]:
        """Real completions before anything is measured; the first must succeed alone."""
        count, tokens = self.options.warmup_requests, self.options.warmup_tokens
        if count <= 0:
            return {"requests": 0, "max_tokens": tokens, "seconds": 0.0}
        started = time.perf_counter()
        cell = Cell(suite="warmup", kind="smoke", name="warmup", mode="burst", concurrency=1, context=0,
                    temperature=None, max_tokens=tokens, ignore_eos=True, api="chat", family="mixed", prompt=None,
                    runs=1, repetitions=1, statistic="median", warmup=0)
        first = await self.client.stream("chat", request_body(cell, self.options.model, self.prompt(cell)))
        if not first.ok:
            raise BenchError("the first warm-up request to %s failed: %s (the engine lists the model but does not "
                             "answer a completion)" % (self.client.root, first.error))
        rest = [self.client.stream("chat", request_body(cell, self.options.model, self.prompt(cell)))
                for _ in range(count - 1)]
        failed = [r.error for r in await asyncio.gather(*rest) if not r.ok]
        if failed:
            raise BenchError("%d of %d warm-up requests failed; first: %s" % (len(failed), count, failed[0]))
        return {"requests": count, "max_tokens": tokens, "seconds": round(time.perf_counter() - started, 3)}

    async def measure(self, cell: Cell, block: int, run: int, nonce: str | None) -> RunSample:
        metrics = self.server.engine if self.server.spec_decode_metrics else None
        before = await self.client.spec_counters(metrics) if metrics is not None else None
        monitor = LoopMonitor()
        monitor.start()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if cell.mode == "sustained":
            requests = await self._sustained(cell, nonce)
        else:
            requests = list(await asyncio.gather(*[
                self.client.stream(cell.api, request_body(cell, self.options.model, self.prompt(cell, nonce)))
                for _ in range(cell.concurrency)]))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        await monitor.stop()
        spec = None
        if before is not None and metrics is not None:
            after = await self.client.spec_counters(metrics)
            spec = after.minus(before) if after is not None else None
        return RunSample(block, run, requests, wall, cpu, monitor.lags_s, spec)

    async def _sustained(self, cell: Cell, nonce: str | None) -> list[RequestResult]:
        """`concurrency` closed loops: each sends its next request when the last ends, until duration_s."""
        assert cell.duration_s is not None
        deadline = time.perf_counter() + cell.duration_s
        results: list[RequestResult] = []

        async def loop() -> None:
            while time.perf_counter() < deadline:
                body = request_body(cell, self.options.model, self.prompt(cell, nonce))
                results.append(await self.client.stream(cell.api, body))

        await asyncio.gather(*[loop() for _ in range(cell.concurrency)])
        return results

    async def run_cell(self, cell: Cell, block: int) -> list[RunSample]:
        nonce = self.maker.nonce() if cell.cached else None
        primers = [self.client.stream(cell.api, request_body(cell, self.options.model, self.prompt(cell, nonce)))
                   for _ in range(cell.warmup + (1 if cell.cached else 0))]
        for result in [await p for p in primers]:
            if not result.ok:
                self.options.log("%s: an unmeasured warm-up request failed: %s" % (cell.id, result.error))
        return [await self.measure(cell, block, run, nonce) for run in range(cell.runs)]


def check_fit(suites: Sequence[Suite], max_model_len: int | None) -> None:
    """Refuse cells whose context plus output would not fit the served model's context."""
    if max_model_len is None:
        return
    too_long = ["%s (context %d + max_tokens %d)" % (c.id, c.context, c.max_tokens)
                for s in suites for c in s.cells if c.context + c.max_tokens > max_model_len]
    if too_long:
        raise BenchError("these cells do not fit the served max_model_len of %d tokens: %s; shorten them or serve "
                         "a longer context" % (max_model_len, "; ".join(too_long)))


def _progress(result: dict[str, Any]) -> str:
    m = result["metrics"]
    parts = ["%s:" % result["id"]]
    speed = m.get(result["speed_metric"])
    if speed is not None:
        parts.append("%.1f %s" % (speed, result["speed_metric"]))
    if m.get("ttft_s") is not None:
        parts.append("TTFT %.3f s" % m["ttft_s"])
    if m.get("itl_ms") is not None:
        parts.append("ITL %.1f ms" % m["itl_ms"])
    if m.get("accept_length") is not None:
        parts.append("accept %.2f" % m["accept_length"])
    parts.append("(%d requests%s)" % (result["requests"], ", %d FAILED" % result["errors"] if result["errors"]
                                      else ""))
    return " ".join(parts)


async def run_bench(options: RunOptions) -> dict[str, Any]:
    """Run every suite; the results document."""
    started_at = datetime.now(timezone.utc)
    started = time.perf_counter()
    top = max((c.concurrency for s in options.suites for c in s.cells), default=1)
    async with Client(options.base_url, options.api_key, options.timeout_s, connections=max(top, 4)) as client:
        server = await client.probe(options.model, options.engine)
        check_fit(options.suites, server.max_model_len)
        runner = Runner(options, client, server)
        for api in sorted({c.api for s in options.suites for c in s.cells if c.context > 0}):
            runner.calibration[api] = await runner.calibrate(api)
        warm = await runner.warmup()
        options.log("warm-up: %d requests in %.1f s" % (warm["requests"], warm["seconds"]))
        samples: dict[str, list[RunSample]] = {}
        cells = [c for s in options.suites for c in s.cells]
        for block in range(max((c.repetitions for c in cells), default=1)):
            for cell in cells:
                if block < cell.repetitions:
                    samples.setdefault(cell.id, []).extend(await runner.run_cell(cell, block))
                    if block == cell.repetitions - 1:
                        options.log(_progress(cell_result(cell, samples[cell.id])))
    results = [cell_result(c, samples[c.id]) for c in cells]
    context = dict(options.context)
    context.update(time=started_at.isoformat(timespec="seconds"),
                   finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   base_url=client.root, model=options.model)
    return {
        "format": RESULTS_FORMAT,
        "tool": {"name": "sparkserve-bench", "version": VERSION},
        "context": context,
        "server": {"models": list(server.models), "owned_by": server.owned_by,
                   "max_model_len": server.max_model_len, "metrics_available": server.metrics_available,
                   "spec_decode_metrics": server.spec_decode_metrics,
                   "engine": server.engine.engine if server.engine is not None else None,
                   "engine_detected": server.engine_detected, **server.facts},
        "method": {"prompt_uniqueness": PROMPT_UNIQUENESS, "seed": runner.seed, "warmup": warm,
                   "calibration": {api: cal.as_dict() for api, cal in runner.calibration.items()},
                   "definitions": DEFINITIONS},
        "suites": [{"name": s.name, "kind": s.kind, "cells": [c.id for c in s.cells], "definition": s.definition}
                   for s in options.suites],
        "cells": results,
        "summary": {"cells": len(results), "requests": sum(r["requests"] for r in results),
                    "sent_requests": runner.client.sent_requests, "generated_tokens": runner.client.generated_tokens,
                    "errors": sum(r["errors"] for r in results), "wall_s": round(time.perf_counter() - started, 3)},
    }
