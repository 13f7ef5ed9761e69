"""Tests for the node library as the nodes have it (plugins/module_utils/node, installed as sparkserve_node), and
its textfile module.

The memory guard, the flusher and the supervisor import the library; their own tests cover the families each
writes. Here: the exposition text (escaping, values), the writer (an atomic replace at mode 0644, a failure said
once, the removal), the syntax the nodes' python3 reads, the layout the roles install (the library once, in its
own folder, put on PYTHONPATH by the programs' units) and the tasks that install it with each program.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sparkserve_node import textfile

from tests.roles import exposition, node_layout

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = {
    "memguard": "roles/memguard/files/sparkserve-memguard.py",
    "flusher": "roles/flusher/files/sparkserve-flusher.py",
    "supervisor": "roles/supervisor/files/sparkserve-supervisor.py",
}
# Each role's tasks file that installs its program and the node library (one sparkserve.deploy.node_files).
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


@pytest.mark.parametrize("role", sorted(INSTALL_TASKS))
def test_each_role_installs_its_program_with_the_library_in_one_call(role: str) -> None:
    # The library comes with each program, in the same round trip: whichever program a run installs first, the
    # node has what it imports, and a run that changes nothing makes no call of the library's own.
    steps = tasks(INSTALL_TASKS[role])
    installs = [task for task in steps if "sparkserve.deploy.node_files" in task]
    assert len(installs) == 1
    install = installs[0]["sparkserve.deploy.node_files"]
    assert install["directories"] == f"{{{{ __sparkserve_node_library_directories + __{role}_directories }}}}"
    assert install["files"] == f"{{{{ __sparkserve_node_library_files + __{role}_files }}}}"
    assert install["absent"] == "{{ __sparkserve_node_library_absent }}"
    own = installs[0]["vars"][f"__{role}_files"]
    assert not [f for f in own if "node_library" in str(f) or "sparkserve_textfile" in str(f)]
    program = (ROOT / f"roles/{role}/vars/main.yml").read_text(encoding="utf-8")
    assert f'"{{{{ sparkserve_programs_dir }}}}/{Path(PROGRAMS[role]).name}"' in program


def test_no_task_installs_the_library_alone_and_the_weights_seeder_gets_it_with_the_download_program() -> None:
    assert not (ROOT / "roles/sparkserve/tasks").exists()
    everything = " ".join(path.read_text(encoding="utf-8") for path in ROOT.glob("roles/*/tasks/*.yml"))
    assert "tasks_from: node_library" not in everything and "sparkserve_node_library_installed" not in everything
    [install] = [task for task in tasks("roles/weights/tasks/rsyncd.yml") if "sparkserve.deploy.node_files" in task]
    args = install["sparkserve.deploy.node_files"]
    assert "__sparkserve_node_library_files if __weights_downloads" in " ".join(args["files"].split())
    assert args["directories"].endswith("(__sparkserve_node_library_directories if __weights_downloads else []) }}")
    assert args["absent"] == "{{ __sparkserve_node_library_absent if __weights_downloads else [] }}"
    assert install["vars"]["__weights_downloads"] == (
        "{{ inventory_hostname == weights_seeder and not weights_offline | bool }}")


@pytest.mark.parametrize("role", sorted(PROGRAMS))
def test_each_unit_puts_the_library_on_pythonpath_and_names_its_fingerprint(role: str) -> None:
    # A unit per deployment (sparkserve-ROLE@.service) or one per node (sparkserve-ROLE.service, the guard's).
    [template] = (ROOT / f"roles/{role}/templates/etc/systemd/system").glob(f"sparkserve-{role}*.service.j2")
    unit = template.read_text("utf-8")
    assert "\nEnvironment=PYTHONPATH={{ sparkserve_node_library_dir }}\n" in unit
    assert "{{ __sparkserve_node_library_fingerprint }}" in unit  # a changed library changes the unit


def test_the_library_is_every_python_file_and_its_package_keeps_nothing_else() -> None:
    variables = yaml.safe_load((ROOT / "roles/sparkserve/vars/main.yml").read_text(encoding="utf-8"))
    assert variables["__sparkserve_node_library_files"].count("query('ansible.builtin.file'") == 1
    # The Python files the library no longer has go in the same call.
    assert variables["__sparkserve_node_library_directories"] == [
        {"path": "{{ sparkserve_node_library_dir }}"},
        {"path": "{{ __sparkserve_node_library_package }}", "prune": "*.py"}]
    assert variables["__sparkserve_node_library_absent"] == ["{{ sparkserve_programs_dir }}/sparkserve_textfile.py"]
    assert variables["__sparkserve_node_library_package"] == "{{ sparkserve_node_library_dir }}/sparkserve_node"
    assert "reject('search', '__pycache__')" in variables["__sparkserve_node_library_paths"]


def test_the_shared_variables_name_the_library_below_the_project_and_its_node_folder() -> None:
    defaults = yaml.safe_load((ROOT / "roles/sparkserve/defaults/main.yml").read_text(encoding="utf-8"))
    assert defaults["sparkserve_project_dir"] == "{{ playbook_dir | dirname }}"  # the checkout, above playbooks/
    library = defaults["sparkserve_node_library"].replace("{{ sparkserve_project_dir }}", str(ROOT))
    assert Path(library) == node_layout.NODE_LIBRARY
    assert Path(textfile.__file__).resolve().parent == node_layout.NODE_LIBRARY
    assert defaults["sparkserve_node_library_dir"] == "{{ sparkserve_programs_dir }}/python"
