"""Which source files this engine runs: relative path -> sha256.

Logged at startup and served at ``/sparkserve/double/sources``, so that a test
can prove a patched file bind-mounted over the image (an overlay) is the one
the engine started with. Paths are relative to the folder holding the package
(``vllm_double/server.py``); the ``bin/vllm`` launcher and the ``sglang/``
shim beside the package are included when present.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def source_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    files = sorted(package_dir.rglob("*.py"))
    launcher = package_dir.parent / "bin" / "vllm"
    if launcher.is_file():
        files.append(launcher)
    files += sorted((package_dir.parent / "sglang").glob("*.py"))
    return files


def source_hashes(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    root = package_dir.parent
    return {path.relative_to(root).as_posix(): sha256_of(path) for path in source_files(package_dir)}
