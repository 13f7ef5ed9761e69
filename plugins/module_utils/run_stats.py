"""What a run hands the sparkserve command: the custom stats and the module result keys it reads.

The playbooks talk to the ``sparkserve`` command (sparkserve/) through two
channels, both in ansible-runner's event stream. This module is their one
written contract: the key names, each key's fields as a TypedDict, and
``stats_problems`` / ``result_problems`` that check a value against them.
The CLI imports the names and types from here; tests check both sides (every
``ansible.builtin.set_stats`` of playbooks/ and roles/ writes only these keys
and fields; the recorded runs of tests/cli/fixtures validate, and the CLI's
readers read no field that is not here).

Custom stats (``ansible.builtin.set_stats`` with ``per_host: false``; the
final ``playbook_on_stats`` event's ``artifact_data``; each a mapping but
``sparkserve_endpoint``):

``sparkserve_endpoint`` (``Endpoint``)
    Where the deployment serves after ``up``, ``upgrade`` or ``rollback``
    (roles/engine, endpoint.yml): the URL, the model and image it serves, the
    nodes and ranks, and whether the API listens on the head's loopback only
    (the summary then prints the ssh tunnel). ``up --ask`` asks it.
``sparkserve_failure`` (``FailureStat``)
    The playbook's own account of a failure (the launch's rescue, the
    release's report): the stage, node, rank, a one-paragraph message, the
    failed rank's last log lines and the folder of the full logs. The
    summary prefers it to the failed task's message, and its stage picks
    the exit code.
``sparkserve_status`` (``Status``)
    ``sparkserve status``'s one screen (roles/engine, status.yml): the
    deployment and recipe, the endpoint, each rank's container, the head's
    readiness answers, the supervisor and each node's guard, flusher,
    fabric and weights.
``sparkserve_logs`` (``Logs``)
    ``sparkserve logs``: each rank's last log lines, with the ssh command
    that follows its log (``--follow``).
``sparkserve_diagnose`` (``Diagnose``)
    ``sparkserve diagnose``: the path of the masked archive on the controller.
``sparkserve_monitoring`` (``Monitoring``)
    Where Prometheus listens after the monitoring stage, with the targets up
    and how to tunnel to it when it listens on loopback.

Module result keys (in a task's result, or in each item of a loop's
``results``; read from ``runner_on_ok`` and ``runner_retry`` events, so a
task's ``until`` retries draw live):

``sparkserve_progress`` (``ProgressReport``, one or a list)
    A progress bar: ``kind`` names the bar (fanout, load, ...), ``label``
    what moves, ``done`` of ``total`` in ``unit``; ``rank`` where the bar is
    one rank's. Written by weights_progress and engine_ready.
``sparkserve_probe`` (``ProbeReport``)
    A readiness probe's state and detail (engine_ready), shown per rank
    while the launch waits.

A stat's value is the templated result, so numbers are numbers and truths
are booleans (Ansible's native types). A field the TypedDict marks Required
is always written; the others may be absent. Mappings marked open
(``OPEN``) come whole from another role's fact (the fabric, weights and
supervisor status) and may carry more fields than the CLI reads.

Pure standard library; the sparkserve command imports it from the checkout.
"""

import typing
from typing import Any, Dict, List, Mapping, Optional, Required, TypedDict, Union

ENDPOINT = "sparkserve_endpoint"
FAILURE = "sparkserve_failure"
STATUS = "sparkserve_status"
LOGS = "sparkserve_logs"
DIAGNOSE = "sparkserve_diagnose"
MONITORING = "sparkserve_monitoring"
PROGRESS = "sparkserve_progress"
PROBE = "sparkserve_probe"
# Several deployments: each one's endpoint and status by its name, and the deployments running on a node that
# the inventory does not list (node -> names).
ENDPOINTS = "sparkserve_endpoints"
STATUSES = "sparkserve_statuses"
UNMANAGED = "sparkserve_unmanaged"
# The gateway in front of the deployments: its URL, and the names of its keys (never a key).
GATEWAY = "sparkserve_gateway"

PREFIX = "sparkserve_"


class RankPlace(TypedDict, total=False):
    """Where one rank runs."""

    rank: Required[int]
    node: Required[str]  # the inventory name of the Spark
    container: str  # the rank's container name


class Endpoint(TypedDict, total=False):
    """Where a deployment serves, and what."""

    url: Required[str]  # the API's base URL as seen from the controller (http://HOST:PORT)
    api_host: str  # the address the API binds to on the head (0.0.0.0, 127.0.0.1, ...)
    api_port: int
    loopback: Required[bool]  # the API listens on the head's loopback only: reach it through an ssh tunnel
    head: str  # the inventory name of the head (rank 0)
    head_address: str  # the head's address for ssh (ansible_host)
    ssh_user: str
    model_name: Required[str]  # the served model name, as /v1/models lists it
    model_repo: str
    model_revision: str  # the full commit of the weights
    image: str  # the engine image, pinned by digest
    image_digest: str  # sha256:... ("" when the image is not pinned by digest)
    engine: str  # the engine adapter's name (vllm, sglang)
    deployment: str
    recipe: str
    nodes: List[str]  # the Sparks of the deployment, in inventory order
    ranks: List[RankPlace]


class FailureStat(TypedDict, total=False):
    """The playbook's own account of what failed."""

    stage: Required[str]  # launch, upgrade, ...: picks the exit code (launch is 5)
    node: Required[str]
    rank: int
    message: Required[str]  # what failed and what to do, one paragraph
    log_tail: List[str]  # the failed rank's last log lines
    logs_dir: str  # the head's folder of every rank's full log


class RankStatus(TypedDict, total=False):
    """One rank's container as docker reports it."""

    rank: Required[int]
    node: Required[str]
    container: str
    state: str  # docker's State.Status (running, exited, ...), or absent
    running: bool
    started_at: str  # ISO 8601, "" when never started
    exit_code: Optional[int]
    image: str  # the image of the running container (its sparkserve.image label)
    recipe: str  # the recipe of the running container (its sparkserve.recipe label)
    fingerprint_matches: bool  # the container is the one the recipe renders now


class Readiness(TypedDict, total=False):
    """What the head's API answered."""

    health: Optional[int]  # the HTTP status of /health, None when it did not answer
    models: List[str]  # the ids /v1/models lists


class SupervisorEvent(TypedDict, total=False):
    """One line of the supervisor's events."""

    time: str
    event: str
    cause: str


class SupervisorStatus(TypedDict, total=False):
    """The supervisor of the deployment (roles/supervisor, status.yml)."""

    unit: str
    state: str  # watching, needs ..., not running
    restarts_total: int
    restarts_last_hour: int
    last_events: List[SupervisorEvent]


class UnitState(TypedDict, total=False):
    """A systemd unit of the node (the memory guard, the page-cache flusher)."""

    state: str  # systemctl is-active's answer, or none
    last_events: List[Any]  # the guard's last events (JSON lines)


class FabricLink(TypedDict, total=False):
    device: str  # the RDMA device
    state: str  # ACTIVE, DOWN, ...
    phys_state: str


class FabricStatus(TypedDict, total=False):
    """The node's fabric (roles/fabric, status.yml)."""

    gid_index: Optional[int]  # the RoCE v2 GID index of the fabric address
    links: List[FabricLink]
    problems: List[str]


class WeightsRepo(TypedDict, total=False):
    repo: str
    missing: int
    corrupt: int


class WeightsStatus(TypedDict, total=False):
    """The node's copy of the weights (roles/weights, status.yml)."""

    verified: bool
    problem: str
    repos: List[WeightsRepo]


class NodeStatus(TypedDict, total=False):
    """One node's sparkserve services."""

    node: Required[str]
    guard: UnitState
    flusher: UnitState
    fabric: FabricStatus
    weights: WeightsStatus


class Status(TypedDict, total=False):
    """sparkserve status's screen."""

    deployment: Required[str]
    recipe: Required[str]
    endpoint: Endpoint
    ranks: Required[List[RankStatus]]
    nodes: Required[List[NodeStatus]]
    supervisor: SupervisorStatus  # {} where the head has no supervisor status
    readiness: Readiness


class DeploymentStatus(TypedDict, total=False):
    """One deployment's part of sparkserve status, with several."""

    recipe: Required[str]
    endpoint: Endpoint
    ranks: Required[List[RankStatus]]


class RankLog(TypedDict, total=False):
    """One rank's last log lines."""

    rank: Required[int]
    node: Required[str]
    container: str
    lines: Required[List[str]]
    follow: List[str]  # the argv that follows the rank's log from the controller (ssh ... docker logs --follow)


class Logs(TypedDict):
    ranks: List[RankLog]


class Diagnose(TypedDict):
    archive: str  # the absolute path of the archive on the controller


class Monitoring(TypedDict, total=False):
    """Where Prometheus is."""

    server: Required[str]  # the inventory name of the host running Prometheus
    url: Required[str]  # Prometheus' API as the server reaches it
    port: Required[int]
    loopback: Required[bool]  # it listens on loopback only: tunnel to it
    address: str  # the server's address for ssh
    ssh_user: str
    targets_up: int


class Gateway(TypedDict, total=False):
    """Where the gateway is."""

    url: Required[str]  # its base URL (the OpenAI base URL is URL/v1)
    open: Required[bool]  # no key is set: it listens on the gateway node's loopback and asks for none
    keys: Required[List[str]]  # the keys' names
    models: List[str]
    node: str
    address: str  # the gateway node's address for ssh
    ssh_user: str
    port: int


class ProgressReport(TypedDict, total=False):
    """One progress bar's sample."""

    kind: Required[str]  # what the bar is (fanout, relay, load, ...); one bar per host, kind, label and rank
    label: str
    rank: Optional[int]
    done: Required[int]
    total: int  # 0 while unknown
    unit: str  # bytes, shards, ...


class ProbeReport(TypedDict, total=False):
    """A readiness probe's state."""

    state: Required[str]  # the probe's stage (container, health, models, completion, ready, ...)
    detail: str
    rank: Optional[int]


# What each key holds: a stat key a mapping of this type (the endpoint too), a result key one or a list.
STATS: Dict[str, Any] = {
    ENDPOINT: Endpoint,
    FAILURE: FailureStat,
    STATUS: Status,
    LOGS: Logs,
    DIAGNOSE: Diagnose,
    MONITORING: Monitoring,
    ENDPOINTS: Dict[str, Endpoint],
    STATUSES: Dict[str, DeploymentStatus],
    UNMANAGED: Dict[str, List[str]],
    GATEWAY: Gateway,
}
RESULTS: Dict[str, Any] = {
    PROGRESS: Union[ProgressReport, List[ProgressReport]],
    PROBE: ProbeReport,
}
# Mappings filled whole from another role's fact: more fields than these are let through.
OPEN = (SupervisorStatus, FabricStatus, WeightsStatus, UnitState)

_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}


def _words(hint: Any) -> str:
    if hint in _WORDS:
        return _WORDS[hint]
    origin = typing.get_origin(hint)
    if origin is Union:
        return " or ".join(_words(arg) for arg in typing.get_args(hint))
    if origin in (list, List):
        return "a list"
    if typing.is_typeddict(hint) or origin in (dict, Dict, Mapping):
        return "a mapping"
    return str(hint)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check(hint: Any, value: Any, path: str) -> List[str]:
    """Every way VALUE at PATH is not of HINT (a type of this module), one sentence each."""
    if hint is Any:
        return []
    origin = typing.get_origin(hint)
    if origin is Union:
        for arg in typing.get_args(hint):
            if not check(arg, value, path):
                return []
        return ["%s is %s; it must be %s." % (path, _show(value), _words(hint))]
    if origin in (list, List):
        if not isinstance(value, list):
            return ["%s is %s; it must be a list." % (path, _show(value))]
        (item,) = typing.get_args(hint)
        return [p for i, one in enumerate(value) for p in check(item, one, "%s[%d]" % (path, i))]
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            return ["%s is %s; it must be a mapping." % (path, _show(value))]
        key_hint, item_hint = typing.get_args(hint)
        return [p for key, one in value.items()
                for p in check(key_hint, key, "%s key" % path) + check(item_hint, one, "%s.%s" % (path, key))]
    if typing.is_typeddict(hint):
        return _check_mapping(hint, value, path)
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is type(None):
        ok = value is None
    else:
        ok = isinstance(value, hint)
    return [] if ok else ["%s is %s; it must be %s." % (path, _show(value), _words(hint))]


def fields(kind: Any) -> Dict[str, Any]:
    """The fields of a TypedDict of this module, name -> type."""
    return typing.get_type_hints(kind)


def _check_mapping(kind: Any, value: Any, path: str) -> List[str]:
    if not isinstance(value, Mapping):
        return ["%s is %s; it must be a mapping." % (path, _show(value))]
    hints = fields(kind)
    problems = ["%s has no %s; the sparkserve command needs it (plugins/module_utils/run_stats.py)." % (path, key)
                for key in sorted(kind.__required_keys__) if key not in value]
    for key, item in value.items():
        if key in hints:
            problems += check(hints[key], item, "%s.%s" % (path, key))
        elif kind not in OPEN:
            problems.append("%s.%s is not a field of %s; add it to plugins/module_utils/run_stats.py or remove it."
                            % (path, key, kind.__name__))
    return problems


def problems(key: str, value: Any) -> List[str]:
    """Every way VALUE is not what the stat or result key KEY holds, one sentence each ([] when it is)."""
    kind = STATS.get(key, RESULTS.get(key))
    if kind is None:
        return ["%s is not a key of the run's contract; name one of %s, or add it to "
                "plugins/module_utils/run_stats.py." % (key, ", ".join(sorted(STATS) + sorted(RESULTS)))]
    return check(kind, value, key)


def stats_problems(stats: Mapping[str, Any]) -> List[str]:
    """Every way a run's custom stats break the contract: an unknown sparkserve_ key, or a value of the wrong shape."""
    found: List[str] = []
    for key, value in stats.items():
        if not str(key).startswith(PREFIX):
            continue
        found += problems(key, value) if key in STATS else [
            "%s is not a stat key of the run's contract; name one of %s, or add it to "
            "plugins/module_utils/run_stats.py." % (key, ", ".join(sorted(STATS)))]
    return found


def result_problems(result: Mapping[str, Any]) -> List[str]:
    """Every way a task's result (and each item of its loop) breaks the contract of the result keys."""
    found: List[str] = []
    sources = [result] + [r for r in result.get("results") or [] if isinstance(r, Mapping)]
    for source in sources:
        for key in RESULTS:
            if key in source:
                found += problems(key, source[key])
    return found
