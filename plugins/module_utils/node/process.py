"""Running a command on this node, or on a peer over ssh, with a timeout."""

from __future__ import annotations

import shlex
import subprocess
from typing import Callable, List, Optional, Sequence, Tuple

RC_NOT_STARTED = 127  # the command could not be started
RC_TIMED_OUT = 124  # it did not end in time
RC_SSH_FAILED = 255  # ssh's own status when it could not connect

# A command's exit status, stdout and stderr; a runner is given the argv and a timeout in seconds.
CommandResult = Tuple[int, str, str]
Runner = Callable[[Sequence[str], float], CommandResult]


def run_command(command: Sequence[str], timeout_s: float) -> CommandResult:
    """Run a command; its exit status, stdout and stderr (127: could not start, 124: timed out)."""
    try:
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout_s, check=False)
    except OSError as err:
        return RC_NOT_STARTED, "", f"cannot run {command[0]}: {err.strerror}"
    except subprocess.TimeoutExpired:
        return RC_TIMED_OUT, "", f"no answer after {timeout_s:.0f} s"
    return done.returncode, done.stdout, done.stderr


def remote_argv(ssh_argv: Sequence[str], host: Optional[str], argv: Sequence[str]) -> List[str]:
    """argv itself for this node (no host), else ``SSH_ARGV HOST -- 'ARGV'`` (one quoted remote command)."""
    if not host:
        return list(argv)
    return [*ssh_argv, host, "--", shlex.join(argv)]


def one_line(text: str, limit: Optional[int] = None) -> str:
    """Text on one line (white space folded), cut to limit characters with ``...`` when given."""
    flat = " ".join(text.split())
    return flat if limit is None or len(flat) <= limit else flat[: limit - 3] + "..."
