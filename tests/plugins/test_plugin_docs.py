"""Every plugin's documentation is YAML that ansible-doc can read, with the plugin's own name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
KINDS = ("modules", "filter", "inventory", "callback", "vars")
DOCUMENTED = sorted(p for kind in KINDS for p in (PLUGINS / kind).glob("*.py"))


def doc_strings(path: Path) -> dict[str, str]:
    """The module-level string constants DOCUMENTATION, EXAMPLES and RETURN of a plugin file."""
    found = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                    found[target.id] = node.value.value
    return found


@pytest.mark.parametrize("path", DOCUMENTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_documentation_parses_and_names_the_plugin(path: Path) -> None:
    docs = doc_strings(path)
    assert "DOCUMENTATION" in docs, f"{path.name} has no DOCUMENTATION"
    documentation = yaml.safe_load(docs["DOCUMENTATION"])
    assert isinstance(documentation, dict)
    name = documentation.get("module") or documentation.get("name")
    if path.parent.name == "filter":  # a filter file may hold several filters; the doc names one of them
        assert f'"{name}":' in path.read_text(encoding="utf-8")
    else:
        assert name == path.stem
    assert isinstance(documentation.get("description"), (list, str)) and documentation["description"]
    for other in ("EXAMPLES", "RETURN"):
        if other in docs:
            yaml.safe_load(docs[other])  # raises on a YAML error


def test_a_plugin_with_broken_documentation_is_caught(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text('DOCUMENTATION = r"""\nname: broken\ndescription:\n  - a (b): c\n    d\n"""\n', encoding="utf-8")
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(doc_strings(broken)["DOCUMENTATION"])
