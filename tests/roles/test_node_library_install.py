"""Tests for the node library as the nodes have it (plugins/module_utils/node, installed as sparkserve_node), and
its textfile module.

The memory guard, the flusher and the supervisor import the library; their own tests cover the families each
writes. Here: the exposition text (escaping, values), the writer (an atomic replace at mode 0644, a failure said
once, the removal), the syntax the nodes' python3 reads, the layout the roles install (the library once, in its
own folder, put on PYTHONPATH by the programs' units) and the tasks that install it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml
from sparkserve_node import textfile

from ansible_collections.sparkserve.deploy.plugins.filter.node_name import node_name
from tests.roles import exposition, node_layout

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = {
    "memguard": "roles/memguard/files/sparkserve-memguard.py",
    "flusher": "roles/flusher/files/sparkserve-flusher.py",
    "supervisor": "roles/supervisor/files/sparkserve-supervisor.py",
}
# Each role's tasks file that installs its program (sparkserve.deploy.node_files), after the node library.
INSTALL_TASKS = {
    "memguard": "roles/memguard/tasks/present.yml",
    "flusher": "roles/flusher/tasks/main.yml",
    "supervisor": "roles/supervisor/tasks/present.yml",
}
DEP = {"deployment": "glm53"}
FLOOR = textfile.MetricFamily("sparkserve_memguard_floor_bytes", "gauge", "The floor.", [(DEP, 1)])


# --- the text --------------------------------------------------------------------------


def test_label_values_are_escaped_and_read_back() -> None:
    weird = 'a\\b"c\nd'
    assert textfile.escape_label_value(weird) == 'a\\\\b\\"c\\nd'
    text = textfile.exposition_text([
        textfile.MetricFamily("x_total", "counter", "Help with a \\ and a\nnewline.",
                              [({"deployment": weird, "container": "c"}, 3)]),
        textfile.MetricFamily("y", "gauge", "Nothing to say.", []),
        textfile.MetricFamily("z_seconds", "gauge", "Time.", [({"deployment": "d"}, 1.5)]),
    ])
    assert text == ('# HELP x_total Help with a \\\\ and a\\nnewline.\n# TYPE x_total counter\n'
                    'x_total{container="c",deployment="a\\\\b\\"c\\nd"} 3\n'  # labels sorted by name
                    "# HELP y Nothing to say.\n# TYPE y gauge\n"
                    '# HELP z_seconds Time.\n# TYPE z_seconds gauge\nz_seconds{deployment="d"} 1.5\n')
    families = exposition.parse(text)
    assert families["x_total"].samples == [({"deployment": weird, "container": "c"}, 3.0)]
    assert families["y"].samples == []


def test_a_sample_without_labels_has_no_braces() -> None:
    text = textfile.exposition_text([textfile.MetricFamily("up", "gauge", "Up.", [({}, 1)])])
    assert text == "# HELP up Up.\n# TYPE up gauge\nup 1\n"
    assert exposition.parse(text)["up"].samples == [({}, 1.0)]


@pytest.mark.parametrize(("value", "text"), [
    (3, "3"),
    (-3, "-3"),
    (2**60, "1152921504606846976"),  # an int stays exact however large
    (True, "1"),
    (2.0, "2"),
    (-0.0, "0"),
    (1.5, "1.5"),
    (0.1, "0.1"),
    (2.0**53, "9007199254740992.0"),  # a whole float past 2**53 is no longer exact: written as a float
    (1e20, "1e+20"),
    (float("nan"), "NaN"),
    (float("inf"), "+Inf"),
    (float("-inf"), "-Inf"),
])
def test_sample_values(value: float, text: str) -> None:
    assert textfile.metric_value(value) == text


# --- the writer ------------------------------------------------------------------------


def test_a_write_replaces_the_file_whole_at_mode_0644(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.prom"
    path.write_text("old\n", encoding="utf-8")
    path.chmod(0o600)
    writer = textfile.TextfileWriter(str(path), "memguard glm53")
    seen: list[tuple[str, str, str, int]] = []
    replace = os.replace

    def watch(source: str, target: str) -> None:
        # What a scrape could see at the rename: the old file whole, and the new text whole beside it.
        seen.append((source, Path(source).read_text(encoding="utf-8"), path.read_text(encoding="utf-8"),
                     os.stat(source).st_mode & 0o777))
        replace(source, target)

    monkeypatch.setattr(textfile.os, "replace", watch)
    umask = os.umask(0o077)  # a new file would be 0600: the writer sets 0644 whatever the umask
    try:
        assert writer.write([FLOOR]) is True
    finally:
        os.umask(umask)
    [(temporary, text, before, mode)] = seen
    # Beside the file, hidden, and not *.prom (the collector reads only those): never scraped half-written.
    assert Path(temporary).parent == path.parent and Path(temporary).name.startswith(".m.prom.")
    assert not temporary.endswith(".prom")
    assert (text, before, mode) == (textfile.exposition_text([FLOOR]), "old\n", 0o644)
    assert exposition.read(path)["sparkserve_memguard_floor_bytes"].value(**DEP) == 1  # 0644, no leftovers
    second = textfile.MetricFamily("sparkserve_memguard_floor_bytes", "gauge", "The floor.", [(DEP, 2)])
    assert writer.write([second]) is True
    assert exposition.read(path)["sparkserve_memguard_floor_bytes"].value(**DEP) == 2


def test_writes_resume_when_the_folder_appears_and_a_new_failure_is_said_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "textfile"
    writer = textfile.TextfileWriter(str(folder / "m.prom"), "memguard glm53")
    assert writer.write([FLOOR]) is False
    assert writer.write([FLOOR]) is False
    assert not folder.exists()  # the folder is not made
    folder.mkdir()
    assert writer.write([FLOOR]) is True
    assert exposition.read(folder / "m.prom")["sparkserve_memguard_floor_bytes"].value(**DEP) == 1
    (folder / "m.prom").unlink()
    (folder / "m.prom").mkdir()  # nothing can be renamed onto a folder, not even by root
    assert writer.write([FLOOR]) is False
    assert writer.write([FLOOR]) is False
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0] == (f"memguard glm53: cannot write the metrics file {folder / 'm.prom'}: No such file or "
                      "directory; carrying on without it")
    assert err[1].endswith("Is a directory; carrying on without it")
    assert exposition.leftovers(folder / "m.prom") == []


def test_a_path_python_refuses_is_said_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    writer = textfile.TextfileWriter("/nowhere/a\0b.prom", "flusher")
    assert writer.write([FLOOR]) is False
    assert capsys.readouterr().err == ("flusher: cannot write the metrics file /nowhere/a\0b.prom: embedded null "
                                       "byte; carrying on without it\n")


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.prom"
    path.write_text("old\n", encoding="utf-8")
    writer = textfile.TextfileWriter(str(path), "supervisor lab-tp2")

    def interrupted(source: str, target: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(textfile.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writer.write([FLOOR])
    assert path.read_text(encoding="utf-8") == "old\n"
    assert exposition.leftovers(path) == []
    assert capsys.readouterr().err == ""  # not a failure to say: the program is being stopped


def test_remove_removes_the_file_and_a_file_already_gone_is_fine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.prom"
    writer = textfile.TextfileWriter(str(path), "flusher")
    assert writer.write([FLOOR]) is True
    writer.remove()
    assert not path.exists()
    writer.remove()
    assert capsys.readouterr().err == ""
    assert not writer.failing


def test_a_removal_that_fails_is_said_once_and_again_after_a_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.prom"
    path.mkdir()
    writer = textfile.TextfileWriter(str(path), "flusher")
    writer.remove()
    writer.remove()
    assert writer.write([FLOOR]) is False  # the same failing spell: not said again
    path.rmdir()
    assert writer.write([FLOOR]) is True
    path.unlink()
    path.mkdir()
    writer.remove()
    assert capsys.readouterr().err == (
        f"flusher: cannot remove the metrics file {path}: Is a directory; carrying on without it\n" * 2)
    assert path.is_dir()


# --- the nodes' python3 and the installed layout ---------------------------------------------------


LIBRARY = sorted(str(path.relative_to(ROOT)) for path in node_layout.NODE_LIBRARY.rglob("*.py"))


@pytest.mark.parametrize("source", [*LIBRARY, *PROGRAMS.values()])
def test_the_syntax_is_python_3_10(source: str) -> None:
    """The Sparks' system python3 is 3.10 or later: nothing newer may be written (except*, type, PEP 701)."""
    ast.parse((ROOT / source).read_text(encoding="utf-8"), filename=source, feature_version=(3, 10))


@pytest.mark.parametrize("source", LIBRARY)
def test_the_library_imports_only_the_standard_library_and_itself(source: str) -> None:
    """It runs on the nodes' bare python3 and imports under two names: relative imports among its own files."""
    tree = ast.parse((ROOT / source).read_text(encoding="utf-8"))
    absolute = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    absolute |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    assert absolute <= set(sys.stdlib_module_names) | {"__future__"}, absolute


@pytest.mark.parametrize("role", sorted(PROGRAMS))
def test_an_installed_program_finds_the_library_on_its_unit_s_path_and_nowhere_else(tmp_path: Path,
                                                                                    role: str) -> None:
    """Program and library installed apart, run from elsewhere with an environment of PATH and PYTHONPATH only,
    as its unit runs it: it starts. Without the library it does not: nothing but PYTHONPATH gives it."""
    clean = {"PATH": os.defpath, "LC_ALL": "C.UTF-8"}
    work = tmp_path / "elsewhere"
    work.mkdir()
    program = node_layout.install(tmp_path / "node", PROGRAMS[role])
    done = subprocess.run([sys.executable, str(program), "--help"], cwd=work,
                          env=node_layout.env(tmp_path / "node", clean),
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: ")
    alone = node_layout.install(tmp_path / "alone", PROGRAMS[role], library=False)
    done = subprocess.run([sys.executable, str(alone), "--help"], cwd=work,
                          env=node_layout.env(tmp_path / "alone", clean),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'sparkserve_node'"


def tasks(path: str) -> list[dict[str, object]]:
    loaded = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    assert isinstance(loaded, list)
    return loaded


LIBRARY_GUARD = "sparkserve_node_library_installed is not defined"


def _installs_library(task: dict[str, object]) -> bool:
    """A task that runs the sparkserve role's node_library tasks (its settings checked once, at the run's start)."""
    step = task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role")
    return (isinstance(step, dict) and step.get("name") == "sparkserve" and step.get("tasks_from") == "node_library"
            and step.get("rolespec_validate") is False and task.get("when") == LIBRARY_GUARD)


@pytest.mark.parametrize("role", sorted(INSTALL_TASKS))
def test_each_role_installs_its_program_without_the_library_itself(role: str) -> None:
    steps = tasks(INSTALL_TASKS[role])
    installs = [i for i, task in enumerate(steps) if "sparkserve.deploy.node_files" in task]
    assert len(installs) == 1
    files = steps[installs[0]]["sparkserve.deploy.node_files"]["files"]  # type: ignore[index]
    assert not [f for f in files if "node_library" in str(f) or "sparkserve_textfile" in str(f)]
    program = (ROOT / f"roles/{role}/vars/main.yml").read_text(encoding="utf-8")
    assert f'"{{{{ sparkserve_programs_dir }}}}/{Path(PROGRAMS[role]).name}"' in program


def test_the_library_is_installed_once_before_the_flusher_and_the_guard_and_by_the_supervisor() -> None:
    # The engine's prepare, which every launch runs first, installs it before the flusher and the guard (whose
    # roles do not, to keep a run that changes nothing short); the supervisor, also run alone, includes it.
    prepare = tasks("roles/engine/tasks/prepare.yml")
    library = [i for i, task in enumerate(prepare) if _installs_library(task)]
    roles = [str((task.get("ansible.builtin.import_role") or {}).get("name")) for task in prepare]  # type: ignore[union-attr]
    assert len(library) == 1 and library[0] < roles.index("flusher") < roles.index("memguard")
    for role in ("flusher", "memguard"):
        assert not [task for task in tasks(INSTALL_TASKS[role]) if _installs_library(task)]
    supervisor = tasks(INSTALL_TASKS["supervisor"])
    includes = [i for i, task in enumerate(supervisor) if _installs_library(task)]
    installs = [i for i, task in enumerate(supervisor) if "sparkserve.deploy.node_files" in task]
    assert len(includes) == 1 and includes[0] < installs[0]


@pytest.mark.parametrize("role", sorted(PROGRAMS))
def test_each_unit_puts_the_library_on_pythonpath_and_names_its_fingerprint(role: str) -> None:
    # A unit per deployment (sparkserve-ROLE@.service) or one per node (sparkserve-ROLE.service, the guard's).
    [template] = (ROOT / f"roles/{role}/templates/etc/systemd/system").glob(f"sparkserve-{role}*.service.j2")
    unit = template.read_text("utf-8")
    assert "\nEnvironment=PYTHONPATH={{ sparkserve_node_library_dir }}\n" in unit
    assert "{{ __sparkserve_node_library_fingerprint }}" in unit  # a changed library changes the unit


def test_the_install_writes_every_python_file_of_the_library_and_removes_what_it_no_longer_has() -> None:
    steps = tasks("roles/sparkserve/tasks/node_library.yml")
    assert [next(k for k in task if "." in k) for task in steps] == [
        "sparkserve.deploy.node_files", "ansible.builtin.set_fact"]
    install = steps[0]["sparkserve.deploy.node_files"]
    assert install["files"] == "{{ __sparkserve_node_library_files }}"  # type: ignore[index]
    # One round trip: the Python files the library no longer has go in the same task.
    assert install["directories"][1] == {"path": "{{ __sparkserve_node_library_package }}",  # type: ignore[index]
                                         "prune": "*.py"}
    assert install["absent"] == ["{{ sparkserve_programs_dir }}/sparkserve_textfile.py"]  # type: ignore[index]
    # Noted on every inventory host of the node, so a second deployment there does not install it again.
    assert steps[1]["ansible.builtin.set_fact"] == {"sparkserve_node_library_installed": True}  # type: ignore[index]
    assert steps[1]["delegate_facts"] is True and steps[1]["loop"] == "{{ __sparkserve_node_hosts }}"
    variables = yaml.safe_load((ROOT / "roles/sparkserve/vars/main.yml").read_text(encoding="utf-8"))
    assert variables["__sparkserve_node_library_package"] == "{{ sparkserve_node_library_dir }}/sparkserve_node"
    assert "reject('search', '__pycache__')" in variables["__sparkserve_node_library_paths"]


def test_the_shared_variables_name_the_library_below_the_project_and_its_node_folder() -> None:
    defaults = yaml.safe_load((ROOT / "roles/sparkserve/defaults/main.yml").read_text(encoding="utf-8"))
    assert defaults["sparkserve_project_dir"] == "{{ playbook_dir | dirname }}"  # the checkout, above playbooks/
    library = defaults["sparkserve_node_library"].replace("{{ sparkserve_project_dir }}", str(ROOT))
    assert Path(library) == node_layout.NODE_LIBRARY
    assert Path(textfile.__file__).resolve().parent == node_layout.NODE_LIBRARY
    assert defaults["sparkserve_node_library_dir"] == "{{ sparkserve_programs_dir }}/python"


@pytest.mark.parametrize(("host", "node_of", "expected"), [
    # Several deployments: each rank is its own inventory host, sparkserve_node names its node.
    ("lab-tp1@spark-1", {"lab-tp2@spark-1": "spark-1", "lab-tp2@spark-2": "spark-2", "lab-tp1@spark-1": "spark-1"},
     ["lab-tp2@spark-1", "lab-tp1@spark-1"]),
    # A plain inventory of one deployment: each host is its own node.
    ("spark-2", {"spark-1": None, "spark-2": None}, ["spark-2"]),
])
def test_the_library_is_noted_on_every_host_of_the_play_on_the_same_node(
        host: str, node_of: dict[str, str | None], expected: list[str]) -> None:
    expression = yaml.safe_load((ROOT / "roles/sparkserve/vars/main.yml").read_text("utf-8"))["__sparkserve_node_hosts"]
    environment = jinja2.Environment()
    environment.filters["sparkserve.deploy.node_name"] = node_name
    environment.filters["zip"] = lambda first, *others: list(zip(first, *others, strict=False))  # Ansible's zip
    hostvars = {name: ({"sparkserve_node": node} if node else {}) for name, node in node_of.items()}
    rendered = environment.from_string(expression).render(
        ansible_play_hosts_all=list(node_of), hostvars=hostvars, inventory_hostname=host)
    assert ast.literal_eval(rendered.strip()) == expected
