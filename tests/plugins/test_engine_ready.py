"""Tests for the engine_ready module against small scripted HTTP engines on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import engine_ready as er

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

Reply = tuple[int, Any]
ONE_CHOICE = {"object": "text_completion", "choices": [{"index": 0, "text": " 4", "finish_reason": "length"}]}
DEAD_BODY = "EngineDeadError: rank 1 died"


def model_list(*ids: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": i, "object": "model", "owned_by": "vllm"} for i in ids]}


class FakeEngine:
    """What each endpoint answers now; a test changes it, or lets step() change it per request."""

    def __init__(self) -> None:
        self.health: Reply = (200, "")
        self.models: Reply = (200, model_list("tiny"))
        self.completion: Reply = (200, ONE_CHOICE)
        self.step: Callable[[FakeEngine, str], None] | None = None
        self.hang = threading.Event()
        self.hang_s = 0.0
        self.seen: list[dict[str, Any]] = []
        self.count: dict[str, int] = {}

    def answer(self, method: str, path: str, body: Any, auth: str | None) -> Reply:
        self.seen.append({"method": method, "path": path, "body": body, "auth": auth})
        self.count[path] = self.count.get(path, 0) + 1
        if self.step is not None:
            self.step(self, path)
        if self.hang_s:
            self.hang.wait(self.hang_s)
        return {"/health": self.health, "/v1/models": self.models, "/v1/completions": self.completion}.get(
            path, (404, {"detail": "Not Found"}))


class Handler(BaseHTTPRequestHandler):
    def _respond(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        status, payload = self.server.engine.answer(  # type: ignore[attr-defined]
            self.command, self.path, body, self.headers.get("Authorization"))
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up (a request timeout under test)

    do_GET = _respond  # noqa: N815 (http.server's handler name)
    do_POST = _respond  # noqa: N815 (http.server's handler name)

    def log_message(self, fmt: str, *args: Any) -> None:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def serve() -> Iterator[Callable[..., str]]:
    """Start a FakeEngine on 127.0.0.1 (on a given port, or a free one); return its base URL."""
    started: list[tuple[ThreadingHTTPServer, FakeEngine]] = []

    def start(engine: FakeEngine, port: int = 0) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        server.engine = engine  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append((server, engine))
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server, engine in started:
        engine.hang.set()
        server.shutdown()
        server.server_close()


def params(url: str, **changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"url": url, "served_name": "tiny", "prompt": "2+2=", "api_key": None,
                            "wait_s": 30.0, "poll_s": 0.1, "request_timeout_s": 10.0,
                            "dead_if_health_body_matches": "dead|EngineDeadError", "health_path": "/health",
                            "models_path": "/v1/models", "completions_path": "/v1/completions",
                            "containers": [], "watch_every_s": 10.0, "lost_after_checks": 3}
    args.update(changes)
    return args


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        er.main()
    return json.loads(capsys.readouterr().out)


class FakeClock:
    """A clock for wait_ready that moves only when it sleeps (or when a test moves it)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def after(n: int, path: str, change: Callable[[FakeEngine], None]) -> Callable[[FakeEngine, str], None]:
    """A step that applies change once path has been asked n times."""
    def step(engine: FakeEngine, asked: str) -> None:
        if asked == path and engine.count[path] > n:
            change(engine)
    return step


def test_a_ready_engine_is_ready_at_once(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    url = serve(engine)
    clock = FakeClock()
    result = er.wait_ready(params(url, api_key="s3cret"), clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [] and result["elapsed_s"] == 0  # at once: the first poll, no wait
    assert result["ready"] is True and result["stage"] == "ready"
    assert result["models"] == ["tiny"]
    assert result["detail"] == "POST /v1/completions: 200, 1 choice ' 4'"
    assert [(r["method"], r["path"]) for r in engine.seen] == [
        ("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")]
    assert engine.seen[2]["body"] == {"model": "tiny", "prompt": "2+2=", "max_tokens": 1, "temperature": 0}
    assert {r["auth"] for r in engine.seen} == {"Bearer s3cret"}


def test_connection_refused_is_not_up_yet(serve: Callable[..., str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = er.wait_ready(params(url, wait_s=0.3))
    assert result["ready"] is False and result["stage"] == "health"
    assert result["detail"] == "GET /health: connection refused (not listening yet)"
    assert result["models"] == []


def test_an_engine_that_starts_listening_later_becomes_ready(serve: Callable[..., str]) -> None:
    port = free_port()
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 5:
            serve(FakeEngine(), port)  # listening from the sixth poll on

    result = er.wait_ready(params(f"http://127.0.0.1:{port}", wait_s=5), clock=clock, sleep=sleep)
    # Refused five times, polled again every poll_s, and ready at the first poll after it listens.
    assert result["ready"] is True and clock.sleeps == [0.1] * 5
    assert result["elapsed_s"] == pytest.approx(0.5)


def test_503_while_loading_then_200(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    engine.models = (503, "loading")

    def loaded(e: FakeEngine) -> None:
        e.health, e.models = (200, ""), (200, model_list("tiny"))

    engine.step = after(3, "/health", loaded)
    url = serve(engine)
    first = er.poll_once(params(url), lambda: 2.0)
    assert first.stage == "health" and first.detail == "GET /health: 503 Service Unavailable: loading"
    result = er.wait_ready(params(url))
    assert result["ready"] is True
    assert engine.count["/health"] == 4


def test_models_without_the_name_then_with_it(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.models = (200, model_list("other"))
    url = serve(engine)
    result = er.wait_ready(params(url, wait_s=0.25))
    assert result["ready"] is False and result["stage"] == "models"
    assert result["models"] == ["other"]
    assert result["detail"] == "GET /v1/models: 200, lists ['other'], not 'tiny'"
    assert "/v1/completions" not in engine.count

    def served(e: FakeEngine) -> None:
        e.models = (200, model_list("other", "tiny"))

    engine.count.clear()
    engine.step = after(2, "/v1/models", served)
    result = er.wait_ready(params(url))
    assert result["ready"] is True and result["models"] == ["other", "tiny"]


def test_a_models_answer_that_is_not_a_list(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.models = (200, "<html>proxy</html>")
    result = er.wait_ready(params(serve(engine), wait_s=0))
    assert result["stage"] == "models" and "not an OpenAI model list: <html>proxy</html>" in result["detail"]


def test_a_refused_completion_is_not_ready(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.completion = (400, {"object": "error", "message": "prompt is too long"})
    url = serve(engine)
    result = er.wait_ready(params(url, wait_s=0.25))
    assert result["ready"] is False and result["stage"] == "completion"
    assert result["detail"].startswith("POST /v1/completions: 400 Bad Request:")
    assert "prompt is too long" in result["detail"]

    engine.completion = (200, {"choices": []})
    result = er.wait_ready(params(url, wait_s=0))
    assert result["stage"] == "completion"
    assert result["detail"].startswith("POST /v1/completions: 200 with 0 choices, want 1")


def test_a_completion_5xx_after_health_200_is_a_dead_engine(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.completion = (500, {"object": "error", "message": "EngineCore encountered an issue"})

    def dies(e: FakeEngine) -> None:
        e.health = (503, "")

    engine.step = after(1, "/health", dies)
    with pytest.raises(er.EngineDeadError) as dead:
        er.wait_ready(params(serve(engine)))
    assert "then the one-token completion answered 500" in dead.value.msg
    assert "EngineCore encountered an issue" in dead.value.msg
    assert "GET /health now answers: 503 Service Unavailable" in dead.value.msg
    assert dead.value.result["stage"] == "completion"


def test_a_dead_engine_behind_a_live_models_fails_fast(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, DEAD_BODY)
    url = serve(engine)
    clock = FakeClock()
    with pytest.raises(er.EngineDeadError) as dead:
        er.wait_ready(params(url, wait_s=20), clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [] and engine.count["/health"] == 1  # fast: at the first poll, no wait
    msg = dead.value.msg
    assert msg.startswith(f"engine at {url} is dead behind a live /v1/models: ")
    assert f"GET /health answers 503 with body '{DEAD_BODY}'" in msg
    assert "while GET /v1/models still answers 200 (vllm#53157" in msg
    assert "tear every rank down and relaunch" in msg
    assert dead.value.result["stage"] == "health" and dead.value.result["models"] == ["tiny"]


def test_health_turning_503_after_200_with_models_live_is_dead(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.models = (200, model_list("other"))  # not ready yet: the name is missing

    def dies(e: FakeEngine) -> None:
        e.health = (503, "Service Unavailable")

    engine.step = after(2, "/health", dies)
    with pytest.raises(er.EngineDeadError) as dead:
        er.wait_ready(params(serve(engine), dead_if_health_body_matches=""))
    assert ("GET /health answered 200 earlier, now GET /health answers 503 with body 'Service Unavailable'"
            in dead.value.msg)
    assert "vllm#53157" in dead.value.msg


def test_one_503_with_models_live_and_nothing_before_is_not_yet_dead(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "warming up")
    result = er.wait_ready(params(serve(engine), wait_s=0))
    assert result["ready"] is False and result["stage"] == "health" and result["models"] == ["tiny"]


def test_wait_is_bounded_when_the_engine_never_gets_ready(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    engine.models = (503, "loading")
    url = serve(engine)
    clock = FakeClock()
    result = er.wait_ready(params(url, wait_s=1.5, poll_s=0.4), clock=clock, sleep=clock.sleep)
    # Polls at 0, 0.4, 0.8, 1.2 and, the last sleep cut to the deadline, 1.5 s; then it gives up.
    assert clock.sleeps == pytest.approx([0.4, 0.4, 0.4, 0.3])
    assert result["ready"] is False and result["stage"] == "health"
    assert result["elapsed_s"] == 1.5
    assert engine.count["/health"] == 5

    started = time.monotonic()  # and on the real clock: not before the deadline
    result = er.wait_ready(params(url, wait_s=1.5, poll_s=0.4))
    assert time.monotonic() - started >= 1.5
    assert result["ready"] is False and result["stage"] == "health"


def test_a_hanging_engine_is_cut_at_the_deadline(serve: Callable[..., str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine()
    engine.hang_s = 60
    url = serve(engine)
    clock = FakeClock()
    timeouts: list[float] = []
    real_request = er.request

    def timed_request(base: str, method: str, path: str, timeout: float, *args: Any) -> er.Answer:
        timeouts.append(timeout)
        answer = real_request(base, method, path, timeout, *args)  # really waits out the timeout
        clock.now += timeout  # the clock wait_ready reads moves by as much
        return answer

    monkeypatch.setattr(er, "request", timed_request)
    result = er.wait_ready(params(url, wait_s=1.2, request_timeout_s=10), clock=clock, sleep=clock.sleep)
    # One request, given the 1.2 s left rather than its 10 s, then the call ends at the deadline.
    assert timeouts == [pytest.approx(1.2)] and clock.sleeps == [] and result["elapsed_s"] == 1.2
    assert result["stage"] == "health" and result["detail"].startswith("GET /health: no answer in 1.2 s")


def test_main_reports_ready_in_check_mode(serve: Callable[..., str], capsys: pytest.CaptureFixture[str]) -> None:
    args = params(serve(FakeEngine()), api_key="s3cret", _ansible_check_mode=True)
    result = run_main(args, capsys)
    assert not result.get("failed") and result["changed"] is False
    assert result["ready"] is True and result["stage"] == "ready" and result["models"] == ["tiny"]
    assert "s3cret" not in json.dumps(result)


def test_main_reports_not_ready_without_failing(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(params(f"http://127.0.0.1:{free_port()}", wait_s=0), capsys)
    assert not result.get("failed") and result["changed"] is False
    assert result["ready"] is False and result["stage"] == "health"


def test_main_fails_on_a_dead_engine(serve: Callable[..., str], capsys: pytest.CaptureFixture[str]) -> None:
    engine = FakeEngine()
    engine.health = (503, DEAD_BODY)
    result = run_main(params(serve(engine)), capsys)
    assert result["failed"] is True and result["changed"] is False
    assert "dead behind a live /v1/models" in result["msg"] and DEAD_BODY in result["msg"]
    assert result["ready"] is False and result["stage"] == "health"


def test_main_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(params("127.0.0.1:8000"), capsys)
    assert result["failed"] is True and "is not an http(s) base URL" in result["msg"]
    result = run_main(params("http://127.0.0.1:8000", dead_if_health_body_matches="("), capsys)
    assert result["failed"] is True and "not a regular expression" in result["msg"]
    result = run_main(params("http://127.0.0.1:8000", load_progress_pattern=r"(?P<done>\d+) shards"), capsys)
    assert result["failed"] is True and "no named groups done and total" in result["msg"]


class FakeDocker:
    """What docker inspect answers per container name, here and on peers; records every command."""

    def __init__(self, states: dict[str, Any]) -> None:
        self.states = states
        self.commands: list[list[str]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        self.commands.append(argv)
        name = argv[-1].split()[-1]
        state = self.states.get(name)
        if isinstance(state, str):
            return 255, state
        if state is None:
            return 1, f"Error: No such container: {name}"
        return 0, json.dumps(state)


def test_a_stopped_worker_ends_the_wait_with_who_and_how(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    docker = FakeDocker({"d-rank0": {"Running": True, "ExitCode": 0}, "d-rank1": {"Running": False, "ExitCode": 137}})
    containers = [{"name": "d-rank0", "host": "", "rank": 0}, {"name": "d-rank1", "host": "spark-2", "rank": 1}]
    pauses: list[float] = []
    result = er.wait_ready(params(serve(engine), containers=containers), run=docker, sleep=pauses.append)
    assert result["stage"] == "rank_stopped" and not result["ready"]
    assert result["stopped"] == [{"rank": 1, "host": "spark-2", "name": "d-rank1", "state": "exited", "exit_code": 137}]
    assert docker.commands[0][:2] == ["docker", "inspect"]
    assert docker.commands[1][0] == "ssh" and "spark-2" in docker.commands[1]
    assert docker.commands[2:] == [docker.commands[0]] * er.STOP_SETTLE_CHECKS, \
        "the head, still running, is checked again before the worker alone is told"
    assert pauses == [er.RECHECK_PAUSE_S] * er.STOP_SETTLE_CHECKS
    assert engine.count == {}, "no HTTP probe once a rank is known stopped"


def test_a_head_whose_exit_docker_records_after_its_workers_is_told_first(serve: Callable[..., str]) -> None:
    # The head's memory cap ends it; its worker, losing the head, exits with code 1, and docker
    # records the worker's exit at the first check and the head's only at the next.
    docker = FakeDocker({"d-rank0": {"Running": True, "ExitCode": 0},
                         "d-rank1": {"Running": False, "OOMKilled": False, "ExitCode": 1}})

    def pause(_: float) -> None:
        docker.states["d-rank0"] = {"Running": False, "OOMKilled": True, "ExitCode": 137}
    containers = [{"name": "d-rank0", "host": "", "rank": 0, "memory_limit": "256m"},
                  {"name": "d-rank1", "host": "spark-2", "rank": 1, "memory_limit": "256m"}]
    result = er.wait_ready(params(serve(FakeEngine()), containers=containers), run=docker, sleep=pause)
    head, worker = result["stopped"]
    assert head["name"] == "d-rank0" and head["oom_killed"] is True
    assert worker == {"rank": 1, "host": "spark-2", "name": "d-rank1", "state": "exited", "exit_code": 1}
    assert result["detail"] == (f"stopped before ready: rank 0 on this node (container d-rank0) {head['reason']}; "
                                "rank 1 (d-rank1) exited")
    assert len(docker.commands) == 3, "checks stop once every rank is found stopped"


MEMORY_HINT = "lower the engine's memory use (kv cache, max-model-len)"


def test_a_rank_killed_by_its_memory_cap_is_told_by_name(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    docker = FakeDocker({"d-rank0": {"Running": True, "ExitCode": 0},
                         "d-rank1": {"Status": "exited", "Running": False, "OOMKilled": True, "ExitCode": 137}})
    containers = [{"name": "d-rank0", "host": "", "rank": 0, "memory_limit": "110g"},
                  {"name": "d-rank1", "host": "spark-2", "rank": 1, "memory_limit": "110g"}]
    result = er.wait_ready(params(serve(engine), containers=containers), run=docker)
    assert result["stage"] == "rank_stopped" and not result["ready"]
    reason = f"was killed by its memory cap (110g) during the load: {MEMORY_HINT} or raise launch.memory_limit"
    assert result["stopped"] == [{"rank": 1, "host": "spark-2", "name": "d-rank1", "state": "exited", "exit_code": 137,
                                  "oom_killed": True, "memory_limit": "110g", "reason": reason}]
    assert result["detail"] == f"stopped before ready: rank 1 on spark-2 (container d-rank1) {reason}"
    assert engine.count == {}, "no HTTP probe once a rank is known stopped"


def test_a_rank_the_oom_killer_ended_without_a_cap_is_told_so(serve: Callable[..., str]) -> None:
    docker = FakeDocker({"d-rank0": {"Running": False, "OOMKilled": True, "ExitCode": 137},
                         "d-rank1": {"Running": False, "OOMKilled": False, "ExitCode": 1}})
    containers = [{"name": "d-rank0", "host": "", "rank": 0, "memory_limit": ""},
                  {"name": "d-rank1", "host": "spark-2", "rank": 1, "memory_limit": None}]
    result = er.wait_ready(params(serve(FakeEngine()), containers=containers), run=docker)
    oom, plain = result["stopped"]
    assert oom["oom_killed"] is True and oom["memory_limit"] == ""
    assert oom["reason"] == (f"was killed by the kernel's out-of-memory killer during the load: {MEMORY_HINT} "
                             "or free the node's memory")
    assert "memory cap" not in oom["reason"]
    assert plain == {"rank": 1, "host": "spark-2", "name": "d-rank1", "state": "exited", "exit_code": 1}, \
        "a plain exit is told as before, its memory cap or not"
    assert result["detail"] == (f"stopped before ready: rank 0 on this node (container d-rank0) {oom['reason']}; "
                                "rank 1 (d-rank1) exited")


def test_a_plain_exit_with_a_memory_cap_is_told_as_before(serve: Callable[..., str]) -> None:
    docker = FakeDocker({"d-rank1": {"Running": False, "OOMKilled": False, "ExitCode": 137}})
    containers = [{"name": "d-rank1", "host": "spark-2", "rank": 1, "memory_limit": "110g"}]
    result = er.wait_ready(params(serve(FakeEngine()), containers=containers), run=docker)
    assert result["stopped"] == [{"rank": 1, "host": "spark-2", "name": "d-rank1", "state": "exited", "exit_code": 137}]
    assert result["detail"] == "stopped before ready: rank 1 (d-rank1) exited"


def test_main_takes_each_containers_memory_limit(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    docker = FakeDocker({"d-rank1": {"Running": False, "OOMKilled": True, "ExitCode": 137}})

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        status, output = docker(argv)
        return subprocess.CompletedProcess(argv, status, output, "")
    monkeypatch.setattr(er.subprocess, "run", run)
    args = params("http://127.0.0.1:9", containers=[{"name": "d-rank1", "host": "spark-2", "rank": 1,
                                                     "memory_limit": "110g"}, {"name": "d-rank0"}])
    result = run_main(args, capsys)
    assert "failed" not in result and result["stage"] == "rank_stopped"
    assert result["stopped"][0]["memory_limit"] == "110g" and "memory cap (110g)" in result["detail"]


def test_a_gone_container_is_stopped_and_an_unreachable_peer_is_not(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    docker = FakeDocker({"d-rank0": {"Running": True}, "d-rank1": "ssh: connect to host spark-2: No route"})
    containers = [{"name": "d-rank0", "host": "", "rank": 0}, {"name": "d-rank1", "host": "spark-2", "rank": 1}]
    result = er.wait_ready(params(serve(engine), containers=containers, lost_after_checks=0), run=docker)
    assert result["ready"] and result["watch_errors"] == ["spark-2: ssh: connect to host spark-2: No route"]
    gone = er.wait_ready(params(serve(engine), containers=[{"name": "d-rank2", "host": "", "rank": 2}]),
                         run=FakeDocker({}))
    assert gone["stage"] == "rank_stopped" and gone["stopped"][0]["state"] == "gone"


def test_containers_are_checked_again_every_watch_interval(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    engine.models = (503, "loading")
    clock = FakeClock()
    docker = FakeDocker({"d-rank1": {"Running": True}})

    def stop_later(argv: list[str]) -> tuple[int, str]:
        if len(docker.commands) == 2:
            docker.states["d-rank1"] = {"Running": False, "ExitCode": 1}
        return docker(argv)
    result = er.wait_ready(params(serve(engine), containers=[{"name": "d-rank1", "host": "", "rank": 1}],
                                  watch_every_s=5.0, wait_s=60.0),
                           clock=clock, sleep=clock.sleep, run=stop_later)
    assert result["stage"] == "rank_stopped"
    assert len(docker.commands) == 3, "checked at the start, after 5 s and after 10 s"
    assert 10.0 <= result["elapsed_s"] < 10.5


def test_a_peer_whose_ssh_fails_three_checks_in_a_row_is_lost(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    engine.models = (503, "loading")
    clock = FakeClock()
    docker = FakeDocker({"d-rank0": {"Running": True}, "d-rank1": "ssh: connect to host spark-2: No route to host"})
    containers = [{"name": "d-rank0", "host": "", "rank": 0}, {"name": "d-rank1", "host": "spark-2", "rank": 1}]
    result = er.wait_ready(params(serve(engine), containers=containers, watch_every_s=5.0, wait_s=60.0),
                           clock=clock, sleep=clock.sleep, run=docker)
    assert result["stage"] == "node_lost" and not result["ready"]
    assert result["lost"] == [{"rank": 1, "host": "spark-2", "name": "d-rank1",
                               "error": "ssh: connect to host spark-2: No route to host"}]
    assert "spark-2 (rank 1)" in result["detail"]
    assert [c[-1].split()[-1] for c in docker.commands] == ["d-rank0", "d-rank1", "d-rank1", "d-rank1"], \
        "the first check of both, then the lost peer alone twice more"
    assert clock.sleeps == [1.0, 1.0] and engine.count == {}, "lost at the first watch, before any HTTP probe"


def test_a_lost_node_comes_before_a_rank_it_took_down(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    clock = FakeClock()
    docker = FakeDocker({"d-rank0": {"Running": False, "ExitCode": 1},
                         "d-rank1": "ssh: connect to host spark-2: timed out"})
    containers = [{"name": "d-rank0", "host": "", "rank": 0}, {"name": "d-rank1", "host": "spark-2", "rank": 1}]
    result = er.wait_ready(params(serve(engine), containers=containers), clock=clock, sleep=clock.sleep, run=docker)
    assert result["stage"] == "node_lost"
    assert result["stopped"][0]["name"] == "d-rank0" and result["lost"][0]["host"] == "spark-2"


def test_a_peer_that_answers_again_is_not_lost(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    engine.models = (503, "loading")
    clock = FakeClock()
    docker = FakeDocker({})
    # Each watch: two failed checks, then an answer: never three in a row.
    answers = ["fail", "fail", "answer"]

    def answer_at_the_third_check(argv: list[str]) -> tuple[int, str]:
        answer = answers[len(docker.commands) % len(answers)]
        timed_out = "ssh: connect to host spark-2: timed out"
        docker.states["d-rank1"] = {"Running": True} if answer == "answer" else timed_out
        return docker(argv)
    result = er.wait_ready(params(serve(engine), containers=[{"name": "d-rank1", "host": "spark-2", "rank": 1}],
                                  watch_every_s=5.0, wait_s=12.0),
                           clock=clock, sleep=clock.sleep, run=answer_at_the_third_check)
    assert len(docker.commands) >= 6, "at least two watches of three checks each"
    assert result["stage"] == "health" and result["lost"] == [], "failures not in a row never make a node lost"


def test_no_peer_is_ever_lost_with_zero_checks(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    engine.models = (503, "loading")
    clock = FakeClock()
    docker = FakeDocker({"d-rank1": "ssh: connect to host spark-2: No route to host"})
    result = er.wait_ready(params(serve(engine), containers=[{"name": "d-rank1", "host": "spark-2", "rank": 1}],
                                  watch_every_s=5.0, wait_s=12.0, lost_after_checks=0),
                           clock=clock, sleep=clock.sleep, run=docker)
    assert result["stage"] == "health" and result["lost"] == []
    assert result["watch_errors"] == ["spark-2: ssh: connect to host spark-2: No route to host"]


def test_a_remote_command_failure_is_not_a_lost_node(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    engine.models = (503, "loading")
    clock = FakeClock()

    def docker_down(argv: list[str]) -> tuple[int, str]:
        return 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
    result = er.wait_ready(params(serve(engine), containers=[{"name": "d-rank1", "host": "spark-2", "rank": 1}],
                                  watch_every_s=5.0, wait_s=20.0),
                           clock=clock, sleep=clock.sleep, run=docker_down)
    assert result["stage"] == "health" and result["lost"] == []
    assert result["watch_errors"] == ["spark-2: Cannot connect to the Docker daemon at unix:///var/run/docker.sock"]


def test_the_paths_come_from_the_caller(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    result = er.wait_ready(params(serve(engine), health_path="/healthz", wait_s=0.0))
    assert result["stage"] == "health" and "GET /healthz: 404" in result["detail"]
    with pytest.raises(ValueError, match="health_path 'healthz' is not a path"):
        er.wait_ready(params(serve(engine), health_path="healthz"))


VLLM_LOAD = r"Loading safetensors checkpoint shards:\s+\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)"


class FakeDockerWithLogs(FakeDocker):
    """FakeDocker that also answers docker logs, with each container's log text (progress bars redraw with \\r)."""

    def __init__(self, states: dict[str, Any], logs: dict[str, str]) -> None:
        super().__init__(states)
        self.logs = logs

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        if "logs" in argv or any(" logs " in word for word in argv):
            self.commands.append(argv)
            name = argv[-1].split()[-1]
            return (0, self.logs[name]) if name in self.logs else (1, f"Error: No such container: {name}")
        return super().__call__(argv)


def test_each_rank_reports_its_weight_loading_from_its_own_log(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    running = {"Running": True, "ExitCode": 0}
    docker = FakeDockerWithLogs(
        {"d-rank0": running, "d-rank1": running},
        {"d-rank0": "INFO start\nLoading safetensors checkpoint shards:  25% Completed | 1/4 [00:01<00:03]\r"
                    "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:02<00:02]\n",
         "d-rank1": "INFO waiting for the head\n"})
    containers = [{"name": "d-rank0", "host": "", "rank": 0}, {"name": "d-rank1", "host": "spark-2", "rank": 1}]
    result = er.wait_ready(params(serve(engine), containers=containers, wait_s=0, load_progress_pattern=VLLM_LOAD),
                           run=docker)
    assert result["sparkserve_progress"] == [
        {"kind": "load", "label": "rank 0", "rank": 0, "done": 2, "total": 4, "unit": "shards"}]
    assert result["sparkserve_probe"]["state"] == "health"
    peer_logs = docker.commands[-1]
    assert peer_logs[:3] == ["ssh", "-o", "BatchMode=yes"] and peer_logs[-1] == "docker logs --tail 40 d-rank1"


def test_no_log_is_read_without_a_progress_pattern(serve: Callable[..., str]) -> None:
    docker = FakeDockerWithLogs({"d-rank0": {"Running": True}}, {})
    result = er.wait_ready(params(serve(FakeEngine()), containers=[{"name": "d-rank0", "host": "", "rank": 0}]),
                           run=docker)
    assert result["ready"] and result["sparkserve_progress"] == []
    assert all("logs" not in argv for argv in docker.commands)


def test_a_peer_ssh_did_not_reach_is_not_asked_for_its_log(serve: Callable[..., str]) -> None:
    engine = FakeEngine()
    engine.health = (503, "loading")
    docker = FakeDockerWithLogs({"d-rank0": {"Running": True}, "d-rank1": "ssh: connect to host spark-2: timed out"},
                                {"d-rank0": "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01]\n"})
    containers = [{"name": "d-rank0", "host": "", "rank": 0}, {"name": "d-rank1", "host": "spark-2", "rank": 1}]
    result = er.wait_ready(params(serve(engine), containers=containers, wait_s=0, lost_after_checks=0,
                                  load_progress_pattern=VLLM_LOAD), run=docker)
    assert [p["rank"] for p in result["sparkserve_progress"]] == [0]
    assert not [argv for argv in docker.commands if "spark-2" in argv and "logs" in argv[-1]]
