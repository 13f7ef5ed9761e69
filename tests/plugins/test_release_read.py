"""Tests for the release_read module: a record in a temporary folder and an API on loopback."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import release_read as rr

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")


class Health(http.server.BaseHTTPRequestHandler):
    status = 200
    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        type(self).asked.append(self.path)
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(b"loading" if self.status != 200 else b"")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[tuple[int, type[Health]]]:
    handler = type("Handler", (Health,), {"asked": [], "status": 200})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def record(port: int, host: str = "0.0.0.0") -> dict[str, Any]:
    return {"fingerprint": "f1", "recorded_at": 1.0, "deployment": "lab-tp2",
            "recipe": {"launch": {"api_host": host, "api_port": port}}, "ranks": {},
            "adapter": {"endpoints": {"health": "/health"}}}


def run_main(path: Path, capsys: pytest.CaptureFixture[str], **more: Any) -> dict[str, Any]:
    args = {"path": str(path), "wildcard_hosts": ["0.0.0.0", "::"], "timeout_s": 5, **more}
    with patch_module_args(args), pytest.raises(SystemExit):
        rr.main()
    return json.loads(capsys.readouterr().out)


def test_a_serving_release_is_read_and_asked_at_loopback(tmp_path: Path, api: tuple[int, type[Health]],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    port, handler = api
    (tmp_path / "current.json").write_text(json.dumps(record(port)))
    result = run_main(tmp_path / "current.json", capsys)
    assert result["changed"] is False and result["serves"] is True and result["health"] == "200 OK"
    assert result["url"] == f"http://127.0.0.1:{port}" and handler.asked == ["/health"]
    assert result["recorded"] == record(port)


def test_no_record_is_a_first_launch_and_nothing_is_asked(tmp_path: Path, api: tuple[int, type[Health]],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(tmp_path / "current.json", capsys)
    assert result == {**result, "recorded": {}, "url": "", "serves": False, "health": ""}
    assert api[1].asked == []


def test_an_api_that_is_not_ready_does_not_serve(tmp_path: Path, api: tuple[int, type[Health]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    port, handler = api
    handler.status = 503
    (tmp_path / "current.json").write_text(json.dumps(record(port, "127.0.0.1")))
    result = run_main(tmp_path / "current.json", capsys)
    assert result["serves"] is False and result["health"] == "503 Service Unavailable: loading"


def test_an_api_that_does_not_answer_does_not_serve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    (tmp_path / "current.json").write_text(json.dumps(record(port)))
    result = run_main(tmp_path / "current.json", capsys)
    assert result["serves"] is False and result["health"].startswith("no answer: ")


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "is not JSON"),
    (json.dumps({"recipe": {}, "recorded_at": 1}), "has no fingerprint"),
    (json.dumps({"fingerprint": "f", "recipe": {}, "recorded_at": 1}), "the record names no API to ask"),
])
def test_a_file_that_is_not_a_release_record_fails_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             text: str, message: str) -> None:
    (tmp_path / "current.json").write_text(text)
    result = run_main(tmp_path / "current.json", capsys)
    assert result["failed"] is True and message in result["msg"] and str(tmp_path / "current.json") in result["msg"]


def test_the_release_folder_is_read_in_the_same_call_without_asking_the_api(
        tmp_path: Path, api: tuple[int, type[Health]], capsys: pytest.CaptureFixture[str]) -> None:
    port, handler = api
    (tmp_path / "current.json").write_text(json.dumps(record(port)))
    (tmp_path / "previous.json").write_text(json.dumps({"fingerprint": "f0"}))
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "f1.json").write_text(json.dumps(record(port)))
    (tmp_path / "releases" / "f0.json").write_text(json.dumps({"fingerprint": "f0", "recorded_at": 0.5}))
    (tmp_path / "releases" / "f0.qualify.json").write_text(json.dumps({"format": "a run, not a release"}))
    result = run_main(tmp_path / "current.json", capsys, releases=True, health=False)
    assert result["releases"] == [{"fingerprint": "f0", "recorded_at": 0.5}, record(port)]
    assert result["previous"] == {"fingerprint": "f0"}
    assert result["recorded"] == record(port)
    assert result["serves"] is False and result["health"] == "" and handler.asked == []


def test_without_releases_nothing_of_the_folder_is_read(tmp_path: Path, api: tuple[int, type[Health]],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "previous.json").write_text("{not json")
    result = run_main(tmp_path / "current.json", capsys)
    assert result["releases"] == [] and result["previous"] == {}


def test_a_folder_without_records_or_previous_reads_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(tmp_path / "current.json", capsys, releases=True)
    assert result == {**result, "recorded": {}, "releases": [], "previous": {}}


@pytest.mark.parametrize(("name", "text", "message"), [
    ("releases/f1.json", "{not json", "cannot read"),
    ("releases/f1.json", "[1, 2]", "a release record is a JSON object, not list"),
    ("previous.json", "{not json", "cannot read"),
])
def test_a_record_of_the_folder_that_is_no_json_object_fails_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, message: str) -> None:
    (tmp_path / "releases").mkdir()
    (tmp_path / name).write_text(text)
    result = run_main(tmp_path / "current.json", capsys, releases=True)
    assert result["failed"] is True and message in result["msg"] and str(tmp_path / name) in result["msg"]
