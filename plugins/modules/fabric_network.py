#!/usr/bin/python
"""Give the fabric twins their addresses through netplan or systemd-networkd, as one step that undoes itself."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_network
short_description: Give a Spark's fabric twins their addresses, as one step that is undone when it fails
version_added: "0.2.0"
description:
  - Installs the network configuration files sparkserve owns for the fabric twins (the two interfaces of the
    fabric), applies them to the twins only, waits until every twin holds its address, and puts the previous
    files back when that does not happen. One task instead of a template, a handler and a check.
  - "First reads: every existing file matching O(owned) and every path of O(files), and the addresses the
    node holds now (C(ip -j -4 addr show)). A file of O(files) whose content or mode differs is written; an
    existing file matching O(owned) that is not in O(files) is removed (a switch of O(backend), or a twin that
    is no longer configured). No other file is ever touched."
  - Nothing to write or remove and every twin holding its address is RV(changed=false) and runs nothing but
    C(ip). Unchanged files but a twin without its address (flushed, or the link was down) applies again.
  - Before anything changes, with O(backend=netplan), the new configuration is checked with
    C(netplan generate --root-dir) on a copy of every netplan file of the node (C(/etc/netplan),
    C(/run/netplan), C(/lib/netplan), sparkserve's own left out) with the new files added. When netplan
    refuses it, the module fails with netplan's message and the node is left as it was. systemd-networkd has
    no such generator, so with O(backend=networkd) there is no check; its files are rendered by sparkserve's
    own template.
  - Files are written atomically (a temporary file in the same folder, then a rename), netplan's with mode
    C(0600) (netplan warns about files others can read), networkd's with mode C(0644).
  - "Applies to the twins only: with O(backend=netplan), C(netplan generate), C(networkctl reload), then
    C(networkctl reconfigure) naming the twins; with O(backend=networkd), C(networkctl reload), then
    C(networkctl reconfigure) naming the twins. Never C(netplan apply), which restarts every interface and
    can take the management link down. With O(backend=networkd), C(netplan generate) also runs first when a
    netplan file was removed (after a switch from netplan), so that the networkd files netplan generated
    from it go too."
  - Then reads the addresses every 0.5 s until every twin holds its address (the same IP and prefix), for at
    most O(wait_s) seconds.
  - When a command of the apply fails, or the addresses do not come up in time, every file written or
    removed is put back exactly as it was (its content and mode, or its absence), the apply commands run
    again (their errors are added to the message), and the module fails naming each twin, the address it
    should have and the ones it has.
  - Runs on the node's python3 with nothing but its standard library; needs root (it writes under C(/etc)
    and runs C(networkctl)).
options:
  backend:
    description: What gives the twins their addresses.
    type: str
    choices: [netplan, networkd]
    required: true
  files:
    description:
      - The files this backend wants, each path (absolute) to its whole content as text, rendered by the role.
      - Each path must match a pattern of O(owned), so that a later run can remove it.
    type: dict
    default: {}
  owned:
    description:
      - Glob patterns (absolute) of the files sparkserve owns, of every backend, for example
        C(/etc/netplan/60-sparkserve-*.yaml) and C(/etc/systemd/network/60-sparkserve-*.network).
      - An existing file that matches one and is not in O(files) is removed. A C(*) never crosses a C(/).
    type: list
    elements: str
    required: true
  interfaces:
    description: The twins, each with the address it must hold once the configuration is applied.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The interface's name.
        type: str
        required: true
      address:
        description: Its address with its prefix length, for example V(10.77.1.11/24).
        type: str
        required: true
  wait_s:
    description: How long to wait, after the apply, for every twin to hold its address, in seconds.
    type: float
    default: 30
  service:
    description:
      - The unit that gives the twins their addresses (netplan renders them for systemd-networkd, and the
        networkd backend writes its files), started when it does not run and enabled at boot, before the
        addresses are read (in check mode, only said).
      - An empty string leaves every unit alone.
    type: str
    default: systemd-networkd.service
  root:
    description:
      - A folder put before every path of O(files) and O(owned) and before the netplan folders read for the
        check (tests use a temporary folder). Commands are run as they are, whatever it is.
    type: path
    default: /
  roce:
    description:
      - When given, and the call changed nothing (the twins already held their addresses, and the unit ran), the
        node's RoCE devices are read in the same call as M(sparkserve.deploy.roce_facts) reads them, with these
        options of it (RV(roce)), so that a run that changes nothing needs no call of its own for them. After a
        change nothing is read (the kernel fills the GID table as the addresses come up), and the caller reads
        it in a call of its own (so does it when RV(roce) has problems, to fail as M(sparkserve.deploy.roce_facts)
        fails).
    type: dict
    suboptions:
      sysfs_root:
        description: The RDMA sysfs tree.
        type: path
        default: /sys/class/infiniband
      net_root:
        description: The network interfaces' sysfs tree.
        type: path
        default: /sys/class/net
      devices:
        description: The RDMA devices, in the order of O(roce.addresses); empty for every device found.
        type: list
        elements: str
        default: []
      addresses:
        description: The fabric addresses, one per device.
        type: list
        elements: str
        default: []
      gid_index_mode:
        description: Whether the devices must share one RoCE v2 GID index (V(fixed)) or not (V(per_device)).
        type: str
        choices: [fixed, per_device]
        default: fixed
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    description: Reads the files and the addresses (C(ip) only); writes nothing and runs nothing else.
  diff_mode:
    support: full
    description: One entry per file written or removed, its content before and after.
notes:
  - Owner and group are not managed; the files belong to the user the module runs as (root).
  - A path of O(files) or a match of O(owned) that exists and is not a regular file (a link, a directory) is
    refused before anything changes.
  - A missing folder of a file of O(files) is made, with mode C(0755).
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Give the twins their fabric addresses
  sparkserve.deploy.fabric_network:
    backend: netplan
    files:
      /etc/netplan/60-sparkserve-fabric.yaml: >-
        {{ lookup('ansible.builtin.template', 'etc/netplan/60-sparkserve-fabric.yaml.j2') }}
    owned:
      - /etc/netplan/60-sparkserve-*.yaml
      - /etc/systemd/network/60-sparkserve-*.network
    interfaces:
      - name: enp1s0f0np0
        address: 10.77.1.11/24
      - name: enp1s0f1np1
        address: 10.77.2.11/24
    wait_s: 30
"""

RETURN = r"""
files_written:
  description: The files written (in check mode, that would be), sorted.
  returned: always
  type: list
  elements: str
  sample: ["/etc/netplan/60-sparkserve-fabric.yaml"]
files_removed:
  description: The files removed (in check mode, that would be), sorted.
  returned: always
  type: list
  elements: str
  sample: ["/etc/systemd/network/60-sparkserve-enp1s0f0np0.network"]
service_changed:
  description: Whether O(service) was started or enabled (in check mode, would be).
  returned: always
  type: bool
applied:
  description: Whether the configuration was applied (the commands ran); false in check mode.
  returned: always
  type: bool
addresses:
  description: Each twin's IPv4 addresses with their prefix, as read last (after the apply, when it ran).
  returned: always
  type: dict
  sample: {"enp1s0f0np0": ["10.77.1.11/24"], "enp1s0f1np1": ["10.77.2.11/24"]}
roce:
  description:
    - The RoCE devices as RV(sparkserve.deploy.roce_facts#module:roce) gives them, problems included (this module
      does not fail on them).
  returned: when O(roce) is given and nothing changed
  type: dict
ansible_facts:
  description: The fact C(sparkserve_roce), the same value as RV(roce).
  returned: when RV(roce) is
  type: dict
diff:
  description:
    - With C(--diff), one entry per file written or removed, in the order of RV(files_written) then
      RV(files_removed), with C(before) and C(after) (its content; empty when absent) and C(before_header)
      and C(after_header) (its path and mode, or that it is absent or removed).
  returned: changed and in diff mode
  type: list
  elements: dict
  sample: [{"before_header": "/etc/netplan/60-sparkserve-fabric.yaml (absent)",
            "after_header": "/etc/netplan/60-sparkserve-fabric.yaml (mode 0600)",
            "before": "", "after": "network:\n  version: 2\n"}]
"""

import fnmatch
import glob
import ipaddress
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import write_atomic
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.units import UnitError, keep_running
from ansible_collections.sparkserve.deploy.plugins.module_utils.roce import ARGUMENT_SPEC as ROCE_SPEC
from ansible_collections.sparkserve.deploy.plugins.module_utils.roce import gather as read_roce

Runner = Callable[[Sequence[str]], "tuple[int, str, str]"]
Clock = Callable[[], float]
Sleep = Callable[[float], None]

MODES = {"netplan": 0o600, "networkd": 0o644}
NETPLAN_DIRS = ("etc/netplan", "run/netplan", "lib/netplan")
IP_ADDR = ["ip", "-j", "-4", "addr", "show"]
POLL_S = 0.5
COMMAND_TIMEOUT_S = 120


class FabricError(Exception):
    """The module fails with this message; ``result`` holds the other keys of its result."""

    def __init__(self, msg: str, result: Mapping[str, Any] | None = None) -> None:
        super().__init__(msg)
        self.result = dict(result or {})


@dataclass(frozen=True)
class Twin:
    name: str
    address: str  # normalised CIDR, 10.77.1.11/24


@dataclass(frozen=True)
class FileState:
    data: bytes
    mode: int


@dataclass
class FilePlan:
    """What must change in the files: host paths (without the root) to new content, and paths to remove."""

    mode: int
    writes: dict[str, bytes] = field(default_factory=dict)
    removes: list[str] = field(default_factory=list)
    previous: dict[str, FileState | None] = field(default_factory=dict)

    @property
    def changed_paths(self) -> list[str]:
        return sorted(self.writes) + sorted(self.removes)


def run(argv: Sequence[str]) -> tuple[int, str, str]:
    """Run a command on the node; a missing program or a hang is a failure with a message, never an exception."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: no answer in {COMMAND_TIMEOUT_S} s"
    return done.returncode, done.stdout, done.stderr


def host_path(root: str, path: str) -> str:
    """Where a node path is under root."""
    return os.path.join(root, path.lstrip("/"))


def mode_text(mode: int) -> str:
    return f"{mode:04o}"


def matches(path: str, pattern: str) -> bool:
    """Whether a path matches a glob pattern as glob reads it: component by component, * never crossing a /."""
    parts, pattern_parts = path.strip("/").split("/"), pattern.strip("/").split("/")
    return len(parts) == len(pattern_parts) and all(
        fnmatch.fnmatchcase(part, want) for part, want in zip(parts, pattern_parts, strict=True))


def is_owned(path: str, owned: Sequence[str]) -> bool:
    return any(matches(path, pattern) for pattern in owned)


def parse_twins(interfaces: Sequence[Mapping[str, Any]]) -> list[Twin]:
    """The twins with their addresses normalised; FabricError on a name or address that is not one."""
    twins: list[Twin] = []
    for index, item in enumerate(interfaces):
        name, address = str(item.get("name") or ""), str(item.get("address") or "")
        if not name or "/" in name or " " in name:
            raise FabricError(f"interfaces[{index}]: {name!r} is not an interface name")
        try:
            if "/" not in address:
                raise ValueError("no prefix length")
            normal = ipaddress.IPv4Interface(address)
        except ValueError as err:
            raise FabricError(f"interfaces[{index}] ({name}): {address!r} is not an IPv4 address with its "
                              f"prefix length such as 10.77.1.11/24 ({err})") from None
        twins.append(Twin(name, normal.with_prefixlen))
    return twins


def parse_files(files: Mapping[str, Any], owned: Sequence[str]) -> dict[str, bytes]:
    """The wanted files by normalised absolute path; FabricError on a path or content that is refused."""
    for pattern in owned:
        if not pattern.startswith("/"):
            raise FabricError(f"owned: {pattern!r} is not an absolute pattern; give the full path from /")
    wanted: dict[str, bytes] = {}
    for path, content in files.items():
        if not isinstance(path, str) or not path.startswith("/"):
            raise FabricError(f"files: {path!r} is not an absolute path")
        if not isinstance(content, str):
            raise FabricError(f"files: {path}: the content is a {type(content).__name__}, not text")
        normal = "/" + os.path.normpath(path).lstrip("/")
        if not is_owned(normal, owned):
            raise FabricError(f"files: {normal} matches no pattern of owned; a file sparkserve writes must be "
                              "one it owns, so that a later run can remove it")
        wanted[normal] = content.encode("utf-8")
    return wanted


def owned_files(root: str, owned: Sequence[str]) -> list[str]:
    """The node paths (without the root) of the existing files that match a pattern of owned."""
    found: set[str] = set()
    base = os.path.normpath(root)
    for pattern in owned:
        for match in glob.glob(host_path(root, pattern)):
            found.add("/" + os.path.relpath(match, base).lstrip("/"))
    return sorted(found)


def read_state(root: str, path: str) -> FileState | None:
    """A file's content and mode, None when absent; FabricError when it is not a regular file."""
    full = host_path(root, path)
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise FabricError(f"{path} exists and is not a regular file (a link, a folder...); remove it first")
    with open(full, "rb") as handle:
        return FileState(handle.read(), stat.S_IMODE(st.st_mode))


def plan_files(root: str, backend: str, wanted: Mapping[str, bytes], owned: Sequence[str]) -> FilePlan:
    """Compare the wanted files with the node's: what to write, what to remove, and what each was before."""
    plan = FilePlan(MODES[backend])
    for path, data in wanted.items():
        before = read_state(root, path)
        if before is None or before.data != data or before.mode != plan.mode:
            plan.writes[path] = data
            plan.previous[path] = before
    for path in owned_files(root, owned):
        if path in wanted:
            continue
        before = read_state(root, path)
        if before is not None:
            plan.removes.append(path)
            plan.previous[path] = before
    return plan


def as_text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def file_diffs(plan: FilePlan) -> list[dict[str, Any]]:
    """One diff entry per file written or removed, as Ansible's diff callback shows them."""
    diffs: list[dict[str, Any]] = []
    for path in plan.changed_paths:
        before = plan.previous.get(path)
        after = plan.writes.get(path)
        diffs.append({
            "before_header": f"{path} (absent)" if before is None else f"{path} (mode {mode_text(before.mode)})",
            "after_header": f"{path} (removed)" if after is None else f"{path} (mode {mode_text(plan.mode)})",
            "before": "" if before is None else as_text(before.data),
            "after": "" if after is None else as_text(after),
        })
    return diffs


def parse_addresses(text: str) -> dict[str, list[str]]:
    """Each interface's IPv4 addresses with their prefix, from the JSON of ``ip -j -4 addr show``."""
    data = json.loads(text or "[]")
    if not isinstance(data, list):
        raise ValueError("not a list of interfaces")
    found: dict[str, list[str]] = {}
    for link in data:
        if not isinstance(link, dict) or not link.get("ifname"):
            continue  # ip prints {} for an interface without an address of the family
        held = found.setdefault(str(link["ifname"]), [])
        for info in link.get("addr_info") or []:
            if info.get("family", "inet") == "inet" and info.get("local") and info.get("prefixlen") is not None:
                held.append(ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").with_prefixlen)
    return found


def live_addresses(runner: Runner) -> dict[str, list[str]]:
    """The node's IPv4 addresses by interface; FabricError when ip cannot tell."""
    rc, out, err = runner(IP_ADDR)
    if rc != 0:
        raise FabricError(f"{' '.join(IP_ADDR)} exited {rc}: {(err or out).strip()}")
    try:
        return parse_addresses(out)
    except (ValueError, TypeError, AttributeError) as error:
        raise FabricError(f"{' '.join(IP_ADDR)} printed what is not its JSON: {error}") from None


def missing_twins(twins: Sequence[Twin], live: Mapping[str, Sequence[str]]) -> list[Twin]:
    return [twin for twin in twins if twin.address not in live.get(twin.name, [])]


def twin_addresses(twins: Sequence[Twin], live: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    return {twin.name: list(live.get(twin.name, [])) for twin in twins}


def netplan_files(root: str) -> list[str]:
    """The node paths of every netplan file (*.yaml of the three netplan folders)."""
    found: list[str] = []
    for folder in NETPLAN_DIRS:
        for match in sorted(glob.glob(host_path(root, f"/{folder}/*.yaml"))):
            found.append(f"/{folder}/{os.path.basename(match)}")
    return found


def stage_netplan(root: str, staging: str, wanted: Mapping[str, bytes], owned: Sequence[str]) -> None:
    """Fill staging with the node's netplan files that are not sparkserve's, and the wanted files."""
    for path in netplan_files(root):
        if not is_owned(path, owned) and os.path.isfile(host_path(root, path)):
            os.makedirs(os.path.dirname(host_path(staging, path)), exist_ok=True)
            shutil.copyfile(host_path(root, path), host_path(staging, path))
            os.chmod(host_path(staging, path), 0o600)
    for path, data in wanted.items():
        os.makedirs(os.path.dirname(host_path(staging, path)), exist_ok=True)
        with open(host_path(staging, path), "wb") as handle:
            handle.write(data)
        os.chmod(host_path(staging, path), 0o600)


def validate_netplan(root: str, wanted: Mapping[str, bytes], owned: Sequence[str], runner: Runner) -> None:
    """Have netplan generate the new configuration in a scratch root; FabricError with its message if refused."""
    staging = tempfile.mkdtemp(prefix="sparkserve-netplan-")
    try:
        stage_netplan(root, staging, wanted, owned)
        rc, out, err = runner(["netplan", "generate", "--root-dir", staging])
    except OSError as error:
        raise FabricError(f"cannot copy the netplan files for netplan generate to check; nothing was changed: "
                          f"{error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if rc != 0:
        said = (err.strip() or out.strip() or f"exit {rc}").replace(staging, "")
        raise FabricError(f"netplan generate refused the fabric configuration; nothing was changed: {said} "
                          f"(sparkserve's file: {', '.join(sorted(wanted)) or 'none'})")


def install(root: str, plan: FilePlan) -> None:
    """Write and remove the plan's files (OSError on the first that fails)."""
    for path in sorted(plan.writes):
        full = host_path(root, path)
        os.makedirs(os.path.dirname(full), mode=0o755, exist_ok=True)
        write_atomic(full, plan.writes[path], plan.mode)
    for path in plan.removes:
        os.unlink(host_path(root, path))


def restore(root: str, plan: FilePlan) -> list[str]:
    """Put every file of the plan back as it was; the paths that could not be, with why."""
    failed: list[str] = []
    for path, before in sorted(plan.previous.items()):
        full = host_path(root, path)
        try:
            if before is None:
                if os.path.lexists(full):
                    os.unlink(full)
            else:
                os.makedirs(os.path.dirname(full), mode=0o755, exist_ok=True)
                write_atomic(full, before.data, before.mode)
        except OSError as err:
            failed.append(f"{path}: {err.strerror or err}")
    return failed


def apply_commands(backend: str, twins: Sequence[Twin], changed_paths: Sequence[str]) -> list[list[str]]:
    """The commands that apply the installed files to the twins, and to nothing else."""
    netplan_changed = any(path.lstrip("/").startswith(tuple(f"{d}/" for d in NETPLAN_DIRS))
                          for path in changed_paths)
    commands: list[list[str]] = []
    if backend == "netplan" or netplan_changed:
        commands.append(["netplan", "generate"])
    commands.append(["networkctl", "reload"])
    if twins:
        commands.append(["networkctl", "reconfigure", *[twin.name for twin in twins]])
    return commands


def run_commands(commands: Sequence[Sequence[str]], runner: Runner, stop: bool) -> list[str]:
    """Run the commands in order; what each failing one said (stopping at the first when stop is set)."""
    errors: list[str] = []
    for argv in commands:
        rc, out, err = runner(argv)
        if rc != 0:
            errors.append(f"{' '.join(argv)} exited {rc}: {(err.strip() or out.strip() or 'no message')}")
            if stop:
                break
    return errors


def wait_for_addresses(twins: Sequence[Twin], runner: Runner, wait_s: float, clock: Clock, sleep: Sleep
                       ) -> dict[str, list[str]]:
    """Read the addresses every POLL_S until every twin holds its own or wait_s has passed; the last read."""
    deadline = clock() + max(wait_s, 0.0)
    while True:
        try:
            live = live_addresses(runner)
        except FabricError:
            live = {}
        if not missing_twins(twins, live) or clock() >= deadline:
            return live
        sleep(min(POLL_S, max(deadline - clock(), 0.0)))


def describe_missing(twins: Sequence[Twin], live: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(f"{twin.name}: wanted {twin.address}, has [{', '.join(live.get(twin.name, []))}]"
                     for twin in missing_twins(twins, live))


def undo(root: str, plan: FilePlan, commands: Sequence[Sequence[str]], runner: Runner) -> str:
    """Put the previous files back and apply them again; how that went, for the end of the message."""
    if not plan.previous:
        return "the fabric configuration files were already as wanted and were left as they are"
    failed = restore(root, plan)
    if failed:
        return ("restoring the previous fabric configuration FAILED for " + "; ".join(failed)
                + "; fix these files by hand")
    errors = run_commands(commands, runner, stop=False)
    said = "the previous fabric configuration was restored"
    return said + (f" (applying it again: {'; '.join(errors)})" if errors else "")


def outcome(plan: FilePlan, twins: Sequence[Twin], live: Mapping[str, Sequence[str]], changed: bool,
            applied: bool, service_changed: bool = False) -> dict[str, Any]:
    return {"changed": changed or service_changed, "files_written": sorted(plan.writes),
            "files_removed": sorted(plan.removes), "applied": applied, "service_changed": service_changed,
            "addresses": twin_addresses(twins, live)}


def keep_service(service: str, check_mode: bool, runner: Runner) -> bool:
    """Start and enable the unit that gives the addresses when it needs it; whether it did (or would)."""
    if not service:
        return False

    def timed(argv: Sequence[str], _timeout_s: float) -> tuple[int, str, str]:
        return runner(argv)

    try:
        return keep_running(service, True, check_mode, timed)
    except UnitError as err:
        raise FabricError(f"the fabric's addresses need {service} running: {err}") from None


def apply_and_wait(params: Mapping[str, Any], plan: FilePlan, twins: Sequence[Twin], runner: Runner,
                   clock: Clock, sleep: Sleep) -> dict[str, list[str]]:
    """Install, apply and wait; on any failure undo and raise FabricError. The addresses read last."""
    root = params["root"]
    commands = apply_commands(params["backend"], twins, plan.changed_paths)
    try:
        install(root, plan)
    except OSError as err:
        failed = restore(root, plan)
        tail = ("restoring FAILED for " + "; ".join(failed)) if failed else "the previous files were restored"
        raise FabricError(f"could not install the fabric configuration: {err}; {tail}",
                          outcome(plan, twins, {}, True, False)) from None
    errors = run_commands(commands, runner, stop=True)
    if errors:
        raise FabricError(f"applying the fabric configuration failed: {errors[0]}; "
                          f"{undo(root, plan, commands, runner)}", outcome(plan, twins, {}, True, True))
    live = wait_for_addresses(twins, runner, params["wait_s"], clock, sleep)
    if missing_twins(twins, live):
        raise FabricError(f"the fabric addresses did not come up within {params['wait_s']:g} s "
                          f"({describe_missing(twins, live)}); {undo(root, plan, commands, runner)}",
                          outcome(plan, twins, live, True, True))
    return live


def converge(params: Mapping[str, Any], check_mode: bool = False, want_diff: bool = False, runner: Runner = run,
             clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> dict[str, Any]:
    """Make the twins' configuration and addresses what params say; the result, or FabricError (see the docs)."""
    twins = parse_twins(params["interfaces"])
    wanted = parse_files(params["files"], params["owned"])
    try:
        plan = plan_files(params["root"], params["backend"], wanted, params["owned"])
    except OSError as err:
        raise FabricError(f"cannot read the fabric configuration files: {err}") from None
    service_changed = keep_service(params["service"], check_mode, runner)
    live = live_addresses(runner)
    changed = bool(plan.previous) or bool(missing_twins(twins, live))
    applied = changed and not check_mode
    if applied:
        if plan.previous and params["backend"] == "netplan":
            validate_netplan(params["root"], wanted, params["owned"], runner)
        live = apply_and_wait(params, plan, twins, runner, clock, sleep)
    result = outcome(plan, twins, live, changed, applied, service_changed)
    if want_diff and plan.previous:
        result["diff"] = file_diffs(plan)
    return result


def main(runner: Runner = run, clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> None:
    module = AnsibleModule(
        argument_spec={
            "backend": {"type": "str", "required": True, "choices": ["netplan", "networkd"]},
            "files": {"type": "dict", "default": {}},
            "owned": {"type": "list", "elements": "str", "required": True},
            "interfaces": {"type": "list", "elements": "dict", "default": [], "options": {
                "name": {"type": "str", "required": True},
                "address": {"type": "str", "required": True},
            }},
            "wait_s": {"type": "float", "default": 30.0},
            "service": {"type": "str", "default": "systemd-networkd.service"},
            "root": {"type": "path", "default": "/"},
            "roce": {"type": "dict", "options": {k: v for k, v in ROCE_SPEC.items() if k != "fail_on_problems"}},
        },
        supports_check_mode=True,
    )
    try:
        result = converge(module.params, module.check_mode, module._diff, runner, clock, sleep)
    except FabricError as err:
        failed: dict[str, Any] = {"changed": False, **err.result}
        module.fail_json(msg=str(err), **failed)
        return
    module.exit_json(**result, **roce_unchanged(module.params["roce"], result["changed"]))


def roce_unchanged(params: Mapping[str, Any] | None, changed: bool) -> dict[str, Any]:
    """The RoCE facts, read when asked and nothing changed (see the docs); else nothing."""
    if not params or changed:
        return {}
    try:
        roce = read_roce(dict(params))
    except ValueError:  # options roce_facts refuses: its own call says why
        return {}
    return {"roce": roce, "ansible_facts": {"sparkserve_roce": roce}}


if __name__ == "__main__":
    main()
