#!/usr/bin/python3
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
  - Meant for an C(until) loop on RV(finished); each retry is an event, so the sparkserve command shows a
    bar with rate and time left, and C(ansible-playbook -v) shows the numbers. Reads only; changes nothing.
    The job's own result is read after the loop with C(ansible.builtin.async_status).
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
  retries: 1800
  delay: 2
"""

RETURN = r"""
finished:
  description: Whether the background job has ended (successfully or not; read its result with async_status).
  returned: always
  type: bool
sparkserve_progress:
  description: C(kind), C(label), C(done) and C(total) bytes (C(total) 0 while unknown), C(unit=bytes).
  returned: always
  type: dict
  sample: {kind: fanout, label: org/name, done: 1073741824, total: 4294967296, unit: bytes}
"""

import json
import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.weights import bytes_arrived, expected_bytes


def job_finished(async_dir: str, job_id: str) -> bool:
    """Whether the job file holds the task's final result (async_wrapper replaces its "started" record)."""
    try:
        with open(os.path.join(async_dir, job_id), encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"no async job {job_id} in {async_dir}") from None
    except (OSError, ValueError):
        return False  # not written yet, or being written
    return not isinstance(data, dict) or "started" not in data or bool(data.get("finished"))


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
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        finished = job_finished(p["async_dir"], p["job_id"])
    except ValueError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, finished=finished, sparkserve_progress=progress(p["path"], p["kind"], p["label"]))


if __name__ == "__main__":
    main()
