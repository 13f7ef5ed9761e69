"""The supervisor program: its arguments, its loop and its exit status (the entry point is
roles/supervisor/files/sparkserve-supervisor.py)."""

from __future__ import annotations

import signal
import time
from typing import Callable, Sequence

from ..api import http_request
from ..config import run_config_program
from ..lifecycle import Terminated, log
from ..process import Runner, run_command
from .config import Config, load_config
from .heal import Supervisor
from .probe import Http


def run(config: Config, once: bool = False, runner: Runner = run_command, http: Http = http_request,
        clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> int:
    """Step until SIGTERM (or once); 0 then, 1 when the state or lock directory cannot be written."""
    supervisor = Supervisor(config, runner=runner, http=http, clock=clock, sleep=sleep)
    shutdown = supervisor.shutdown
    previous = {sig: signal.signal(sig, shutdown.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    log(f"supervisor {config.deployment}: supervising from {config.head} the render {config.render_path}")
    try:
        while True:
            delay = supervisor.step()
            if once:
                return 0
            sleep(delay)
    except Terminated:
        shutdown.deferred = True
        supervisor.remove_metrics()
        log(f"supervisor {config.deployment}: terminated; exiting")
        return 0
    except OSError as err:
        log(f"supervisor {config.deployment}: {err}; exiting")
        return 1
    finally:
        supervisor.lock.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    return run_config_program(
        argv, "supervisor",
        "Heal a serving sparkserve deployment from its head: watch, and restart every rank in order.",
        "the supervisor's JSON config file", "one step, then exit", load_config,
        lambda config, once: run(config, once=once))
