#!/usr/bin/python
"""One side of an ib_write_bw run over one twin: the server (detached, bounded), the client (gated), or the stop."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: link_bench
short_description: Measure one twin's RDMA write bandwidth to a peer with perftest's ib_write_bw
version_added: "0.6.0"
description:
  - Runs one side of C(ib_write_bw) (the C(perftest) package) for one RDMA device, with C(--report_gbits), C(-F),
    a duration (C(-D)), a message size (C(-s)) and the device's RoCE v2 GID index (C(-x)).
  - O(role=server) starts the server detached, in a session of its own, under C(timeout) so that it ends by itself
    after O(wait_s) plus O(duration_s) seconds even when no client comes; it first ends a server this module
    started earlier on the same O(port). It returns once the server listens on O(port), or fails with what the
    server printed when it ended instead. Its output goes to a log in O(state_dir).
  - O(role=client) runs the client to O(server_address) (the peer's address on this twin's subnet), reads its
    output with the node library's reader (C(module_utils/node/perftest.py)), returns the figures and fails,
    naming the link (C(NODE:DEVICE -> PEER:PEER_DEVICE)), when ib_write_bw gave no result or when the average
    bandwidth is under O(floor_gbps), with the likely cause.
  - O(role=stop) ends the server this module started on O(port) when it still runs (a client that failed leaves
    it waiting) and returns what it printed, with its figures when it saw the run through.
  - Standard library only; runs with the node's python3.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    details:
      - A measurement is all the module does, so in check mode it runs nothing, starts and ends no process, and
        says so in RV(msg); RV(ran) is V(false) and there are no figures.
options:
  role:
    description: Which side to run, or V(stop) to end the server of O(port).
    type: str
    choices: [server, client, stop]
    required: true
  device:
    description: This node's RDMA device of the twin measured (C(rocep1s0f1)); required for V(server) and V(client).
    type: str
  gid_index:
    description: The device's RoCE v2 GID index (C(-x)), as M(sparkserve.deploy.roce_facts) reads it; leave it out
      to let ib_write_bw pick its default.
    type: int
  port:
    description: The TCP port the server listens on and the client connects to (C(-p)).
    type: int
    default: 18515
  server_address:
    description: The server's address on this twin's subnet; required for V(client).
    type: str
  duration_s:
    description: Seconds of writes (C(-D)); server and client must be given the same.
    type: int
    default: 5
  size_bytes:
    description: The message size in bytes (C(-s)); server and client must be given the same.
    type: int
    default: 65536
  wait_s:
    description:
      - V(server) waits this long for its client before C(timeout) ends it (it then ends after O(duration_s) more).
      - V(client) is ended when it has not finished O(wait_s) seconds after its O(duration_s).
    type: int
    default: 60
  floor_gbps:
    description: With V(client), fail naming the link when the average bandwidth is under this many Gb/s.
    type: float
  node:
    description: This node's name in messages (the host name when empty).
    type: str
    default: ""
  peer:
    description: The peer's name in messages.
    type: str
    default: ""
  peer_device:
    description: The peer's RDMA device of the twin measured, for messages.
    type: str
    default: ""
  state_dir:
    description: Where the server's process id and output are kept, one pair of files per O(port).
    type: path
    default: /run/sparkserve/link-bench
  executable:
    description: The ib_write_bw program, a name looked up on C(PATH) or a path.
    type: str
    default: ib_write_bw
notes:
  - The C(perftest) package of Debian and Ubuntu provides C(ib_write_bw).
seealso:
  - module: sparkserve.deploy.roce_facts
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Start the server on spark-1's first twin
  sparkserve.deploy.link_bench:
    role: server
    device: rocep1s0f1
    gid_index: 3
  delegate_to: spark-1

- name: Measure spark-2's first twin to it, gated at 80 Gb/s
  sparkserve.deploy.link_bench:
    role: client
    device: rocep1s0f1
    gid_index: 3
    server_address: 10.77.1.11
    floor_gbps: 80
    node: spark-2
    peer: spark-1
    peer_device: rocep1s0f1
  delegate_to: spark-2
  register: __link

- name: End the server if it still waits
  sparkserve.deploy.link_bench:
    role: stop
  delegate_to: spark-1
"""

RETURN = r"""
ran:
  description: Whether ib_write_bw was run (or, for V(stop), a server ended); V(false) in check mode.
  returned: always
  type: bool
msg:
  description: What was done, or the problem.
  returned: always
  type: str
link:
  description: The link measured, C(NODE:DEVICE -> PEER:PEER_DEVICE) (V(client)).
  returned: when O(role=client)
  type: str
command:
  description: The ib_write_bw command line run.
  returned: when O(role) is V(server) or V(client), outside check mode
  type: list
  elements: str
bandwidth_gbps:
  description: The average bandwidth, Gb/s (V(null) when the run gave no result).
  returned: when O(role) is V(client) or V(stop)
  type: float
report:
  description: The run's figures as ib_write_bw printed them (C(side), C(device), C(link_type), C(mtu_bytes),
    C(gid_index), C(bytes), C(iterations), C(bw_peak_gbps) (V(null) when the run measured no peak),
    C(bw_average_gbps), C(msg_rate_mpps)); V(null) when it printed none.
  returned: when O(role) is V(client) or V(stop)
  type: dict
problem:
  description: Why the link fails (no result, or under O(floor_gbps)), naming it; V(null) when it passes.
  returned: when O(role=client)
  type: str
output:
  description: What ib_write_bw printed (stdout and stderr together).
  returned: when O(role) is V(client) or V(stop), or a server ended before it listened
  type: str
pid:
  description: The process id of the bounded server (of C(timeout), the leader of its process group).
  returned: when O(role=server), outside check mode
  type: int
"""

import os
import signal
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import perftest
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.ports import listening
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import (
    RC_TIMED_OUT,
    one_line,
    run_command,
)

ARGUMENT_SPEC: Dict[str, Any] = {
    "role": {"type": "str", "choices": ["server", "client", "stop"], "required": True},
    "device": {"type": "str"},
    "gid_index": {"type": "int"},
    "port": {"type": "int", "default": perftest.DEFAULT_PORT},
    "server_address": {"type": "str"},
    "duration_s": {"type": "int", "default": 5},
    "size_bytes": {"type": "int", "default": 65536},
    "wait_s": {"type": "int", "default": 60},
    "floor_gbps": {"type": "float"},
    "node": {"type": "str", "default": ""},
    "peer": {"type": "str", "default": ""},
    "peer_device": {"type": "str", "default": ""},
    "state_dir": {"type": "path", "default": "/run/sparkserve/link-bench"},
    "executable": {"type": "str", "default": perftest.TOOL},
}
REQUIRED_IF = [("role", "server", ("device",)), ("role", "client", ("device", "server_address"))]
LISTEN_WAIT_S = 15  # how long a server may take to listen
KILL_AFTER_S = 5  # timeout's grace between its TERM and its KILL


def paths(state_dir: str, port: int) -> Dict[str, str]:
    """The server's process id file and output file for a port."""
    base = os.path.join(state_dir, f"{perftest.TOOL}-{port}")
    return {"pid": base + ".pid", "log": base + ".log"}


def _alive(pid: int) -> bool:
    """Whether pid is still the bounded server this module started (a process id may be reused)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return b"timeout" in os.path.basename(argv[0]) and any(perftest.TOOL.encode() in arg for arg in argv)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def stop_server(state_dir: str, port: int) -> Dict[str, Any]:
    """End the server started on port when it still runs (its whole process group); what it printed."""
    files = paths(state_dir, port)
    pid_text = _read(files["pid"]).strip()
    was_running = False
    if pid_text.isdigit() and _alive(int(pid_text)):
        was_running = True
        pid = int(pid_text)
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _alive(pid):
                break
    if os.path.exists(files["pid"]):
        os.unlink(files["pid"])
    return {"was_running": was_running, "output": _read(files["log"])}


def start_server(argv: List[str], bound_s: int, state_dir: str, port: int) -> Dict[str, Any]:
    """Start argv detached under timeout (bound_s seconds), its output to a log; wait until it listens on port.

    Returns pid, listening and, when it does not listen, problem (why) and output (what it printed)."""
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    stop_server(state_dir, port)
    if listening(port):
        return {"pid": None, "listening": False, "output": "",
                "problem": f"port {port} is taken on this node (another program listens there); free it, or set "
                           "another port"}
    files = paths(state_dir, port)
    bounded = ["timeout", "-k", str(KILL_AFTER_S), str(bound_s), *argv]
    with open(files["log"], "wb") as log:
        process = subprocess.Popen(bounded, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, close_fds=True)
    with open(files["pid"], "w", encoding="ascii") as handle:
        handle.write(f"{process.pid}\n")
    deadline = time.monotonic() + LISTEN_WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            os.unlink(files["pid"])
            output = _read(files["log"])
            said = perftest.failure(output) or one_line(output, 300) or "it printed nothing"
            return {"pid": process.pid, "listening": False, "output": output,
                    "problem": f"it ended with status {process.returncode}: {said}"}
        if listening(port):
            return {"pid": process.pid, "listening": True}
        time.sleep(0.1)
    stopped = stop_server(state_dir, port)
    return {"pid": process.pid, "listening": False, "output": stopped["output"],
            "problem": f"it did not listen within {LISTEN_WAIT_S} s, and was ended"}


def measure(argv: List[str], timeout_s: int, link: str, floor_gbps: Optional[float],
            runner: Any = run_command) -> Dict[str, Any]:
    """Run the client; its figures, and the problem naming the link when it gave none or is under floor_gbps."""
    rc, out, err = runner(argv, timeout_s)
    output = (out or "") + (err or "")
    report: Optional[Dict[str, Any]] = None
    problem = None
    try:
        report = perftest.read(output)
    except perftest.PerftestError as error:
        problem = f"{link}: {error}"
        if rc == RC_TIMED_OUT:
            problem = f"{link}: {perftest.TOOL} did not end within {timeout_s} s ({one_line(output, 200)})"
    if report is not None and rc != 0:
        problem = f"{link}: {perftest.TOOL} exited with status {rc} after printing its figures"
    bandwidth = report["bw_average_gbps"] if report else None
    if problem is None and floor_gbps is not None:
        problem = perftest.gate(bandwidth, floor_gbps, link, report)
    return {"bandwidth_gbps": bandwidth, "report": perftest.summary(report) if report else None,
            "problem": problem, "output": output}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF, supports_check_mode=True)
    p = module.params
    node = p["node"] or socket.gethostname()
    link = perftest.link_name(node, p["device"] or "?", p["peer"] or p["server_address"] or "?",
                              p["peer_device"] or "?")
    if module.check_mode:
        extra: Dict[str, Any] = {"link": link, "bandwidth_gbps": None, "report": None, "problem": None} \
            if p["role"] == "client" else {}
        module.exit_json(changed=False, ran=False, msg=f"check mode: {perftest.TOOL} was not run ({p['role']})",
                         **extra)
    for name in ("port", "duration_s", "size_bytes", "wait_s"):
        if p[name] < 1:
            module.fail_json(msg=f"{name} is {p[name]}; give a whole number of 1 or more", ran=False)
    if p["role"] == "stop":
        stopped = stop_server(p["state_dir"], p["port"])
        try:
            report: Optional[Dict[str, Any]] = perftest.summary(perftest.read(stopped["output"]))
        except perftest.PerftestError:
            report = None
        module.exit_json(changed=stopped["was_running"], ran=stopped["was_running"], output=stopped["output"],
                         report=report, bandwidth_gbps=report["bw_average_gbps"] if report else None,
                         msg=("ended the server, which still waited" if stopped["was_running"]
                              else "no server of this port was running"))
    executable = module.get_bin_path(p["executable"], required=True)
    server = p["server_address"] if p["role"] == "client" else None
    argv = perftest.command(p["device"], p["port"], p["duration_s"], p["size_bytes"], p["gid_index"], server,
                            executable)
    if p["role"] == "server":
        started = start_server(argv, p["wait_s"] + p["duration_s"], p["state_dir"], p["port"])
        if not started["listening"]:
            module.fail_json(msg=f"the {perftest.TOOL} server on {node}:{p['device']} did not listen on port "
                                 f"{p['port']}: {started['problem']}", ran=True, command=argv,
                             output=started["output"])
        module.exit_json(changed=True, ran=True, command=argv, pid=started["pid"],
                         msg=f"{perftest.TOOL} server on {p['device']} listens on port {p['port']} for "
                             f"{p['wait_s']} s")
    result = measure(argv, p["duration_s"] + p["wait_s"], link, p["floor_gbps"])
    if result["problem"]:
        module.fail_json(msg=result["problem"], ran=True, link=link, command=argv, **result)
    module.exit_json(changed=False, ran=True, link=link, command=argv,
                     msg=f"{link}: {result['bandwidth_gbps']:.2f} Gb/s", **result)


if __name__ == "__main__":
    main()
