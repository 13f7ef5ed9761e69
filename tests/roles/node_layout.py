"""The node programs laid out as a node has them, for the tests that run them as programs.

The memguard, flusher and supervisor roles install each program and the module it imports
(roles/sparkserve/files/sparkserve_textfile.py) side by side in sparkserve_programs_dir, and systemd runs
``/usr/bin/python3 PROGRAM``: python finds the module in the program's own folder. A test that runs a program
copies both into one folder first, so that it runs the layout a node has, not the checkout's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE_LIBRARY = ROOT / "roles" / "sparkserve" / "files" / "sparkserve_textfile.py"


def install(folder: Path, program: str, *, library: bool = True) -> Path:
    """Copy the program (a path below the checkout) and, unless library is False, the module into folder,
    as the roles install them (program 0755, module 0644); the copied program's path."""
    folder.mkdir(parents=True, exist_ok=True)
    installed = folder / Path(program).name
    shutil.copyfile(ROOT / program, installed)
    installed.chmod(0o755)
    if library:
        module = folder / NODE_LIBRARY.name
        shutil.copyfile(NODE_LIBRARY, module)
        module.chmod(0o644)
    return installed
