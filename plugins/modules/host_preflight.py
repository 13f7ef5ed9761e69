#!/usr/bin/python
"""Check that a Spark can take a deployment, before anything on it changes."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_preflight
short_description: Check a node can take a deployment (memory, GPU, driver, disk, ports)
version_added: "0.1.0"
description:
  - Reads C(/proc/meminfo), asks C(nvidia-smi) for the driver version and the running compute processes,
    measures free disk where the weights go, and finds the process that holds each engine port.
  - Resources held by this deployment's own containers (a deployment already serving) are not
    counted against it, and the memory floor applies only while none of its containers runs.
  - Warns when an OOM killer that picks its own victim runs on the node (C(earlyoom)). Under memory pressure it
    kills the process with the highest OOM score, an engine rank, where the memory guard stops only the rank
    of the deployment that crossed its floor.
  - Changes nothing; runs the same in check mode.
extends_documentation_fragment:
  - sparkserve.deploy.attributes
options:
  deployment:
    description: Name of the deployment; its containers carry the label C(sparkserve.deployment=NAME).
    type: str
    required: true
  min_available_bytes:
    description: MemAvailable must be at least this before a launch.
    type: int
    required: true
  driver_prefixes:
    description: Allowed NVIDIA driver versions, as prefixes (C(580.) allows 580.x).
    type: list
    elements: str
    default: []
  ports:
    description: TCP ports the engine will listen on; each must be free.
    type: list
    elements: int
    default: []
  disk_path:
    description: Where the weights go; the nearest existing parent is measured.
    type: path
    required: true
  min_free_disk_bytes:
    description: Free space needed at O(disk_path).
    type: int
    default: 0
  meminfo_path:
    description: The meminfo file to read.
    type: path
    default: /proc/meminfo
  nvidia_smi:
    description: The nvidia-smi program.
    type: str
    default: nvidia-smi
  known_bad:
    description: Kernel, driver and firmware versions known to break RDMA, NCCL or the GPU (roles/preflight's
      C(known_bad.yml)), each C(component) (C(kernel), C(driver), C(firmware)), C(versions) and/or C(prefixes),
      C(breaks) (C(rdma), C(nccl), C(gpu)), C(what), C(fix), C(worked_around_by) (a kernel command-line word) and
      C(sources). The node's kernel release and command line are read from C(/proc), the driver from nvidia-smi,
      each RoCE device's firmware from O(rdma_sysfs_root). A match is a warning with the fix, or a problem when
      it breaks RDMA and O(needs_rdma); a kernel command line holding its C(worked_around_by) is neither.
    type: list
    elements: dict
    default: []
  needs_rdma:
    description: The deployment needs RDMA between its nodes (several nodes, the recipe's C(fabric.require_rdma)).
    type: bool
    default: false
  rdma_devices:
    description: This node's RoCE devices, whose firmware is read.
    type: list
    elements: str
    default: []
  rdma_sysfs_root:
    description: Root of the RDMA sysfs tree (C(DEVICE/fw_ver)).
    type: path
    default: /sys/class/infiniband
  report_paths:
    description:
      - Paths whose presence on the node is reported (RV(present_paths)), in the same call; nothing is checked
        against them. The preflight role gives the files of the gateway's units, so that a gateway the inventory
        moved or turned off is found on the node that still has it.
    type: list
    elements: path
    default: []
    version_added: "0.6.0"
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Check the node can take the deployment
  sparkserve.deploy.host_preflight:
    deployment: glm53-tp2
    min_available_bytes: "{{ 100 * 1024 ** 3 }}"
    driver_prefixes: ["580."]
    ports: [30198, 29501]
    disk_path: /var/lib/sparkserve/models
    min_free_disk_bytes: "{{ 200 * 1024 ** 3 }}"
"""

RETURN = r"""
problems:
  description: Every check that failed, one message each, naming the value found and the fix.
  returned: always
  type: list
  elements: str
warnings_known_bad:
  description: Each known-bad version this node runs that is a warning here (it is also said as a warning).
  returned: always
  type: list
  elements: str
versions:
  description: What this node runs as the known-bad list names it, C(kernel), C(driver) and C(firmware) (lists).
  returned: always
  type: dict
mem_available_bytes:
  description: MemAvailable from meminfo.
  returned: always
  type: int
driver_version:
  description: The NVIDIA driver version nvidia-smi reports.
  returned: always
  type: str
gpu_processes:
  description: Compute processes on the GPU that are not this deployment's.
  returned: always
  type: list
  elements: dict
own_containers:
  description: IDs of this deployment's running containers on the node.
  returned: always
  type: list
  elements: str
free_disk_bytes:
  description: Free bytes at the weights path.
  returned: always
  type: int
port_holders:
  description: Busy engine ports and who holds them (port -> process description).
  returned: always
  type: dict
oom_killers:
  description: The OOM killers that pick their own victim running on the node (C(earlyoom)), each its C(pid) and
    C(name); each is also said as a warning.
  returned: always
  type: list
  elements: dict
  version_added: "0.6.0"
present_paths:
  description: Those of O(report_paths) that are on the node (a link counts, wherever it points), in their order.
  returned: always
  type: list
  elements: str
"""

import os
import re
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.meminfo import mem_available

Runner = Callable[[Sequence[str]], "tuple[int, str, str]"]
GIB = 1024**3


def run(argv: Sequence[str]) -> tuple[int, str, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: no answer in 30 s"
    return done.returncode, done.stdout, done.stderr


def own_containers_argv(deployment: str) -> list[str]:
    return ["docker", "ps", "--no-trunc", "--quiet", "--filter", f"label=sparkserve.deployment={deployment}"]


def gpu_processes_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]


def driver_version_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-gpu=driver_version", "--format=csv,noheader"]


PORT_HOLDERS_ARGV = ["ss", "-Htlnp"]
# Daemons that, under memory pressure, kill the process they choose (the one with the highest OOM score): on a
# Spark that is an engine rank, and the deployment loses it.
OOM_KILLERS = ("earlyoom",)


def answered_at_once(commands: Sequence[Sequence[str]], runner: Runner = run) -> Runner:
    """Run the commands side by side (on a Spark each nvidia-smi takes a while), and return a runner that
    answers them from those runs (any other command runs when asked)."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        started = {tuple(argv): pool.submit(runner, argv) for argv in commands}
        answers = {argv: future.result() for argv, future in started.items()}

    def answer(argv: Sequence[str]) -> tuple[int, str, str]:
        return answers[tuple(argv)] if tuple(argv) in answers else runner(argv)

    return answer


def own_containers(deployment: str, runner: Runner = run) -> list[str]:
    """Full IDs of this deployment's running containers (none where docker is absent)."""
    rc, out, _ = runner(own_containers_argv(deployment))
    return out.split() if rc == 0 else []


def pid_in_containers(pid: int, container_ids: Sequence[str], proc: str = "/proc") -> bool:
    """Whether a process runs inside one of the given containers (by its cgroup)."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as handle:
            cgroups = handle.read()
    except OSError:
        return False
    return any(cid in cgroups for cid in container_ids)


def gpu_processes(nvidia_smi: str, runner: Runner = run) -> tuple[list[dict[str, str]], str | None]:
    """Compute processes on the GPU, or the error that kept nvidia-smi from answering."""
    rc, out, err = runner(gpu_processes_argv(nvidia_smi))
    if rc != 0:
        return [], (out + err).strip() or f"exit {rc}"
    found = []
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit():
            found.append({"pid": cells[0], "name": cells[1], "used_memory": cells[2] if len(cells) > 2 else ""})
    return found, None


def driver_version(nvidia_smi: str, runner: Runner = run) -> tuple[str, str | None]:
    rc, out, err = runner(driver_version_argv(nvidia_smi))
    if rc != 0:
        return "", (out + err).strip() or f"exit {rc}"
    return (out.strip().splitlines() or [""])[0].strip(), None


def free_disk(path: str) -> tuple[str, int]:
    """Free bytes at the nearest existing parent of path."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return probe, shutil.disk_usage(probe).free


def port_holders(ports: Sequence[int], runner: Runner = run) -> dict[int, dict[str, str]]:
    """For each busy port, the process holding it (name and pid, when ss can tell)."""
    rc, out, _ = runner(PORT_HOLDERS_ARGV)
    if rc != 0:
        return {}
    held: dict[int, dict[str, str]] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        port_text = local.rsplit(":", 1)[-1]
        if not port_text.isdigit() or int(port_text) not in ports:
            continue
        users = re.search(r'users:\(\("([^"]+)",pid=(\d+)', line)
        held[int(port_text)] = ({"process": users.group(1), "pid": users.group(2)} if users
                                else {"process": "unknown", "pid": ""})
    return held


def read_text(path: str) -> str:
    """A small file's text, stripped; empty when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def oom_killers(proc: str = "/proc") -> list[dict[str, str]]:
    """The processes of OOM_KILLERS running on the node (by their name in /proc/PID/comm), in pid order."""
    try:
        pids = sorted((entry for entry in os.listdir(proc) if entry.isdigit()), key=int)
    except OSError:
        return []
    found = []
    for pid in pids:
        name = read_text(os.path.join(proc, pid, "comm"))
        if name in OOM_KILLERS:
            found.append({"pid": pid, "name": name})
    return found


def oom_killer_warning(killer: dict[str, str], host: str) -> str:
    """The warning of one OOM killer found running on host (the node's own name)."""
    name = killer["name"]
    return (f"{name} runs on {host} (pid {killer['pid']}): under memory pressure it kills the process with the "
            "highest OOM score, an engine rank, and the deployment loses that rank; sparkserve's memory guard "
            "stops only the rank of the deployment that crossed its floor (memory.guard). Stop it and keep it "
            f"off: systemctl disable --now {name}")


def node_versions(params: dict, driver: str, proc: str) -> dict[str, list[str]]:
    """What this node runs, as the known-bad list names it: the kernel release, the driver, each RoCE device's
    firmware (those that say)."""
    firmware = [read_text(os.path.join(params.get("rdma_sysfs_root") or "/sys/class/infiniband", device, "fw_ver"))
                for device in params.get("rdma_devices") or []]
    return {"kernel": [read_text(os.path.join(proc, "sys/kernel/osrelease"))], "driver": [driver],
            "firmware": [f for f in firmware if f]}


def known_bad_matches(entries: list[dict], versions: dict[str, list[str]], cmdline: list[str],
                      needs_rdma: bool) -> tuple[list[str], list[str]]:
    """(problems, warnings): one sentence per known-bad entry this node matches and does not work around."""
    problems: list[str] = []
    warnings: list[str] = []
    for entry in entries:
        component = str(entry.get("component", ""))
        exact, prefixes = entry.get("versions") or [], entry.get("prefixes") or []
        found = [v for v in versions.get(component, []) if v and (v in exact or any(v.startswith(p) for p in prefixes))]
        workaround = entry.get("worked_around_by")
        if not found or (workaround and workaround in cmdline):
            continue
        breaks = str(entry.get("breaks", ""))
        sources = ", ".join(entry.get("sources") or []) or "no source given"
        sentence = (f"{component} {found[0]} is known to break {breaks.upper() if breaks == 'rdma' else breaks} on "
                    f"Sparks: {' '.join(str(entry.get('what', '')).split())}; fix: "
                    f"{' '.join(str(entry.get('fix', '')).split())} (sources: {sources})")
        (problems if breaks == "rdma" and needs_rdma else warnings).append(sentence)
    return problems, warnings


def check(params: dict, runner: Runner = run, proc: str = "/proc") -> dict:
    """Run every check; return the facts found and the problems. The node's four probes run side by side (the
    driver's version is asked even when nvidia-smi fails, and then not read)."""
    problems: list[str] = []
    runner = answered_at_once([own_containers_argv(params["deployment"]), gpu_processes_argv(params["nvidia_smi"]),
                               driver_version_argv(params["nvidia_smi"]), PORT_HOLDERS_ARGV], runner)
    ours = own_containers(params["deployment"], runner)

    with open(params["meminfo_path"], encoding="utf-8") as handle:
        available = mem_available(handle.read())
    floor = params["min_available_bytes"]
    if not ours and available < floor:
        problems.append(
            f"MemAvailable is {available / GIB:.1f} GiB, below the recipe's floor of {floor / GIB:.1f} GiB "
            "(memory.min_available_gib); stop what holds the memory (or drop caches) and run again."
        )

    processes, smi_error = gpu_processes(params["nvidia_smi"], runner)
    foreign = [p for p in processes if not pid_in_containers(int(p["pid"]), ours, proc)]
    if smi_error is not None:
        problems.append(f"nvidia-smi failed: {smi_error}; check the NVIDIA driver on this node.")
    for p in foreign:
        problems.append(
            f"a GPU compute process is already running: pid {p['pid']} ({p['name']}, {p['used_memory']}); "
            "stop it before launching (a second engine would not fit)."
        )

    version, version_error = ("", None) if smi_error else driver_version(params["nvidia_smi"], runner)
    prefixes = params["driver_prefixes"]
    if version_error is not None:
        problems.append(f"nvidia-smi could not report the driver version: {version_error}.")
    elif prefixes and not smi_error and not any(version.startswith(prefix) for prefix in prefixes):
        problems.append(
            f"NVIDIA driver {version} is not in the recipe's allowed set {prefixes} (host.driver_versions); "
            "install an allowed driver (590.x deadlocks CUDA-graph capture on GB10; use 580.x)."
        )

    measured, free = free_disk(params["disk_path"])
    need = params["min_free_disk_bytes"]
    if free < need:
        problems.append(
            f"{measured} has {free / GIB:.1f} GiB free, the weights need {need / GIB:.1f} GiB "
            "(host.min_free_disk_gib); free space or point the weights elsewhere."
        )

    holders = port_holders(params["ports"], runner)
    for port, holder in sorted(holders.items()):
        if holder["pid"] and pid_in_containers(int(holder["pid"]), ours, proc):
            continue
        problems.append(
            f"port {port} is held by {holder['process']} (pid {holder['pid'] or '?'}); "
            "stop it or choose another port in the recipe (launch.*_port)."
        )

    versions = node_versions(params, version, proc)
    bad, warnings = known_bad_matches(params.get("known_bad") or [], versions,
                                      read_text(os.path.join(proc, "cmdline")).split(), bool(params.get("needs_rdma")))
    problems += bad

    return {
        "problems": problems,
        "warnings_known_bad": warnings,
        "oom_killers": oom_killers(proc),
        "versions": versions,
        "mem_available_bytes": available,
        "driver_version": version,
        "gpu_processes": foreign,
        "own_containers": ours,
        "free_disk_bytes": free,
        "port_holders": {str(port): holder for port, holder in holders.items()},
        "present_paths": [path for path in params.get("report_paths") or [] if os.path.lexists(path)],
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "deployment": {"type": "str", "required": True},
            "min_available_bytes": {"type": "int", "required": True},
            "driver_prefixes": {"type": "list", "elements": "str", "default": []},
            "ports": {"type": "list", "elements": "int", "default": []},
            "disk_path": {"type": "path", "required": True},
            "min_free_disk_bytes": {"type": "int", "default": 0},
            "meminfo_path": {"type": "path", "default": "/proc/meminfo"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "known_bad": {"type": "list", "elements": "dict", "default": []},
            "needs_rdma": {"type": "bool", "default": False},
            "rdma_devices": {"type": "list", "elements": "str", "default": []},
            "rdma_sysfs_root": {"type": "path", "default": "/sys/class/infiniband"},
            "report_paths": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    try:
        result = check(module.params)
    except (OSError, ValueError) as err:
        module.fail_json(msg=f"preflight could not read this node: {err}")
    host = socket.gethostname()
    for warning in result["warnings_known_bad"] + [oom_killer_warning(k, host) for k in result["oom_killers"]]:
        module.warn(warning)
    if result["problems"]:
        module.fail_json(msg="; ".join(result["problems"]), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
