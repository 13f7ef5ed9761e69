"""The supervisor program: its arguments, its loop and its exit status (the entry point is
roles/supervisor/files/sparkserve-supervisor.py)."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from ..api import http_request
from ..config import run_config_program
from ..lifecycle import log, run_until_terminated
from ..process import Runner, run_command
from .config import Config, load_config
from .heal import Supervisor
from .probe import Http


def run(config: Config, once: bool = False, runner: Runner = run_command, http: Http = http_request,
        clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> int:
    """Step until SIGTERM (or once); 0 then, 1 when the state or lock directory cannot be written."""
    supervisor = Supervisor(config, runner=runner, http=http, clock=clock, sleep=sleep)
    log(f"supervisor {config.deployment}: supervising from {config.head} the render {config.render_path}")
    return run_until_terminated(
        f"supervisor {config.deployment}", supervisor.shutdown, supervisor.step, once, sleep,
        on_terminate=supervisor.remove_metrics, fatal=(OSError,), cleanup=supervisor.lock.release)


def main(argv: Sequence[str] | None = None) -> int:
    return run_config_program(
        argv, "supervisor",
        "Heal a serving sparkserve deployment from its head: watch, and restart every rank in order.",
        "the supervisor's JSON config file", "one step, then exit", load_config,
        lambda config, once: run(config, once=once))
