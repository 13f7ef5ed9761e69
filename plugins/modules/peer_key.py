#!/usr/bin/python
"""Keep this node's ssh key for its peers, and read it with the node's ssh host key (and the blocks of lines the
access stage keeps in the node's ssh files), in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: peer_key
short_description: Keep this node's ssh key for its peers, and read it with the node's ssh host key
version_added: "0.6.0"
description:
  - The access stage needs, from every node, the public half of the key its peers will authorize and the
    public key its sshd answers with (for the peers' C(known_hosts)). This module gives both in one round
    trip, making the key when it is missing.
  - A missing key is made with C(ssh-keygen -t ed25519), with no passphrase and O(comment), its folder made
    with mode C(0700) when missing.
  - A key that is there is kept. Its public half is read from the private key (C(ssh-keygen -y)), and
    C(PATH.pub) is rewritten (mode C(0644)) when it does not hold that key with O(comment). The private key
    is given mode C(0600) when it has another, and C(PATH.pub) mode C(0644).
  - A private key C(ssh-keygen) cannot read (a passphrase, another format, a damaged file), or a path that is
    not a regular file, is refused and left as it is; the module fails naming it, and nothing is written.
  - A host key that cannot be read fails the module before anything is written.
  - With O(blocks), it also reads, for each file and marker, the lines the access stage keeps between
    C(# BEGIN MARKER) and C(# END MARKER) (RV(blocks)), so that the writer of those blocks
    (M(sparkserve.deploy.node_files) O(sparkserve.deploy.node_files#module:blocks)) is called only when one of
    them is not what it would write.
  - Runs on the node's python3 with nothing but its standard library, and the node's C(ssh-keygen).
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    description: Writes nothing and says what would change; RV(public_key) is empty when the key would be made.
options:
  path:
    description: Absolute path of the private key; its public half is C(PATH.pub).
    type: path
    required: true
  comment:
    description: The comment of the key (its C(PATH.pub) line ends with it).
    type: str
    default: ""
  host_key:
    description: The public key of the node's sshd that its peers will know it by.
    type: path
    default: /etc/ssh/ssh_host_ed25519_key.pub
  blocks:
    description: Files and markers whose blocks of lines to read (nothing is written to them).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file.
        type: path
        required: true
      marker:
        description: What the marker lines say after C(# BEGIN) and C(# END).
        type: str
        required: true
notes:
  - Owner and group are not managed; a new key belongs to the user the module runs as.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Keep this node's key for its peers, and read it with the ssh host key
  sparkserve.deploy.peer_key:
    path: "{{ ansible_env.HOME }}/.ssh/id_ed25519_sparkserve"
    comment: sparkserve spark-1
  register: node_key
"""

RETURN = r"""
public_key:
  description: The key's type and base64 body, without the comment (empty in check mode when it would be made).
  returned: always
  type: str
  sample: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx...
host_key:
  description: The host key's type and base64 body, without the comment.
  returned: always
  type: str
  sample: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKy...
made:
  description: Whether the key was made (in check mode, would be).
  returned: always
  type: bool
fixed:
  description: >-
    What was fixed of a key that was there (C(public key), C(public key mode), C(mode)); in check mode, would be.
  returned: always
  type: list
  elements: str
  sample: ["public key"]
blocks:
  description:
    - For each of O(blocks), in order, what P(sparkserve.deploy.blocks_in_place#filter) compares with the block a
      writer would put there.
    - C(exists) and C(readable) (UTF-8 text); for a readable file its C(mode) (octal digits), C(tidy) (every line
      of the file ends with a newline) and C(marked) (its lines from C(# BEGIN MARKER) to the first
      C(# END MARKER) after it, the markers included; null when they are not there).
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/root/.ssh/known_hosts", "marker": "sparkserve peers", "exists": true, "readable": true,
            "mode": "0644", "tidy": true, "marked": ["# BEGIN sparkserve peers", "spark-2 ssh-ed25519 AAAA...",
                                                     "# END sparkserve peers"]}]
"""

import os
import stat
import tempfile
from typing import Any, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import read_block, write_atomic
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import Runner, one_line, run_command

KEYGEN_TIMEOUT_S = 60.0
PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644


class PeerKeyError(Exception):
    """The module fails with this message; nothing was written."""


def key_body(line: str) -> str:
    """The type and base64 body of a public key line (its comment left out); empty when there is none."""
    return " ".join(line.split()[:2])


def read_host_key(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            body = key_body(handle.readline())
    except OSError as err:
        raise PeerKeyError(f"cannot read the ssh host key {path}: {err.strerror}") from None
    if len(body.split()) != 2:
        raise PeerKeyError(f"the ssh host key {path} holds no public key")
    return body


def regular_file(path: str) -> Optional[os.stat_result]:
    """Its lstat when it is a regular file; None when absent; PeerKeyError when it is anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise PeerKeyError(f"cannot read {path}: {err.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PeerKeyError(f"{path} is there and is not a regular file; move it away and run again")
    return st


def derived_public(path: str, runner: Runner) -> str:
    """The public body of the private key at path. ssh-keygen refuses a key others may read, so one with
    another mode than 0600 is read from a private copy (its mode is fixed afterwards, or only said)."""
    if stat.S_IMODE(os.lstat(path).st_mode) == PRIVATE_MODE:
        return read_public(path, path, runner)
    with open(path, "rb") as handle:
        data = handle.read()
    handle_fd, copy = tempfile.mkstemp(prefix="peer_key.")
    try:
        with os.fdopen(handle_fd, "wb") as out:
            out.write(data)
        return read_public(copy, path, runner)
    finally:
        os.unlink(copy)


def read_public(source: str, path: str, runner: Runner) -> str:
    rc, out, err = runner(["ssh-keygen", "-y", "-P", "", "-f", source], KEYGEN_TIMEOUT_S)
    body = key_body(out)
    if rc != 0 or len(body.split()) != 2:
        said = one_line(err or out or f"exit {rc}", 200).replace(source, path)
        raise PeerKeyError(f"{path} is not a private key ssh-keygen can read without a passphrase ({said}); "
                        "it is left as it is: move it away and run again to get a new one")
    return body


def read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def make_key(path: str, comment: str, runner: Runner) -> str:
    """Make the key pair (its folder too); its public body."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700)
    if os.path.lexists(path + ".pub"):
        os.unlink(path + ".pub")  # a public half without its private key: ssh-keygen would ask before replacing it
    rc, out, err = runner(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
                          KEYGEN_TIMEOUT_S)
    if rc != 0:
        raise PeerKeyError(f"ssh-keygen could not make {path}: {one_line(err or out or f'exit {rc}', 200)}")
    return derived_public(path, runner)


def fixes(path: str, private: os.stat_result, public: Optional[os.stat_result], public_line: str) -> List[str]:
    """What differs from the wanted key files: the public half's content or mode, and the private key's mode."""
    found: List[str] = []
    if read_text(path + ".pub") != public_line:
        found.append("public key")
    elif public is not None and stat.S_IMODE(public.st_mode) != PUBLIC_MODE:
        found.append("public key mode")
    if stat.S_IMODE(private.st_mode) != PRIVATE_MODE:
        found.append("mode")
    return found


def keep(path: str, comment: str, check_mode: bool, runner: Runner) -> Tuple[str, bool, List[str]]:
    """Make or keep the key as the docs say; its public body, whether it was made, and what was fixed."""
    private = regular_file(path)
    public_file = regular_file(path + ".pub")
    if private is None:
        return ("" if check_mode else make_key(path, comment, runner)), True, []
    public = derived_public(path, runner)
    public_line = f"{public} {comment}\n" if comment else f"{public}\n"
    found = fixes(path, private, public_file, public_line)
    if "public key" in found and not check_mode:
        write_atomic(path + ".pub", public_line.encode("utf-8"), PUBLIC_MODE)
    if "public key mode" in found and not check_mode:
        os.chmod(path + ".pub", PUBLIC_MODE)
    if "mode" in found and not check_mode:
        os.chmod(path, PRIVATE_MODE)
    return public, False, found


def main(runner: Runner = run_command) -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "comment": {"type": "str", "default": ""},
            "host_key": {"type": "path", "default": "/etc/ssh/ssh_host_ed25519_key.pub"},
            "blocks": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "marker": {"type": "str", "required": True},
            }},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    if not os.path.isabs(path):
        module.fail_json(msg=f"path {path} is not absolute; give the full path from /")
    try:
        host_key = read_host_key(module.params["host_key"])
        public, made, fixed = keep(path, module.params["comment"], module.check_mode, runner)
    except PeerKeyError as err:
        module.fail_json(msg=str(err))
    except OSError as err:
        module.fail_json(msg=f"cannot write the key {path}: {err.strerror}")
    result: dict[str, Any] = {"changed": made or bool(fixed), "public_key": public, "host_key": host_key,
                              "made": made, "fixed": fixed,
                              "blocks": [read_block(b["path"], b["marker"]) for b in module.params["blocks"]]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
