"""The lab inventory overrides only what cannot be real here, and the README says so, row by row."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles/lab/templates/inventory/lab/cluster.sparks.yml.j2"
README = ROOT / "lab/README.md"
TABLE_HEADING = "## What the lab makes real, and what it stands in for"

# The paths a Spark takes that the lab once turned off: none may come back.
TURNED_OFF = {
    "sparkserve_fabric_backend": re.compile(r"sparkserve_fabric_backend:\s*none"),
    "sparkserve_container_gpus": re.compile(r"sparkserve_container_gpus:"),
    "sparkserve_drop_caches_path": re.compile(r"sparkserve_drop_caches_path:"),
}


def inventory_settings(text: str) -> list[str]:
    """Every variable the lab inventory sets, and every fabric key beyond the twins and the MTU."""
    settings: list[str] = []
    section = None
    for line in text.splitlines():
        top = re.match(r"^([a-z_]+):", line)
        if top:
            section = top.group(1)
            continue
        key = re.match(r"^  ([a-z_]+):", line)
        if key and section == "vars":
            settings.append(key.group(1))
        elif key and section == "fabric" and key.group(1) not in {"mtu", "twins"}:
            settings.append(key.group(1))
    return settings


def readme_rows() -> list[str]:
    """The rows of the README's table of what the lab makes real."""
    text = README.read_text(encoding="utf-8")
    assert TABLE_HEADING in text, f"the README has no section {TABLE_HEADING!r}"
    section = text.split(TABLE_HEADING, 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]


def test_the_template_is_read_as_the_lab_writes_it() -> None:
    settings = inventory_settings(TEMPLATE.read_text(encoding="utf-8"))
    assert "sparkserve_meminfo_path" in settings and "rdma_sysfs_root" in settings
    assert "ansible_ssh_private_key_file" in settings and "lab_engine_image" in settings
    assert inventory_settings("fabric:\n  mtu: 9000\n  twins: []\nvars:\n  a_b: 1\n    nested: 2\nnodes:\n  c: 3\n") \
        == ["a_b"]


def test_every_lab_setting_has_its_readme_row() -> None:
    rows = readme_rows()
    missing = [name for name in inventory_settings(TEMPLATE.read_text(encoding="utf-8"))
               if not any(f"`{name}`" in row for row in rows)]
    assert not missing, f"the lab inventory sets {missing} with no row in the README's table ({TABLE_HEADING})"


def test_the_lab_turns_off_no_path_a_spark_takes() -> None:
    text = TEMPLATE.read_text(encoding="utf-8")
    back = [name for name, pattern in TURNED_OFF.items() if pattern.search(text)]
    assert not back, f"the lab inventory turns a Spark's path off again: {back}"
