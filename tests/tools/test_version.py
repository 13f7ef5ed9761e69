"""One version across galaxy.yml, pyproject.toml and every plugin's version_added."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"])


def test_the_collection_has_the_project_version() -> None:
    galaxy = yaml.safe_load((ROOT / "collections/ansible_collections/sparkserve/deploy/galaxy.yml").read_text())
    assert str(galaxy["version"]) == project_version()


def test_no_plugin_is_added_in_a_version_after_the_project() -> None:
    current = parse(project_version())
    late = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for added in re.findall(r'^version_added:\s*"?([0-9.]+)"?', path.read_text(encoding="utf-8"), re.M):
            if parse(added) > current:
                late.append(f"{path.relative_to(ROOT)}: {added}")
    assert not late, f"version_added after {project_version()}: {late}"
