"""Tests for the node_files module: make, leave alone, rewrite only what differs, check and diff mode, refusals."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.module_utils import node_files_plan
from ansible_collections.sparkserve.deploy.plugins.modules import node_files as nf
from tests.tree import snapshot

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

ROOT = Path(__file__).resolve().parents[2]
SECRET = "token-that-must-never-be-shown"


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        nf.main()
    return json.loads(capsys.readouterr().out)


def shown(result: dict[str, Any]) -> str:
    """The result as a failure shows it, without the module's arguments (ansible echoes those in `invocation`,
    shown at -vvv only, as for any module whose options are not no_log)."""
    return json.dumps({k: v for k, v in result.items() if k != "invocation"})


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def items(base: Path) -> dict[str, Any]:
    """A role's worth of items: a private directory, nested parents, an executable and a secret."""
    return {
        "directories": [
            {"path": str(base / "etc" / "sparkserve")},
            {"path": str(base / "etc" / "sparkserve" / "secrets"), "mode": "0700"},
            {"path": str(base / "var" / "lib" / "sparkserve" / "cache"), "mode": "2775"},
        ],
        "files": [
            {"dest": str(base / "etc" / "sparkserve" / "fabric.env"), "content": "MTU=9000\nGID=3\n"},
            {"dest": str(base / "etc" / "sparkserve" / "secrets" / "hf_token"), "content": SECRET + "\n",
             "mode": "0600"},
            {"dest": str(base / "usr" / "local" / "sbin" / "sparkserve-health"), "content": "#!/bin/sh\nexit 0\n",
             "mode": "0755"},
        ],
    }


@pytest.fixture
def umask_077() -> Iterator[None]:
    """A strict umask, so a mode the module does not set explicitly shows."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_makes_directories_and_files_with_their_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       umask_077: None) -> None:
    result = run_main(items(tmp_path), capsys)
    assert result["changed"] is True and not result.get("failed")
    assert result["changed_paths"] == [str(tmp_path / p) for p in (
        "etc", "etc/sparkserve", "etc/sparkserve/secrets", "var", "var/lib", "var/lib/sparkserve",
        "var/lib/sparkserve/cache", "etc/sparkserve/fabric.env", "etc/sparkserve/secrets/hf_token",
        "usr", "usr/local", "usr/local/sbin", "usr/local/sbin/sparkserve-health")]
    assert "diff" not in result
    assert mode_of(tmp_path / "etc" / "sparkserve") == 0o755
    assert mode_of(tmp_path / "etc" / "sparkserve" / "secrets") == 0o700
    assert mode_of(tmp_path / "var" / "lib" / "sparkserve" / "cache") == 0o2775
    for parent in ("etc", "var", "var/lib", "usr", "usr/local", "usr/local/sbin"):
        assert mode_of(tmp_path / parent) == 0o755, parent
    assert (tmp_path / "etc/sparkserve/fabric.env").read_bytes() == b"MTU=9000\nGID=3\n"
    assert mode_of(tmp_path / "etc/sparkserve/fabric.env") == 0o644
    assert (tmp_path / "etc/sparkserve/secrets/hf_token").read_text(encoding="utf-8") == SECRET + "\n"
    assert mode_of(tmp_path / "etc/sparkserve/secrets/hf_token") == 0o600
    assert mode_of(tmp_path / "usr/local/sbin/sparkserve-health") == 0o755
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_second_run_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_main(items(tmp_path), capsys)
    before = snapshot(tmp_path)
    again = run_main(dict(items(tmp_path), _ansible_diff=True), capsys)
    assert again["changed"] is False and again["changed_paths"] == [] and "diff" not in again
    assert snapshot(tmp_path) == before


def test_changed_content_rewrites_only_that_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = items(tmp_path)
    run_main(args, capsys)
    before = snapshot(tmp_path)
    args["files"][0]["content"] = "MTU=1500\nGID=3\n"
    result = run_main(args, capsys)
    dest = "etc/sparkserve/fabric.env"
    assert result["changed"] is True and result["changed_paths"] == [str(tmp_path / dest)]
    after = snapshot(tmp_path)
    assert after[dest][4] == b"MTU=1500\nGID=3\n" and after[dest][1] == 0o644
    assert after[dest][2] != before[dest][2], "an atomic write leaves a new inode"
    # The rename changes the folder's entries, so its mtime; nothing else moves.
    folder = "etc/sparkserve"
    assert after[folder][:3] == before[folder][:3]
    assert ({p: v for p, v in after.items() if p not in (dest, folder)}
            == {p: v for p, v in before.items() if p not in (dest, folder)})


def test_a_mode_only_change_keeps_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = items(tmp_path)
    run_main(args, capsys)
    token = tmp_path / "etc/sparkserve/secrets/hf_token"
    os.chmod(token, 0o644)
    os.chmod(tmp_path / "etc/sparkserve/secrets", 0o755)
    before = snapshot(tmp_path)
    result = run_main(dict(args, _ansible_diff=True), capsys)
    assert result["changed_paths"] == [str(tmp_path / "etc/sparkserve/secrets"), str(token)]
    assert mode_of(token) == 0o600 and mode_of(tmp_path / "etc/sparkserve/secrets") == 0o700
    after = snapshot(tmp_path)
    rel = "etc/sparkserve/secrets/hf_token"
    assert after[rel][2] == before[rel][2] and after[rel][4] == before[rel][4], "chmod only, no rewrite"
    dir_diff, file_diff = result["diff"]
    assert dir_diff["before"]["mode"] == "0755" and dir_diff["after"]["mode"] == "0700"
    assert file_diff["prepared"] == f"mode of {token}: 0644 -> 0600\n"
    assert file_diff["before_header"] == f"{token} (mode 0644)" and file_diff["after_header"] == f"{token} (mode 0600)"


def test_check_mode_writes_nothing_and_says_what_would_change(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "node"
    base.mkdir()
    checked = run_main(dict(items(base), _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert checked["changed"] is True and list(base.iterdir()) == []
    assert len(checked["diff"]) == len(checked["changed_paths"])
    done = run_main(items(base), capsys)
    assert done["changed_paths"] == checked["changed_paths"]

    args = items(base)
    args["files"][0]["content"] = "MTU=1500\n"
    args["files"][2]["mode"] = "0700"
    before = snapshot(base)
    checked = run_main(dict(args, _ansible_check_mode=True), capsys)
    assert checked["changed"] is True
    assert checked["changed_paths"] == [args["files"][0]["dest"], args["files"][2]["dest"]]
    assert snapshot(base) == before


def test_the_diff_shows_each_changed_file_as_copy_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "fabric.env"
    old.write_text("MTU=1500\nGID=3\n", encoding="utf-8")
    os.chmod(old, 0o600)
    new = tmp_path / "new" / "motd"
    result = run_main({"files": [{"dest": str(old), "content": "MTU=9000\nGID=3\n"},
                                 {"dest": str(new), "content": "hello\n"}],
                       "_ansible_diff": True}, capsys)
    assert result["changed_paths"] == [str(old), str(new.parent), str(new)]
    changed, made, created = result["diff"]
    assert changed == {"before_header": f"{old} (mode 0600)", "after_header": f"{old} (mode 0644)",
                       "before": "MTU=1500\nGID=3\n", "after": "MTU=9000\nGID=3\n"}
    assert made == {"before_header": str(new.parent), "after_header": str(new.parent),
                    "before": {"path": str(new.parent), "state": "absent"},
                    "after": {"path": str(new.parent), "state": "directory", "mode": "0755"}}
    assert created == {"before_header": str(new), "after_header": f"{new} (mode 0644)", "before": "",
                       "after": "hello\n"}

    from ansible.plugins.callback import CallbackBase

    shown = CallbackBase()._get_diff(result["diff"])
    assert "-MTU=1500\n+MTU=9000\n" in shown and f"+++ after: {new} (mode 0644)" in shown and "+hello\n" in shown


def test_the_diff_leaves_out_binary_and_large_content(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "blob"
    binary.write_bytes(b"\xff\x00\x01")
    large = tmp_path / "large"
    result = run_main({"files": [{"dest": str(binary), "content": "text now\n"},
                                 {"dest": str(large), "content": "x" * (node_files_plan.MAX_DIFF_BYTES + 1)}],
                       "_ansible_diff": True}, capsys)
    first, second = result["diff"]
    assert first["dst_binary"] == 1 and "before" not in first and "after" not in first
    assert second["src_larger"] == node_files_plan.MAX_DIFF_BYTES and "after" not in second
    assert binary.read_text(encoding="utf-8") == "text now\n"


@pytest.mark.parametrize(("bad", "says"), [
    ({"files": [{"dest": "etc/motd", "content": "x"}]}, "files[0] (etc/motd): the path is not absolute"),
    ({"directories": [{"path": "srv/data"}]}, "directories[0] (srv/data): the path is not absolute"),
    ({"files": [{"dest": "{tmp}/existing", "content": "x"}]}, "file {tmp}/existing: it exists and is a directory"),
    ({"files": [{"dest": "{tmp}/a", "content": "x", "mode": "rw-r--r--"}]},
     "files[0] ({tmp}/a): mode 'rw-r--r--' is not a string of 3 or 4 octal digits"),
    ({"files": [{"dest": "{tmp}/a", "content": "x", "mode": 420}]},
     "files[0] ({tmp}/a): mode is a int, not a string; quote it"),
    ({"directories": [{"path": "{tmp}/d", "mode": "0o755"}]}, "directories[0] ({tmp}/d): mode '0o755' is not"),
    ({"files": [{"dest": "{tmp}/a", "content": {"token": SECRET}}]},
     "files[0] ({tmp}/a): content is a dict, not text"),
    ({"directories": [{"path": "{tmp}/plain/sub"}]}, "directory {tmp}/plain/sub: {tmp}/plain exists and is a regular"),
    ({"directories": [{"path": "{tmp}/plain"}]}, "directory {tmp}/plain: it exists and is a regular file"),
    ({"files": [{"dest": "{tmp}/f", "content": "x"}, {"dest": "{tmp}/f/g", "content": "y"}]},
     "file {tmp}/f/g: it is below {tmp}/f, which is listed as a file"),
    ({"files": [{"dest": "{tmp}/f", "content": "x"}, {"dest": "{tmp}/f", "content": "y"}]},
     "files[1] ({tmp}/f): listed twice, with different content or mode"),
    ({"directories": [{"path": "{tmp}/d"}], "files": [{"dest": "{tmp}/d", "content": "x"}]},
     "files[0] ({tmp}/d): the path is also listed in directories"),
    ({"files": [{"dest": "{tmp}/d/", "content": "x"}]}, "the path ends with /"),
])
def test_a_bad_item_fails_and_leaves_the_node_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        bad: dict[str, Any], says: str) -> None:
    base = tmp_path / "node"
    (base / "existing").mkdir(parents=True)
    (base / "plain").write_text("keep\n", encoding="utf-8")
    args = items(base)
    text = json.dumps(bad).replace("{tmp}", str(base))
    for key, extra in json.loads(text).items():
        args[key] = extra + args[key]
    before = snapshot(base)
    result = run_main(args, capsys)
    assert result["failed"] is True and result["changed"] is False and result["changed_paths"] == []
    assert says.replace("{tmp}", str(base)) in result["msg"], result["msg"]
    assert "nothing was written" in result["msg"]
    assert snapshot(base) == before
    assert SECRET not in shown(result)


def test_every_bad_item_is_named_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main({"directories": [{"path": "rel"}],
                       "files": [{"dest": str(tmp_path / "ok"), "content": "ok\n"},
                                 {"dest": str(tmp_path / "m"), "content": SECRET, "mode": "644x"}]}, capsys)
    assert result["failed"] is True and len(result["errors"]) == 2
    assert result["msg"].startswith("node_files refused 2 item(s), nothing was written: directories[0] (rel): ")
    assert SECRET not in shown(result) and list(tmp_path.iterdir()) == []


def test_a_missing_parent_is_made_with_0755(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           umask_077: None) -> None:
    dest = tmp_path / "opt" / "sparkserve" / "bin" / "tool"
    result = run_main({"files": [{"dest": str(dest), "content": "x\n", "mode": "0700"}]}, capsys)
    assert result["changed_paths"] == [str(tmp_path / "opt"), str(tmp_path / "opt/sparkserve"),
                                       str(tmp_path / "opt/sparkserve/bin"), str(dest)]
    for folder in ("opt", "opt/sparkserve", "opt/sparkserve/bin"):
        assert mode_of(tmp_path / folder) == 0o755
    assert mode_of(dest) == 0o700 and dest.read_text(encoding="utf-8") == "x\n"


def test_a_parent_listed_later_is_made_with_its_listed_mode(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    inner, outer = tmp_path / "srv" / "inner", tmp_path / "srv"
    result = run_main({"directories": [{"path": str(inner)}, {"path": str(outer), "mode": "0750"}]}, capsys)
    assert result["changed_paths"] == [str(outer), str(inner)]
    assert mode_of(outer) == 0o750 and mode_of(inner) == 0o755
    assert run_main({"directories": [{"path": str(inner)}, {"path": str(outer), "mode": "0750"}]},
                    capsys)["changed"] is False


def test_paths_are_normalised_and_same_duplicates_are_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "a" / "f"
    result = run_main({"directories": [{"path": f"{tmp_path}//a/"}, {"path": f"{tmp_path}/a/../a"}],
                       "files": [{"dest": str(dest), "content": "x"}, {"dest": f"{tmp_path}/a/./f", "content": "x"}]},
                      capsys)
    assert result["changed_paths"] == [str(tmp_path / "a"), str(dest)]


def test_a_link_is_replaced_by_a_file_and_its_target_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target"
    target.write_text("theirs\n", encoding="utf-8")
    link = tmp_path / "link"
    link.symlink_to(target)
    result = run_main({"files": [{"dest": str(link), "content": "theirs\n"}], "_ansible_diff": True}, capsys)
    assert result["changed_paths"] == [str(link)]
    assert result["diff"][0]["before"] == f"(a link to {target})\n"
    assert not link.is_symlink() and link.read_text(encoding="utf-8") == "theirs\n"
    assert target.read_text(encoding="utf-8") == "theirs\n"


def test_a_fifo_or_a_link_to_a_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dirlink").symlink_to(tmp_path / "dir")
    result = run_main({"files": [{"dest": str(tmp_path / "pipe"), "content": "x"},
                                 {"dest": str(tmp_path / "dirlink"), "content": "x"}]}, capsys)
    assert result["failed"] is True
    assert result["errors"] == [f"file {tmp_path / 'pipe'}: it exists and is a fifo; remove it first",
                                f"file {tmp_path / 'dirlink'}: it is a link to a directory; remove it first"]


def test_a_failed_write_says_what_was_done(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    real = nf.write_atomic

    def failing(path: str, data: bytes, mode: int) -> None:
        if path.endswith("second"):
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(nf, "write_atomic", failing)
    result = run_main({"files": [{"dest": str(tmp_path / "first"), "content": SECRET},
                                 {"dest": str(tmp_path / "second"), "content": SECRET},
                                 {"dest": str(tmp_path / "third"), "content": SECRET}]}, capsys)
    assert result["failed"] is True and result["changed"] is True
    assert result["changed_paths"] == [str(tmp_path / "first")] and result["failed_path"] == str(tmp_path / "second")
    assert result["msg"].startswith(f"node_files could not write {tmp_path / 'second'}: No space left on device")
    assert SECRET not in shown(result) and sorted(p.name for p in tmp_path.iterdir()) == ["first"]


def test_a_directory_another_call_made_since_the_plan_is_taken_as_made(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Two deployments on one node install their programs at once: each plans the shared folder as missing.
    shared = tmp_path / "etc" / "sparkserve" / "supervisor"
    real = nf.plan

    def other_call_first(*args: Any, **kwargs: Any) -> list[node_files_plan.Action]:
        actions = real(*args, **kwargs)
        shared.mkdir(parents=True, mode=0o700)
        (shared / "lab-tp1.json").write_text("{}")
        return actions

    monkeypatch.setattr(nf, "plan", other_call_first)
    result = run_main({"directories": [{"path": str(shared)}],
                       "files": [{"dest": str(shared / "lab-tp2.json"), "content": "{}"}]}, capsys)
    assert not result.get("failed") and result["changed"] is True
    assert sorted(p.name for p in shared.iterdir()) == ["lab-tp1.json", "lab-tp2.json"]
    assert mode_of(shared) == 0o755  # the mode this call asks


def test_a_file_where_a_planned_directory_goes_still_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = tmp_path / "etc"
    real = nf.plan

    def file_appears(*args: Any, **kwargs: Any) -> list[node_files_plan.Action]:
        actions = real(*args, **kwargs)
        wanted.write_text("not a folder")
        return actions

    monkeypatch.setattr(nf, "plan", file_appears)
    result = run_main({"directories": [{"path": str(wanted)}]}, capsys)
    assert result["failed"] is True and result["failed_path"] == str(wanted)
    assert "File exists" in result["msg"] and wanted.read_text() == "not a folder"


# ansible-playbook against localhost: the module as a play runs it, fed by the template lookup.

PLAY = """\
- name: Write a role's files in one task
  hosts: node
  gather_facts: false
  tasks:
    - name: Write the files of the role
      sparkserve.deploy.node_files:
        directories:
          - path: "{{ base }}/etc/sparkserve"
          - path: "{{ base }}/etc/sparkserve/secrets"
            mode: "0700"
        files:
          - dest: "{{ base }}/etc/sparkserve/fabric.env"
            content: "{{ lookup('ansible.builtin.template', 'fabric.env.j2') }}"
          - dest: "{{ base }}/etc/sparkserve/secrets/note"
            content: "{{ lookup('ansible.builtin.file', 'note.txt', rstrip=false) }}"
            mode: "0600"
"""


def playbook_bin() -> str:
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    assert found, "ansible-playbook is not installed"
    return found


def play(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN="memory")
    return subprocess.run(
        [playbook_bin(), "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_play_writes_templated_files_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    base = tmp_path / "node"
    # The node's system python3 where there is one, as on a Spark (the module needs only its standard library).
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    (tmp_path / "inventory.yml").write_text(
        json.dumps({"all": {"hosts": {"node": {"ansible_connection": "local", "ansible_python_interpreter": python,
                                               "base": str(base), "mtu": 9000}}}}), encoding="utf-8")
    (tmp_path / "play.yml").write_text(PLAY, encoding="utf-8")
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "fabric.env.j2").write_text("# {{ inventory_hostname }}\nMTU={{ mtu }}\n",
                                                          encoding="utf-8")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "note.txt").write_text("kept as is\n\n", encoding="utf-8")

    first = play(tmp_path, "--diff")
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"node\s*:\s*ok=1\s+changed=1\s", first.stdout), first.stdout
    assert "+MTU=9000" in first.stdout
    assert (base / "etc/sparkserve/fabric.env").read_text(encoding="utf-8") == "# node\nMTU=9000\n"
    assert (base / "etc/sparkserve/secrets/note").read_text(encoding="utf-8") == "kept as is\n\n"
    assert mode_of(base / "etc/sparkserve/secrets") == 0o700 and mode_of(base / "etc/sparkserve/secrets/note") == 0o600

    second = play(tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(r"node\s*:\s*ok=1\s+changed=0\s", second.stdout), second.stdout

    checked = play(tmp_path, "--check", "--diff", "-e", "mtu=1500")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.search(r"node\s*:\s*ok=1\s+changed=1\s", checked.stdout), checked.stdout
    assert "-MTU=9000" in checked.stdout and "+MTU=1500" in checked.stdout
    assert (base / "etc/sparkserve/fabric.env").read_text(encoding="utf-8") == "# node\nMTU=9000\n"


def test_a_block_is_added_then_replaced_and_the_rest_of_the_file_kept(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAA user@laptop\n")
    os.chmod(keys, 0o640)
    block = {"path": str(keys), "marker": "sparkserve peers",
             "content": "ssh-ed25519 BBBB spark-1\nssh-ed25519 CCCC spark-2"}
    first = run_main({"blocks": [block]}, capsys)
    assert first["changed"] and first["changed_paths"] == [str(keys)]
    assert keys.read_text() == ("ssh-ed25519 AAAA user@laptop\n# BEGIN sparkserve peers\nssh-ed25519 BBBB spark-1\n"
                                "ssh-ed25519 CCCC spark-2\n# END sparkserve peers\n")
    assert mode_of(keys) == 0o640, "the file keeps its mode"
    assert run_main({"blocks": [block]}, capsys)["changed"] is False
    keys.write_text(keys.read_text() + "ssh-rsa DDDD added@later\n")
    changed = run_main({"blocks": [dict(block, content="ssh-ed25519 EEEE spark-3")]}, capsys)
    assert changed["changed"]
    assert keys.read_text() == ("ssh-ed25519 AAAA user@laptop\n# BEGIN sparkserve peers\nssh-ed25519 EEEE spark-3\n"
                                "# END sparkserve peers\nssh-rsa DDDD added@later\n")
    run_main({"blocks": [dict(block, content="")]}, capsys)
    assert keys.read_text() == "ssh-ed25519 AAAA user@laptop\nssh-rsa DDDD added@later\n"


def test_a_block_makes_a_missing_file_with_mode_0600_and_checks_like_a_file(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ssh" / "config"
    block = {"path": str(config), "marker": "m", "content": "Host a\n    HostName 10.0.0.1"}
    checked = run_main({"blocks": [block], "_ansible_check_mode": True}, capsys)
    assert checked["changed"] and not config.exists()
    run_main({"blocks": [block]}, capsys)
    assert config.read_text() == "# BEGIN m\nHost a\n    HostName 10.0.0.1\n# END m\n" and mode_of(config) == 0o600
    refused = run_main({"blocks": [dict(block, path="relative/config")]}, capsys)
    assert refused["failed"] and "relative/config" in refused["msg"]


def test_a_pruned_directory_loses_the_unlisted_files_of_its_pattern_only(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    package = tmp_path / "lib" / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "gone.py").write_text("old\n")
    (package / "sub" / "gone_too.py").write_text("old\n")
    (package / "notes.txt").write_text("kept: not *.py\n")
    legacy = tmp_path / "legacy.py"
    legacy.write_text("from older releases\n")
    args = {"directories": [{"path": str(package), "prune": "*.py"}],
            "files": [{"dest": str(package / "kept.py"), "content": "x = 1\n"}],
            "absent": [str(legacy), str(tmp_path / "never-there.py")]}
    before = snapshot(tmp_path)
    checked = run_main(dict(args, _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert snapshot(tmp_path) == before  # check mode removes nothing
    assert checked["changed_paths"] == [str(package / "kept.py"), str(package / "gone.py"),
                                        str(package / "sub" / "gone_too.py"), str(legacy)]
    assert checked["diff"][-1]["after"] == {"path": str(legacy), "state": "absent"}
    done = run_main(args, capsys)
    assert done["changed_paths"] == checked["changed_paths"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "lib/pkg/kept.py", "lib/pkg/notes.txt"]
    assert run_main(args, capsys)["changed"] is False  # a second run changes nothing


def test_absent_refuses_a_directory_or_a_path_it_is_told_to_keep(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    kept = tmp_path / "kept.py"
    folder = tmp_path / "folder"
    folder.mkdir()
    before = snapshot(tmp_path)
    result = run_main({"files": [{"dest": str(kept), "content": "x\n"}], "absent": [str(folder), str(kept)]},
                      capsys)
    assert result["failed"] is True and snapshot(tmp_path) == before
    assert [e.split(":")[0] for e in result["errors"]] == [f"absent[0] ({folder})", f"absent[1] ({kept})"]


class FakeSystemd:
    """Answers the systemctl commands of ``units`` for units it knows, and records the ones that act."""

    def __init__(self, **units: tuple[bool, bool]) -> None:
        self.units = {name: {"enabled": enabled, "active": active} for name, (enabled, active) in units.items()}
        self.acted: list[list[str]] = []
        self.failing: set[str] = set()

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        verb, name = argv[1], argv[-1]
        state = self.units[name]
        if verb == "is-enabled":
            return (0, "enabled\n", "") if state["enabled"] else (1, "disabled\n", "")
        if verb == "show":
            return 0, "active\n" if state["active"] else "failed\n", ""
        self.acted.append(list(argv))
        if verb in self.failing:
            return 1, "", f"Job for {name} failed because the control process exited with error code.\n"
        state["enabled" if verb in ("enable", "disable") else "active"] = verb != "disable"
        return 0, "", ""


def run_with(args: dict[str, Any], systemd: FakeSystemd, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        nf.main(runner=systemd)
    return json.loads(capsys.readouterr().out)


def unit_args(base: Path, content: str = "[Service]\n", **unit: Any) -> dict[str, Any]:
    program, unit_file = str(base / "guard.py"), str(base / "guard.service")
    return {"files": [{"dest": program, "content": "print(1)\n"}, {"dest": unit_file, "content": content}],
            "units": [{"name": "guard.service", "files": [program, unit_file], **unit}]}


def test_a_unit_whose_files_did_not_change_is_kept_running_in_the_same_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    systemd = FakeSystemd(**{"guard.service": (False, False)})
    first = run_with(unit_args(tmp_path, enabled=True), systemd, capsys)
    # Its files were written: the caller reloads and restarts it, nothing is asked of systemd.
    assert first["units_left"] == ["guard.service"] and first["units_changed"] == [] and systemd.acted == []
    stopped = run_with(unit_args(tmp_path, enabled=True), systemd, capsys)
    assert stopped["changed"] is True and stopped["changed_paths"] == []
    assert stopped["units_changed"] == ["guard.service"] and stopped["units_left"] == []
    assert systemd.acted == [["systemctl", "enable", "guard.service"], ["systemctl", "start", "guard.service"]]
    systemd.acted.clear()
    again = run_with(unit_args(tmp_path, enabled=True), systemd, capsys)
    assert again["changed"] is False and again["units_changed"] == [] and systemd.acted == []


def test_a_unit_is_disabled_when_asked_and_its_boot_state_left_when_not_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    systemd = FakeSystemd(**{"guard.service": (True, True)})
    run_with(unit_args(tmp_path), systemd, capsys)
    assert run_with(unit_args(tmp_path), systemd, capsys)["changed"] is False
    disabled = run_with(unit_args(tmp_path, enabled=False), systemd, capsys)
    assert disabled["units_changed"] == ["guard.service"]
    assert systemd.acted == [["systemctl", "disable", "guard.service"]]


def test_check_mode_says_a_unit_would_start_and_starts_nothing(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    systemd = FakeSystemd(**{"guard.service": (True, False)})
    run_with(unit_args(tmp_path), systemd, capsys)
    checked = run_with(dict(unit_args(tmp_path), _ansible_check_mode=True), systemd, capsys)
    assert checked["changed"] is True and checked["units_changed"] == ["guard.service"] and systemd.acted == []
    # A unit file that would change leaves the unit to the caller, in check mode too.
    changing = run_with(dict(unit_args(tmp_path, "[Service]\nNice=5\n"), _ansible_check_mode=True), systemd, capsys)
    assert changing["units_left"] == ["guard.service"] and changing["units_changed"] == [] and systemd.acted == []


def test_a_unit_that_does_not_start_fails_naming_it_after_the_files_are_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    systemd = FakeSystemd(**{"guard.service": (True, False)})
    run_with(unit_args(tmp_path), systemd, capsys)
    systemd.failing.add("start")
    (tmp_path / "other.txt").write_text("old\n")
    args = unit_args(tmp_path)
    args["files"].append({"dest": str(tmp_path / "other.txt"), "content": "new\n"})
    result = run_with(args, systemd, capsys)
    assert result["failed"] is True and result["changed_paths"] == [str(tmp_path / "other.txt")]
    assert result["msg"].startswith("node_files wrote its files, then: systemctl start guard.service exited 1: "
                                    "Job for guard.service failed")
    assert (tmp_path / "other.txt").read_text() == "new\n"


def test_a_unit_naming_a_file_the_call_does_not_list_is_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    systemd = FakeSystemd(**{"guard.service": (True, True)})
    args = unit_args(tmp_path)
    args["units"][0]["files"].append(str(tmp_path / "guard.json"))
    result = run_with(args, systemd, capsys)
    assert result["failed"] is True and not (tmp_path / "guard.py").exists() and systemd.acted == []
    assert result["errors"] == [f"units[0] (guard.service): files names {tmp_path / 'guard.json'}, "
                                "which this call does not list"]
