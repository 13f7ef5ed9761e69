#!/usr/bin/python
"""Keep services last in the OOM killer's line: a drop-in for their next start, their running process now."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: oom_protect
short_description: Keep services last in the OOM killer's line, now and at their next start
version_added: "0.6.0"
description:
  - A rank that runs the node out of memory must not take the node's remote access or its container engine
    with it. For each service of O(services) this module keeps, in one call,
    a systemd drop-in C(SYSTEMD_DIR/SERVICE.service.d/sparkserve-oom.conf) that sets C(OOMScoreAdjust) to
    O(score) for its next start (systemd is reloaded when a drop-in changed; nothing is restarted, as a
    restarted dockerd would stop the ranks),
    and the same score on its running main process now (its C(MainPID), as C(choom -p) sets it).
  - Lowering a score needs C(CAP_SYS_RESOURCE). A node whose module process lacks it (a container) is left
    as it is, with a warning; RV(protected) is false and RV(reason) says why.
  - A service that does not run (no main process) gets its drop-in only.
  - Runs on the node's python3 with nothing but its standard library.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    description: Reads the drop-ins, the main processes and their scores; writes and reloads nothing.
options:
  services:
    description: The systemd services to protect, without C(.service) (C(ssh), C(docker)).
    type: list
    elements: str
    required: true
  score:
    description: The OOM score adjustment they get, from -1000 (never killed) to 1000.
    type: int
    default: -900
  systemd_dir:
    description: Where the drop-in folders are made.
    type: path
    default: /etc/systemd/system
  proc_root:
    description: The proc file system the capabilities and the scores are read from and written to.
    type: path
    default: /proc
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Spare sshd and the container engine
  sparkserve.deploy.oom_protect:
    services: [ssh, docker, containerd]
    score: -900
  register: protection
"""

RETURN = r"""
protected:
  description: Whether the node can lower the scores (it has C(CAP_SYS_RESOURCE)); nothing is done when not.
  returned: always
  type: bool
reason:
  description: Why the node is not protected.
  returned: when not protected
  type: str
  sample: no CAP_SYS_RESOURCE, as in a container
changed_paths:
  description: The drop-ins written (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: ["/etc/systemd/system/ssh.service.d/sparkserve-oom.conf"]
adjusted:
  description: The running processes given the score (in check mode, that would be), as C(SERVICE (pid N)).
  returned: always
  type: list
  elements: str
  sample: ["docker (pid 1234)"]
"""

import os
import re
from typing import Any, List, Optional, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import write_atomic
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import Runner, run_command
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.units import UnitError, systemctl

CAP_SYS_RESOURCE = 24
DROP_IN = "sparkserve-oom.conf"
SERVICE_NAME = re.compile(r"^[A-Za-z0-9:_.@-]+$")


class ProtectError(Exception):
    """The module fails with this message."""


def can_lower_scores(proc_root: str) -> bool:
    """Whether this process holds CAP_SYS_RESOURCE in its effective set."""
    try:
        with open(os.path.join(proc_root, "self", "status"), encoding="utf-8") as handle:
            found = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", handle.read(), re.MULTILINE)
    except OSError as err:
        raise ProtectError(f"cannot read this process's capabilities: {err.strerror}") from None
    return found is not None and bool(int(found.group(1), 16) >> CAP_SYS_RESOURCE & 1)


def drop_in_text(score: int) -> str:
    return ("# Written by sparkserve (node_protect): spare this service when a rank runs the node out of memory.\n"
            f"[Service]\nOOMScoreAdjust={score}\n")


def read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ProtectError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None


def stale_drop_ins(services: Sequence[str], systemd_dir: str, text: str) -> List[str]:
    """The drop-ins that are missing or hold something else."""
    paths = [os.path.join(systemd_dir, f"{service}.service.d", DROP_IN) for service in services]
    return [path for path in paths if read_text(path) != text]


def main_pid(service: str, runner: Runner) -> int:
    out = systemctl(runner, "show", "--property=MainPID", "--value", f"{service}.service").strip()
    return int(out) if out.isdigit() else 0


def scores_to_set(services: Sequence[str], score: int, proc_root: str, runner: Runner) -> List[tuple[str, int]]:
    """(service, pid) of each running main process whose score is not the wanted one."""
    found: List[tuple[str, int]] = []
    for service in services:
        pid = main_pid(service, runner)
        if pid <= 0:
            continue
        now = read_text(os.path.join(proc_root, str(pid), "oom_score_adj"))
        if now is not None and now.strip() != str(score):  # None: the process ended since systemctl named it
            found.append((service, pid))
    return found


def set_score(proc_root: str, pid: int, score: int) -> None:
    path = os.path.join(proc_root, str(pid), "oom_score_adj")
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"{score}\n")
    except FileNotFoundError:
        return  # it ended: its next start takes the drop-in
    except OSError as err:
        raise ProtectError(f"cannot set {path} to {score}: {err.strerror}") from None


def protect(params: dict[str, Any], check_mode: bool, runner: Runner) -> dict[str, Any]:
    services, score, proc_root = params["services"], params["score"], params["proc_root"]
    if not can_lower_scores(proc_root):
        return {"changed": False, "protected": False, "reason": "no CAP_SYS_RESOURCE, as in a container",
                "changed_paths": [], "adjusted": []}
    text = drop_in_text(score)
    stale = stale_drop_ins(services, params["systemd_dir"], text)
    if stale and not check_mode:
        for path in stale:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            write_atomic(path, text.encode("utf-8"), 0o644)
        systemctl(runner, "daemon-reload")
    to_set = scores_to_set(services, score, proc_root, runner)
    if not check_mode:
        for _service, pid in to_set:
            set_score(proc_root, pid, score)
    adjusted = [f"{service} (pid {pid})" for service, pid in to_set]
    return {"changed": bool(stale or adjusted), "protected": True, "changed_paths": stale, "adjusted": adjusted}


def main(runner: Runner = run_command) -> None:
    module = AnsibleModule(
        argument_spec={
            "services": {"type": "list", "elements": "str", "required": True},
            "score": {"type": "int", "default": -900},
            "systemd_dir": {"type": "path", "default": "/etc/systemd/system"},
            "proc_root": {"type": "path", "default": "/proc"},
        },
        supports_check_mode=True,
    )
    params = module.params
    bad = [service for service in params["services"]
           if not SERVICE_NAME.match(service) or service.endswith(".service")]
    if bad:
        module.fail_json(msg=f"not a service name: {', '.join(map(repr, bad))} (give ssh, not ssh.service or a path)")
    if not -1000 <= params["score"] <= 1000:
        module.fail_json(msg=f"score {params['score']} is outside -1000..1000")
    try:
        result = protect(params, module.check_mode, runner)
    except (ProtectError, UnitError) as err:
        module.fail_json(msg=str(err), changed=False)
    except OSError as err:
        module.fail_json(msg=f"cannot write a drop-in: {err.strerror} ({err.filename})", changed=False)
    if not result["protected"]:
        module.warn(f"cannot lower OOM scores here ({result['reason']}); "
                    f"{', '.join(params['services'])} are left as they are")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
