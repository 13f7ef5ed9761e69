"""Where things are in the checkout the command was installed from, and which playbook each verb runs."""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from pathlib import Path

# The package is installed editable: the project's root is the folder that holds it.
ROOT = Path(__file__).resolve().parent.parent

# verb -> (playbook relative to the root, tags it always runs with)
PLAYBOOKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "up": ("site.yml", ()),
    "down": ("playbooks/stop.yml", ()),
    "status": ("playbooks/status.yml", ("status",)),
    "logs": ("playbooks/logs.yml", ()),
    "render": ("playbooks/render.yml", ()),
    "check": ("playbooks/preflight.yml", ()),
    "bench": ("playbooks/bench.yml", ()),
    "rollback": ("playbooks/rollback.yml", ()),
    "upgrade": ("playbooks/upgrade.yml", ()),
    "diagnose": ("playbooks/diagnose.yml", ()),
}

DEFAULT_KEEP_RUNS = 20
KEEP_RUNS_VARIABLE = "SPARKSERVE_KEEP_RUNS"


class UsageError(Exception):
    """Bad input the user can fix; the command exits 2 with the message."""


def default_inventory(root: Path) -> Path:
    """The lab's inventory when the lab wrote one, else an error that says to pass -i."""
    lab = root / "inventory" / "lab"
    if (lab / "cluster.sparks.yml").is_file():
        return lab
    raise UsageError(
        f"no inventory given and {lab / 'cluster.sparks.yml'} does not exist; pass one with "
        f"-i/--inventory (for example -i inventory/example/two-sparks.sparks.yml), or bring the lab up with make lab"
    )


def resolve_inventory(root: Path, given: str | None, cwd: Path) -> Path:
    """The inventory as an absolute path; a relative -i is read from the current folder."""
    if given is None:
        return default_inventory(root)
    path = Path(given).expanduser()
    path = path if path.is_absolute() else cwd / path
    if not path.exists():
        raise UsageError(f"inventory {given}: no such file or folder ({path})")
    return path.resolve()


def keep_runs(environ: Mapping[str, str]) -> int:
    """How many runs artifacts/runs/ keeps (SPARKSERVE_KEEP_RUNS, default 20; 0 keeps every run)."""
    value = environ.get(KEEP_RUNS_VARIABLE, "").strip()
    if not value:
        return DEFAULT_KEEP_RUNS
    if not value.isdigit():
        raise UsageError(f"{KEEP_RUNS_VARIABLE}={value!r}: set a whole number of runs to keep (0 keeps all)")
    return int(value)


def host_key_checking(root: Path) -> str:
    """ansible.cfg's host_key_checking, or Ansible's default (on).

    ansible-runner turns host key checking off unless ANSIBLE_HOST_KEY_CHECKING is set; sparkserve sets it to
    what ansible-playbook would use, so both check the same keys.
    """
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(root / "ansible.cfg", encoding="utf-8")
    except configparser.Error:
        return "True"
    return parser.get("defaults", "host_key_checking", fallback="True").strip() or "True"
