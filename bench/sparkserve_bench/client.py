"""The HTTP side: probe the server, stream one request and time it, read ``/metrics``.

One ``aiohttp`` session with a connection pool as large as the highest
concurrency; every request streams (``stream: true``) and asks for usage in
its last chunk (``stream_options.include_usage``). Chunk arrival times are
taken with ``time.perf_counter()`` as each SSE event is read.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from .engines import detect_engine, metrics_of
from .errors import BenchError
from .promparse import EngineMetrics, SpecCounters, parse_exposition


@dataclass
class RequestResult:
    """One streamed request, as the client saw it."""

    ok: bool
    t_send: float
    t_end: float
    t_first: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk carrying output text
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def output_tokens(self) -> int:
        """Tokens from the final usage chunk; without one, the text-bearing chunks (a lower bound)."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return len(self.chunk_times)

    @property
    def tokens_source(self) -> str:
        return "usage" if self.usage_completion_tokens is not None else "chunks"

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send

    @property
    def latency_s(self) -> float:
        return self.t_end - self.t_send

    @property
    def decode_s(self) -> float | None:
        if self.t_first is None or len(self.chunk_times) < 2:
            return None
        return self.chunk_times[-1] - self.t_first

    def gaps_s(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in pairwise(times)]


@dataclass(frozen=True)
class ServerInfo:
    base_url: str
    models: tuple[str, ...]
    owned_by: str | None
    max_model_len: int | None
    metrics_available: bool
    spec_decode_metrics: bool
    facts: dict[str, Any]
    # The engine whose metric names /metrics is read by (None: none known found there), and whether it was
    # found in the first reading rather than given.
    engine: EngineMetrics | None = None
    engine_detected: bool = False


def _chunk_text(payload: dict[str, Any]) -> bool:
    """Whether a chunk carries output: content, reasoning or tool calls (chat), or text (completions)."""
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")
                                        or delta.get("reasoning") or delta.get("tool_calls")):
            return True
    return False


def _error_text(status: int, body: bytes) -> str:
    try:
        data = json.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and error.get("message"):
            return "HTTP %d: %s" % (status, error["message"])
        if isinstance(data, dict) and (data.get("detail") or data.get("message")):
            return "HTTP %d: %s" % (status, data.get("detail") or data.get("message"))
    except ValueError:
        pass
    return "HTTP %d: %s" % (status, body[:300].decode("utf-8", "replace").strip())


class Client:
    """An OpenAI-compatible server at base_url (``http://HOST:PORT``, with or without ``/v1``)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0,
                 connections: int = 64) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise BenchError("--base-url %r: give http://HOST:PORT (the head's API, e.g. http://127.0.0.1:8000)"
                             % base_url)
        root = base_url.rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.headers = {"Authorization": "Bearer " + api_key} if api_key else {}
        self.timeout_s = timeout_s
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None
        # Every completion this client sent and the tokens they generated (usage), whatever the phase
        # (calibration, warm-up, cells): what the engine's generation counter grows by.
        self.sent_requests = 0
        self.generated_tokens = 0

    async def __aenter__(self) -> "Client":
        connector = aiohttp.TCPConnector(limit=max(self.connections, 1), force_close=False,
                                         enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(connector=connector, headers=self.headers,
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=10,
                                                                            sock_read=self.timeout_s))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use Client as an async context manager"
        return self._session

    # --- probing ----------------------------------------------------------

    async def _get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        url = self.root + path
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientConnectorError as exc:
            raise BenchError("cannot reach the engine at %s (%s); is it running, and is this the head's API "
                             "address and port? Check with: curl %s/v1/models"
                             % (self.root, exc.os_error.strerror or exc, self.root)) from None
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise BenchError("GET %s failed (%s); is it an OpenAI-compatible engine?"
                             % (url, type(exc).__name__ if not str(exc) else exc)) from None

    async def probe(self, model: str, engine: str | None = None) -> ServerInfo:
        """The served models, the model's context limit and what /metrics offers; BenchError if unusable.

        /metrics is read by the metric names of ENGINE's adapter; without ENGINE, by those of the registered
        engine whose metrics the first reading holds.
        """
        given = metrics_of(engine) if engine is not None else None
        status, body = await self._get("/v1/models")
        if status == 401:
            raise BenchError("%s/v1/models answered 401: the engine needs an API key; pass --api-key or set "
                             "SPARKSERVE_BENCH_API_KEY" % self.root)
        if status == 503:
            raise BenchError("%s/v1/models answered 503: the engine is still loading; wait for /health to "
                             "answer 200" % self.root)
        if status != 200:
            raise BenchError("%s/v1/models answered %s" % (self.root, _error_text(status, body)))
        try:
            data = json.loads(body).get("data") or []
            entries = {str(entry["id"]): entry for entry in data if isinstance(entry, dict) and "id" in entry}
        except (ValueError, AttributeError, TypeError):
            raise BenchError("%s/v1/models did not answer an OpenAI model list" % self.root) from None
        if model not in entries:
            served = ", ".join(sorted(entries)) or "nothing"
            raise BenchError("model %r is not served at %s; it serves: %s. Pass --model with one of them (the "
                             "recipe's model.served_name)" % (model, self.root, served))
        entry = entries[model]
        max_len = entry.get("max_model_len")
        status, body = await self._get("/metrics")
        facts: dict[str, Any] = {}
        spec = False
        reader = given
        if status == 200:
            families = parse_exposition(body.decode("utf-8", "replace"))
            if reader is None:
                reader = detect_engine(families)
            if reader is not None:
                facts = reader.server_facts(families)
                spec = reader.spec_counters(families) is not None
        return ServerInfo(base_url=self.root, models=tuple(sorted(entries)), owned_by=entry.get("owned_by"),
                          max_model_len=max_len if isinstance(max_len, int) else None,
                          metrics_available=status == 200, spec_decode_metrics=spec, facts=facts,
                          engine=reader, engine_detected=given is None and reader is not None)

    async def spec_counters(self, metrics: EngineMetrics) -> SpecCounters | None:
        """One reading of /metrics by the engine's metric names; None when it has no speculative decoding."""
        status, body = await self._get("/metrics")
        if status != 200:
            return None
        return metrics.spec_counters(parse_exposition(body.decode("utf-8", "replace")))

    # --- one request ------------------------------------------------------

    async def stream(self, api: str, body: dict[str, Any]) -> RequestResult:
        """Send one streamed request and time its chunks; failures come back as ok=False, never raised."""
        path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        data = json.dumps(body).encode("utf-8")
        t_send = time.perf_counter()
        result = RequestResult(ok=False, t_send=t_send, t_end=t_send)
        try:
            async with self.session.post(self.root + path, data=data,
                                         headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    result.error = _error_text(resp.status, await resp.read())
                else:
                    await self._read_events(resp, result)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            result.error = "%s: %s" % (type(exc).__name__, exc)
        result.t_end = time.perf_counter()
        if result.error is None and result.t_first is None and result.output_tokens == 0:
            result.error = "the stream ended without any output"
        result.ok = result.error is None
        self.sent_requests += 1
        self.generated_tokens += result.output_tokens
        return result

    async def _read_events(self, resp: aiohttp.ClientResponse, result: RequestResult) -> None:
        buffer = b""
        done = False
        async for block in resp.content.iter_any():
            now = time.perf_counter()
            buffer += block
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                self._event(payload, now, result)
        if not done and result.error is None:
            result.error = "the stream ended without data: [DONE]"

    @staticmethod
    def _event(payload: bytes, now: float, result: RequestResult) -> None:
        try:
            event = json.loads(payload)
        except ValueError:
            result.error = "a stream event is not JSON: %r" % payload[:120]
            return
        if not isinstance(event, dict):
            return
        if "error" in event:
            error = event["error"]
            result.error = "stream error: %s" % (error.get("message") if isinstance(error, dict) else error)
            return
        if _chunk_text(event):
            if result.t_first is None:
                result.t_first = now
            result.chunk_times.append(now)
        for choice in event.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
        usage = event.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                result.usage_completion_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                result.usage_prompt_tokens = usage["prompt_tokens"]
