"""How a verb becomes one ansible_runner.run() call, and what is kept of the runs.

build_run_kwargs() is the whole call, as data: the CLI and the tests build it the same way, and only
run_playbook() hands it to ansible-runner.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import ansible_runner  # type: ignore[import-untyped]  # ansible-runner ships no type information

from sparkserve.project import host_key_checking

# What ansible-playbook prints when it asks for a vault password: "Vault password: " for
# --ask-vault-pass, "Vault password (LABEL): " for --vault-id LABEL@prompt.
VAULT_PROMPT = r"^Vault password[^\n]*:\s*$"
RUN_ID = re.compile(r"^\d{8}T\d{6}Z-[a-z]+(-\d+)?$")
# ansible-runner writes env/ and inventory/ into its private data folder: one of its own per run, here.
PRIVATE_DIRS = Path(".cache") / "runner"
RUNS_DIR = Path("artifacts") / "runs"
# ansible-runner points Ansible's fact cache into each run's artifacts unless the cache type is not
# "jsonfile"; any other value leaves ansible.cfg's cache (.cache/facts) in charge, as with ansible-playbook.
FACT_CACHE_FROM_ANSIBLE_CFG = "ansible.cfg"


@dataclass(frozen=True)
class Invocation:
    """One verb's playbook run, as the command line asked for it."""

    verb: str
    playbook: str  # relative to the project's root
    inventory: Path
    extra_vars: tuple[str, ...] = ()  # each one -e value, in order
    tags: tuple[str, ...] = ()
    limit: str | None = None
    vault_ids: tuple[str, ...] = ()
    vault_password_file: str | None = None
    ask_vault_pass: bool = False
    verbosity: int = 0

    @property
    def prompts_for_vault(self) -> bool:
        """Whether ansible-playbook will ask for a vault password (answered through runner's passwords)."""
        return self.ask_vault_pass or any(v.endswith("@prompt") for v in self.vault_ids)


def cmdline_args(inv: Invocation) -> list[str]:
    """ansible-playbook's options beyond the inventory and the playbook, which runner adds itself."""
    args: list[str] = []
    for value in inv.extra_vars:
        args += ["-e", value]
    if inv.tags:
        args += ["--tags", ",".join(inv.tags)]
    if inv.limit:
        args += ["--limit", inv.limit]
    for vault_id in inv.vault_ids:
        args += ["--vault-id", vault_id]
    if inv.vault_password_file:
        args += ["--vault-password-file", inv.vault_password_file]
    if inv.ask_vault_pass:
        args.append("--ask-vault-pass")
    if inv.verbosity:
        args.append("-" + "v" * inv.verbosity)
    return args


def run_envvars(root: Path, environ: Mapping[str, str], python: str = sys.executable) -> dict[str, str]:
    """Variables set on top of this process's environment (which ansible-runner passes on)."""
    bin_dir = str(Path(python).parent)
    path = environ.get("PATH", "")
    env = {
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        # ansible-playbook and the collection's tools are beside this interpreter, in .venv/bin.
        "PATH": path if path.split(os.pathsep)[0] == bin_dir else os.pathsep.join(p for p in (bin_dir, path) if p),
    }
    if "ANSIBLE_HOST_KEY_CHECKING" not in environ:
        env["ANSIBLE_HOST_KEY_CHECKING"] = host_key_checking(root)
    return env


def new_ident(verb: str, runs_dir: Path, now: datetime | None = None) -> str:
    """UTC-TIME-VERB, with a counter when that folder exists already (two runs in one second)."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    ident, n = f"{stamp}-{verb}", 1
    while (runs_dir / ident).exists():
        n += 1
        ident = f"{stamp}-{verb}-{n}"
    return ident


def build_run_kwargs(
    inv: Invocation,
    root: Path,
    ident: str,
    private_data_dir: Path,
    *,
    event_handler: Callable[[dict[str, Any]], bool],
    cancel_callback: Callable[[], bool] | None = None,
    vault_password: str | None = None,
    environ: Mapping[str, str] | None = None,
    runs_dir: Path | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ansible_runner.run() for one invocation.

    Runner keeps each run's events (job_events/), stdout, command and rc in RUNS_DIR/IDENT/.
    """
    kwargs: dict[str, Any] = {
        "private_data_dir": str(private_data_dir),
        "project_dir": str(root),
        "playbook": inv.playbook,
        "inventory": str(inv.inventory),
        "cmdline": shlex.join(cmdline_args(inv)),
        "envvars": run_envvars(root, os.environ if environ is None else environ),
        "ident": ident,
        "artifact_dir": str(runs_dir or root / RUNS_DIR),
        # Retention is prune_runs()'s: newest by run name, only run folders, counted after the run.
        "rotate_artifacts": 0,
        "quiet": True,
        "event_handler": event_handler,
        "fact_cache_type": FACT_CACHE_FROM_ANSIBLE_CFG,
        # Nothing (above all no vault password) is written into the private data folder's env/.
        "suppress_env_files": True,
    }
    if cancel_callback is not None:
        kwargs["cancel_callback"] = cancel_callback
    if vault_password is not None:
        kwargs["passwords"] = {VAULT_PROMPT: vault_password}
    return kwargs


@dataclass
class RunResult:
    rc: int
    status: str
    artifacts: Path


def run_playbook(kwargs: dict[str, Any]) -> RunResult:
    """Run ansible-playbook through ansible-runner (the only place that does)."""
    result = ansible_runner.run(**kwargs)
    rc = result.rc if isinstance(result.rc, int) else 1
    return RunResult(rc=rc, status=str(result.status), artifacts=Path(kwargs["artifact_dir"]) / kwargs["ident"])


@contextmanager
def private_data_dir(parent: Path, ident: str) -> Iterator[Path]:
    """A fresh, empty private data folder for one run (under parent), removed after it."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{ident}.", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def prune_runs(runs_dir: Path, keep: int) -> list[Path]:
    """Remove all but the newest `keep` run folders (0 keeps every run); returns the removed ones.

    Only folders named like a run (UTC-TIME-VERB) count; their names sort by time.
    """
    if keep <= 0 or not runs_dir.is_dir():
        return []
    runs = sorted(p for p in runs_dir.iterdir() if p.is_dir() and RUN_ID.match(p.name))
    removed = runs[:-keep] if len(runs) > keep else []
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


@dataclass
class Interrupt:
    """Ctrl-C during a run: the first asks ansible-playbook to stop (SIGINT, as in a terminal), the second
    has ansible-runner kill it (through cancel_callback)."""

    pid: Callable[[], int | None]
    kill: Callable[[int, int], None] = os.kill
    notify: Callable[[str], None] = field(default=lambda _message: None)
    count: int = 0

    def handle(self, _signum: int = signal.SIGINT, _frame: FrameType | None = None) -> None:
        self.count += 1
        pid = self.pid()
        if self.count == 1 and pid is not None:
            self.notify("stopping the playbook (Ctrl-C again to kill it)")
            try:
                self.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        else:
            self.notify("killing the playbook")

    def cancel(self) -> bool:
        """ansible-runner's cancel_callback: kill once a second Ctrl-C came (or the first found no pid)."""
        return self.count >= 2 or (self.count == 1 and self.pid() is None)

    @property
    def interrupted(self) -> bool:
        return self.count > 0


@contextmanager
def sigint_to(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Route SIGINT to handler while a run is in progress (ansible-playbook runs in its own session).

    Only the main thread may set signal handlers; elsewhere SIGINT keeps its own.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
