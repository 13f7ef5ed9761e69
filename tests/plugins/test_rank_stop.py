"""Tests for the rank_stop module: a docker double (a script that keeps its containers in a folder and logs
every call) and real listening sockets of this test process, which the module reads from /proc."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.ports import listening
from ansible_collections.sparkserve.deploy.plugins.modules import rank_stop

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

LABEL = "sparkserve.deployment=lab-tp2"

# Containers are files DIR/NAME holding their label; every call is logged. `rm` of a name not there fails
# with docker's words, as `rm --force` does for one already gone; FAIL_RM makes rm fail otherwise.
DOCKER = r"""#!/bin/sh
dir="$(dirname "$0")/containers"
echo "$*" >> "$(dirname "$0")/calls"
cmd=$1; shift
case $cmd in
ps)
  [ -f "$(dirname "$0")/fail_ps" ] && { echo "Cannot connect to the Docker daemon" >&2; exit 1; }
  label=$(echo "$*" | sed 's/.*label=\([^ ]*\).*/\1/')
  for f in "$dir"/*; do [ -f "$f" ] && [ "$(cat "$f")" = "$label" ] && basename "$f"; done; exit 0 ;;
stop)
  shift 2; for n; do [ -f "$dir/$n" ] || echo "Error response from daemon: No such container: $n" >&2; done ;;
rm)
  shift; rc=0
  for n; do
    if [ -f "$(dirname "$0")/fail_rm" ]; then
      echo "Error response from daemon: removal of $n is already in progress" >&2; rc=1
    elif [ -f "$dir/$n" ]; then rm "$dir/$n"
    else echo "Error response from daemon: No such container: $n" >&2; rc=1; fi
  done; exit $rc ;;
esac
"""


@pytest.fixture
def docker(tmp_path: Path) -> Path:
    script = tmp_path / "docker"
    script.write_text(DOCKER)
    script.chmod(0o755)
    (tmp_path / "containers").mkdir()
    return script


def container(docker: Path, name: str, label: str = LABEL) -> None:
    (docker.parent / "containers" / name).write_text(label)


def calls(docker: Path) -> list[str]:
    log = docker.parent / "calls"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket of this process listening on a free port of 127.0.0.1."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server
    server.close()


def run_main(capsys: pytest.CaptureFixture[str], docker: Path, **more: Any) -> dict[str, Any]:
    args = {"label": LABEL, "stop_grace_s": 7, "docker": str(docker), **more}
    with patch_module_args(args), pytest.raises(SystemExit):
        rank_stop.main()
    return json.loads(capsys.readouterr().out)


def test_the_deployments_containers_are_stopped_gracefully_removed_and_others_kept(
        docker: Path, capsys: pytest.CaptureFixture[str]) -> None:
    container(docker, "lab-tp2-rank0")
    container(docker, "lab-tp2-rank0-old")
    container(docker, "other-rank0", "sparkserve.deployment=other")
    result = run_main(capsys, docker)
    assert result["changed"] is True
    assert sorted(result["removed"]) == ["lab-tp2-rank0", "lab-tp2-rank0-old"]
    assert sorted(p.name for p in (docker.parent / "containers").iterdir()) == ["other-rank0"]
    log = calls(docker)
    assert log[0] == f"ps --all --filter label={LABEL} --format {{{{.Names}}}}"
    assert log[1] == "stop --time 7 lab-tp2-rank0 lab-tp2-rank0-old"
    assert log[2] == "rm --force lab-tp2-rank0 lab-tp2-rank0-old"

    again = run_main(capsys, docker)
    assert again == {**again, "changed": False, "removed": [], "listening": []}
    assert len(calls(docker)) == 4  # the second run only listed


def test_check_mode_names_what_it_would_remove_and_the_busy_ports_and_stops_nothing(
        docker: Path, listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    container(docker, "lab-tp2-rank0")
    port = listener.getsockname()[1]
    result = run_main(capsys, docker, ports=[port], _ansible_check_mode=True)
    assert result["changed"] is True
    assert result["removed"] == ["lab-tp2-rank0"]
    assert result["listening"] == [port]
    assert (docker.parent / "containers" / "lab-tp2-rank0").exists()
    assert [c.split()[0] for c in calls(docker)] == ["ps"]


def test_a_container_gone_between_the_list_and_the_removal_is_not_an_error(docker: Path) -> None:
    def gone_runner(argv: Any, timeout_s: float) -> tuple[int, str, str]:
        if argv[1] == "ps":
            return 0, "lab-tp2-rank0\n", ""
        return 1, "", "Error response from daemon: No such container: lab-tp2-rank0\n"

    params = {"label": LABEL, "stop_grace_s": 1, "ports": [], "port_timeout_s": 1, "docker": "docker"}
    assert rank_stop.stop(params, False, runner=gone_runner)["removed"] == ["lab-tp2-rank0"]


def test_a_removal_docker_refuses_fails_naming_the_containers_and_its_words(
        docker: Path, capsys: pytest.CaptureFixture[str]) -> None:
    container(docker, "lab-tp2-rank0")
    (docker.parent / "fail_rm").touch()
    result = run_main(capsys, docker)
    assert result["failed"] is True
    assert "docker could not remove lab-tp2-rank0" in result["msg"]
    assert "already in progress" in result["msg"]


def test_a_daemon_that_does_not_answer_fails_the_list(docker: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (docker.parent / "fail_ps").touch()
    result = run_main(capsys, docker)
    assert result["failed"] is True
    assert result["msg"].startswith(f"cannot list the containers labelled {LABEL}: Cannot connect")


def test_it_returns_once_the_ports_are_closed(docker: Path, listener: socket.socket,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    port = listener.getsockname()[1]
    assert listening(port)
    closer = threading.Timer(0.5, listener.close)
    closer.start()
    result = run_main(capsys, docker, ports=[port], port_timeout_s=30)
    closer.join()
    assert not result.get("failed")
    assert result["listening"] == []
    assert not listening(port)


def test_a_port_another_program_holds_fails_naming_it_after_the_timeout(
        docker: Path, listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    container(docker, "lab-tp2-rank0")
    port = listener.getsockname()[1]
    result = run_main(capsys, docker, ports=[port], port_timeout_s=0)
    assert result["failed"] is True
    assert result["msg"].startswith(f"port {port} still listens 0 s after the deployment's containers were removed "
                                    "(lab-tp2-rank0); another program holds it")
    assert result["removed"] == ["lab-tp2-rank0"]
    assert result["changed"] is True


def test_the_wait_reads_again_until_the_deadline() -> None:
    now = [0.0]
    readings = iter([True, True, False])
    busy = rank_stop.wait_free([8000], 10, is_listening=lambda port: next(readings), clock=lambda: now[0],
                               sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert busy == []
    assert now[0] == pytest.approx(2 * rank_stop.POLL_S)
    now[0] = 0.0
    assert rank_stop.wait_free([8000, 8001], 1, is_listening=lambda port: port == 8001, clock=lambda: now[0],
                               sleep=lambda s: now.__setitem__(0, now[0] + s)) == [8001]
    assert now[0] >= 1
