"""The vLLM lab double as the server under test, started as a subprocess on 127.0.0.1.

The double, its configuration A and the launcher come from
tools/bench-client.py, the benchmark that prints how closely the client's
measurements match that configuration; the tests start the same double and
assert only what does not depend on the machine's speed.
"""

from __future__ import annotations

from tests.scripts import load_script

tool = load_script("tools/bench-client.py", "sparkserve_bench_client")

ROOT = tool.ROOT
BENCH = tool.BENCH  # on sys.path: sparkserve_bench imports
Double = tool.Double
free_port = tool.free_port
expected_acceptance = tool.expected_acceptance

TTFT_BASE_MS: float = tool.TTFT_BASE_MS
TTFT_PER_1K_MS: float = tool.TTFT_PER_1K_MS
ITL_MS: float = tool.ITL_MS
ACCEPT: tuple[float, ...] = tool.ACCEPT
SPEC_TOKENS: int = tool.SPEC_TOKENS
KNOBS_A: dict[str, str] = tool.KNOBS_A
