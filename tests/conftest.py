"""Make the project's collection (sparkserve.deploy) importable in tests."""

from __future__ import annotations

import sys
from pathlib import Path

COLLECTIONS = str(Path(__file__).resolve().parents[1] / "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
