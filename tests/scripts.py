"""Load a program of the project (a script without .py, or one installed by a role) as a module."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative_path: str, name: str) -> ModuleType:
    """Import the file at ROOT/relative_path under the module name ``name``."""
    loader = importlib.machinery.SourceFileLoader(name, str(ROOT / relative_path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look the module up
    loader.exec_module(module)
    return module
