"""Every role's argument spec against its defaults, its callers and the shared role.

The spec (meta/argument_specs.yml) is what Ansible validates a role's inputs
against and what tools/role-docs.py writes the role's README from, so it must
say what defaults/main.yml does: every default there is an option of the main
entry point with the same default, and no entry point claims a default that
defaults/main.yml does not set. Every tasks_from some file calls is an entry
point of the spec (Ansible validates the entry point named exactly as
tasks_from is written; `tasks_from: stop.yml` would skip the spec of `stop`).
Paths and names shared by roles live in roles/sparkserve; a role that reads
one depends on it, and no other role or playbook repeats those paths.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if p.is_dir() and not p.name.startswith("."))
SHARED = "sparkserve"
INCLUDES = {"include_role", "import_role", "ansible.builtin.include_role", "ansible.builtin.import_role"}

# Roles whose spec another engineer is rewriting: the drift is known and the replacements are listed for
# them. strict: once fixed these tests pass, and the marker must go.


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def specs(role: str) -> dict[str, Any]:
    return load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]


def defaults(role: str) -> dict[str, Any]:
    path = ROLES / role / "defaults" / "main.yml"
    return (load(path) or {}) if path.is_file() else {}


def main_entry(role: str) -> str:
    """The entry point a role's defaults belong to: main, or shared for the shared role, whose names a role gets by
    depending on it (it runs nothing, so Ansible validates nothing each time; settings_check does, once per run)."""
    return "shared" if role == SHARED else "main"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_role_has_a_spec_for_main(role: str) -> None:
    main = specs(role).get(main_entry(role))
    assert isinstance(main, dict) and main.get("short_description"), (
        f"roles/{role}: give argument_specs.{main_entry(role)}")
    if role == SHARED:
        assert "main" not in specs(role) and not (ROLES / role / "tasks" / "main.yml").exists()


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_default_is_an_option_of_main_with_the_same_default(role: str) -> None:
    options = specs(role)[main_entry(role)].get("options") or {}
    problems = []
    for name, value in defaults(role).items():
        if name not in options:
            problems.append(f"{name} is in defaults/main.yml but not in the main spec")
        elif "default" not in options[name]:
            problems.append(f"{name}: the spec gives no default; defaults/main.yml has {value!r}")
        elif options[name]["default"] != value:
            problems.append(f"{name}: the spec's default {options[name]['default']!r} is not defaults/main.yml's "
                            f"{value!r}")
    assert not problems, f"roles/{role}/meta/argument_specs.yml:\n" + "\n".join(problems)


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_default_of_the_spec_is_set_in_defaults(role: str) -> None:
    values = defaults(role)
    problems = []
    for entry, spec in specs(role).items():
        for name, option in (spec.get("options") or {}).items():
            if "default" not in option:
                continue
            if name not in values:
                problems.append(f"{entry}: {name} has a default in the spec but none in defaults/main.yml")
            elif option["default"] != values[name]:
                problems.append(f"{entry}: {name}'s default {option['default']!r} is not defaults/main.yml's "
                                f"{values[name]!r}")
    assert not problems, f"roles/{role}/meta/argument_specs.yml:\n" + "\n".join(problems)


def yaml_files() -> list[Path]:
    found = [ROOT / "site.yml"]
    for folder in ("playbooks", "molecule", "roles"):
        found += sorted((ROOT / folder).rglob("*.yml"))
    return [path for path in found if "/templates/" not in str(path)]


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def tasks_from_calls() -> list[tuple[str, str, str]]:
    """(file, role, tasks_from) of every include_role or import_role with tasks_from."""
    calls = []
    for path in yaml_files():
        for node in walk(load(path)):
            for key in INCLUDES & set(node):
                args = node[key]
                if isinstance(args, dict) and "tasks_from" in args:
                    calls.append((str(path.relative_to(ROOT)), str(args["name"]), str(args["tasks_from"])))
    return calls


def test_every_tasks_from_is_an_entry_point_of_the_roles_spec() -> None:
    calls = tasks_from_calls()
    assert ("playbooks/status.yml", "engine", "status") in calls  # the scan finds them
    problems = [f"{where}: {role} tasks_from {entry!r} has no argument_specs.{entry} in roles/{role}"
                + (f" (write tasks_from: {entry.rsplit('.', 1)[0]}, the entry point's name)"
                   if entry.endswith((".yml", ".yaml")) else "")
                for where, role, entry in calls if entry not in specs(role)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_entry_point_but_main_is_a_tasks_file(role: str) -> None:
    tasks = ROLES / role / "tasks"
    missing = [entry for entry in specs(role)
               if entry != main_entry(role) and not (tasks / f"{entry}.yml").is_file()]
    assert not missing, f"roles/{role}: entry points without tasks/NAME.yml: {missing}"


def shared_names() -> set[str]:
    return set(defaults(SHARED))


def reads(role: str, names: set[str]) -> set[str]:
    """The shared variables a role's files use (in a template, only inside its Jinja)."""
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    used: set[str] = set()
    for path in (ROLES / role).rglob("*"):
        if path.suffix == ".yml":
            used |= set(pattern.findall(path.read_text(encoding="utf-8")))
        elif path.suffix == ".j2":
            for jinja in re.findall(r"\{\{.*?\}\}|\{%.*?%\}", path.read_text(encoding="utf-8"), re.DOTALL):
                used |= set(pattern.findall(jinja))
    return used


@pytest.mark.parametrize("role", [name for name in ROLE_NAMES if name != SHARED])
def test_a_role_reading_a_shared_variable_depends_on_the_shared_role(role: str) -> None:
    used = reads(role, shared_names())
    meta = load(ROLES / role / "meta" / "main.yml") or {}
    deps = [d.get("role", d.get("name")) if isinstance(d, dict) else d for d in meta.get("dependencies") or []]
    assert not used or SHARED in deps, (f"roles/{role} reads {sorted(used)} but meta/main.yml does not list "
                                        f"the {SHARED} role among its dependencies")


def test_the_shared_role_is_defaults_and_the_library_files_and_every_name_is_read() -> None:
    # No tasks: depending on the role runs none. Its vars give the node library (sparkserve_node_library) as the
    # roles whose programs import it install it; files/ holds only the library under the name the programs
    # import it by (a link, for the tests and mypy).
    assert sorted(p.name for p in (ROLES / SHARED).iterdir() if p.is_dir()) == ["defaults", "files", "meta", "vars"]
    link = ROLES / SHARED / "files" / "sparkserve_node"
    assert [p.name for p in (ROLES / SHARED / "files").iterdir()] == [link.name]
    assert link.is_symlink() and link.resolve() == ROOT / "plugins" / "module_utils" / "node"
    names = shared_names()
    assert all(name.startswith(SHARED + "_") for name in names)
    by_roles = set().union(*(reads(role, names) for role in ROLE_NAMES if role != SHARED))
    playbooks = " ".join(p.read_text(encoding="utf-8") for p in (ROOT / "playbooks").glob("*.yml"))
    # sparkserve_data_dir and the like are read by the shared defaults below them.
    inside = {name for name in names if any(re.search(rf"\b{name}\b", str(value))
                                             for key, value in defaults(SHARED).items() if key != name)}
    # sparkserve_node_library and the like are read by the role's own list of the node library's files.
    own = " ".join(path.read_text(encoding="utf-8") for path in sorted((ROLES / SHARED / "vars").glob("*.yml")))
    inside |= {name for name in names if re.search(rf"\b{name}\b", own)}
    unread = sorted(name for name in names - by_roles - inside if not re.search(rf"\b{name}\b", playbooks))
    assert not unread, f"roles/{SHARED} defines what no role reads: {unread}"


# The sparkserve folders on a node: only roles/sparkserve spells them out. The lab role makes the nodes
# themselves (its node containers keep the models folder on a volume); files/ holds the programs, whose own
# defaults and documentation name them; meta/ holds documentation.
SHARED_PATHS = re.compile(r"(/var/lib/sparkserve|/etc/sparkserve|/usr/local/lib/sparkserve|/run/sparkserve)(?![\w-])")
PATH_EXEMPT = {"roles/sparkserve", "roles/lab"}


def test_no_role_or_playbook_repeats_a_shared_path() -> None:
    places = [p for p in sorted(ROLES.rglob("*")) if p.suffix in (".yml", ".j2") and "/files/" not in str(p)
              and "/meta/" not in str(p)] + sorted((ROOT / "playbooks").glob("*.yml")) + [ROOT / "site.yml"]
    found = []
    for path in places:
        where = str(path.relative_to(ROOT))
        if any(where.startswith(exempt + "/") for exempt in PATH_EXEMPT):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SHARED_PATHS.search(line):
                found.append(f"{where}:{number}: {line.strip()}")
    assert not found, "use the sparkserve role's variables instead:\n" + "\n".join(found)
