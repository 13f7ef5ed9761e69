#!/usr/bin/python
"""Read the release a head records as applied, and ask its API whether it serves, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_read
short_description: Read the release a head records as applied, and ask its API whether it serves
version_added: "0.6.0"
description:
  - Runs on a deployment's head. Reads the release record O(path) (C(current.json) of the release folder)
    through the record's schema (the node library's C(release)), and, when there is one, asks the health path
    its engine adapter names (C(adapter.endpoints.health)) at the URL the head reaches its API at (an API
    bound to one of O(wildcard_hosts) at C(127.0.0.1)), as the launch's readiness wait does.
  - No record (a first launch) is no failure; RV(recorded) is then empty and nothing is asked.
  - A record that is not one (not JSON, a field missing or of the wrong kind) fails the module naming it and
    what is wrong.
  - An API that does not answer in O(timeout_s), or answers with another status than 200, is no failure;
    RV(serves) is false and RV(health) says what it answered.
  - With O(releases), it also reads, in the same call, every release record of the folder's C(releases/)
    (C(FINGERPRINT.json), not the C(.qualify.json) runs) and C(previous.json), as plain JSON (retention reads
    older records leniently), which is what retention needs, in one round trip.
  - Reads only; runs on the node's python3 with nothing but its standard library.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    description: Reads and asks as in a run; it never changes anything.
options:
  path:
    description: The release record, C(RELEASE_DIR/current.json).
    type: path
    required: true
  wildcard_hosts:
    description: The addresses that mean every interface (C(sparkserve_wildcard_hosts)).
    type: list
    elements: str
    required: true
  timeout_s:
    description: How long to wait for the health path's answer.
    type: float
    default: 10
  health:
    description: Whether to ask the recorded release's health path (false, RV(serves) is false and RV(health) empty).
    type: bool
    default: true
  releases:
    description: Whether to read the release folder's records and C(previous.json) too (RV(releases), RV(previous)).
    type: bool
    default: false
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Read the release the head records, and whether it serves
  sparkserve.deploy.release_read:
    path: /var/lib/sparkserve/releases/lab-tp2/current.json
    wildcard_hosts: [0.0.0.0, "::"]
  register: recorded
"""

RETURN = r"""
recorded:
  description: The release record's fields; empty when there is none.
  returned: always
  type: dict
url:
  description: The API's base URL as the head reaches it (empty when nothing is recorded).
  returned: always
  type: str
  sample: http://127.0.0.1:8000
serves:
  description: Whether the recorded release's health path answered 200.
  returned: always
  type: bool
health:
  description: What the health path answered (C(200 OK)), or why it did not; empty when nothing was asked.
  returned: always
  type: str
  sample: "no answer: [Errno 111] Connection refused"
releases:
  description: With O(releases), every record of the folder's C(releases/), in file name order, as its JSON holds it.
  returned: always
  type: list
  elements: dict
previous:
  description:
    - With O(releases), C(previous.json) as its JSON holds it (the release rollback.yml goes back to).
    - Empty when there is none.
  returned: always
  type: dict
"""

import glob
import json
import os
from typing import Any, Dict, List

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.api import (
    answer_text,
    head_api_base,
    http_request,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.release import Release, ReleaseError


def read_record(path: str) -> Dict[str, Any]:
    """The record's fields, {} when there is no file; ReleaseError when it is not a release record."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        raise ReleaseError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    return Release.from_json(text, path).to_dict()


def read_json(path: str) -> Dict[str, Any]:
    """A record file as its JSON holds it, {} when there is no file; ReleaseError when it is no JSON object."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ReleaseError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    if not isinstance(data, dict):
        raise ReleaseError(f"{path}: a release record is a JSON object, not {type(data).__name__}")
    return data


def read_releases(folder: str) -> Dict[str, Any]:
    """Every release record of folder/releases (not the qualification runs), by file name, and previous.json."""
    paths = sorted(p for p in glob.glob(os.path.join(glob.escape(folder), "releases", "*.json"))
                   if not p.endswith(".qualify.json"))
    return {"releases": [read_json(p) for p in paths], "previous": read_json(os.path.join(folder, "previous.json"))}


def ask_health(url: str, timeout_s: float) -> tuple[bool, str]:
    try:
        status, body = http_request("GET", url, None, timeout_s)
    except OSError as err:
        return False, f"no answer: {err}"
    return status == 200, answer_text("health", status, body, 200).removeprefix("health: ")


def read(path: str, wildcard_hosts: List[str], timeout_s: float, health: bool = True,
         releases: bool = False) -> Dict[str, Any]:
    held = read_releases(os.path.dirname(path)) if releases else {"releases": [], "previous": {}}
    recorded = read_record(path)
    if not recorded:
        return {"changed": False, "recorded": {}, "url": "", "serves": False, "health": "", **held}
    launch = recorded["recipe"]["launch"]
    url = head_api_base(str(launch["api_host"]), int(launch["api_port"]), wildcard_hosts)
    serves, answer = ask_health(url + recorded["adapter"]["endpoints"]["health"], timeout_s) if health else (False, "")
    return {"changed": False, "recorded": recorded, "url": url, "serves": serves, "health": answer, **held}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "wildcard_hosts": {"type": "list", "elements": "str", "required": True},
            "timeout_s": {"type": "float", "default": 10.0},
            "health": {"type": "bool", "default": True},
            "releases": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    try:
        params = module.params
        result = read(params["path"], params["wildcard_hosts"], params["timeout_s"],
                      health=params["health"], releases=params["releases"])
    except ReleaseError as err:
        module.fail_json(msg=str(err))
    except (KeyError, TypeError, ValueError) as err:
        module.fail_json(msg=f"{module.params['path']}: the record names no API to ask ({err!r})")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
