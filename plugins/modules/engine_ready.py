#!/usr/bin/python
"""Probe an OpenAI-compatible engine for real readiness: /health, /v1/models and a one-token completion."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_ready
short_description: Probe an OpenAI-compatible engine for real readiness, for a bounded time
version_added: "0.1.0"
description:
  - Polls the engine for at most about O(wait_s) seconds and reports how far it got. Each poll asks
    the health path (C(GET /health) by default; must answer 200), the model list (C(GET /v1/models);
    must list O(served_name)) and sends a one-token completion (C(POST /v1/completions); must return
    one choice). The engine's adapter gives the paths; the engine role passes them from the render.
  - Watches the deployment's rank containers too (O(containers)), on this node with C(docker) and on
    the peers over the ssh the access stage set up. A rank whose container has stopped ends the call
    with RV(stage=rank_stopped) and RV(stopped) (without failing, so the caller can say why). A peer
    whose ssh has not connected at O(lost_after_checks) checks in a row ends the call with
    RV(stage=node_lost) and RV(lost), as a node that stopped answering.
  - A rank the kernel's out-of-memory killer ended (C(docker inspect) shows C(OOMKilled)) is reported as
    killed by its container's memory cap, named (O(containers[].memory_limit)), or by the kernel's
    out-of-memory killer when it has no cap.
  - Ranks often go down together (a worker exits when the head it joined dies), and docker may record
    the consequence before the cause. When the ranks found stopped exited on their own, the ranks still
    running are checked again up to three times, a second apart, and every rank that stopped meanwhile
    is reported too. RV(stopped) lists the ranks the out-of-memory killer ended first, then by rank.
  - Does not fail because the engine is not ready yet; it returns RV(ready=false) and the caller loops
    (C(until), C(retries)). Connection refused counts as "not up yet".
  - Fails when the engine is known dead. vLLM keeps answering C(/v1/models) with 200 after its engine
    died (vllm#53157) while C(/health) answers 503, so a live C(/v1/models) proves nothing. The engine
    counts as dead when C(/health) answers 5xx with a body matching O(dead_if_health_body_matches);
    when, after C(/health) answered 200 or C(/v1/models) answered 200 at an earlier poll of this call,
    C(/health) answers 503 while C(/v1/models) still answers 200; or when the completion answers 5xx
    after C(/health) answered 200.
  - A request still running at the deadline is given at least one second, so a call can end up to a
    few seconds after O(wait_s) when the engine answers slowly.
  - Talks to the engine directly, never through a proxy from the environment.
  - Changes nothing; runs the same in check mode (a one-token completion counts as read-only).
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  url:
    description: Base URL of the engine, without C(/v1), for example C(http://127.0.0.1:8000).
    type: str
    required: true
  served_name:
    description: The model name the engine serves (C(--served-model-name)); C(/v1/models) must list it.
    type: str
    required: true
  prompt:
    description: The canary prompt of the one-token completion.
    type: str
    default: "2+2="
  api_key:
    description: Sent as C(Authorization) C(Bearer KEY) when the engine was started with C(--api-key).
    type: str
  wait_s:
    description: Poll for at most about this many seconds in this call. C(0) probes once.
    type: float
    default: 20
  poll_s:
    description: Seconds between polls.
    type: float
    default: 2
  request_timeout_s:
    description: Seconds one HTTP request may take.
    type: float
    default: 10
  dead_if_health_body_matches:
    description:
      - A regular expression (Python C(re.search)). A 5xx answer of the health path whose body matches it
        means the engine is dead, and the module fails at once. An empty string turns this check off.
    type: str
    default: "dead|EngineDeadError"
  health_path:
    description: The engine's liveness path.
    type: str
    default: /health
  models_path:
    description: The engine's OpenAI model list.
    type: str
    default: /v1/models
  completions_path:
    description: The engine's OpenAI completions path.
    type: str
    default: /v1/completions
  containers:
    description:
      - The rank containers that must keep running, checked when the call starts and then every
        O(watch_every_s) seconds. C(host) empty is this node; otherwise C(ssh HOST docker inspect)
        (BatchMode). A peer that cannot be asked is reported in RV(watch_errors), not as stopped.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The container's name.
        type: str
        required: true
      host:
        description: The node it runs on, as this node's ssh knows it; empty for this node.
        type: str
        default: ""
      rank:
        description: The rank it runs, for the report.
        type: int
        default: 0
      memory_limit:
        description:
          - The container's memory cap as the recipe gives it (C(launch.memory_limit), for example C(110g)),
            named in the report of a rank the kernel's out-of-memory killer ended. Empty when it has none.
        type: str
        default: ""
  watch_every_s:
    description: Seconds between two checks of O(containers).
    type: float
    default: 10
  lost_after_checks:
    description:
      - A peer whose ssh could not connect (exit status 255) at a check of O(containers) is checked again,
        one second apart; when it has not connected at this many checks in a row it is lost
        (RV(stage=node_lost)), which comes before any rank found stopped at the same check (a node that
        stops answering often takes its peers' ranks down). C(0) never counts a peer lost.
    type: int
    default: 3
  load_progress_pattern:
    description:
      - A regular expression (Python) with the named groups C(done) and C(total), matched against the last
        log lines of each watched container at each check of O(containers) (C(docker logs), here or over
        ssh), which is the engine's own weight-loading progress line. The last match of each rank is returned in
        RV(sparkserve_progress). Empty reads no logs.
    type: str
    default: ""
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Wait until the head answers a real completion
  sparkserve.deploy.engine_ready:
    url: "http://127.0.0.1:{{ recipe.api.port }}"
    served_name: "{{ recipe.served_name }}"
    prompt: "2+2="
    wait_s: 20
  register: __engine
  until: __engine.ready or __engine.stopped | length > 0
  retries: 90
  delay: 0
  check_mode: false
"""

RETURN = r"""
ready:
  description: Whether the last poll passed every stage.
  returned: always
  type: bool
stage:
  description:
    - The first stage of the last poll that did not pass (C(health), C(models), C(completion)), or C(ready),
      C(rank_stopped) when a watched container has stopped, or C(node_lost) when a peer stopped answering.
  returned: always
  type: str
  sample: models
stopped:
  description:
    - The watched containers found stopped (C(rank), C(host), C(name), C(state), C(exit_code)).
    - One the kernel's out-of-memory killer ended has C(oom_killed=true), its C(memory_limit) (empty when it
      has none) and C(reason), what happened and what to do, for example that it was killed by its memory
      cap (C(110g)) during the load and what to lower or raise.
  returned: always
  type: list
  elements: dict
lost:
  description: The peers that stopped answering (C(rank), C(host), C(name), C(error)); empty unless RV(stage=node_lost).
  returned: always
  type: list
  elements: dict
watch_errors:
  description: Peers whose containers could not be checked, with the error.
  returned: always
  type: list
  elements: str
detail:
  description: What the probe that decided RV(stage) got (status code and body, or the error).
  returned: always
  type: str
  sample: "GET /health: 503 Service Unavailable: loading"
elapsed_s:
  description: Seconds this call polled.
  returned: always
  type: float
models:
  description: The model ids C(/v1/models) listed at the last poll it answered in this call.
  returned: always
  type: list
  elements: str
sparkserve_progress:
  description:
    - Each watched rank's weight loading, from its last log line matching O(load_progress_pattern), with
      C(kind=load), C(label), C(rank), C(done), C(total) and C(unit=shards). The sparkserve command shows a
      load bar per rank from it (each retry of the caller's C(until) loop is an event it reads).
  returned: always
  type: list
  elements: dict
sparkserve_probe:
  description: The readiness probe's state for the sparkserve command's display (C(state), C(detail)).
  returned: always
  type: dict
"""

import json
import re
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import docker
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.api import (
    answer_text,
    completion_choices,
    completion_payload,
    http_request,
    model_ids,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import one_line, remote_argv

DETAIL_CHARS = 300
MIN_REQUEST_S = 1.0
MIN_POLL_S = 0.1
# Seconds between two checks of a peer whose ssh did not connect, before it counts as lost.
RECHECK_PAUSE_S = 1.0
# A rank that stops often takes its peers down with it (a worker whose head died exits as it loses the
# head), and docker may record the peer's exit before the first rank's: when the ranks found stopped
# exited on their own (none was ended by the out-of-memory killer), those still running are checked
# again this many times, RECHECK_PAUSE_S apart, and every rank that stopped meanwhile is told too.
STOP_SETTLE_CHECKS = 3
# How long one check of a watched container may take (docker inspect, or ssh to the peer and docker inspect).
WATCH_TIMEOUT_S = 10.0
# How long ssh may take to connect to a peer on the management network; a peer that does not connect in
# this time, three checks in a row, is lost (lost_after_checks).
SSH_CONNECT_TIMEOUT_S = 5
# Log lines read from each rank for its weight-loading progress.
LOAD_LOG_LINES = 40
# How a peer is reached: the management network's ssh, never a prompt, a bounded wait to connect.
SSH_ARGV = ("ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}")


@dataclass
class Answer:
    """What one HTTP request got: a status and body, or no answer (status None) and why."""

    status: int | None
    body: str = ""
    error: str = ""

    def describe(self, probe: str) -> str:
        if self.status is None:
            return f"{probe}: {self.error}"
        return answer_text(probe, self.status, self.body, DETAIL_CHARS)


@dataclass
class Poll:
    """One round of the three probes: the first stage that did not pass, and what each probe got."""

    stage: str
    detail: str
    models: list[str] | None
    health: Answer
    models_answer: Answer | None = None
    completion: Answer | None = None


class EngineDeadError(Exception):
    """The engine is known dead; carries the message and the result of the poll that showed it."""

    def __init__(self, msg: str, result: dict[str, Any]) -> None:
        super().__init__(msg)
        self.msg = msg
        self.result = result


def short(text: str) -> str:
    """One line, at most DETAIL_CHARS characters, of a response body."""
    return one_line(text, DETAIL_CHARS)


def request(base: str, method: str, path: str, timeout: float,
            api_key: str | None = None, payload: dict[str, Any] | None = None) -> Answer:
    """Send one request; an HTTP error status is an answer, a network error is not."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = None if payload is None else json.dumps(payload)
    try:
        status, text = http_request(method, base.rstrip("/") + path, body, timeout, headers)
    except TimeoutError:
        return Answer(None, error=f"no answer in {timeout:.1f} s")
    except ConnectionRefusedError:
        return Answer(None, error="connection refused (not listening yet)")
    except OSError as err:
        return Answer(None, error=str(err) or type(err).__name__)
    return Answer(status, text)


def listed_models(answer: Answer | None, path: str) -> tuple[list[str] | None, str]:
    """The ids the model list gives (None when it gave no list), and why not when it gave none."""
    if answer is None:
        return None, f"GET {path}: not asked, the health path gave no answer"
    if answer.status != 200:
        return None, answer.describe(f"GET {path}")
    ids = model_ids(answer.body)
    if ids is None:
        return None, f"GET {path}: 200 but not an OpenAI model list: {short(answer.body)}"
    return ids, ""


def completion_problem(answer: Answer, path: str) -> str:
    """Why the completion does not count (empty when it returned exactly one choice)."""
    if answer.status != 200:
        return answer.describe(f"POST {path}")
    choices = completion_choices(answer.body)
    if choices is None:
        return f"POST {path}: 200 but not an OpenAI completion: {short(answer.body)}"
    if len(choices) != 1:
        return f"POST {path}: 200 with {len(choices)} choices, want 1: {short(answer.body)}"
    return ""


def poll_once(params: dict[str, Any], budget: Callable[[], float]) -> Poll:
    """Probe the health path, the model list and a one-token completion; stop at the first stage that fails.

    The model list is asked whenever the health path answered at all, so a dead
    engine behind a live model list shows. budget() gives the timeout of the next request.
    """
    base, key, name = params["url"], params.get("api_key"), params["served_name"]
    health_path, models_path = params["health_path"], params["models_path"]
    completions_path = params["completions_path"]
    health = request(base, "GET", health_path, budget(), key)
    models_answer = request(base, "GET", models_path, budget(), key) if health.status is not None else None
    ids, models_error = listed_models(models_answer, models_path)
    if health.status != 200:
        return Poll("health", health.describe(f"GET {health_path}"), ids, health, models_answer)
    if ids is None:
        return Poll("models", models_error, ids, health, models_answer)
    if name not in ids:
        return Poll("models", f"GET {models_path}: 200, lists {ids}, not {name!r}", ids, health, models_answer)
    payload = {**completion_payload(name, params["prompt"]), "temperature": 0}
    completion = request(base, "POST", completions_path, budget(), key, payload)
    problem = completion_problem(completion, completions_path)
    if problem:
        return Poll("completion", problem, ids, health, models_answer, completion)
    text = json.loads(completion.body)["choices"][0]
    shown = text.get("text", "") if isinstance(text, dict) else ""
    return Poll("ready", f"POST {completions_path}: 200, 1 choice {str(shown)[:DETAIL_CHARS]!r}", ids, health,
                models_answer, completion)


def dead_reason(poll: Poll, params: dict[str, Any], pattern: re.Pattern[str] | None,
                seen_health_ok: bool, seen_models_ok: bool) -> str:
    """Why this poll shows a dead engine (empty when it does not)."""
    base, health_path, models_path = params["url"], params["health_path"], params["models_path"]
    health = poll.health
    models_live = poll.models_answer is not None and poll.models_answer.status == 200
    fix = "read the ranks' logs for the first error, then tear every rank down and relaunch"
    health_said = f"GET {health_path} answers {health.status} with body {short(health.body)!r}"
    behind = f" behind a live {models_path}" if models_live else ""
    still = (f" while GET {models_path} still answers 200 (vllm#53157: the model list alone does not show a "
             "dead engine)") if models_live else ""

    if health.status is not None and health.status >= 500 and pattern is not None and pattern.search(health.body):
        return f"engine at {base} is dead{behind}: {health_said}{still}; {fix}."
    if health.status == 503 and models_live and (seen_health_ok or seen_models_ok):
        earlier = f"GET {health_path} answered 200" if seen_health_ok else f"GET {models_path} answered 200"
        return (f"engine at {base} is dead{behind}: {earlier} earlier, now {health_said}{still}; {fix}.")
    completion = poll.completion
    if completion is not None and completion.status is not None and completion.status >= 500:
        again = request(base, "GET", health_path, params["request_timeout_s"], params.get("api_key"))
        now = again.describe(f"GET {health_path} now answers")
        return (f"engine at {base} is dead: GET {health_path} answered 200, then the one-token completion "
                f"answered {completion.status} with body {short(completion.body)!r}; {now}; {fix}.")
    return ""


# Runs a command and gives its exit status and output; the tests replace it.
Runner = Callable[[list[str]], tuple[int, str]]


def run_command(argv: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=WATCH_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 255, f"{type(err).__name__}: {err}"
    return done.returncode, (done.stdout + done.stderr).strip()


def container_argv(container: dict[str, Any]) -> list[str]:
    """docker inspect of one container, here or on its peer over ssh."""
    return remote_argv(SSH_ARGV, container.get("host"), docker.inspect_argv(container["name"]))


def oom_reason(memory_limit: str) -> str:
    """What happened to a rank the kernel's out-of-memory killer ended, and what to do, after "rank N on HOST"."""
    if memory_limit:
        return (f"was killed by its memory cap ({memory_limit}) during the load: lower the engine's memory use "
                "(kv cache, max-model-len) or raise launch.memory_limit")
    return ("was killed by the kernel's out-of-memory killer during the load: lower the engine's memory use "
            "(kv cache, max-model-len) or free the node's memory")


def stopped_line(stopped: dict[str, Any]) -> str:
    """One stopped rank, for RV(detail)."""
    if stopped.get("oom_killed"):
        return f"rank {stopped['rank']} on {stopped['host'] or 'this node'} (container {stopped['name']}) " + \
            stopped["reason"]
    return f"rank {stopped['rank']} ({stopped['name']}) {stopped['state']}"


def check_containers(containers: list[dict[str, Any]], run: Runner
                     ) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """The watched containers that have stopped, the checks that failed, and the peers ssh could not reach."""
    stopped: list[dict[str, Any]] = []
    errors: list[str] = []
    unreached: list[dict[str, Any]] = []
    for container in containers:
        where = container.get("host") or "this node"
        status, output = run(container_argv(container))
        report = {"rank": container.get("rank", 0), "host": container.get("host") or "", "name": container["name"]}
        seen = docker.read_inspect(status, output)
        if status == 0:
            if seen.status == docker.FAILED:
                errors.append(f"{where}: docker inspect {container['name']} gave {short(output)!r}")
                continue
            if seen.status == docker.RUNNING:
                continue
            exited = dict(report, state="exited", exit_code=seen.exit_code)
            if seen.status == docker.OOM:
                limit = str(container.get("memory_limit") or "").strip()
                exited.update(oom_killed=True, memory_limit=limit, reason=oom_reason(limit))
            stopped.append(exited)
        elif seen.status == docker.GONE:
            stopped.append(dict(report, state="gone", exit_code=None))
        else:
            error = short(output) or "exit status %d" % status
            errors.append(f"{where}: {error}")
            # ssh exits 255 when it could not connect (the remote command's own failures have other codes).
            if status == 255 and container.get("host"):
                unreached.append(dict(report, error=error))
    return stopped, errors, unreached


def logs_argv(container: dict[str, Any]) -> list[str]:
    """The last lines of one container's log, here or on its peer over ssh."""
    logs = ["docker", "logs", "--tail", str(LOAD_LOG_LINES), container["name"]]
    return remote_argv(SSH_ARGV, container.get("host"), logs)


def load_progress(containers: list[dict[str, Any]], pattern: re.Pattern[str], run: Runner,
                  seen: dict[int, dict[str, Any]]) -> None:
    """Update `seen` (rank to progress) from each container's last progress line; a rank whose log cannot be
    read or shows none keeps what it showed before."""
    for container in containers:
        status, output = run(logs_argv(container))
        if status != 0:
            continue
        # Progress bars redraw with carriage returns: the last match on the last lines is the newest.
        matches = list(pattern.finditer(output.replace("\r", "\n")))
        if not matches:
            continue
        rank = int(container.get("rank", 0))
        done, total = int(matches[-1].group("done")), int(matches[-1].group("total"))
        seen[rank] = {"kind": "load", "label": f"rank {rank}", "rank": rank, "done": done, "total": total,
                      "unit": "shards"}


def confirm_lost(unreached: list[dict[str, Any]], checks: int, run: Runner,
                 sleep: Callable[[float], None]) -> list[dict[str, Any]]:
    """The peers whose ssh could not connect at `checks` checks in a row (the first one given, the others
    RECHECK_PAUSE_S apart); none when `checks` is 0."""
    if checks <= 0:
        return []
    still = unreached
    for _ in range(checks - 1):
        if not still:
            break
        sleep(RECHECK_PAUSE_S)
        _, _, still = check_containers([{"name": u["name"], "host": u["host"], "rank": u["rank"]} for u in still], run)
    return still


def settle_stopped(stopped: list[dict[str, Any]], containers: list[dict[str, Any]], run: Runner,
                   sleep: Callable[[float], None]) -> list[dict[str, Any]]:
    """The ranks found stopped and those that stop within STOP_SETTLE_CHECKS more checks (only while no
    rank found stopped was ended by the out-of-memory killer), those the killer ended first, then by rank."""
    found = {s["name"] for s in stopped}
    running = [c for c in containers if c["name"] not in found]
    for _ in range(STOP_SETTLE_CHECKS):
        if not running or any(s.get("oom_killed") for s in stopped):
            break
        sleep(RECHECK_PAUSE_S)
        more, _, _ = check_containers(running, run)
        stopped = stopped + more
        ended = {s["name"] for s in more}
        running = [c for c in running if c["name"] not in ended]
    return sorted(stopped, key=lambda s: (not s.get("oom_killed"), s["rank"]))


def wait_ready(params: dict[str, Any], clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep, run: Runner = run_command) -> dict[str, Any]:
    """Poll until the engine is ready, a watched rank stopped or about wait_s seconds passed.

    Raises EngineDeadError when the engine is dead.
    """
    url = urllib.parse.urlsplit(params["url"])
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ValueError(f"url {params['url']!r} is not an http(s) base URL like http://127.0.0.1:8000")
    for key in ("health_path", "models_path", "completions_path"):
        if not str(params[key]).startswith("/"):
            raise ValueError(f"{key} {params[key]!r} is not a path; it starts with /")
    regex = params.get("dead_if_health_body_matches")
    pattern = re.compile(regex) if regex else None
    timeout_s = max(float(params["request_timeout_s"]), 0.1)
    poll_s = max(float(params["poll_s"]), MIN_POLL_S)
    watch_every_s = max(float(params["watch_every_s"]), MIN_POLL_S)
    start = clock()
    deadline = start + max(float(params["wait_s"]), 0.0)
    next_watch = start

    def budget() -> float:
        return min(timeout_s, max(deadline - clock(), MIN_REQUEST_S))

    lost_after = int(params.get("lost_after_checks", 3))
    progress_regex = params.get("load_progress_pattern") or ""
    progress_pattern = re.compile(progress_regex) if progress_regex else None
    if progress_pattern is not None and not {"done", "total"} <= set(progress_pattern.groupindex):
        raise ValueError(f"load_progress_pattern {progress_regex!r} has no named groups done and total")
    loading: dict[int, dict[str, Any]] = {}

    def reported(result: dict[str, Any]) -> dict[str, Any]:
        result["sparkserve_progress"] = [loading[rank] for rank in sorted(loading)]
        result["sparkserve_probe"] = {"state": result["stage"], "detail": result.get("detail", "")}
        return result

    seen_health_ok = seen_models_ok = False
    models: list[str] = []
    watch_errors: list[str] = []
    while True:
        if params["containers"] and clock() >= next_watch:
            stopped, watch_errors, unreached = check_containers(params["containers"], run)
            lost = confirm_lost(unreached, lost_after, run, sleep)
            if progress_pattern is not None and not lost and not stopped:
                # A peer ssh did not reach at this check is not asked for its log (it would wait out the timeout).
                away = {u["host"] for u in unreached}
                load_progress([c for c in params["containers"] if not c.get("host") or c["host"] not in away],
                              progress_pattern, run, loading)
            next_watch = clock() + watch_every_s
            if lost:
                names = ", ".join(f"{u['host']} (rank {u['rank']}): {u['error']}" for u in lost)
                return reported({"ready": False, "stage": "node_lost",
                                 "detail": f"stopped answering before ready: {names}",
                                 "elapsed_s": round(clock() - start, 2), "models": models, "stopped": stopped,
                                 "lost": lost, "watch_errors": watch_errors})
            if stopped:
                stopped = settle_stopped(stopped, params["containers"], run, sleep)
                # An out-of-memory reason has commas of its own: such ranks are set apart by semicolons.
                names = ("; " if any(s.get("oom_killed") for s in stopped) else ", ").join(map(stopped_line, stopped))
                return reported({"ready": False, "stage": "rank_stopped", "detail": f"stopped before ready: {names}",
                                 "elapsed_s": round(clock() - start, 2), "models": models, "stopped": stopped,
                                 "lost": [], "watch_errors": watch_errors})
        poll = poll_once(params, budget)
        if poll.models is not None:
            models = poll.models
        result = {"ready": poll.stage == "ready", "stage": poll.stage, "detail": poll.detail,
                  "elapsed_s": round(clock() - start, 2), "models": models, "stopped": [], "lost": [],
                  "watch_errors": watch_errors}
        dead = dead_reason(poll, params, pattern, seen_health_ok, seen_models_ok)
        if dead:
            raise EngineDeadError(dead, reported(result))
        if poll.stage == "ready":
            return reported(result)
        seen_health_ok = seen_health_ok or poll.health.status == 200
        seen_models_ok = seen_models_ok or (poll.models_answer is not None and poll.models_answer.status == 200)
        remaining = deadline - clock()
        if remaining <= 0:
            return reported(result)
        sleep(min(poll_s, remaining))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "served_name": {"type": "str", "required": True},
            "prompt": {"type": "str", "default": "2+2="},
            "api_key": {"type": "str", "no_log": True},
            "wait_s": {"type": "float", "default": 20},
            "poll_s": {"type": "float", "default": 2},
            "request_timeout_s": {"type": "float", "default": 10},
            "dead_if_health_body_matches": {"type": "str", "default": "dead|EngineDeadError"},
            "health_path": {"type": "str", "default": "/health"},
            "models_path": {"type": "str", "default": "/v1/models"},
            "completions_path": {"type": "str", "default": "/v1/completions"},
            "containers": {"type": "list", "elements": "dict", "default": [], "options": {
                "name": {"type": "str", "required": True},
                "host": {"type": "str", "default": ""},
                "rank": {"type": "int", "default": 0},
                "memory_limit": {"type": "str", "default": ""},
            }},
            "watch_every_s": {"type": "float", "default": 10},
            "lost_after_checks": {"type": "int", "default": 3},
            "load_progress_pattern": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    try:
        result = wait_ready(module.params)
    except EngineDeadError as dead:
        module.fail_json(msg=dead.msg, changed=False, **dead.result)
    except re.error as err:
        module.fail_json(msg=f"dead_if_health_body_matches or load_progress_pattern is not a regular expression: {err}")
    except ValueError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
