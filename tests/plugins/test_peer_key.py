"""Tests for the peer_key module, with the real ssh-keygen on a temporary folder."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.modules import peer_key as pk
from tests.tree import snapshot

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfTheNodeForTheTestsOnly root@spark-1\n"


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        pk.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "host.pub").write_text(HOST_KEY)
    return tmp_path


def args(node: Path, **more: Any) -> dict[str, Any]:
    return {"path": str(node / "home" / ".ssh" / "id_peer"), "comment": "sparkserve spark-1",
            "host_key": str(node / "etc" / "host.pub"), **more}


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_key_is_made_and_read_with_the_host_key(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(args(node), capsys)
    key = node / "home" / ".ssh" / "id_peer"
    assert result["changed"] is True and result["made"] is True and result["fixed"] == []
    assert result["host_key"] == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfTheNodeForTheTestsOnly"
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True)
    assert result["public_key"] == " ".join(derived.stdout.split()[:2])
    assert result["public_key"].startswith("ssh-ed25519 ")
    assert (node / "home" / ".ssh" / "id_peer.pub").read_text() == result["public_key"] + " sparkserve spark-1\n"
    assert mode_of(key) == 0o600 and mode_of(key.parent) == 0o700
    again = run_main(args(node), capsys)
    assert again["changed"] is False and again["public_key"] == result["public_key"]


def test_check_mode_makes_nothing_and_says_it_would(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(node)
    result = run_main(dict(args(node), _ansible_check_mode=True), capsys)
    assert result["changed"] is True and result["made"] is True and result["public_key"] == ""
    assert snapshot(node) == before


def test_a_kept_key_gets_its_public_half_and_modes_back(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made = run_main(args(node), capsys)
    key = node / "home" / ".ssh" / "id_peer"
    private = key.read_bytes()
    key.chmod(0o644)
    (node / "home" / ".ssh" / "id_peer.pub").write_text("ssh-ed25519 AAAAsomethingelse old comment\n")
    checked = run_main(dict(args(node), _ansible_check_mode=True), capsys)
    assert checked["fixed"] == ["public key", "mode"] and mode_of(key) == 0o644
    fixed = run_main(args(node, comment="sparkserve renamed"), capsys)
    assert fixed["changed"] is True and fixed["made"] is False and fixed["public_key"] == made["public_key"]
    assert key.read_bytes() == private and mode_of(key) == 0o600
    assert (node / "home" / ".ssh" / "id_peer.pub").read_text() == made["public_key"] + " sparkserve renamed\n"



def test_a_public_half_others_may_write_gets_its_mode_back(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_main(args(node), capsys)
    public = node / "home" / ".ssh" / "id_peer.pub"
    content = public.read_bytes()
    public.chmod(0o666)
    checked = run_main(dict(args(node), _ansible_check_mode=True), capsys)
    assert checked["changed"] is True and checked["fixed"] == ["public key mode"] and mode_of(public) == 0o666
    fixed = run_main(args(node), capsys)
    assert fixed["fixed"] == ["public key mode"] and mode_of(public) == 0o644 and public.read_bytes() == content
    assert run_main(args(node), capsys)["changed"] is False

def test_a_key_ssh_keygen_cannot_read_is_refused_and_left(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = node / "home" / ".ssh" / "id_peer"
    key.parent.mkdir(parents=True)
    key.write_text("not a key\n")
    key.chmod(0o600)
    before = snapshot(node)
    result = run_main(args(node), capsys)
    assert result["failed"] is True and result["msg"].startswith(
        f"{key} is not a private key ssh-keygen can read without a passphrase (")
    assert result["msg"].endswith("it is left as it is: move it away and run again to get a new one")
    assert snapshot(node) == before


@pytest.mark.parametrize("broken", ["missing", "directory", "empty"])
def test_a_host_key_that_cannot_be_read_fails_before_anything_is_written(
        node: Path, capsys: pytest.CaptureFixture[str], broken: str) -> None:
    host = node / "etc" / "host.pub"
    host.unlink()
    if broken == "directory":
        host.mkdir()
    elif broken == "empty":
        host.write_text("")
    before = snapshot(node)
    result = run_main(args(node), capsys)
    assert result["failed"] is True and str(host) in result["msg"]
    assert snapshot(node) == before


def test_a_key_path_that_is_a_directory_is_refused(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node / "home" / ".ssh" / "id_peer").mkdir(parents=True)
    result = run_main(args(node), capsys)
    assert result["failed"] is True and "is there and is not a regular file" in result["msg"]


def test_the_blocks_asked_for_are_read_and_nothing_is_written_to_them(
        node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ssh = node / "home" / ".ssh"
    ssh.mkdir(parents=True)
    known = ssh / "known_hosts"
    known.write_text("other ssh-rsa AAAA\n# BEGIN sparkserve peers\nspark-2 ssh-ed25519 BBBB\n"
                     "# END sparkserve peers\n")
    known.chmod(0o644)
    (ssh / "config").write_bytes(b"\xff\xfe not text")
    asked = [{"path": str(known), "marker": "sparkserve peers"},
             {"path": str(ssh / "config"), "marker": "sparkserve peers"},
             {"path": str(ssh / "authorized_keys"), "marker": "sparkserve peers"}]
    before = snapshot(ssh)
    result = run_main(args(node, blocks=asked), capsys)
    assert result["blocks"] == [
        {"path": str(known), "marker": "sparkserve peers", "exists": True, "readable": True, "mode": "0644",
         "tidy": True, "marked": ["# BEGIN sparkserve peers", "spark-2 ssh-ed25519 BBBB", "# END sparkserve peers"]},
        {"path": str(ssh / "config"), "marker": "sparkserve peers", "exists": True, "readable": False},
        {"path": str(ssh / "authorized_keys"), "marker": "sparkserve peers", "exists": False, "readable": False}]
    # Only the key was made; the files read are as they were.
    after = snapshot(ssh)
    assert {k: v for k, v in after.items() if "id_peer" not in k} == before
    assert run_main(args(node), capsys)["blocks"] == []
