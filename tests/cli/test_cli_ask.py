"""sparkserve up --ask: one real completion from the reported endpoint, against a small engine on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkserve.ask import AskError, complete


class Engine(BaseHTTPRequestHandler):
    answer: tuple[int, object] = (200, {"choices": [{"text": " Paris."}]})
    seen: list[dict[str, object]] = []

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, **body})
        status, data = type(self).answer
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, fmt: str, *args: object) -> None:
        return


@pytest.fixture
def url() -> Iterator[str]:
    Engine.seen = []
    Engine.answer = (200, {"choices": [{"text": " Paris."}]})
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_completion_is_asked_of_the_served_model(url: str) -> None:
    text = complete({"url": url, "model_name": "tiny-model", "loopback": False}, "The capital of France is")
    assert text == " Paris."
    assert Engine.seen == [{"path": "/v1/completions", "model": "tiny-model", "prompt": "The capital of France is",
                            "max_tokens": 16}]


def test_an_error_answer_or_no_choice_is_said(url: str) -> None:
    Engine.answer = (503, {"error": "loading"})
    with pytest.raises(AskError, match="answered 503: .*loading"):
        complete({"url": url, "model_name": "m"}, "x")
    Engine.answer = (200, {"choices": []})
    with pytest.raises(AskError, match="without a choice"):
        complete({"url": url, "model_name": "m"}, "x")


def test_a_loopback_api_or_no_endpoint_is_not_asked() -> None:
    with pytest.raises(AskError, match="ssh tunnel"):
        complete({"url": "http://127.0.0.1:8000", "model_name": "m", "loopback": True}, "x")
    with pytest.raises(AskError, match="no endpoint"):
        complete({}, "x")
