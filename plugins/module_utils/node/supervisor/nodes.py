"""The deployment's nodes as the supervisor reaches them: commands over ssh, the ranks' containers, memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from .. import docker
from ..config import is_int
from ..meminfo import MeminfoError, parse_meminfo, read_meminfo
from ..process import RC_SSH_FAILED, CommandResult, Runner, one_line, remote_argv
from .config import Config
from .render import Rank

INSPECT_TIMEOUT_S = 30.0
CAT_TIMEOUT_S = 30.0
DETAIL_CHARS = 200


@dataclass(frozen=True)
class Seen:
    """What docker inspect told of one rank's container.

    status: running, exited, oom (killed by the kernel's out-of-memory killer), gone, unreachable (ssh did
    not connect), unknown (docker did not answer in a way that says).
    """

    rank: Rank
    status: str
    exit_code: int | None = None
    started_at: float | None = None
    detail: str = ""

    @property
    def stopped(self) -> bool:
        return self.status in ("exited", "oom", "gone")

    def cause(self) -> str:
        why = {"oom": "killed by the kernel's out-of-memory killer", "gone": "gone"}.get(
            self.status, f"exited with code {self.exit_code}")
        return f"rank {self.rank.rank} on {self.rank.node} is not running ({why})"


@dataclass(frozen=True)
class Memory:
    """A node's MemAvailable in bytes, or None and why it could not be read."""

    available: int | None
    error: str = ""


class Nodes:
    """Runs commands on the deployment's nodes: on the head directly, on the others over ssh."""

    def __init__(self, config: Config, runner: Runner) -> None:
        self.config = config
        self.runner = runner

    def argv(self, node: str, argv: Sequence[str]) -> list[str]:
        host = None if node == self.config.head else self.config.nodes[node]
        return remote_argv(self.config.ssh_argv, host, argv)

    def run(self, node: str, argv: Sequence[str], timeout_s: float) -> CommandResult:
        return self.runner(self.argv(node, argv), timeout_s)

    def unreached(self, node: str, rc: int) -> bool:
        """Whether a command failed because ssh could not connect to the node."""
        return rc == RC_SSH_FAILED and node != self.config.head

    def inspect(self, rank: Rank) -> Seen:
        rc, out, err = self.run(rank.node, docker.inspect_argv(rank.container), INSPECT_TIMEOUT_S)
        seen = docker.read_inspect(rc, out, err)
        words = one_line(err or out, DETAIL_CHARS)
        if seen.status == docker.GONE:
            return Seen(rank, "gone")
        if seen.status == docker.FAILED:
            if rc == 0:
                return Seen(rank, "unknown",
                            detail=f"docker inspect answered {json.dumps(one_line(out, DETAIL_CHARS))}")
            if self.unreached(rank.node, rc):
                return Seen(rank, "unreachable", detail=f"ssh could not connect: {words}")
            return Seen(rank, "unknown", detail=f"docker inspect failed with status {rc}: {words}")
        if seen.status == docker.RUNNING:
            return Seen(rank, "running", started_at=seen.started_at)
        code = seen.exit_code
        return Seen(rank, seen.status, exit_code=code if is_int(code) else None, started_at=seen.started_at)

    def memory(self, node: str) -> Memory:
        """The node's MemAvailable: the head's file read here, the others' with cat over ssh."""
        path = self.config.meminfo_path
        if node == self.config.head:
            try:
                values = read_meminfo(path)
            except MeminfoError as err:
                return Memory(None, str(err))
        else:
            rc, text, errors = self.run(node, ["cat", path], CAT_TIMEOUT_S)
            if rc != 0:
                return Memory(None, f"cat {path} failed with status {rc}: {one_line(errors or text, DETAIL_CHARS)}")
            values = parse_meminfo(text)
        available = values.get("MemAvailable")
        return Memory(available, "" if available is not None else f"{path} has no MemAvailable")
