"""Tests for the supervisor (roles/supervisor/files/sparkserve-supervisor.py, and its modules in the node
library: plugins/module_utils/node/supervisor).

Fake nodes answer the supervisor's commands (docker on the head, docker and cat over ssh on the others) from
their containers' state, a fake engine answers its readiness probe, and a fake clock stands for time: nothing
sleeps, nothing reaches the network, and every time asserted is the fake clock's.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.error
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.message import Message
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import pytest
from sparkserve_node import api
from sparkserve_node import supervisor as sv

from ansible_collections.sparkserve.deploy.plugins.modules import deployment_lock
from tests.roles import exposition, node_layout

# The entry point; the program is the node library's supervisor package (sv), as the tests import it.
PROGRAM = "roles/supervisor/files/sparkserve-supervisor.py"


def installed(tmp_path: Path) -> str:
    """The supervisor as a node has it, with the node library in a folder of its own (run it with
    env=node_layout.env(tmp_path / "node")); its path."""
    return str(node_layout.install(tmp_path / "node", PROGRAM))


GIB = 1024**3
START = 1_800_000_000.0
DEPLOYMENT = "lab-tp2"
SERVED = "tiny-model"
PROMPT = "The capital of France is"
SSH = ["ssh", "-i", "/root/.ssh/id_ed25519_sparkserve", "-o", "UserKnownHostsFile=/root/.ssh/known_hosts",
       "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-l", "root"]
HANG = "completions time out while /health answers (hang)"
LAUNCH = "controller-a pid 1234 at 2027-01-15T07:59:00Z"
HEALER = "sparkserve-supervisor on spark-1 (healing)"
WATCHDOG = ("[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 "
            "milliseconds before timing out." + " padding" * 20)


def docker_time(epoch: float) -> str:
    """Docker's StartedAt: RFC 3339 with nanoseconds."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + ".123456789Z"


def meminfo_text(available: int) -> str:
    return (f"MemTotal:       {128 * GIB // 1024} kB\n"
            f"MemFree:        {available // 2048} kB\n"
            f"MemAvailable:   {available // 1024} kB\n")


# --- fakes ------------------------------------------------------------------------


class FakeClock:
    """Epoch seconds that move only when the supervisor sleeps (or a fake command takes time)."""

    def __init__(self) -> None:
        self.now = START
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class Container:
    name: str
    running: bool = True
    exit_code: int = 0
    oom: bool = False
    started_at: float = START - 600
    logs: list[tuple[float, str]] = field(default_factory=list)

    def kill(self, code: int = 137, oom: bool = False) -> None:
        self.running, self.exit_code, self.oom = False, code, oom


@dataclass
class Node:
    name: str
    address: str
    containers: dict[str, Container] = field(default_factory=dict)
    # MemAvailable at each read over ssh; the last one stays.
    memory: list[int] = field(default_factory=lambda: [100 * GIB])
    reachable: bool = True
    stop_s: float = 0.0  # fake seconds a docker stop takes

    def read_memory(self) -> int:
        return self.memory.pop(0) if len(self.memory) > 1 else self.memory[0]


@dataclass(frozen=True)
class Call:
    time: float
    node: str
    argv: list[str]


class Cluster:
    """The nodes, as the supervisor's runner reaches them: the head directly, the others with SSH + [address,
    "--", command]. Every command is checked for that form and recorded; hooks see each before it runs."""

    def __init__(self, clock: FakeClock, count: int) -> None:
        self.clock = clock
        names = [f"spark-{i + 1}" for i in range(count)]
        self.head = names[0]
        self.nodes = {name: Node(name, f"10.77.1.{11 + i}") for i, name in enumerate(names)}
        for rank, node in enumerate(self.nodes.values()):
            name = f"{DEPLOYMENT}-rank{rank}"
            node.containers[name] = Container(name, logs=[
                (START - 700, "EngineDeadError: from the run before this start"),
                (START - 590, f"rank {rank}: loading the weights"),
                (START - 500, f"rank {rank}: ready"),
            ])
        self.calls: list[Call] = []
        self.raw: list[list[str]] = []
        self.hooks: list[Callable[[Call], None]] = []
        self.started: list[Callable[[], None]] = []

    def container(self, rank: int) -> Container:
        name = f"{DEPLOYMENT}-rank{rank}"
        return next(node.containers[name] for node in self.nodes.values() if name in node.containers)

    def running(self) -> list[bool]:
        return [self.container(rank).running for rank in range(len(self.nodes))]

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        argv = list(argv)
        self.raw.append(argv)
        assert timeout_s > 0
        node = self.nodes[self.head]
        if argv[0] == "ssh":
            assert argv[:len(SSH)] == SSH
            address, dash, command = argv[len(SSH):]
            assert dash == "--"
            [node] = [n for n in self.nodes.values() if n.address == address]
            assert node.name != self.head, "the head runs its own commands without ssh"
            if not node.reachable:
                return 255, "", f"ssh: connect to host {address} port 22: No route to host\n"
            argv = shlex.split(command)
        call = Call(self.clock(), node.name, argv)
        self.calls.append(call)
        for hook in self.hooks:
            hook(call)
        if argv[0] == "cat":
            assert node.name != self.head, "the head's meminfo is read as a file"
            return 0, meminfo_text(node.read_memory()), ""
        if argv[0] == "systemctl":
            assert argv[1] in ("start", "stop") and len(argv) == 3, argv
            return 0, "", ""
        assert argv[0] == "docker", argv
        return self.docker(node, argv[1:])

    def docker(self, node: Node, args: list[str]) -> tuple[int, str, str]:
        name = args[-1]
        container = node.containers.get(name)
        if container is None:
            return 1, "", f"Error: No such container: {name}\n"
        verb = args[0]
        if verb == "inspect":
            assert args == ["inspect", "--type", "container", "--format", "{{json .State}}", name]
            state = {"Status": "running" if container.running else "exited", "Running": container.running,
                     "OOMKilled": container.oom, "ExitCode": container.exit_code,
                     "StartedAt": docker_time(container.started_at)}
            return 0, json.dumps(state) + "\n", ""
        if verb == "logs":  # engines log on stderr
            if args[1] == "--since":
                lines = [line for when, line in container.logs if when >= int(args[2])]
            else:
                assert args[1] == "--tail"
                lines = [line for _, line in container.logs][-int(args[2]):]
            return 0, "", "".join(line + "\n" for line in lines)
        if verb == "stop":
            assert args[1] == "-t"
            self.clock.now += node.stop_s
            if container.running:
                container.running, container.exit_code, container.oom = False, 0, False
            return 0, f"{name}\n", ""
        if verb == "start":
            container.running, container.exit_code, container.oom = True, 0, False
            container.started_at = self.clock()
            for hook in self.started:
                hook()
            return 0, f"{name}\n", ""
        raise AssertionError(f"unexpected docker {args}")


class Engine:
    """The API on the head. healthy answers all three; dead answers 503 on /health with the engine's words (and
    200 on /v1/models, vllm#53157); hung answers /health and /v1/models but the completion times out. After
    every rank is started again it becomes after_restart, load_s fake seconds later (refusing until then)."""

    def __init__(self, cluster: Cluster, clock: FakeClock) -> None:
        self.cluster = cluster
        self.clock = clock
        self.mode = "healthy"
        self.after_restart = "healthy"
        self.load_s = 0.0
        self.ready_at = 0.0
        self.requests: list[tuple[str, str, Any, float]] = []
        cluster.started.append(self.on_start)

    def on_start(self) -> None:
        if all(self.cluster.running()):
            self.mode, self.ready_at = self.after_restart, self.clock() + self.load_s

    def __call__(self, method: str, url: str, body: str | None, timeout: float) -> tuple[int, str]:
        assert url.startswith("http://127.0.0.1:8000/")
        path = urlsplit(url).path
        self.requests.append((method, path, json.loads(body) if body is not None else None, timeout))
        if not self.cluster.container(0).running or self.clock() < self.ready_at:
            raise ConnectionRefusedError(111, "Connection refused")
        if (method, path) == ("GET", "/health"):
            if self.mode == "dead":
                return 503, '{"detail": "EngineDeadError: EngineCore encountered an issue"}'
            return 200, ""
        if (method, path) == ("GET", "/v1/models"):
            return 200, json.dumps({"object": "list", "data": [{"id": SERVED, "object": "model"}]})
        assert (method, path) == ("POST", "/v1/completions")
        if self.mode == "hung":
            raise TimeoutError("timed out")
        return 200, json.dumps({"choices": [{"index": 0, "text": " Paris"}]})


# --- the lab: config, render, supervisor --------------------------------------------


def config_data(tmp_path: Path, nodes: int = 2) -> dict[str, Any]:
    names = [f"spark-{i + 1}" for i in range(nodes)]
    return {
        "deployment": DEPLOYMENT,
        "render_path": str(tmp_path / "deployments" / DEPLOYMENT / "current.json"),
        "head": "spark-1",
        "nodes": {name: {"address": f"10.77.1.{11 + i}"} for i, name in enumerate(names)},
        "rank_hosts": {str(i): name for i, name in enumerate(names)},
        "ssh_argv": SSH,
        "meminfo_path": str(tmp_path / "meminfo"),
        "lock_dir": str(tmp_path / "locks"),
        "state_dir": str(tmp_path / "state"),
        "api_base": "http://127.0.0.1:8000",
        "wildcard_hosts": ["0.0.0.0", "::"],
    }


def render_data(nodes: int = 2, fingerprint: str = "fp-1", order: str = "workers_first",
                head_delay_s: float = 0, **supervise: Any) -> dict[str, Any]:
    return {
        "deployment": DEPLOYMENT,
        "fingerprint": fingerprint,
        "ranks": {str(rank): {"rank": rank, "container_name": f"{DEPLOYMENT}-rank{rank}", "argv": ["vllm", "serve"]}
                  for rank in range(nodes)},
        "adapter": {
            "endpoints": {"health": "/health", "models": "/v1/models", "completions": "/v1/completions"},
            "dead_health_pattern": "dead|EngineDeadError",
            "fatal_log_patterns": ["EngineDeadError", "Watchdog caught collective operation timeout", "NCCL error"],
        },
        "recipe": {
            "model": {"served_name": SERVED},
            "launch": {"order": order, "head_delay_s": head_delay_s, "stop_grace_s": 10},
            "readiness": {"canary_prompt": PROMPT, "timeout_s": 300},
            "memory": {"min_available_gib": 1},
            "supervise": {**sv.SUPERVISE_DEFAULTS, **supervise},
        },
        "ready_after_s": 42.0,
        "started_at": 1764640000.0,
        "recorded_at": 1764640042.0,
    }


@dataclass
class Lab:
    tmp: Path
    clock: FakeClock
    cluster: Cluster
    engine: Engine
    config: Any
    supervisor: Any

    @property
    def render_path(self) -> Path:
        return Path(self.config.render_path)

    @property
    def lock_path(self) -> Path:
        return Path(self.config.lock_dir) / f"{DEPLOYMENT}.lock"

    def write_render(self, data: dict[str, Any]) -> None:
        self.render_path.parent.mkdir(parents=True, exist_ok=True)
        self.render_path.write_text(json.dumps(data), encoding="utf-8")

    def step(self) -> float:
        delay: float = self.supervisor.step()
        return delay

    def later(self, seconds: float = 15) -> float:
        """The main loop: sleep the interval, then step."""
        self.clock.sleep(seconds)
        return self.step()

    def events(self) -> list[dict[str, Any]]:
        path = self.tmp / "state" / f"{DEPLOYMENT}.events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def names(self) -> list[str]:
        return [event["event"] for event in self.events()]

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.tmp / "state" / f"{DEPLOYMENT}.state.json").read_text("utf-8"))
        return data

    def docker(self, verb: str) -> list[tuple[str, str]]:
        return [(call.node, call.argv[-1]) for call in self.cluster.calls if call.argv[:2] == ["docker", verb]]


def make_lab(tmp_path: Path, nodes: int = 2, order: str = "workers_first", head_delay_s: float = 0,
             config_extra: dict[str, Any] | None = None, **supervise: Any) -> Lab:
    clock = FakeClock()
    cluster = Cluster(clock, nodes)
    engine = Engine(cluster, clock)
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps({**config_data(tmp_path, nodes), **(config_extra or {})}), encoding="utf-8")
    config = sv.load_config(str(path))
    (tmp_path / "meminfo").write_text(meminfo_text(100 * GIB), encoding="ascii")
    supervisor = sv.Supervisor(config, runner=cluster, http=engine, clock=clock, sleep=clock.sleep)
    lab = Lab(tmp_path, clock, cluster, engine, config, supervisor)
    lab.write_render(render_data(nodes, order=order, head_delay_s=head_delay_s, **supervise))
    return lab


def rank(n: int) -> str:
    return f"{DEPLOYMENT}-rank{n}"


def epoch(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


# --- watching -----------------------------------------------------------------------


def test_a_serving_deployment_is_watched_and_nothing_is_touched(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    assert lab.step() == 15
    assert lab.supervisor.state == "watching"
    assert lab.docker("stop") == [] and lab.docker("start") == []
    assert [(m, p) for m, p, _, _ in lab.engine.requests] == [
        ("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")]
    assert lab.engine.requests[2][2] == {"model": SERVED, "prompt": PROMPT, "max_tokens": 1}
    assert {timeout for *_, timeout in lab.engine.requests} == {30}
    # The peer's commands go over ssh with the access stage's key, to its address; the head's run here.
    assert SSH + ["10.77.1.12", "--", "docker inspect --type container --format '{{json .State}}' lab-tp2-rank1"] \
        in lab.cluster.raw
    assert ["docker", "inspect", "--type", "container", "--format", "{{json .State}}", rank(0)] in lab.cluster.raw
    # First check: the log since the container started (the fatal line of the run before is not read again).
    assert [c.argv for c in lab.cluster.calls if c.argv[1] == "logs"] == [
        ["docker", "logs", "--since", str(int(START - 600)), rank(0)],
        ["docker", "logs", "--since", str(int(START - 600)), rank(1)]]
    lab.later()
    assert [c.argv[3] for c in lab.cluster.calls if c.argv[1] == "logs"][2:] == [str(int(START))] * 2
    assert lab.events() == []
    state = lab.state()
    assert {key: state[key] for key in ("deployment", "state", "restarts_last_hour", "restarts_total")} == {
        "deployment": DEPLOYMENT, "state": "watching", "restarts_last_hour": 0, "restarts_total": 0}
    assert state["pid"] == os.getpid() and state["updated"] == sv.iso(START + 15) and state["last_event"] is None


def test_without_a_render_there_is_nothing_to_supervise(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    lab.render_path.unlink()
    assert lab.step() == 15
    assert lab.supervisor.state == "waiting for a launch"
    assert lab.state()["state"] == "waiting for a launch"
    assert lab.cluster.calls == [] and lab.engine.requests == []


@pytest.mark.parametrize(("data", "why"), [
    ("{", "not valid JSON"),
    (json.dumps(dict(render_data(), deployment="other")), 'it is the render of "other", not of lab-tp2'),
    (json.dumps(render_data(3)), "rank 2 is not in the supervisor's rank_hosts; run site.yml"),
    (json.dumps(render_data(max_restarts_per_hour=0)), "recipe.supervise.max_restarts_per_hour is 0"),
])
def test_an_unusable_render_is_waited_out(tmp_path: Path, data: str, why: str) -> None:
    lab = make_lab(tmp_path)
    lab.render_path.write_text(data, encoding="utf-8")
    lab.step()
    assert lab.supervisor.state.startswith(f"waiting for a launch: {lab.render_path} is unusable: ")
    assert why in lab.supervisor.state
    assert lab.cluster.calls == []


def test_a_render_with_supervise_off_is_left_alone(tmp_path: Path) -> None:
    lab = make_lab(tmp_path, enabled=False)
    lab.cluster.container(1).kill()
    lab.step()
    assert lab.supervisor.state == "disabled: the recipe's supervise.enabled is false"
    assert lab.cluster.calls == []


# --- detections -----------------------------------------------------------------------


def kill_worker(lab: Lab) -> None:
    lab.cluster.container(1).kill(137)


def oom_worker(lab: Lab) -> None:
    lab.cluster.container(1).kill(137, oom=True)


def kill_head(lab: Lab) -> None:
    lab.cluster.container(0).kill(1)


def watchdog(lab: Lab) -> None:
    lab.cluster.container(1).logs.append((START + 5, WATCHDOG))


@pytest.mark.parametrize(("fault", "cause"), [
    (kill_worker, "rank 1 on spark-2 is not running (exited with code 137)"),
    (oom_worker, "rank 1 on spark-2 is not running (killed by the kernel's out-of-memory killer)"),
    (kill_head, "rank 0 on spark-1 is not running (exited with code 1)"),
    (watchdog, f"rank 1 on spark-2 logged: {WATCHDOG[:200]}"),
])
def test_a_stopped_rank_or_a_fatal_log_line_heals_at_once(
    tmp_path: Path, fault: Callable[[Lab], None], cause: str
) -> None:
    lab = make_lab(tmp_path)
    lab.step()
    fault(lab)
    lab.later()
    assert lab.names() == ["heal_started", "healed"]
    assert [event["cause"] for event in lab.events()] == [cause, cause]
    assert lab.supervisor.state == "watching"
    assert lab.cluster.running() == [True, True]
    assert (lab.state()["restarts_last_hour"], lab.state()["restarts_total"]) == (1, 1)
    lab.later()  # the restarted containers' old lines (the fatal one included) are not read again
    assert lab.names() == ["heal_started", "healed"]
    assert lab.supervisor.state == "watching"


def test_a_gone_container_needs_attention_with_every_rank_stopped(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    del lab.cluster.nodes["spark-2"].containers[rank(1)]
    lab.step()
    attention = "needs attention: rank 1's container lab-tp2-rank1 is gone; run site.yml"
    assert lab.supervisor.state == attention
    assert lab.cluster.container(0).running is False
    assert lab.docker("start") == []
    [event] = lab.events()
    assert (event["event"], event["rank"], event["node"], event["container"], event["state"]) == (
        "container_gone", 1, "spark-2", rank(1), attention)
    calls, requests = len(lab.cluster.calls), len(lab.engine.requests)
    lab.later()
    lab.later()
    assert (len(lab.cluster.calls), len(lab.engine.requests)) == (calls, requests)
    assert lab.state()["state"] == attention


def test_a_hang_heals_after_failures_before_heal_probes(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    lab.engine.mode = "hung"
    lab.step()
    assert lab.supervisor.state == f"watching (1 of 3 probes failed: {HANG})"
    lab.later()
    assert lab.supervisor.state == f"watching (2 of 3 probes failed: {HANG})"
    assert lab.docker("stop") == [] and lab.events() == []
    lab.later()
    assert lab.names() == ["heal_started", "healed"]
    assert lab.events()[0]["cause"] == HANG
    assert [timeout for method, _, _, timeout in lab.engine.requests if method == "POST"][:3] == [30, 30, 30]
    assert lab.supervisor.state == "watching"


def test_a_dead_engine_heals_after_failures_before_heal_probes(tmp_path: Path) -> None:
    lab = make_lab(tmp_path, failures_before_heal=2)
    lab.engine.mode = "dead"
    lab.step()
    assert lab.supervisor.state.startswith(
        "watching (1 of 2 probes failed: the head does not answer: GET /health: 503 Service Unavailable: ")
    assert "EngineDeadError" in lab.supervisor.state
    lab.later()
    assert lab.names() == ["heal_started", "healed"]
    assert lab.events()[0]["cause"].startswith("the head does not answer: GET /health: 503")


def test_a_probe_that_passes_resets_the_count(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    for mode in ("hung", "hung", "healthy", "hung", "hung"):
        lab.engine.mode = mode
        lab.later()
    assert lab.supervisor.state == f"watching (2 of 3 probes failed: {HANG})"
    assert lab.events() == [] and lab.docker("stop") == []


def test_the_render_gives_the_ranks_on_their_nodes_and_fills_in_supervise() -> None:
    config = sv.parse_config(config_data(Path("/srv"), nodes=3))
    data = render_data(3, order="head_first")
    del data["recipe"]["supervise"]  # a render of a launch before the supervisor
    render = sv.parse_render(data, config, 5.0)
    assert [(r.rank, r.node, r.container) for r in render.ranks] == [
        (0, "spark-1", rank(0)), (1, "spark-2", rank(1)), (2, "spark-3", rank(2))]
    assert (render.key, render.order, render.served_name) == (("fp-1", 5.0), "head_first", SERVED)
    assert render.supervise.ready_timeout_s == 300 and render.supervise.failures_before_heal == 3
    # The record's schema (node/release.py) holds the ranks by number; any other form is refused by it.
    data["ranks"] = [dict(entry) for entry in data["ranks"].values()]
    with pytest.raises(sv.RenderError, match=r"^it: ranks is \[.*; it must be a mapping\.$"):
        sv.parse_render(data, config, 5.0)
    del data["recorded_at"]
    data["ranks"] = {"0": {"container_name": rank(0)}}
    with pytest.raises(sv.RenderError, match="^it has no recorded_at; it is not a release record the launch wrote"):
        sv.parse_render(data, config, 5.0)


def test_the_probe_asks_the_api_where_the_record_s_launch_put_it() -> None:
    """An upgrade that moved the API (to the fabric address, the gateway gone to another node) records it before
    the supervisor's settings are written again: the record says where to ask."""
    config = sv.parse_config(config_data(Path("/srv")))
    data = render_data()
    assert sv.parse_render(data, config, 0.0).api_base == "http://127.0.0.1:8000"  # no address in the record
    data["recipe"]["launch"].update(api_host="10.77.1.11", api_port=8001)
    assert sv.parse_render(data, config, 0.0).api_base == "http://10.77.1.11:8001"
    data["recipe"]["launch"].update(api_host="0.0.0.0", api_port=8002)
    assert sv.parse_render(data, config, 0.0).api_base == "http://127.0.0.1:8002"
    data["recipe"]["launch"].update(api_host="fd00::1")
    assert sv.parse_render(data, config, 0.0).api_base == "http://[fd00::1]:8002"
    # The wildcard addresses are the config's (sparkserve_wildcard_hosts), not the program's own.
    data["recipe"]["launch"].update(api_host="::")
    assert sv.parse_render(data, config, 0.0).api_base == "http://127.0.0.1:8002"
    narrow = sv.parse_config({**config_data(Path("/srv")), "wildcard_hosts": ["0.0.0.0"]})
    assert sv.parse_render(data, narrow, 0.0).api_base == "http://[::]:8002"


def test_a_model_list_without_the_served_model_fails_the_probe() -> None:
    config = sv.parse_config(config_data(Path("/srv")))
    render = sv.parse_render(render_data(), config, 0.0)

    def engine(method: str, url: str, body: str | None, timeout: float) -> tuple[int, str]:
        return 200, json.dumps({"data": [{"id": "another-model"}]})

    cause = sv.probe(config.api_base, render, engine, 30)
    assert cause.startswith("the head does not answer: GET /v1/models: 200 but it does not list tiny-model")


# --- the heal -------------------------------------------------------------------------


def test_a_heal_saves_the_logs_stops_and_starts_in_the_recipe_order(tmp_path: Path) -> None:
    lab = make_lab(tmp_path, nodes=3, head_delay_s=20, log_lines=2)
    for node in lab.cluster.nodes.values():
        node.stop_s = 2
    lab.cluster.nodes["spark-2"].memory = [GIB // 2, GIB // 2, 100 * GIB]
    lab.engine.load_s = 30
    lab.cluster.container(2).kill(137)
    lab.step()

    assert lab.docker("stop") == [("spark-1", rank(0)), ("spark-2", rank(1)), ("spark-3", rank(2))]
    assert {tuple(c.argv[2:4]) for c in lab.cluster.calls if c.argv[1] == "stop"} == {("-t", "10")}
    assert lab.docker("start") == [("spark-3", rank(2)), ("spark-2", rank(1)), ("spark-1", rank(0))]
    starts = {c.argv[-1]: c.time for c in lab.cluster.calls if c.argv[1] == "start"}
    assert starts[rank(0)] - starts[rank(1)] == 20  # head_delay_s, on the fake clock
    verbs = [c.argv[1] for c in lab.cluster.calls if c.argv[1] in ("stop", "start", "logs")]
    assert verbs.index("start") > max(i for i, verb in enumerate(verbs) if verb == "stop")
    assert verbs[:4] == ["logs", "logs", "logs", "stop"]  # the logs are saved before anything stops
    assert [c.argv for c in lab.cluster.calls if c.node == "spark-2" and c.argv[0] == "cat"] == [
        ["cat", str(tmp_path / "meminfo")]] * 3

    folder = tmp_path / "state" / DEPLOYMENT / "logs" / sv.compact_time(START)
    assert sorted(p.name for p in folder.iterdir()) == ["rank0-spark-1.log", "rank1-spark-2.log", "rank2-spark-3.log"]
    assert (folder / "rank1-spark-2.log").read_text() == "rank 1: loading the weights\nrank 1: ready\n"
    assert ["docker", "logs", "--tail", "2", rank(2)] in [c.argv for c in lab.cluster.calls]

    cause = "rank 2 on spark-3 is not running (exited with code 137)"
    started, healed = lab.events()
    assert {k: started[k] for k in ("event", "cause", "attempt", "time")} == {
        "event": "heal_started", "cause": cause, "attempt": 1, "time": sv.iso(START)}
    assert started["state"] == f"healing (attempt 1, saving the logs): {cause}"
    # 3 stops of 2 s; memory back at the third read, 5 s apart; the head 20 s after the workers, ready 30 s later.
    assert {k: healed[k] for k in ("event", "cause", "attempt", "seconds", "stopped_s", "memory_s", "ready_s")} == {
        "event": "healed", "cause": cause, "attempt": 1, "seconds": 66.0, "stopped_s": 6.0, "memory_s": 10.0,
        "ready_s": 50.0}
    assert (healed["state"], healed["deployment"]) == ("watching", DEPLOYMENT)
    assert lab.cluster.running() == [True, True, True]
    state = lab.state()
    assert (state["state"], state["restarts_last_hour"], state["restarts_total"]) == ("watching", 1, 1)
    assert state["last_event"]["event"] == "healed"
    assert not lab.lock_path.exists()


def test_the_guard_is_armed_and_the_flusher_runs_on_every_node_while_the_ranks_load(tmp_path: Path) -> None:
    flusher, guard = f"sparkserve-flusher@{DEPLOYMENT}.service", f"sparkserve-memguard@{DEPLOYMENT}.service"
    lab = make_lab(tmp_path, nodes=3, config_extra={"flusher_unit": flusher, "memguard_unit": guard})
    kill_worker(lab)
    lab.step()

    assert lab.names() == ["heal_started", "healed"]
    order = [(c.node, *c.argv[:3]) for c in lab.cluster.calls
             if c.argv[0] == "systemctl" or c.argv[:2] in (["docker", "start"], ["docker", "stop"])]
    nodes = ["spark-1", "spark-2", "spark-3"]
    first_start = next(i for i, call in enumerate(order) if call[1:3] == ("docker", "start"))
    # After every stop and before the first start: the guard, then the flusher, on every node.
    assert order[first_start - 6:first_start] == (
        [(node, "systemctl", "start", guard) for node in nodes]
        + [(node, "systemctl", "start", flusher) for node in nodes])
    assert all(call[1:3] == ("docker", "stop") for call in order[:first_start - 6])
    # The flusher stops once the deployment is ready again; the guard keeps watching.
    assert order[-3:] == [(node, "systemctl", "stop", flusher) for node in nodes]


def test_the_operator_s_pause_file_keeps_it_from_acting(tmp_path: Path) -> None:
    pause = tmp_path / f"{DEPLOYMENT}.paused"
    lab = make_lab(tmp_path, config_extra={"pause_file": str(pause)})
    pause.write_text("working on spark-2\n", encoding="utf-8")
    kill_worker(lab)
    lab.step()
    lab.later()

    assert lab.state()["state"] == f"paused by the operator: {pause} exists"
    assert lab.docker("stop") == lab.docker("start") == []
    assert lab.cluster.running() == [True, False]
    pause.unlink()
    lab.later()
    assert lab.names() == ["heal_started", "healed"]
    assert lab.cluster.running() == [True, True]


def test_event_lines_go_to_the_journal_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = make_lab(tmp_path)
    kill_worker(lab)
    lab.step()
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert printed == lab.events()


def test_head_first_starts_the_head_first_and_stops_it_last(tmp_path: Path) -> None:
    lab = make_lab(tmp_path, nodes=3, order="head_first", head_delay_s=20)
    kill_worker(lab)
    lab.step()
    assert lab.docker("stop") == [("spark-3", rank(2)), ("spark-2", rank(1)), ("spark-1", rank(0))]
    assert lab.docker("start") == [("spark-1", rank(0)), ("spark-2", rank(1)), ("spark-3", rank(2))]
    assert 20 not in lab.clock.sleeps
    assert lab.names() == ["heal_started", "healed"]


def test_a_failed_attempt_backs_off_then_tries_again_with_the_same_cause(tmp_path: Path) -> None:
    lab = make_lab(tmp_path, ready_timeout_s=60, backoff_s=30, max_restarts_per_hour=3)
    lab.engine.after_restart = "hung"
    kill_worker(lab)
    cause = "rank 1 on spark-2 is not running (exited with code 137)"
    delay = lab.step()
    assert lab.names() == ["heal_started", "heal_failed"]
    failed = lab.events()[1]
    assert failed["why"] == f"not ready after 60 s: {HANG}"
    assert (failed["cause"], failed["attempt"]) == (cause, 1)
    assert lab.cluster.running() == [False, False]  # the failed attempt stopped every rank
    ended = [lab.clock.now]
    assert lab.supervisor.state == f"backing off until {sv.iso(ended[0] + 30)}: {cause}"
    assert failed["state"] == lab.supervisor.state
    assert delay == 15

    attempts: list[float] = []  # when each later attempt started: its saving of rank 0's log

    def note(call: Call) -> None:
        if call.argv[2:3] == ["--tail"] and call.argv[-1] == rank(0):
            attempts.append(call.time)

    lab.cluster.hooks.append(note)
    while not attempts:
        before = len(lab.cluster.calls)
        delay = lab.later(delay)
        if not attempts:
            assert len(lab.cluster.calls) == before  # backing off: nothing is done, nothing is asked
    ended.append(lab.clock.now)
    assert attempts[0] >= ended[0] + 30
    while len(attempts) < 2:
        delay = lab.later(delay)
    assert attempts[1] >= ended[1] + 60  # doubled
    events = lab.events()
    assert [e["attempt"] for e in events if e["event"] == "heal_started"] == [1, 2, 3]
    assert {e["cause"] for e in events} == {cause}


def test_past_the_limit_every_rank_is_stopped_and_it_needs_attention(tmp_path: Path) -> None:
    lab = make_lab(tmp_path, backoff_s=30, max_restarts_per_hour=2)
    cause = "rank 1 on spark-2 is not running (exited with code 137)"
    kill_worker(lab)
    lab.step()
    assert lab.names() == ["heal_started", "healed"]
    kill_worker(lab)
    delay = lab.later()
    assert lab.supervisor.state == f"backing off until {sv.iso(START + 30)}: {cause}"
    while lab.names().count("healed") < 2:
        delay = lab.later(delay)
    assert lab.clock.now >= START + 30
    kill_worker(lab)
    lab.later()
    attention = f"needs attention: restart limit reached (2 in the last hour); last cause: {cause}"
    assert lab.supervisor.state == attention
    assert lab.names()[-1] == "gave_up"
    assert (lab.events()[-1]["restarts_last_hour"], lab.events()[-1]["cause"]) == (2, cause)
    assert lab.cluster.running() == [False, False]  # the head's rank too, not half up
    assert lab.docker("stop")[-2:] == [("spark-1", rank(0)), ("spark-2", rank(1))]
    starts = len(lab.docker("start"))
    lab.later()
    lab.later(600)
    assert len(lab.docker("start")) == starts
    assert lab.state()["state"] == attention


def test_memory_that_does_not_come_back_needs_a_reboot_and_nothing_starts(tmp_path: Path) -> None:
    lab = make_lab(tmp_path, memory_wait_s=20)
    lab.cluster.nodes["spark-2"].memory = [GIB // 2]
    kill_worker(lab)
    lab.step()
    reboot = "needs reboot: spark-2 (MemAvailable 0.5 GiB, needs 1 GiB)"
    assert lab.supervisor.state == reboot
    assert lab.names() == ["heal_started", "needs_reboot"]
    assert lab.events()[1]["nodes"] == {"spark-2": {"mem_available_bytes": GIB // 2, "needs_bytes": GIB}}
    assert lab.events()[1]["cause"] == "rank 1 on spark-2 is not running (exited with code 137)"
    assert lab.docker("start") == []
    assert lab.cluster.running() == [False, False]
    assert [c.time - START for c in lab.cluster.calls if c.argv[0] == "cat"] == [0, 5, 10, 15, 20]
    assert not lab.lock_path.exists()
    calls = len(lab.cluster.calls)
    lab.later()
    assert len(lab.cluster.calls) == calls and lab.supervisor.state == reboot


# --- the lock -------------------------------------------------------------------------


def test_a_launch_holding_the_lock_pauses_the_supervisor(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    deployment_lock.acquire(lab.config.lock_dir, DEPLOYMENT, LAUNCH, 1800, clock=lab.clock)
    held = lab.lock_path.read_text()
    kill_worker(lab)
    lab.step()
    lab.later()
    assert lab.supervisor.state == f"paused: the deployment is locked by {LAUNCH}"
    assert lab.cluster.calls == [] and lab.engine.requests == []
    assert lab.lock_path.read_text() == held
    assert lab.events() == []
    deployment_lock.release(lab.config.lock_dir, DEPLOYMENT, LAUNCH, clock=lab.clock)
    lab.later()
    assert lab.names() == ["heal_started", "healed"]


@pytest.mark.parametrize(("text", "age_s", "paused_by"), [
    ("", 100, "an unknown run (the lock file is empty or not JSON)"),
    ("not json", 100, "an unknown run (the lock file is empty or not JSON)"),
    (json.dumps({"owner": "an older launch", "since": START - 100}), 100, "an older launch"),
    ("not json", 1900, None),  # held at its mtime, with the default lease of 1800 s: run out
])
def test_a_lock_file_of_unknown_format_is_held_from_its_mtime(
    tmp_path: Path, text: str, age_s: float, paused_by: str | None
) -> None:
    lab = make_lab(tmp_path)
    lab.lock_path.parent.mkdir(parents=True)
    lab.lock_path.write_text(text, encoding="utf-8")
    os.utime(lab.lock_path, (START - age_s, START - age_s))
    kill_worker(lab)
    lab.step()
    if paused_by is not None:
        assert lab.supervisor.state == f"paused: the deployment is locked by {paused_by}"
        assert lab.cluster.calls == []
    else:
        assert lab.names() == ["heal_started", "healed"]
        assert not lab.lock_path.exists()


def test_a_lock_whose_lease_ran_out_is_taken_over(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    deployment_lock.acquire(lab.config.lock_dir, DEPLOYMENT, LAUNCH, 1800, clock=lambda: START - 1801)
    kill_worker(lab)
    lab.step()
    assert lab.names() == ["heal_started", "healed"]
    assert not lab.lock_path.exists()


def test_the_lock_is_held_during_a_heal_and_given_back_after(tmp_path: Path) -> None:
    lab = make_lab(tmp_path, nodes=2, memory_wait_s=60, ready_timeout_s=120)
    lab.engine.load_s = 10
    seen: list[dict[str, Any]] = []
    refusals: list[str] = []

    def look(call: Call) -> None:
        if call.argv[1] in ("stop", "start"):
            seen.append(json.loads(lab.lock_path.read_text()))
            with pytest.raises(deployment_lock.LockError) as refused:  # a launch now is refused, naming the heal
                deployment_lock.acquire(lab.config.lock_dir, DEPLOYMENT, LAUNCH, 1800, clock=lab.clock)
            refusals.append(refused.value.msg)

    lab.cluster.hooks.append(look)
    for node in lab.cluster.nodes.values():
        node.stop_s = 3
    kill_worker(lab)
    lab.step()
    assert lab.names() == ["heal_started", "healed"]
    assert len(seen) == 4
    assert {holder["owner"] for holder in seen} == {HEALER}
    assert {holder["run"] for holder in seen} == {None}
    assert {holder["lease_s"] for holder in seen} == {60 + 120 + 300}
    assert len({holder["token"] for holder in seen}) == 1
    assert all(h["expires"] == h["renewed"] + h["lease_s"] for h in seen)
    assert seen[0]["renewed"] == START and seen[2]["renewed"] == START + 6  # renewed after the stop
    assert all(msg.startswith(f"deployment {DEPLOYMENT} is being launched by {HEALER} since ") for msg in refusals)
    assert not lab.lock_path.exists()
    assert deployment_lock.read_holder(str(lab.lock_path)) is None


def test_a_lock_left_by_an_earlier_run_of_the_supervisor_is_given_back(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    lab.lock_path.parent.mkdir(parents=True)
    lab.lock_path.write_text(json.dumps({"owner": HEALER, "since": START - 60, "renewed": START - 60,
                                         "lease_s": 900, "expires": START + 840, "token": "0123abcd", "run": None}))
    lab.step()
    assert lab.supervisor.state == "watching"
    assert not lab.lock_path.exists()


# --- nodes, renders, restarts of the supervisor ---------------------------------------


def test_an_unreachable_node_is_waited_for_then_the_deployment_is_healed(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    lab.cluster.nodes["spark-2"].reachable = False
    kill_head(lab)
    lab.step()
    lab.later()
    assert lab.supervisor.state == "waiting for nodes: spark-2"
    assert lab.docker("stop") == [] and lab.docker("start") == [] and lab.engine.requests == []
    [event] = lab.events()
    assert event["event"] == "node_unreachable"
    assert event["nodes"]["spark-2"].startswith("ssh could not connect: ssh: connect to host 10.77.1.12 port 22")
    # The node comes back from its reboot: its rank did not start by itself.
    lab.cluster.nodes["spark-2"].reachable = True
    lab.cluster.container(1).kill(255)
    lab.later()
    assert lab.names() == ["node_unreachable", "heal_started", "healed"]
    assert lab.events()[1]["cause"] == ("rank 0 on spark-1 is not running (exited with code 1); "
                                        "rank 1 on spark-2 is not running (exited with code 255)")
    assert lab.cluster.running() == [True, True]


@pytest.mark.parametrize("new_fingerprint", [True, False])
def test_a_new_render_ends_a_hold(tmp_path: Path, new_fingerprint: bool) -> None:
    lab = make_lab(tmp_path)
    del lab.cluster.nodes["spark-2"].containers[rank(1)]
    lab.step()
    assert lab.supervisor.state.startswith("needs attention: ")
    # site.yml: the ranks are created and started again, the render recorded (a stop and start keeps the
    # fingerprint; the file is written again all the same).
    lab.cluster.nodes["spark-2"].containers[rank(1)] = Container(rank(1), started_at=START + 10)
    lab.cluster.container(0).running = True
    lab.write_render(render_data(fingerprint="fp-2" if new_fingerprint else "fp-1"))
    mtime = lab.render_path.stat().st_mtime + 60
    os.utime(lab.render_path, (mtime, mtime))
    lab.later()
    assert lab.supervisor.state == "watching"
    event = lab.events()[-1]
    assert (event["event"], event["previous"], event["state"]) == ("render_changed", "fp-1", "watching")
    assert event["fingerprint"] == ("fp-2" if new_fingerprint else "fp-1")
    assert (lab.state()["restarts_last_hour"], lab.state()["restarts_total"]) == (0, 0)


def test_a_restarted_supervisor_keeps_the_attempts_of_the_hour(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    kill_worker(lab)
    lab.step()
    assert lab.state()["restarts_last_hour"] == 1
    again = sv.Supervisor(lab.config, runner=lab.cluster, http=lab.engine, clock=lab.clock, sleep=lab.clock.sleep)
    lab.clock.sleep(15)
    again.step()
    assert (lab.state()["restarts_last_hour"], lab.state()["restarts_total"]) == (1, 1)
    lab.clock.sleep(3600)
    again.step()
    assert (lab.state()["restarts_last_hour"], lab.state()["restarts_total"]) == (0, 1)
    assert lab.names() == ["heal_started", "healed"]  # no render_changed: the same render


# --- the program ----------------------------------------------------------------------


def test_run_once_steps_once_and_exits_0(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)

    def no_sleep(seconds: float) -> None:
        raise AssertionError("--once does not sleep")

    assert sv.run(lab.config, once=True, runner=lab.cluster, http=lab.engine, clock=lab.clock, sleep=no_sleep) == 0
    assert lab.state()["state"] == "watching"


def test_sigterm_ends_the_loop_with_status_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = make_lab(tmp_path)
    delays: list[float] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        lab.clock.sleep(seconds)
        if len(delays) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    assert sv.run(lab.config, runner=lab.cluster, http=lab.engine, clock=lab.clock, sleep=sleep) == 0
    assert signal.getsignal(signal.SIGTERM) == previous
    assert delays == [15, 15]
    assert capsys.readouterr().out.endswith("supervisor lab-tp2: terminated; exiting\n")


BAD_CONFIGS: list[tuple[dict[str, Any], list[str], str]] = [
    ({}, ["deployment"], "deployment is missing"),
    ({}, ["render_path"], "render_path is missing"),
    ({}, ["ssh_argv"], "ssh_argv is missing"),
    ({}, ["api_base"], "api_base is missing"),
    ({}, ["wildcard_hosts"], "wildcard_hosts is missing"),
    ({"wildcard_hosts": "0.0.0.0"}, [], 'wildcard_hosts is "0.0.0.0"; set the addresses'),
    ({"deployment": "../x"}, [], 'deployment is "../x"'),
    ({"render_path": "current.json"}, [], 'render_path is "current.json"; set an absolute path'),
    ({"state_dir": None}, [], "state_dir is null"),
    ({"head": "spark-9"}, [], 'head is "spark-9"; set one of the nodes (spark-1, spark-2)'),
    ({"nodes": {}}, [], "nodes is {}"),
    ({"nodes": {"spark-1": {"address": "10.77.1.11"}, "spark-2": {"adress": "x"}}}, [], "nodes.spark-2 is"),
    ({"rank_hosts": {"0": "spark-1", "1": "spark-7"}}, [], 'rank_hosts.1 is "spark-7"'),
    ({"rank_hosts": {"0": "spark-2", "1": "spark-1"}}, [], "rank 0 runs on the head (spark-1)"),
    ({"rank_hosts": {"one": "spark-1"}}, [], 'rank_hosts has the key "one"'),
    ({"ssh_argv": "ssh -l root"}, [], 'ssh_argv is "ssh -l root"'),
    ({"ssh_argv": []}, [], "ssh_argv is []"),
    ({"api_base": "127.0.0.1:8000"}, [], 'api_base is "127.0.0.1:8000"'),
    ({"interval_s": 15}, [], "unknown key interval_s"),
    ({"pause_file": "lab-tp2.paused"}, [], 'pause_file is "lab-tp2.paused"; set an absolute path'),
    ({"flusher_unit": "sparkserve-flusher"}, [], 'flusher_unit is "sparkserve-flusher"; set a systemd unit name'),
    ({"memguard_unit": 3}, [], "memguard_unit is 3; set a systemd unit name"),
]


@pytest.mark.parametrize(("changes", "drop", "message"), BAD_CONFIGS)
def test_a_bad_config_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], drop: list[str], message: str
) -> None:
    config = {**config_data(tmp_path), **changes}
    for key in drop:
        del config[key]
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    assert sv.main(["--config", str(path), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"supervisor config {path}: ")
    assert message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(("text", "message"), [("[1]", "not a JSON object"), ("{", "not valid JSON")])
def test_a_config_that_is_no_json_object_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "supervisor.json"
    path.write_text(text, encoding="utf-8")
    assert sv.main(["--config", str(path), "--check-config"]) == 2
    assert message in capsys.readouterr().err


def test_check_config_prints_ok_and_does_nothing_else(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(config_data(tmp_path)), encoding="utf-8")
    assert sv.main(["--config", str(path), "--check-config"]) == 0
    assert capsys.readouterr().out == "OK\n"
    assert not (tmp_path / "state").exists()


def test_as_a_program_check_config_says_ok_and_a_bad_config_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(config_data(tmp_path)), encoding="utf-8")
    program = installed(tmp_path)
    done = subprocess.run([sys.executable, program, "--config", str(path), "--check-config"],
                          capture_output=True, text=True, check=False, env=node_layout.env(tmp_path / "node"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "OK\n", "")
    path.write_text(json.dumps({**config_data(tmp_path), "head": 1}), encoding="utf-8")
    done = subprocess.run([sys.executable, program, "--config", str(path), "--check-config"],
                          capture_output=True, text=True, check=False, env=node_layout.env(tmp_path / "node"))
    assert done.returncode == 2
    assert "head is 1; set one of the nodes" in done.stderr


# --- small parts ----------------------------------------------------------------------


def test_docker_started_at_with_nanoseconds_is_read() -> None:
    assert sv.parse_started_at(docker_time(START)) == START + 0.123456
    assert sv.parse_started_at("2027-01-15T09:00:00+01:00") == START
    assert sv.parse_started_at("0001-01-01T00:00:00Z") is None
    assert sv.parse_started_at("yesterday") is None


class FakeResponse:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def __enter__(self) -> FakeResponse:
        return self

    def __exit__(self, *args: object) -> None:
        return None

    def read(self, limit: int) -> bytes:
        return self.body[:limit]


class FakeOpener:
    """urllib's opener, answering or failing as told, and keeping the request."""

    def __init__(self, outcome: FakeResponse | Exception) -> None:
        self.outcome = outcome
        self.requests: list[tuple[Any, float]] = []

    def open(self, request: Any, timeout: float) -> FakeResponse:
        self.requests.append((request, timeout))
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def test_http_request_answers_an_http_error_and_raises_a_timeout_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://127.0.0.1:8000/v1/completions"
    opener = FakeOpener(FakeResponse(200, b'{"choices": [{}]}'))
    monkeypatch.setattr(api, "OPENER", opener)
    assert sv.http_request("POST", url, '{"max_tokens": 1}', 30) == (200, '{"choices": [{}]}')
    [(request, timeout)] = opener.requests
    assert (request.get_method(), request.data, request.get_header("Content-type"), timeout) == (
        "POST", b'{"max_tokens": 1}', "application/json", 30)

    dead = urllib.error.HTTPError(url, 503, "Service Unavailable", Message(), io.BytesIO(b"EngineDeadError"))
    monkeypatch.setattr(api, "OPENER", FakeOpener(dead))
    assert sv.http_request("GET", url, None, 30) == (503, "EngineDeadError")

    monkeypatch.setattr(api, "OPENER", FakeOpener(urllib.error.URLError(TimeoutError("timed out"))))
    with pytest.raises(TimeoutError):
        sv.http_request("GET", url, None, 30)
    monkeypatch.setattr(api, "OPENER", FakeOpener(urllib.error.URLError(ConnectionRefusedError(111, "refused"))))
    with pytest.raises(ConnectionRefusedError):
        sv.http_request("GET", url, None, 30)
    monkeypatch.setattr(api, "OPENER", FakeOpener(TimeoutError("timed out")))  # while reading the answer
    with pytest.raises(TimeoutError):
        sv.http_request("GET", url, None, 30)


# --- metrics (a node-exporter textfile) -------------------------------------------------

SUPERVISOR_FAMILIES = {
    "sparkserve_supervisor_state": "gauge",
    "sparkserve_supervisor_restarts_total": "counter",
    "sparkserve_supervisor_paused": "gauge",
    "sparkserve_supervisor_last_check_timestamp_seconds": "gauge",
}
DEP = {"deployment": DEPLOYMENT}
STATE_NAMES = ["starting", "waiting for a launch", "disabled", "watching", "paused", "waiting for nodes", "healing",
               "backing off", "needs attention", "needs reboot"]


def metrics_lab(tmp_path: Path, **config_extra: Any) -> tuple[Lab, Path]:
    folder = tmp_path / "textfile"
    folder.mkdir(exist_ok=True)
    path = folder / f"sparkserve-supervisor-{DEPLOYMENT}.prom"
    return make_lab(tmp_path, config_extra={"metrics_path": str(path), **config_extra}), path


def figures(path: Path) -> tuple[str, float, float, float]:
    """The current state's name, the restarts, paused and the last check: the file's figures."""
    families = exposition.read(path)
    assert {name: family.kind for name, family in families.items()} == SUPERVISOR_FAMILIES
    states = families["sparkserve_supervisor_state"].samples
    assert [labels for labels, _ in states] == [{**DEP, "state": name} for name in STATE_NAMES]
    [current] = [labels["state"] for labels, value in states if value == 1]
    assert all(value in (0, 1) for _, value in states)
    return (current, families["sparkserve_supervisor_restarts_total"].value(**DEP),
            families["sparkserve_supervisor_paused"].value(**DEP),
            families["sparkserve_supervisor_last_check_timestamp_seconds"].value(**DEP))


def test_a_step_writes_every_family(tmp_path: Path) -> None:
    lab, path = metrics_lab(tmp_path)
    lab.step()
    assert figures(path) == ("watching", 0, 0, START)
    assert path.read_text(encoding="utf-8").startswith(
        "# HELP sparkserve_supervisor_state 1 for the supervisor's current state, 0 for the others.\n"
        "# TYPE sparkserve_supervisor_state gauge\n"
        'sparkserve_supervisor_state{deployment="lab-tp2",state="starting"} 0\n'
        'sparkserve_supervisor_state{deployment="lab-tp2",state="waiting for a launch"} 0\n'
        'sparkserve_supervisor_state{deployment="lab-tp2",state="disabled"} 0\n'
        'sparkserve_supervisor_state{deployment="lab-tp2",state="watching"} 1\n')
    lab.later()
    assert figures(path) == ("watching", 0, 0, START + 15)


def test_a_heal_shows_while_it_runs_and_counts_as_a_restart(tmp_path: Path) -> None:
    lab, path = metrics_lab(tmp_path)
    lab.step()
    kill_worker(lab)
    during: list[tuple[str, float, float, float]] = []

    def look(call: Call) -> None:
        if call.argv[:2] == ["docker", "start"]:
            during.append(figures(path))

    lab.cluster.hooks.append(look)
    lab.later()
    assert lab.names() == ["heal_started", "healed"]
    assert during == [("healing", 1, 0, START + 15)] * 2
    assert figures(path) == ("watching", 1, 0, START + 15)


def test_restarts_total_adds_the_state_file_s_count_and_does_not_drop_at_a_launch(tmp_path: Path) -> None:
    lab, path = metrics_lab(tmp_path)
    kill_worker(lab)
    lab.step()
    assert figures(path)[:2] == ("watching", 1)
    again = sv.Supervisor(lab.config, runner=lab.cluster, http=lab.engine, clock=lab.clock, sleep=lab.clock.sleep)
    lab.clock.sleep(15)
    again.step()
    assert figures(path)[:2] == ("watching", 1)  # the count the state file kept
    kill_worker(lab)
    lab.clock.sleep(15)
    again.step()
    assert figures(path)[:2] == ("watching", 2)
    lab.write_render(render_data(fingerprint="fp-2"))  # a launch: the state file's counts start again
    lab.clock.sleep(15)
    again.step()
    assert lab.state()["restarts_total"] == 0
    assert figures(path)[:2] == ("watching", 2)


def test_the_pause_file_shows_as_paused(tmp_path: Path) -> None:
    pause = tmp_path / f"{DEPLOYMENT}.paused"
    lab, path = metrics_lab(tmp_path, pause_file=str(pause))
    lab.step()
    assert figures(path)[:3] == ("watching", 0, 0)
    pause.write_text("working on spark-2\n", encoding="utf-8")
    lab.later()
    assert figures(path)[:3] == ("paused", 0, 1)
    pause.unlink()
    lab.later()
    assert figures(path)[:3] == ("watching", 0, 0)


def test_without_a_render_it_waits_for_a_launch(tmp_path: Path) -> None:
    lab, path = metrics_lab(tmp_path)
    lab.render_path.unlink()
    lab.step()
    assert figures(path) == ("waiting for a launch", 0, 0, START)


@pytest.mark.parametrize(("state", "name"), [
    ("starting", "starting"),
    ("waiting for a launch", "waiting for a launch"),
    ("waiting for a launch: /x/current.json is unusable: not valid JSON", "waiting for a launch"),
    ("disabled: the recipe's supervise.enabled is false", "disabled"),
    ("watching", "watching"),
    ("watching (1 of 3 probes failed: the head does not answer: x)", "watching"),
    (f"paused: the deployment is locked by {LAUNCH}", "paused"),
    ("paused by the operator: /etc/x.paused exists", "paused"),
    ("waiting for nodes: spark-2, spark-3", "waiting for nodes"),
    ("healing (attempt 2, waiting for memory): rank 1 on spark-2 is not running (gone)", "healing"),
    ("backing off until 2027-01-15T08:00:30Z: cause", "backing off"),
    ("needs attention: restart limit reached (3 in the last hour); last cause: x", "needs attention"),
    ("needs reboot: spark-2 (MemAvailable 0.5 GiB, needs 1 GiB)", "needs reboot"),
    ("watchingX", None),
])
def test_every_state_has_its_name(state: str, name: str | None) -> None:
    assert list(sv.STATE_NAMES) == STATE_NAMES
    assert sv.state_name(state) == name


def test_sigterm_removes_the_file_and_once_leaves_it(tmp_path: Path) -> None:
    lab, path = metrics_lab(tmp_path)

    def no_sleep(seconds: float) -> None:
        raise AssertionError("--once does not sleep")

    assert sv.run(lab.config, once=True, runner=lab.cluster, http=lab.engine, clock=lab.clock, sleep=no_sleep) == 0
    assert figures(path) == ("watching", 0, 0, START)
    seen: list[tuple[str, float, float, float]] = []

    def sleep(seconds: float) -> None:
        seen.append(figures(path))
        lab.clock.sleep(seconds)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    assert sv.run(lab.config, runner=lab.cluster, http=lab.engine, clock=lab.clock, sleep=sleep) == 0
    assert seen == [("watching", 0, 0, START), ("watching", 0, 0, START + 15)]
    assert not path.exists()
    assert exposition.leftovers(path) == []


def test_a_missing_folder_is_said_once_on_stderr_and_the_supervisor_carries_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "absent" / "supervisor.prom"
    lab = make_lab(tmp_path, config_extra={"metrics_path": str(path)})
    lab.step()
    kill_worker(lab)
    lab.later()
    assert lab.names() == ["heal_started", "healed"]
    err = capsys.readouterr().err
    assert err == (f"supervisor {DEPLOYMENT}: cannot write the metrics file {path}: No such file or directory; "
                   "carrying on without it\n")


def test_without_metrics_path_no_file_is_written(tmp_path: Path) -> None:
    lab = make_lab(tmp_path)
    assert lab.config.metrics_path is None
    lab.step()
    assert not list(tmp_path.rglob("*.prom"))


@pytest.mark.parametrize(("value", "message"), [
    ("lab-tp2.prom", 'metrics_path is "lab-tp2.prom"; set an absolute path'),
    ("", 'metrics_path is ""; set an absolute path'),
    (3, "metrics_path is 3; set an absolute path"),
    (["/x.prom"], 'metrics_path is ["/x.prom"]; set an absolute path'),
])
def test_a_bad_metrics_path_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: object, message: str
) -> None:
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps({**config_data(tmp_path), "metrics_path": value}), encoding="utf-8")
    assert sv.main(["--config", str(path), "--check-config"]) == 2
    assert capsys.readouterr().err == f"supervisor config {path}: {message}\n"


def test_a_null_metrics_path_means_no_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps({**config_data(tmp_path), "metrics_path": None}), encoding="utf-8")
    assert sv.main(["--config", str(path), "--check-config"]) == 0
    assert sv.load_config(str(path)).metrics_path is None


# --- NCCL's network after a heal -------------------------------------------------------------------------------

TWINS = ["rocep1s0f1", "roceP2p1s0f1"]
NCCL_SOCKETS = ["spark:1:1 [0] NCCL INFO NET/IB : No device found.",
                "spark:1:1 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:10.77.1.11<0>",
                "spark:1:1 [0] NCCL INFO Using network Socket"]
NCCL_IB = ["spark:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB x",
           "spark:1:1 [0] NCCL INFO Using network IB"]


def nccl_lab(tmp_path: Path, lines: list[str], require_rdma: bool = True, report: bool = True) -> tuple[Lab, Path]:
    """A lab whose render asks NCCL for its report (as every launch does) and whose ranks, once started again, log
    the given NCCL lines."""
    lab, path = metrics_lab(tmp_path, rdma_devices=TWINS)
    data = render_data()
    for entry in data["ranks"].values():
        entry["env"] = {"NCCL_DEBUG": "INFO"} if report else {}
    data["recipe"]["fabric"] = {"require_rdma": require_rdma}
    lab.write_render(data)

    def log_nccl() -> None:
        for rank in range(2):
            container = lab.cluster.container(rank)
            if container.running and container.started_at == lab.clock():
                container.logs += [(lab.clock(), line) for line in lines]
    lab.cluster.started.append(log_nccl)
    return lab, path.parent / f"transport-{DEPLOYMENT}.prom"


def test_a_heal_whose_ranks_fell_back_to_sockets_fails_naming_them(tmp_path: Path) -> None:
    lab, series = nccl_lab(tmp_path, NCCL_SOCKETS)
    kill_worker(lab)
    lab.step()
    assert lab.names() == ["heal_started", "transport", "heal_failed"]
    transport, failed = lab.events()[1:]
    assert [p.split(":")[0] for p in transport["problems"]] == ["rank 0 on spark-1", "rank 1 on spark-2"]
    assert failed["why"].startswith("NCCL does not use RDMA between the nodes: rank 0 on spark-1: NCCL runs over "
                                    "TCP sockets, not RDMA: NCCL found no RDMA device")
    assert lab.cluster.running() == [False, False]  # a failed attempt leaves no rank running
    text = series.read_text(encoding="utf-8")
    assert 'sparkserve_rank_transport_info{deployment="lab-tp2",node="spark-2",rank="1",transport="NET/Socket"} 1' \
        in text


def test_without_require_rdma_the_heal_serves_on_sockets_and_says_so(tmp_path: Path) -> None:
    lab, series = nccl_lab(tmp_path, NCCL_SOCKETS, require_rdma=False)
    kill_worker(lab)
    lab.step()
    assert lab.names() == ["heal_started", "transport", "healed"] and lab.supervisor.state == "watching"
    assert series.read_text(encoding="utf-8").count('transport="NET/Socket"} 1') == 2


def test_rdma_over_both_twins_heals_with_no_word_and_an_old_render_is_not_read(tmp_path: Path) -> None:
    lab, series = nccl_lab(tmp_path, NCCL_IB)
    kill_worker(lab)
    lab.step()
    assert lab.names() == ["heal_started", "healed"]
    assert series.read_text(encoding="utf-8").count('transport="NET/IB"} 1') == 2
    (tmp_path / "old").mkdir()
    old, old_series = nccl_lab(tmp_path / "old", [], report=False)
    kill_worker(old)
    old.step()
    assert old.names() == ["heal_started", "healed"] and not old_series.exists()
