"""The head's HTTP API (ThreadingHTTPServer, one thread per request).

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions``, ``GET /metrics``, ``GET /version`` and
``GET /sparkserve/double/sources``; as SGLang also ``GET /health_generate``
and ``GET /get_model_info``, and ``/metrics`` only when enabled.
``--api-key`` guards ``/v1/*`` only.
Requests sleep on their own threads, so they run concurrently, up to
``--max-num-seqs`` at a time; the rest wait for a slot. While
``VLLM_DOUBLE_STALL_FILE`` exists, a completion that starts generates nothing
and answers nothing until the file is gone (or its client leaves).
A request arrives when its body is checked; its latencies (time to first
token, each later step, end to end) and the KV tokens it holds go to
``Metrics`` as they happen.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Generator

from . import VERSION
from .cli import ServeArgs
from .generation import Step, make_tokens, output_length, request_digest, schedule
from .knobs import Knobs
from .logs import Logger
from .metrics import Metrics
from .openai_api import (
    ApiError,
    GenRequest,
    chunk_body,
    models_body,
    new_request_id,
    parse_request,
    response_body,
    usage_chunk,
)
from .provenance import source_hashes
from .state import EngineState, Phase

# How often a stalled completion looks for its file (VLLM_DOUBLE_STALL_FILE) and for its client.
STALL_POLL_S = 0.2


class EngineDeadError(Exception):
    """The engine died while a request was running."""


def client_gone(connection: socket.socket) -> bool:
    """Whether the client has closed its end of the connection (it is readable, at its end), without waiting."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or already closed
        return True


@dataclass
class Api:
    """Everything a request handler needs."""

    args: ServeArgs
    knobs: Knobs
    state: EngineState
    metrics: Metrics
    log: Logger
    max_model_len: int
    flavor: str = "vllm"  # the engine answered as: vllm or sglang
    metrics_enabled: bool = True
    sources: dict[str, str] = field(default_factory=source_hashes)
    # A step every worker rank takes part in (the rendezvous's collective); None on one node.
    collective: Callable[[], bool] | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    slots: threading.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.slots = threading.Semaphore(self.args.max_num_seqs)

    @property
    def api_key(self) -> str | None:
        return self.args.api_key or self.knobs.api_key

    def dead_error(self) -> ApiError:
        return ApiError(500, "EngineCore encountered an issue. See stack trace (above) for the root cause. (%s)"
                        % self.state.dead_reason, kind="InternalServerError")

    def check_serving(self) -> None:
        phase = self.state.phase
        if phase is Phase.LOADING:
            raise ApiError(503, "The engine is still loading.", kind="ServiceUnavailableError")
        if phase is Phase.DEAD:
            raise self.dead_error()

    def plan(self, req: GenRequest) -> tuple[list[str], str, list[Step]]:
        """Tokens, finish reason and timed steps of a request."""
        digest = request_digest(req.prompt, req.temperature, req.seed)
        count, finish = output_length(digest, req.max_tokens, req.ignore_eos)
        steps = schedule(count, req.prompt_tokens, self.knobs, self.args.num_speculative_tokens, digest)
        return make_tokens(digest, count), finish, steps

    def run_steps(self, req: GenRequest, steps: list[Step],
                  arrived: float | None = None) -> Generator[Step, None, None]:
        """Yield each step when it is due; raise EngineDeadError if the engine dies meanwhile.

        Records the time to first token (from ``arrived``, a ``time.monotonic()``; default now) and the gap
        before each later step; the request holds its prompt and output tokens in the KV cache from its first
        token until the generator ends (run out, raised or closed)."""
        started = time.monotonic()
        last = started if arrived is None else arrived
        held = 0
        try:
            for number, step in enumerate(steps):
                delay = started + step.at_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if self.state.phase is Phase.DEAD:
                    raise EngineDeadError()
                if (number == 0 or number == len(steps) - 1) and self.collective and not self.collective():
                    raise EngineDeadError()
                now = time.monotonic()
                tokens = step.tokens
                if number == 0:
                    self.metrics.prefilled(req.prompt_tokens)
                    self.metrics.first_token(now - last)
                    tokens += req.prompt_tokens
                else:
                    self.metrics.inter_token(now - last)
                last = now
                held += tokens
                self.metrics.kv_held(tokens)
                self.metrics.stepped(step)
                yield step
        finally:
            self.metrics.kv_held(-held)


class DoubleHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a stop must not wait for streams in flight
    allow_reuse_address = True
    # uvicorn's backlog (vLLM's server); socketserver's 5 drops the SYNs of a burst of
    # clients, which then retry after a second and look like a slow first token.
    request_queue_size = 2048

    def __init__(self, host: str | None, port: int, api: Api) -> None:
        bind = host or ""
        self.address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self.api = api
        super().__init__((bind, port), Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    @property
    def api(self) -> Api:
        server = self.server
        assert isinstance(server, DoubleHTTPServer)
        return server.api

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt: str, *args: Any) -> None:
        self.api.log.info("%s:%s - %s" % (self.client_address[0], self.client_address[1], fmt % args))

    # --- responses ------------------------------------------------------

    def send_json(self, status: int, body: Any) -> None:
        self.send_bytes(status, json.dumps(body).encode("utf-8"), "application/json")

    def send_bytes(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_body(self, error: ApiError) -> None:
        self.send_json(error.status, error.body())

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send_event(self, payload: Any) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        data = ("data: %s\n\n" % text).encode("utf-8")
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self.send_event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    # --- routing --------------------------------------------------------

    def authorized(self) -> bool:
        key = self.api.api_key
        if key is None or not self.path.startswith("/v1"):
            return True
        return self.headers.get("Authorization", "") == "Bearer " + key

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if not self.authorized():
            self.send_json(401, {"error": "Unauthorized"})
        elif path == "/health":
            self.get_health()
        elif path == "/v1/models":
            self.get_models()
        elif path == "/metrics" and self.api.metrics_enabled:
            self.send_bytes(200, self.api.metrics.render().encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/health_generate" and self.api.flavor == "sglang":
            self.get_health()
        elif path == "/get_model_info" and self.api.flavor == "sglang":
            self.send_json(200, {"model_path": self.api.args.model, "tokenizer_path": self.api.args.model,
                                 "is_generation": True})
        elif path == "/version":
            self.send_json(200, {"version": VERSION})
        elif path == "/sparkserve/double/sources":
            self.send_json(200, {"package": "vllm_double", "version": VERSION, "files": self.api.sources})
        elif path in ("/v1/completions", "/v1/chat/completions"):
            self.send_json(405, {"detail": "Method Not Allowed"})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self.read_body()
        if not self.authorized():
            self.send_json(401, {"error": "Unauthorized"})
        elif path in ("/v1/completions", "/v1/chat/completions"):
            self.post_generate(body, chat=path.endswith("chat/completions"))
        elif path in ("/health", "/v1/models", "/metrics"):
            self.send_json(405, {"detail": "Method Not Allowed"})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    # --- endpoints ------------------------------------------------------

    def get_health(self) -> None:
        state = self.api.state
        phase = state.phase
        if phase is Phase.SERVING:
            self.send_bytes(200, b"", "application/json")
        elif phase is Phase.DEAD:
            self.send_json(503, {"status": "dead", "error": state.dead_reason})
        else:
            self.send_json(503, {"status": "loading", "waiting_for_ranks": state.missing_ranks()})

    def get_models(self) -> None:
        api = self.api
        if api.state.phase is Phase.LOADING:
            self.send_error_body(ApiError(503, "The engine is still loading.", kind="ServiceUnavailableError"))
            return
        self.send_json(200, models_body(api.args.served_names, api.args.model, api.max_model_len, api.created,
                                        owned_by=api.flavor))

    def post_generate(self, raw: bytes, chat: bool) -> None:
        api = self.api
        try:
            body = json.loads(raw.decode("utf-8")) if raw else None
            req = parse_request(body, chat, api.args.served_names, api.max_model_len, api.args.seed)
            api.check_serving()
        except ValueError as exc:
            self.send_error_body(ApiError(400, "invalid JSON body: %s" % exc))
            return
        except ApiError as error:
            self.send_error_body(error)
            return
        self.run_request(req, new_request_id(chat))

    def run_request(self, req: GenRequest, request_id: str) -> None:
        api = self.api
        arrived = time.monotonic()
        if not api.args.disable_log_requests:
            api.log.info("Received request %s: prompt_tokens=%d, max_tokens=%d, stream=%s"
                         % (request_id, req.prompt_tokens, req.max_tokens, req.stream))
        api.metrics.queued(1)
        api.slots.acquire()
        api.metrics.queued(-1)
        api.metrics.started(1)
        finish = "abort"
        try:
            if self.wait_out_stall():
                finish = (self.stream(req, request_id, arrived) if req.stream
                          else self.complete(req, request_id, arrived))
            else:
                self.close_connection = True
                api.log.warning("request %s: client went away" % request_id)
        except (BrokenPipeError, ConnectionResetError):
            api.log.warning("request %s: client went away" % request_id)
        finally:
            api.metrics.started(-1)
            api.slots.release()
            api.metrics.finished(finish, time.monotonic() - arrived)

    def wait_out_stall(self) -> bool:
        """Hold the request, generating and answering nothing, while VLLM_DOUBLE_STALL_FILE exists: a hung
        model behind a green /health. False if the client went away meanwhile."""
        api = self.api
        path = api.knobs.stall_file
        if not path or not os.path.exists(path):
            return True
        api.log.warning("completions stalled: VLLM_DOUBLE_STALL_FILE (%s) exists" % path)
        while os.path.exists(path):
            if client_gone(self.connection):
                return False
            time.sleep(STALL_POLL_S)
        api.log.info("%s is gone: completions go on" % path)
        return True

    def complete(self, req: GenRequest, request_id: str, arrived: float) -> str:
        api = self.api
        tokens, finish, steps = api.plan(req)
        try:
            for _ in api.run_steps(req, steps, arrived):
                pass
        except EngineDeadError:
            self.send_error_body(api.dead_error())
            return "abort"
        self.send_json(200, response_body(req, request_id, "".join(tokens), finish, len(tokens)))
        return finish

    def stream(self, req: GenRequest, request_id: str, arrived: float) -> str:
        api = self.api
        tokens, finish, steps = api.plan(req)
        self.start_stream()
        sent = 0
        try:
            # closing(): a client gone mid-stream ends the steps (and gives back their KV tokens) at once.
            with closing(api.run_steps(req, steps, arrived)) as run:
                for number, step in enumerate(run):
                    if number == 0 and req.chat:
                        self.send_event(chunk_body(req, request_id, None, None, role=True))
                    text = "".join(tokens[sent:sent + step.tokens])
                    sent += step.tokens
                    self.send_event(chunk_body(req, request_id, text, finish if sent == len(tokens) else None))
        except EngineDeadError:
            self.send_event(api.dead_error().body())
            self.end_stream()
            return "abort"
        if req.include_usage:
            self.send_event(usage_chunk(req, request_id, len(tokens)))
        self.end_stream()
        return finish
