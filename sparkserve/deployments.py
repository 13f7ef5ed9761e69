"""Which deployments a verb acts on: the inventory's deployments, read on the controller, and --deployment as a limit.

An inventory may list several deployments (a cluster file's ``deployments:``). Each deployment's hosts are the
inventory group ``deployment_NAME`` (``group_name``: ``-`` and ``.`` as ``_``) and carry ``sparkserve_deployment``;
the plays that act on one deployment run one batch per deployment, so a limit to that group runs the playbook for
that deployment alone. ``read_inventory`` lists them with ``ansible-inventory --list`` (the inventory plugins only:
no vars plugin, so no group_vars file and no vault password is read, and no host is contacted); ``scope`` turns the
command line's ``--deployment`` (and ``--all``) into the run's ``--limit``:

- ``--deployment a`` is ``deployment_a:localhost`` (the controller's plays, such as the context's first play, the
  bench and the qualification, run on localhost, which a limit leaves out unless it names it); several are their
  union, ``deployment_a:deployment_b:localhost``;
- with ``--limit L`` too, the intersection: ``L:localhost:!deployment_c`` where c is every other deployment of
  the inventory (ansible's ``&`` applies after every union, so ``L:&deployment_a`` would also leave out the
  controller's plays);
- none named: every deployment for ``up``, ``status``, ``render``, ``check`` and ``diagnose``; ``down`` stops
  several only with ``--all``; ``logs``, ``upgrade``, ``rollback`` and ``bench`` act on one, so with several
  deployments they ask which. A ``--limit`` of the user's own lifts both requirements (it already says what runs).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.deployments import GROUP_PREFIX, group_name
from sparkserve.project import UsageError
from sparkserve.runner import Invocation, run_envvars

# Verbs that act on one deployment: with several in the inventory, --deployment names it.
ONE_DEPLOYMENT_VERBS = frozenset({"logs", "upgrade", "rollback", "bench"})
# The controller's own plays (hosts: localhost) run under a --deployment limit too.
CONTROLLER = "localhost"
READ_TIMEOUT_S = 120
STDERR_LINES = 6


@dataclass(frozen=True)
class Deployment:
    """One deployment of the inventory: its name, its group, and whether it serves (not marked absent)."""

    name: str
    group: str
    present: bool = True


@dataclass(frozen=True)
class InventoryRead:
    """What reading the inventory gave: its deployments in file order, or why it could not be read."""

    deployments: tuple[Deployment, ...] = ()
    problem: str = ""

    @property
    def present(self) -> list[Deployment]:
        return [d for d in self.deployments if d.present]


Reader = Callable[[Path, Path, Mapping[str, str]], InventoryRead]


def _members(listing: Mapping[str, Any], group: str, seen: set[str] | None = None) -> list[str]:
    """Every host of a group of ``ansible-inventory --list``, its children's included."""
    seen = set() if seen is None else seen
    if group in seen or not isinstance(listing.get(group), Mapping):
        return []
    seen.add(group)
    entry = listing[group]
    hosts = [str(h) for h in entry.get("hosts") or []]
    for child in entry.get("children") or []:
        hosts += _members(listing, str(child), seen)
    return hosts


def deployments_of(listing: Mapping[str, Any]) -> tuple[Deployment, ...]:
    """The deployments of an ``ansible-inventory --list`` document, in the inventory's order.

    A deployment is a ``deployment_*`` group; its name is its hosts' ``sparkserve_deployment``, else their
    ``sparkserve_recipe`` (one deployment named after its recipe), else the group's name without the prefix. It
    is present when one of its hosts is in ``sparks`` (a deployment marked absent has its hosts in ``absent``
    only). A plain inventory has no such group: ().
    """
    meta = listing.get("_meta")
    hostvars = meta.get("hostvars") if isinstance(meta, Mapping) else None
    hostvars = hostvars if isinstance(hostvars, Mapping) else {}
    top = listing.get("all")
    children = [str(c) for c in (top.get("children") or [] if isinstance(top, Mapping) else [])]
    groups = [g for g in children if g.startswith(GROUP_PREFIX)]
    groups += sorted(str(g) for g in listing if str(g).startswith(GROUP_PREFIX) and g not in groups)
    sparks = set(_members(listing, "sparks"))
    found: list[Deployment] = []
    for group in groups:
        hosts = _members(listing, group)
        # One deployment named after its recipe carries only sparkserve_recipe.
        names = [hostvars[h].get("sparkserve_deployment") or hostvars[h].get("sparkserve_recipe")
                 for h in hosts if isinstance(hostvars.get(h), Mapping)]
        name = next((str(n) for n in names if isinstance(n, str) and n), group[len(GROUP_PREFIX):])
        found.append(Deployment(name=name, group=group, present=not hosts or any(h in sparks for h in hosts)))
    return tuple(found)


def ansible_inventory() -> str:
    """The ansible-inventory beside this interpreter (.venv/bin), else the one on PATH."""
    beside = Path(sys.executable).with_name("ansible-inventory")
    return str(beside) if beside.exists() else "ansible-inventory"


def read_inventory(root: Path, inventory: Path, environ: Mapping[str, str]) -> InventoryRead:
    """The inventory's deployments, read with ``ansible-inventory --list`` as the run will read the inventory.

    Only the inventory plugins run (``ANSIBLE_VARS_ENABLED`` empty): the deployments are the plugins' groups and
    host variables, so no group_vars file is read, no vault password is asked, and no host is contacted.
    """
    env = {**environ, **run_envvars(root, environ), "ANSIBLE_VARS_ENABLED": ""}
    try:
        done = subprocess.run([ansible_inventory(), "-i", str(inventory), "--list"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=READ_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return InventoryRead(problem=f"ansible-inventory did not run ({error})")
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()][-STDERR_LINES:]
        return InventoryRead(problem=f"ansible-inventory exited {done.returncode}: " + (" ".join(lines) or "no output"))
    try:
        listing = json.loads(done.stdout)
    except ValueError as error:
        return InventoryRead(problem=f"ansible-inventory printed no JSON ({error})")
    if not isinstance(listing, Mapping):
        return InventoryRead(problem="ansible-inventory printed no inventory")
    return InventoryRead(deployments=deployments_of(listing))


def _names(deployments: Sequence[Deployment]) -> str:
    return ", ".join(d.name for d in deployments)


def find(name: str, read: InventoryRead) -> Deployment:
    """The deployment NAME (or the one whose group it maps to), or a UsageError listing the names."""
    for deployment in read.deployments:
        if name == deployment.name:
            return deployment
    for deployment in read.deployments:
        if group_name(name) == deployment.group:
            return deployment
    if not read.deployments:
        raise UsageError(f"--deployment {name}: the inventory names no deployment (it has no deployment_* group, "
                         "so it serves one deployment: leave --deployment out)")
    raise UsageError(f"--deployment {name}: the inventory has no such deployment; its deployments are "
                     f"{_names(read.deployments)}")


def limit_for(chosen: Sequence[Deployment], user_limit: str | None, every: Sequence[Deployment]) -> str:
    """ansible's --limit for the chosen deployments, within the user's own --limit (see the module's docstring)."""
    groups = list(dict.fromkeys(d.group for d in chosen))
    if not user_limit:
        return ":".join([*groups, CONTROLLER])
    others = [g for g in dict.fromkeys(d.group for d in every) if g not in groups]
    return ":".join([user_limit, CONTROLLER, *(f"!{g}" for g in others)])


def scope(inv: Invocation, names: Sequence[str], everything: bool, read_with: Reader, root: Path,
          environ: Mapping[str, str]) -> Invocation:
    """The invocation limited to the deployments named (none: as the verb's default; see the module's docstring)."""
    if everything and names:
        raise UsageError("give --deployment NAME or --all, not both")
    must_choose = not inv.limit and not everything and (inv.verb in ONE_DEPLOYMENT_VERBS or inv.verb == "down")
    if not names and not must_choose:
        return inv
    read = read_with(root, inv.inventory, environ)
    if read.problem:
        if names:
            raise UsageError(f"cannot read the deployments of {inv.inventory} to find "
                             f"{', '.join(names)}: {read.problem}")
        return inv  # the run reads the same inventory and says what is wrong with it
    if not names:
        present = read.present
        if len(present) > 1:
            if inv.verb == "down":
                raise UsageError(f"the inventory has {len(present)} deployments ({_names(present)}); name the one "
                                 "to stop with --deployment NAME, or stop them all with --all")
            raise UsageError(f"the inventory has {len(present)} deployments ({_names(present)}) and {inv.verb} "
                             "acts on one; name it with --deployment NAME")
        return inv
    chosen = [find(name, read) for name in names]
    return dataclasses.replace(inv, limit=limit_for(chosen, inv.limit, read.deployments))
