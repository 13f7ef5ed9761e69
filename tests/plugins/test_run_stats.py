"""The run's contract with the sparkserve command (module_utils/run_stats.py): the schema, and the writers' side.

Every ``ansible.builtin.set_stats`` of playbooks/ and roles/ writes only the keys of the contract, with the
fields its TypedDict names and every required one; a field written as a whole ``{{ variable }}`` is followed
to the mapping that variable holds (the task's own vars, the role's vars and defaults). The CLI's side (the
recorded runs validate, the readers read nothing else) is tests/cli/test_cli_contract.py.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils import run_stats
from ansible_collections.sparkserve.deploy.plugins.module_utils.run_stats import (
    problems,
    result_problems,
    stats_problems,
)

ROOT = Path(__file__).resolve().parents[2]
SET_STATS = ("ansible.builtin.set_stats", "set_stats")
WHOLE_VARIABLE = re.compile(r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")


def _yaml_files() -> list[Path]:
    files = sorted((ROOT / "playbooks").rglob("*.yml")) + sorted((ROOT / "roles").rglob("*.yml"))
    return [f for f in files if "molecule" not in f.parts]


def _load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return None  # not ours to judge here: yamllint and ansible-lint read every file


def _tasks(node: Any) -> list[dict[str, Any]]:
    """Every mapping in NODE (a task file, a play, a block) that calls set_stats."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if any(key in node for key in SET_STATS):
            found.append(node)
        for value in node.values():
            found += _tasks(value)
    elif isinstance(node, list):
        for item in node:
            found += _tasks(item)
    return found


def _role_vars(path: Path) -> dict[str, Any]:
    """The variables of the role PATH belongs to (vars/ over defaults/), for following a {{ variable }}."""
    parts = path.relative_to(ROOT).parts
    if parts[0] != "roles":
        return {}
    role = ROOT / "roles" / parts[1]
    found: dict[str, Any] = {}
    for folder in ("defaults", "vars"):
        for file in sorted((role / folder).rglob("*.yml")) if (role / folder).is_dir() else []:
            data = _load(file)
            found.update(data if isinstance(data, dict) else {})
    return found


def _writers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(file, set_stats task, the variables it can see) of every set_stats in playbooks/ and roles/."""
    found = []
    for path in _yaml_files():
        for task in _tasks(_load(path)):
            seen = dict(_role_vars(path), **(task.get("vars") or {}))
            found.append((str(path.relative_to(ROOT)), task, seen))
    return found


def _literal(value: Any) -> bool:
    return not (isinstance(value, str) and "{{" in value or "{%" in str(value))


def _shape_problems(kind: Any, value: Any, where: str, seen: dict[str, Any]) -> list[str]:
    """What is wrong with a written VALUE of KIND; Jinja values are judged by what they can be read as."""
    if isinstance(value, str):
        match = WHOLE_VARIABLE.match(value.strip())
        if match and isinstance(seen.get(match.group(1)), dict | list):
            return _shape_problems(kind, seen[match.group(1)], "%s (%s)" % (where, match.group(1)), seen)
        if not _literal(value):
            return []  # a templated value: its type is judged on the recorded runs (tests/cli)
    if isinstance(value, dict) and typing.is_typeddict(kind):
        hints = run_stats.fields(kind)
        found = ["%s has no %s" % (where, key) for key in sorted(kind.__required_keys__) if key not in value]
        for key, item in value.items():
            if key not in hints:
                if kind not in run_stats.OPEN:
                    found.append("%s.%s is not a field of %s" % (where, key, kind.__name__))
                continue
            found += _shape_problems(hints[key], item, "%s.%s" % (where, key), seen)
        return found
    if _literal(value) and not isinstance(value, dict):
        return run_stats.check(kind, value, where)
    return []


WRITERS = _writers()


def test_set_stats_is_found() -> None:
    """The walk finds the writers the CLI is known to read (a broken walk would pass every check below)."""
    keys = {key for _, task, _ in WRITERS for key in (task.get("ansible.builtin.set_stats") or {}).get("data", {})}
    assert {run_stats.ENDPOINT, run_stats.FAILURE, run_stats.STATUS, run_stats.LOGS} <= keys


@pytest.mark.parametrize(("where", "task", "seen"), WRITERS, ids=[w for w, _, _ in WRITERS])
def test_every_set_stats_writes_the_contract(where: str, task: dict[str, Any], seen: dict[str, Any]) -> None:
    args = next(task[key] for key in SET_STATS if key in task)
    assert args.get("per_host") in (None, False), "%s: the sparkserve command reads the run's global stats" % where
    data = args.get("data")
    assert isinstance(data, dict) and data, "%s: set_stats without a data mapping" % where
    found: list[str] = []
    for key, value in data.items():
        if key not in run_stats.STATS:
            found.append("%s is not a stat key of run_stats.py (%s)" % (key, ", ".join(sorted(run_stats.STATS))))
            continue
        found += _shape_problems(run_stats.STATS[key], value, key, seen)
    assert found == [], "%s: %s" % (where, "; ".join(found))


def test_a_good_endpoint_passes() -> None:
    endpoint = {"url": "http://10.0.0.1:8000", "loopback": False, "model_name": "m", "api_port": 8000,
                "ranks": [{"rank": 0, "node": "spark-1"}], "nodes": ["spark-1"]}
    assert problems(run_stats.ENDPOINT, endpoint) == []


def test_each_problem_is_one_sentence_naming_the_field() -> None:
    endpoint = {"url": "http://10.0.0.1:8000", "loopback": "no", "api_port": "8000", "colour": "blue",
                "ranks": [{"rank": True, "node": "spark-1"}]}
    assert problems(run_stats.ENDPOINT, endpoint) == [
        "sparkserve_endpoint has no model_name; the sparkserve command needs it (plugins/module_utils/run_stats.py).",
        "sparkserve_endpoint.loopback is 'no'; it must be true or false.",
        "sparkserve_endpoint.api_port is '8000'; it must be an integer.",
        "sparkserve_endpoint.colour is not a field of Endpoint; add it to plugins/module_utils/run_stats.py or "
        "remove it.",
        "sparkserve_endpoint.ranks[0].rank is True; it must be an integer.",
    ]


def test_open_mappings_let_other_fields_through() -> None:
    status = {"deployment": "d", "recipe": "r", "ranks": [], "nodes": [
        {"node": "spark-1", "fabric": {"gid_index": 3, "mtu": 9000}, "weights": {"verified": "yes"}}]}
    assert problems(run_stats.STATUS, status) == [
        "sparkserve_status.nodes[0].weights.verified is 'yes'; it must be true or false."]


def test_optional_and_either_types() -> None:
    assert problems(run_stats.PROGRESS, [{"kind": "load", "done": 3, "rank": None}]) == []
    assert problems(run_stats.PROGRESS, {"kind": "fanout", "done": 1, "total": 4, "unit": "bytes"}) == []
    assert problems(run_stats.PROGRESS, "half") == [
        "sparkserve_progress is 'half'; it must be a mapping or a list."]


def test_unknown_keys_are_refused() -> None:
    assert stats_problems({"sparkserve_endpointz": {}, "other_tool": 1}) == [
        "sparkserve_endpointz is not a stat key of the run's contract; name one of sparkserve_diagnose, "
        "sparkserve_endpoint, sparkserve_endpoints, sparkserve_failure, sparkserve_gateway, sparkserve_logs, "
        "sparkserve_monitoring, "
        "sparkserve_status, sparkserve_statuses, sparkserve_unmanaged, or add it to plugins/module_utils/run_stats.py."]
    assert problems("sparkserve_nope", 1)[0].startswith("sparkserve_nope is not a key of the run's contract")


def test_several_deployments_are_mappings_by_name() -> None:
    assert problems("sparkserve_unmanaged", {"spark-2": ["old-model"]}) == []
    assert problems("sparkserve_unmanaged", {"spark-2": "old-model"}) == [
        "sparkserve_unmanaged.spark-2 is 'old-model'; it must be a list."]
    assert problems("sparkserve_statuses", {"lab-tp1": {"ranks": []}}) == [
        "sparkserve_statuses.lab-tp1 has no recipe; the sparkserve command needs it "
        "(plugins/module_utils/run_stats.py)."]


def test_result_keys_are_checked_in_each_loop_item() -> None:
    result = {"changed": False, "results": [{"sparkserve_probe": {"state": "health"}},
                                            {"sparkserve_probe": {"detail": "503"}}]}
    assert result_problems(result) == [
        "sparkserve_probe has no state; the sparkserve command needs it (plugins/module_utils/run_stats.py)."]
