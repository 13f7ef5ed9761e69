"""Make the project's collection (sparkserve.deploy) and the node programs' library importable in tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
from ansible.plugins.loader import init_plugin_loader

COLLECTIONS = str(Path(__file__).resolve().parents[1] / "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
# Ansible's own collection loader, before anything of the collection is imported: as in ansible-playbook, the
# collection's metadata is loaded with it, so that a template naming sparkserve.deploy.FILTER finds it
# (tests/playbooks/test_pipeline_shape.py templates the plays' hosts).
init_plugin_loader([COLLECTIONS])

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The node library (plugins/module_utils/node) as the node programs (roles/*/files/sparkserve-*.py) import it:
# the package sparkserve_node, which a node has in sparkserve_node_library_dir and the checkout as the link
# roles/sparkserve/files/sparkserve_node; that folder goes on the path.
NODE_PATH = str(Path(__file__).resolve().parents[1] / "roles" / "sparkserve" / "files")
if NODE_PATH not in sys.path:
    sys.path.insert(0, NODE_PATH)


@pytest.fixture
def as_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a module's main() as it runs on a node, whatever else this test process imported.

    Importing any controller code (a filter, the inventory or a callback plugin) marks the whole process as
    the controller, and from then on a module's warnings go to the controller's display instead of its
    result. Tests run in any order (pytest-xdist), so the tests of modules reset that mark.
    """
    from ansible.module_utils import _internal
    from ansible.module_utils.common import warnings

    monkeypatch.setattr(_internal, "is_controller", False)
    # A module's warnings are kept process-wide until its result is written; a test that ran main() before in
    # this worker must not lend its warnings to the next one.
    warnings._global_warnings.clear()
    warnings._global_deprecations.clear()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """A real file system of a few KiB: make(size_kib) mounts a tmpfs of that size in tmp_path and returns it
    (the suite runs as root, as CI does); every one is unmounted after the test."""
    mounted: list[Path] = []

    def make(size_kib: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "sparkserve-test", str(where)],
                       check=True, capture_output=True)
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "--lazy", str(where)], check=False)
