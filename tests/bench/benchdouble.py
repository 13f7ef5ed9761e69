"""The lab doubles as the server under test, started as subprocesses on 127.0.0.1.

The vLLM double, its configuration A and the launcher come from
tools/bench-client.py, the benchmark that prints how closely the client's
measurements match that configuration; the tests start the same double and
assert only what does not depend on the machine's speed. ``SGLangDouble``
starts the SGLang double (``python3 -m sglang.launch_server`` of lab/engine)
the same way, for what the bench reads of an SGLang /metrics.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.scripts import load_script

tool = load_script("tools/bench-client.py", "sparkserve_bench_client")

ROOT = tool.ROOT
BENCH = tool.BENCH  # on sys.path, with COLLECTIONS (the engine adapters): sparkserve_bench imports
COLLECTIONS = tool.COLLECTIONS
Double = tool.Double
free_port = tool.free_port
expected_acceptance = tool.expected_acceptance

TTFT_BASE_MS: float = tool.TTFT_BASE_MS
TTFT_PER_1K_MS: float = tool.TTFT_PER_1K_MS
ITL_MS: float = tool.ITL_MS
ACCEPT: tuple[float, ...] = tool.ACCEPT
SPEC_TOKENS: int = tool.SPEC_TOKENS
KNOBS_A: dict[str, str] = tool.KNOBS_A
KNOBS_FAST: dict[str, str] = tool.KNOBS_FAST
LAB_ENGINE = ROOT / "lab/engine"


class SGLangDouble(Double):
    """One SGLang double with metrics on (``--enable-metrics``) and SPEC_TOKENS draft steps."""

    def __init__(self, folder: Path, knobs: dict[str, str]) -> None:
        super().__init__(folder, knobs, SPEC_TOKENS)

    def argv(self, model: Path, speculative_tokens: int) -> list[str]:
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
                "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
                "--load-format", "dummy", "--enable-metrics", "--speculative-algorithm", "EAGLE",
                "--speculative-num-steps", str(speculative_tokens)]

    def extra_env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(LAB_ENGINE)}
