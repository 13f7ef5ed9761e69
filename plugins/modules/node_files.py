#!/usr/bin/python
"""Make a set of folders and files be on the node exactly as given, in one task."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_files
short_description: Make a set of folders and files be on the node exactly as given, in one task
version_added: "0.1.0"
description:
  - One task for what a role would otherwise write with one M(ansible.builtin.file),
    M(ansible.builtin.copy) or M(ansible.builtin.template) task per path (each one a round trip to every node).
  - Every directory of O(directories) is made (with its missing parents) and given its mode; an existing one
    only has its mode fixed.
  - Every file of O(files) is compared with its O(files[].content) (as UTF-8 bytes) and O(files[].mode). Only
    what differs is written. A file whose content differs is written whole and atomically (a temporary file in
    the same folder, fsync, then a rename over the old one), so it ends as a new regular file owned by the
    user the module runs as, with nothing of the old one kept (owner, links, extended attributes). A file
    whose content is right but whose mode is not only has its mode fixed.
  - A directory this module makes that is not listed in O(directories) (a missing parent of a listed
    directory or of a file) gets mode C(0755).
  - Files below a directory with O(directories[].prune) that match its pattern and are not listed, and the
    paths of O(absent), are removed after everything is written.
  - Every item is checked before anything is written; when one is refused the module fails naming it (never
    showing any content) and the node is left as it was. Refused are a path that is not absolute, a mode that
    is not a string of octal digits, content that is not text, a file whose path is an existing directory (or
    a link to one), fifo, socket or device, a directory whose path is an existing file, a path below an
    existing file or below a listed file, and a path listed twice with different content or mode.
  - Content is the text itself; render a template on the controller with
    C(lookup('ansible.builtin.template', ...)) or read a role file with
    C(lookup('ansible.builtin.file', ..., rstrip=false)) (the file lookup strips the trailing newline unless
    told not to).
  - Runs on the node's python3 with nothing but its standard library.
options:
  directories:
    description: Directories to make, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the directory.
        type: str
        required: true
      mode:
        description:
          - Its mode, a quoted string of octal digits such as V(0755) or V(2775).
          - A number is refused, as YAML may read an unquoted 0755 as the decimal 493.
        type: raw
        default: "0755"
      prune:
        description:
          - A file name pattern (C(*.py)); files below the directory, at any depth, whose name matches it and
            that O(files) does not list are removed, so that the directory holds what is listed and nothing
            left from before. Links matching it are removed too; folders are left.
        type: str
  files:
    description: Files to write, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: Absolute path of the file.
        type: str
        required: true
      content:
        description:
          - The whole content of the file, as text (written as UTF-8).
          - Anything that is not a string (a number, a list, a mapping) is refused; render it to text first.
        type: raw
        required: true
      mode:
        description: Its mode, a quoted string of octal digits such as V(0644) or V(0600).
        type: raw
        default: "0644"
  blocks:
    description:
      - Blocks of lines this module owns inside a file that others write too (C(~/.ssh/authorized_keys),
        C(~/.ssh/config)), as M(ansible.builtin.blockinfile) keeps them, between the lines
        C(# BEGIN MARKER) and C(# END MARKER).
      - The block replaces what is between the markers, or is added at the end of the file with its markers;
        the rest of the file is kept as it is. An empty O(blocks[].content) removes the block and its markers.
      - Each block becomes one file of O(files) (its whole new content), so the same checks, check mode and
        diff apply; a path may hold one block.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file; it is made when missing.
        type: str
        required: true
      marker:
        description: What the marker lines say after C(# BEGIN) and C(# END).
        type: str
        required: true
      content:
        description: The lines of the block, as text.
        type: str
        required: true
      mode:
        description: The file's mode; by default the mode it has, or V(0600) for a new file.
        type: raw
  absent:
    description:
      - Files (or links) that must not be on the node, removed when there. A path that is a directory, or
        that O(files) or O(directories) lists, is refused.
    type: list
    elements: str
    default: []
  units:
    description:
      - systemd units that run from these files, kept running in the same call when this call changed none
        of their O(units[].files); the round trip of an M(ansible.builtin.systemd_service) task with
        C(state=started) saved on a run that changes nothing.
      - Such a unit is started when it does not run (its C(ActiveState) is neither C(active), C(activating)
        nor C(reloading)), and enabled or disabled at boot as O(units[].enabled) says.
      - A unit one of whose files this call changed (or, in check mode, would change) is left as it is and
        named in RV(units_left), for its caller to reload systemd, check and restart it.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The unit's name, with its suffix (C(sparkserve-memguard.service)).
        type: str
        required: true
      enabled:
        description: Whether it starts at boot; left as it is when not given.
        type: bool
      files:
        description:
          - The paths of this call (of O(files), O(blocks) or O(directories)) the unit runs from; a path
            this call does not list is refused.
        type: list
        elements: str
        default: []
extends_documentation_fragment:
  - sparkserve.deploy.attributes
attributes:
  check_mode:
    support: full
    description: Writes nothing, starts nothing and reports what would change.
  diff_mode:
    support: full
    description: One entry per changed path; the content of a file before and after, as M(ansible.builtin.copy).
notes:
  - Owner and group are not managed; what is made belongs to the user the module runs as.
  - A file that is a symbolic link is replaced by a regular file; the link's target is left alone.
  - The mode of a listed directory that is a symbolic link to a directory is set on the directory it points to.
author:
  - sparkserve
"""

EXAMPLES = r"""
- name: Write the fabric configuration of this node
  sparkserve.deploy.node_files:
    directories:
      - path: /etc/sparkserve
      - path: /etc/sparkserve/secrets
        mode: "0700"
    files:
      - dest: /etc/sparkserve/fabric.env
        content: "{{ lookup('ansible.builtin.template', 'etc/sparkserve/fabric.env.j2') }}"
      - dest: /etc/sparkserve/secrets/hf_token
        content: "{{ weights_hf_token }}\n"
        mode: "0600"
      - dest: /usr/local/sbin/sparkserve-health
        content: "{{ lookup('ansible.builtin.file', 'sparkserve-health', rstrip=false) }}"
        mode: "0755"
  notify: Restart ranks

- name: Keep the peers' keys in a block of authorized_keys, leaving the user's own lines alone
  sparkserve.deploy.node_files:
    blocks:
      - path: /root/.ssh/authorized_keys
        marker: sparkserve peers
        content: "{{ peer_keys | join('\\n') }}"
"""

RETURN = r"""
changed_paths:
  description:
    - Every directory and file made or changed (in check mode, that would be), in the order it was done.
    - Directories come first, in the order of O(directories), each after the missing parents made for it;
      then the files in the order of O(files), each after a missing parent made for it; then the files
      removed (those below a pruned directory, then those of O(absent)).
  returned: always
  type: list
  elements: str
  sample: ["/etc/sparkserve", "/etc/sparkserve/fabric.env"]
diff:
  description:
    - With C(--diff), one entry per changed path, in the order of RV(changed_paths).
    - A file's entry holds C(before) and C(after) (its content; C(before) is empty for a new file), and
      C(before_header) and C(after_header) (its path and mode). When only its mode changes, C(prepared)
      says so. When either content is larger than 104448 bytes, or the old content is not UTF-8 text,
      C(before) and C(after) are left out and C(dst_larger), C(src_larger) or C(dst_binary) says why,
      as M(ansible.builtin.copy) does.
    - A directory's entry holds C(before) and C(after) as mappings of C(path), C(state) and C(mode), as
      M(ansible.builtin.file) gives them, and its path as C(before_header) and C(after_header).
    - A removed file's entry holds C(before) (state C(file)) and C(after) (state C(absent)).
  returned: changed and in diff mode
  type: list
  elements: dict
  sample: [{"before_header": "/etc/sparkserve/fabric.env (mode 0644)", "after_header":
            "/etc/sparkserve/fabric.env (mode 0644)", "before": "MTU=1500\n", "after": "MTU=9000\n"}]
errors:
  description: One message per refused item (its index or path and what is wrong; never its content).
  returned: when an item is refused
  type: list
  elements: str
  sample: ["files[2] (etc/motd): the path is not absolute; give the full path from /"]
failed_path:
  description: The path whose change failed on the node (a read-only file system, a full disk...).
  returned: when a change failed
  type: str
units_changed:
  description: The units of O(units) started, enabled or disabled (in check mode, that would be), in order.
  returned: always
  type: list
  elements: str
  sample: ["sparkserve-memguard.service"]
units_left:
  description: The units of O(units) left to the caller, as one of their files changed (or would).
  returned: always
  type: list
  elements: str
  sample: []
"""

import os
import stat
from typing import Any, Mapping, Sequence

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkserve.deploy.plugins.module_utils.node.files import with_block, write_atomic
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.process import Runner, run_command
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.units import UnitError
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.units import keep_running as keep_unit_running
from ansible_collections.sparkserve.deploy.plugins.module_utils.node_files_plan import (
    Action,
    ItemError,
    mode_text,
    plan,
)


def apply(action: Action) -> None:
    if action.kind == "mkdir":
        try:
            os.mkdir(action.path, action.mode)
        except FileExistsError:
            # Made since the plan by another call on this node (two deployments' installs at once).
            if not os.path.isdir(action.path):
                raise
        os.chmod(action.path, action.mode)  # mkdir's mode is cut by the umask
    elif action.kind == "chmod":
        os.chmod(action.path, action.mode)
    elif action.kind == "remove":
        try:
            os.unlink(action.path)
        except FileNotFoundError:
            pass
    else:
        write_atomic(action.path, action.data, action.mode)


def block_files(blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each block as the file item that holds it: the file's whole new content and its mode."""
    items = []
    for block in blocks:
        path = block["path"]
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            mode = block.get("mode") or mode_text(stat.S_IMODE(os.stat(path).st_mode))
        except FileNotFoundError:
            text, mode = "", block.get("mode") or "0600"
        except (OSError, UnicodeDecodeError) as err:
            raise ItemError([f"blocks: {path} cannot be read as text: {err}"]) from None
        items.append({"dest": path, "content": with_block(text, block["marker"], block["content"]), "mode": mode})
    return items


def refused_unit_files(units: Sequence[Mapping[str, Any]], directories: Sequence[Mapping[str, Any]],
                       files: Sequence[Mapping[str, Any]]) -> list[str]:
    """One message per path of units[].files that this call does not list."""
    listed = {os.path.normpath(str(d["path"])) for d in directories} | {os.path.normpath(str(f["dest"])) for f in files}
    return [f"units[{index}] ({unit['name']}): files names {path}, which this call does not list"
            for index, unit in enumerate(units) for path in unit["files"]
            if os.path.normpath(str(path)) not in listed]


def split_units(units: Sequence[Mapping[str, Any]], changed_paths: Sequence[str]) -> tuple[list[Any], list[str]]:
    """The units to keep running, and the names of those left to the caller as one of their files changed."""
    changed = {os.path.normpath(path) for path in changed_paths}
    kept = [unit for unit in units if not changed & {os.path.normpath(str(p)) for p in unit["files"]}]
    return kept, [str(unit["name"]) for unit in units if unit not in kept]


def keep_running(units: Sequence[Mapping[str, Any]], check_mode: bool, runner: Runner) -> list[str]:
    """Start and enable (or disable) each unit as asked; the names of those that changed. UnitError."""
    return [str(unit["name"]) for unit in units
            if keep_unit_running(unit["name"], unit["enabled"], check_mode, runner)]


def main(runner: Runner = run_command) -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "str", "required": True},
                "mode": {"type": "raw", "default": "0755"},
                "prune": {"type": "str"},
            }},
            "files": {"type": "list", "elements": "dict", "default": [], "options": {
                "dest": {"type": "str", "required": True},
                "content": {"type": "raw", "required": True},
                "mode": {"type": "raw", "default": "0644"},
            }},
            "blocks": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "str", "required": True},
                "marker": {"type": "str", "required": True},
                "content": {"type": "str", "required": True},
                "mode": {"type": "raw"},
            }},
            "absent": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "dict", "default": [], "options": {
                "name": {"type": "str", "required": True},
                "enabled": {"type": "bool"},
                "files": {"type": "list", "elements": "str", "default": []},
            }},
        },
        supports_check_mode=True,
    )
    units = module.params["units"]
    try:
        files = list(module.params["files"]) + block_files(module.params["blocks"])
        refused = refused_unit_files(units, module.params["directories"], files)
        if refused:
            raise ItemError(refused)
        actions = plan(module.params["directories"], files, module.params["absent"])
    except ItemError as err:
        module.fail_json(msg=err.msg, errors=err.errors, changed=False, changed_paths=[])
    done: list[str] = []
    if not module.check_mode:
        for action in actions:
            try:
                apply(action)
            except OSError as err:
                module.fail_json(
                    msg=f"node_files could not {action.kind} {action.path}: {err.strerror}; the paths in "
                        "changed_paths were changed before it, the ones listed after it were not",
                    changed=bool(done), changed_paths=done, failed_path=action.path)
            done.append(action.path)
    changed_paths = [a.path for a in actions]
    kept, left = split_units(units, changed_paths)
    try:
        touched = keep_running(kept, module.check_mode, runner)
    except UnitError as err:
        module.fail_json(msg=f"node_files wrote its files, then: {err}", changed=bool(actions),
                         changed_paths=changed_paths, units_left=left)
    result: dict[str, Any] = {"changed": bool(actions) or bool(touched), "changed_paths": changed_paths,
                              "units_changed": touched, "units_left": left}
    if module._diff and actions:
        result["diff"] = [a.diff for a in actions]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
