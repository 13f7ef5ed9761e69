"""Roles read the recipe role's results only through their argument specs.

The recipe role renders ``recipe_config``, ``recipe_engine``, ``recipe_ranks``,
``recipe_deployment`` and ``recipe_dir``; every other role takes what it needs
of them as options of its own (``engine_recipe: "{{ recipe_config }}"``), so
its spec says what it reads and a caller can give another value. A role's
tasks, vars, templates and handlers name no ``recipe_*`` variable: only its
defaults and its spec do. Setting one for the recipe role (a key of ``vars:``)
is not a read, nor is another host's rendered recipe (``hostvars[...].recipe_config``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir() and p.name != "recipe")
READ = re.compile(r"(?<![\w.])(recipe_[a-z_]+)\b(?!\s*:)")


def reads(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        code = line.split(" #", 1)[0]
        if code.lstrip().startswith("#"):
            continue
        found += READ.findall(code)
    return found


@pytest.mark.parametrize("role", ROLES)
def test_a_role_reads_the_recipe_only_through_its_spec(role: str) -> None:
    problems = []
    for folder in ("tasks", "vars", "templates", "handlers"):
        for path in sorted((ROOT / "roles" / role / folder).rglob("*")):
            if path.is_file():
                names = reads(path.read_text(encoding="utf-8"))
                if names:
                    problems.append(f"{path.relative_to(ROOT)} reads {sorted(set(names))}")
    assert not problems, "; ".join(problems) + ": take it as an option of the role (defaults and argument spec)"


def test_the_check_sees_a_direct_read_and_leaves_keys_and_other_hosts_alone() -> None:
    assert reads('image: "{{ recipe_config.image }}"') == ["recipe_config"]
    assert reads("when: recipe_rendered_for is not defined") == ["recipe_rendered_for"]
    assert reads('    recipe_recorded: "{{ release_relaunch }}"') == []
    assert reads("x: \"{{ hostvars[h].recipe_config }}\"  # recipe_dir") == []
