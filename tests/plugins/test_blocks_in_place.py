"""Tests for the blocks_in_place filter: it says a node_files call of blocks would change nothing exactly when the
call, run on the same files, changes nothing (node_files in check mode is the judge), from what the node read."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.filter.blocks_in_place import blocks_in_place
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import read_block
from ansible_collections.sparkserve.deploy.plugins.modules import node_files as nf

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

MARKER = "sparkserve peers"
BEGIN, END = f"# BEGIN {MARKER}", f"# END {MARKER}"
# Files as people and earlier runs leave them: none of ours, ours alone or among other lines, a second copy of
# the markers, an END before its BEGIN, no newline at the end, CRLF line ends, blank lines, an empty file.
TEXTS = [
    "",
    "\n",
    "ssh-rsa AAAA user@laptop\n",
    "ssh-rsa AAAA user@laptop",
    f"{BEGIN}\nssh-ed25519 BBBB spark-1\n{END}\n",
    f"ssh-rsa AAAA user@laptop\n{BEGIN}\nssh-ed25519 BBBB spark-1\nssh-ed25519 CCCC spark-2\n{END}\nssh-rsa DDDD x\n",
    f"{BEGIN}\nssh-ed25519 BBBB spark-1\n{END}",
    f"{BEGIN}\r\nssh-ed25519 BBBB spark-1\r\n{END}\r\n",
    f"{BEGIN}\n{END}\n",
    f"{END}\n{BEGIN}\nssh-ed25519 BBBB spark-1\n{END}\n",
    f"{BEGIN}\nssh-ed25519 BBBB spark-1\n",
    f"{BEGIN}\nssh-ed25519 BBBB spark-1\n{END}\n{BEGIN}\nold\n{END}\n",
    f"\n\n{BEGIN}\n\nssh-ed25519 BBBB spark-1\n\n{END}\n\n",
]
BLOCKS = [
    "",
    "\n",
    "ssh-ed25519 BBBB spark-1",
    "ssh-ed25519 BBBB spark-1\n",
    "ssh-ed25519 BBBB spark-1\nssh-ed25519 CCCC spark-2\n",
    "\nssh-ed25519 BBBB spark-1\n\n",
    "old",
]


def node_files_would_change(blocks: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> bool:
    with patch_module_args({"blocks": blocks, "_ansible_check_mode": True}), pytest.raises(SystemExit):
        nf.main()
    result = json.loads(capsys.readouterr().out)
    assert not result.get("failed"), result
    return bool(result["changed"])


@pytest.mark.parametrize(("text", "content"), list(itertools.product(TEXTS, BLOCKS)))
def test_the_filter_agrees_with_node_files_on_every_file_and_block(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, content: str) -> None:
    path = tmp_path / "authorized_keys"
    path.write_bytes(text.encode("utf-8"))
    block = {"path": str(path), "marker": MARKER, "content": content}
    in_place = blocks_in_place([block], [read_block(str(path), MARKER)])
    assert in_place is not node_files_would_change([block], capsys)


def test_a_mode_asked_for_must_be_the_files_and_a_missing_or_unread_file_is_never_in_place(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config"
    config.write_text(f"{BEGIN}\nHost a\n{END}\n")
    os.chmod(config, 0o644)
    block = {"path": str(config), "marker": MARKER, "content": "Host a\n"}
    read = [read_block(str(config), MARKER)]
    assert blocks_in_place([block], read) and blocks_in_place([dict(block, mode="0644")], read)
    assert not blocks_in_place([dict(block, mode="0600")], read)
    assert node_files_would_change([dict(block, mode="0600")], capsys)
    missing = tmp_path / "known_hosts"
    assert not blocks_in_place([dict(block, path=str(missing))], [read_block(str(missing), MARKER)])
    config.write_bytes(b"\xff not text")
    assert not blocks_in_place([block], [read_block(str(config), MARKER)])
    # A block the node did not read (another file, another marker) is not taken for in place.
    assert not blocks_in_place([block], [])
    assert not blocks_in_place([dict(block, marker="other")], read)


def test_every_block_must_be_in_place(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(f"{BEGIN}\nx\n{END}\n")
    second.write_text(f"{BEGIN}\ny\n{END}\n")
    read = [read_block(str(first), MARKER), read_block(str(second), MARKER)]
    wanted = [{"path": str(first), "marker": MARKER, "content": "x"},
              {"path": str(second), "marker": MARKER, "content": "y"}]
    assert blocks_in_place(wanted, read)
    assert not blocks_in_place([wanted[0], dict(wanted[1], content="z")], read)
