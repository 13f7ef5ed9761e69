#!/usr/bin/python
"""How far a background download or fetch of a model revision is, and whether its job has finished."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_progress
short_description: Report how far a background weights transfer is, for an until loop to follow
version_added: "0.2.0"
description:
  - Reads the state of a task started with C(async) and C(poll=0) (its job file, as C(async_status) does) and
    counts the bytes that have arrived in the revision folder it fills, against the revision's size.
  - The size comes from the folder's manifest (a fetch from an upstream node) or from the file the download
    program writes when it starts (a download from the hub). Bytes that have arrived are whole files,
    rsync's partial files and the hub client's unfinished downloads.
  - Waits up to O(wait_s) for the job to end, then reports. Meant for an C(until) loop on RV(finished)
    with no delay; each retry is an event, so the sparkserve command shows a bar with rate and time left,
    and C(ansible-playbook -v) shows the numbers. Reads only; changes nothing.
  - Once the job has ended, returns what it needs of the job's result in RV(job), and fails with the job's
    message when the job failed (unless O(fail_on_job_failure=false)).
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  job_id:
    description: The C(ansible_job_id) of the background task.
    type: str
    required: true
  async_dir:
    description: Where the node keeps async job files (the shell plugin's C(async_dir)).
    type: path
    default: ~/.ansible_async
  path:
    description: The revision folder being filled.
    type: path
    required: true
  kind:
    description: What moves the bytes, for the display.
    type: str
    choices: [download, fanout]
    required: true
  label:
    description: What is shown beside the bar (the repository).
    type: str
    required: true
  wait_s:
    description: The longest one call waits for the job to end before it reports.
    type: float
    default: 1
  job_keys:
    description:
      - The keys of the job's result returned in RV(job); a dotted key (C(container.Output)) reaches into a
        mapping. Empty returns every key but C(invocation). Name only what is safe to show - the result of a
        task that had secrets in its arguments may repeat them.
    type: list
    elements: str
    default: []
  fail_on_job_failure:
    description: Fail, with the job's message, when the job failed.
    type: bool
    default: true
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Follow the fetch
  sparkserve.deploy.weights_progress:
    job_id: "{{ __fetch_job.ansible_job_id }}"
    path: /var/lib/sparkserve/models/org/name/0123456789abcdef0123456789abcdef01234567
    kind: fanout
    label: org/name
  register: __progress
  until: __progress.finished
  retries: 86400
  delay: 0
"""

RETURN = r"""
finished:
  description: Whether the background job has ended (successfully or not; read its result with async_status).
  returned: always
  type: bool
job:
  description: Once RV(finished), the keys of the job's result that O(job_keys) names (dotted keys as given).
  returned: when finished
  type: dict
sparkserve_progress:
  description: C(kind), C(label), C(done) and C(total) bytes (C(total) 0 while unknown), C(unit=bytes).
  returned: always
  type: dict
  sample: {kind: fanout, label: org/name, done: 1073741824, total: 4294967296, unit: bytes}
"""

import json
import os
import time
from typing import Any, Callable

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.weights import bytes_arrived, expected_bytes

# How often a call looks at the job file while it waits.
POLL_S = 0.1


def job_result(async_dir: str, job_id: str) -> dict[str, Any] | None:
    """The task's final result once the job file holds it (async_wrapper replaces its "started" record)."""
    try:
        with open(os.path.join(async_dir, job_id), encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"no async job {job_id} in {async_dir}") from None
    except (OSError, ValueError):
        return None  # not written yet, or being written
    if not isinstance(data, dict):
        return {"failed": True, "msg": f"job {job_id} left {str(data)[:200]!r}"}
    return None if "started" in data and not data.get("finished") else data


def wait_for_job(async_dir: str, job_id: str, wait_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any] | None:
    """The job's result once it has ended, looking every POLL_S for at most wait_s; None while it runs."""
    deadline = clock() + max(wait_s, 0.0)
    while True:
        result = job_result(async_dir, job_id)
        if result is not None or clock() >= deadline:
            return result
        sleep(min(POLL_S, max(deadline - clock(), 0.0)))


def pick(result: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The named keys of a result (a dotted key reaches into mappings), or all of it but its invocation."""
    if not keys:
        return {k: v for k, v in result.items() if k != "invocation"}
    picked: dict[str, Any] = {}
    for key in keys:
        value: Any = result
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            picked[key] = value
    return picked


def progress(path: str, kind: str, label: str) -> dict[str, Any]:
    total = expected_bytes(path) or 0
    done = bytes_arrived(path) if os.path.isdir(path) else 0
    return {"kind": kind, "label": label, "done": min(done, total) if total else done, "total": total,
            "unit": "bytes"}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "job_id": {"type": "str", "required": True},
            "async_dir": {"type": "path", "default": "~/.ansible_async"},
            "path": {"type": "path", "required": True},
            "kind": {"type": "str", "required": True, "choices": ["download", "fanout"]},
            "label": {"type": "str", "required": True},
            "wait_s": {"type": "float", "default": 1.0},
            "job_keys": {"type": "list", "elements": "str", "default": []},
            "fail_on_job_failure": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = wait_for_job(p["async_dir"], p["job_id"], p["wait_s"])
    except ValueError as err:
        module.fail_json(msg=str(err), finished=True)
    report: dict[str, Any] = {"changed": False, "finished": result is not None,
                              "sparkserve_progress": progress(p["path"], p["kind"], p["label"])}
    if result is not None:
        report["job"] = pick(result, p["job_keys"])
        report["changed"] = bool(result.get("changed"))
        if result.get("failed") and p["fail_on_job_failure"]:
            module.fail_json(msg=str(result.get("msg") or f"job {p['job_id']} failed"), **report)
    module.exit_json(**report)


if __name__ == "__main__":
    main()
