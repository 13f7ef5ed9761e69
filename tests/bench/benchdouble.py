"""The vLLM lab double as the server under test, started as a subprocess on 127.0.0.1.

The double runs as its own process (one rank, ``--load-format dummy``), so its
threads never share the client's interpreter: timings are the double's
schedule plus real HTTP, and the client's own CPU time is its alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / "lab/engine/bin/vllm"
BENCH = str(ROOT / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Double:
    """One `vllm serve` of the double with known knobs."""

    def __init__(self, folder: Path, knobs: dict[str, str], speculative_tokens: int = 0) -> None:
        model = folder / "model"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps({"max_position_embeddings": 65536}), encoding="utf-8")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.knobs = knobs
        argv = [sys.executable, str(VLLM), "serve", str(model), "--served-model-name", "tiny",
                "--host", "127.0.0.1", "--port", str(self.port), "--load-format", "dummy", "--disable-log-requests"]
        if speculative_tokens:
            argv += ["--speculative-config", json.dumps({"method": "mtp",
                                                         "num_speculative_tokens": speculative_tokens})]
        self.log = folder / "double.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **knobs})
        self._wait()

    def _wait(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the double exited: " + self.log.read_text(errors="replace"))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the double did not get healthy: " + self.log.read_text(errors="replace"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


# Configuration A: what the accuracy tests check the measurements against.
TTFT_BASE_MS = 300.0
TTFT_PER_1K_MS = 40.0
ITL_MS = 10.0
ACCEPT = (0.95, 0.9, 0.8)
SPEC_TOKENS = 3
KNOBS_A = {"VLLM_DOUBLE_TTFT_BASE_MS": "%g" % TTFT_BASE_MS, "VLLM_DOUBLE_TTFT_PER_1K_MS": "%g" % TTFT_PER_1K_MS,
           "VLLM_DOUBLE_ITL_MS": "%g" % ITL_MS, "VLLM_DOUBLE_ACCEPT": ",".join("%g" % p for p in ACCEPT)}
# Configuration B: the same engine, faster (shorter steps and first token).
KNOBS_B = {**KNOBS_A, "VLLM_DOUBLE_TTFT_BASE_MS": "200", "VLLM_DOUBLE_ITL_MS": "7"}
