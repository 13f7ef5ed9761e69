"""Fixtures shared by the sparkserve command's tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkserve.project import PLAYBOOKS


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root with the lab's inventory and every verb's playbook."""
    root = tmp_path / "project"
    (root / "inventory" / "lab").mkdir(parents=True)
    (root / "inventory" / "lab" / "cluster.sparks.yml").write_text("plugin: sparkserve.deploy.spark_cluster\n")
    (root / "ansible.cfg").write_text("[defaults]\nroles_path = roles\n")
    for playbook, _tags in PLAYBOOKS.values():
        (root / playbook).parent.mkdir(parents=True, exist_ok=True)
        (root / playbook).write_text("---\n")
    return root


@pytest.fixture(autouse=True)
def interactive_sigint() -> Iterator[None]:
    """Ctrl-C as in a terminal: a suite started in the background (make test) inherits SIGINT ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
