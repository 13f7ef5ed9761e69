"""Make the lab's engine programs importable in the lab tests (make_tiny_model, vllm_double, sglang)."""

from __future__ import annotations

import sys
from pathlib import Path

ENGINE = str(Path(__file__).resolve().parents[2] / "lab" / "engine")
if ENGINE not in sys.path:
    sys.path.insert(0, ENGINE)
