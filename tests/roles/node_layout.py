"""The node programs laid out as a node has them, for the tests that run them as programs.

The sparkserve role installs the node library (plugins/module_utils/node) once per node as the package
``sparkserve_node`` in sparkserve_node_library_dir; the memguard, flusher and supervisor roles install each
program in sparkserve_programs_dir, and systemd runs ``/usr/bin/python3 PROGRAM`` with that library folder on
PYTHONPATH. A test that runs a program copies both into folders of their own first and runs it with env(), so
that it runs the layout a node has, not the checkout's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE_LIBRARY = ROOT / "plugins" / "module_utils" / "node"
PACKAGE = "sparkserve_node"


def install_library(folder: Path) -> Path:
    """Copy the library's Python files into folder/sparkserve_node, as the sparkserve role does (0644); folder."""
    for source in sorted(NODE_LIBRARY.rglob("*.py")):
        target = folder / PACKAGE / source.relative_to(NODE_LIBRARY)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o644)
    return folder


def install(folder: Path, program: str, *, library: bool = True) -> Path:
    """Copy the program (a path below the checkout) into folder/programs (0755) and, unless library is False,
    the library into folder/lib; the copied program's path (env(folder) runs it as its unit does)."""
    programs = folder / "programs"
    programs.mkdir(parents=True, exist_ok=True)
    installed = programs / Path(program).name
    shutil.copyfile(ROOT / program, installed)
    installed.chmod(0o755)
    if library:
        install_library(folder / "lib")
    return installed


def env(folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a program's unit gives it: base (this process's by default) with PYTHONPATH set to the
    library folder of an install into folder."""
    environment = dict(os.environ if base is None else base)
    environment["PYTHONPATH"] = str(folder / "lib")
    return environment
