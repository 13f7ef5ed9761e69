"""Environment knobs of the double: how fast it loads (and how much memory it takes), answers and accepts drafts,
when it stalls or crashes, and which network NCCL's log says it chose.

Every knob is read once at startup. A malformed value stops the engine with
a line naming the variable, as a misconfigured engine would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


class KnobError(ValueError):
    """An environment variable holds a value the double cannot use."""


@dataclass(frozen=True)
class Knobs:
    """The knobs' values; the defaults are those of an unset environment."""

    join_timeout_s: float = 120.0  # VLLM_DOUBLE_JOIN_TIMEOUT_S: how long a worker retries joining the head
    load_mib_s: float = 0.0  # VLLM_DOUBLE_LOAD_MIB_S: weight read rate per rank, 0 = unlimited
    load_delay_s: float = 0.0  # VLLM_DOUBLE_LOAD_DELAY_S: extra engine-init time after the weights
    load_hold_file: str | None = None  # VLLM_DOUBLE_LOAD_HOLD_FILE: engine init ends only once this file exists
    load_alloc_mib: float = 0.0  # VLLM_DOUBLE_LOAD_ALLOC_MIB: MiB taken (pages written) for the load
    stall_file: str | None = None  # VLLM_DOUBLE_STALL_FILE: completions stall while this file exists
    crash_file: str | None = None  # VLLM_DOUBLE_CRASH_FILE: the engine fails at start while this file exists
    ttft_base_ms: float = 20.0  # VLLM_DOUBLE_TTFT_BASE_MS: time to first token of an empty prompt
    ttft_per_1k_ms: float = 50.0  # VLLM_DOUBLE_TTFT_PER_1K_MS: added per 1000 prompt tokens
    itl_ms: float = 10.0  # VLLM_DOUBLE_ITL_MS: time of one decode step
    accept: tuple[float, ...] = (0.8, 0.6, 0.4)  # VLLM_DOUBLE_ACCEPT: draft acceptance per position
    heartbeat_s: float = 1.0  # VLLM_DOUBLE_HEARTBEAT_S: heartbeat period between head and workers
    heartbeat_timeout_s: float = 10.0  # VLLM_DOUBLE_HEARTBEAT_TIMEOUT_S: silence that counts as a lost rank
    ready_timeout_s: float = 600.0  # VLLM_ENGINE_READY_TIMEOUT_S: how long the head waits for every rank
    api_key: str | None = None  # VLLM_API_KEY: as --api-key
    nccl_net: str = "IB"  # VLLM_DOUBLE_NCCL_NET: the network NCCL's log lines report (IB, Socket, regmr)


# VLLM_DOUBLE_NCCL_NET's values, as spelt in the README; read case-insensitively.
NCCL_NETS = ("IB", "Socket", "regmr")


def _number(env: Mapping[str, str], name: str, default: float, positive: bool = False) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise KnobError("%s is %r; give a number" % (name, text)) from None
    if value < 0 or (positive and value == 0) or value != value:
        raise KnobError("%s is %r; give a number %s 0" % (name, text, "above" if positive else "of at least"))
    return value


def _probabilities(env: Mapping[str, str], name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise KnobError("%s is %r; give probabilities separated by commas, like 0.8,0.6,0.4" % (name, text)) from None
    if not all(0.0 <= value <= 1.0 for value in values):
        raise KnobError("%s is %r; every probability must be from 0 to 1" % (name, text))
    return values


def read_nccl_net(env: Mapping[str, str]) -> str:
    """VLLM_DOUBLE_NCCL_NET as one of NCCL_NETS (default IB); raises KnobError on another value."""
    text = env.get("VLLM_DOUBLE_NCCL_NET", "").strip()
    if not text:
        return Knobs.nccl_net
    for name in NCCL_NETS:
        if text.lower() == name.lower():
            return name
    raise KnobError("VLLM_DOUBLE_NCCL_NET is %r; give one of %s" % (text, ", ".join(NCCL_NETS)))


def read_knobs(env: Mapping[str, str]) -> Knobs:
    """The knobs from an environment; raises KnobError on a malformed value."""
    base = Knobs()
    return Knobs(
        join_timeout_s=_number(env, "VLLM_DOUBLE_JOIN_TIMEOUT_S", base.join_timeout_s, positive=True),
        load_mib_s=_number(env, "VLLM_DOUBLE_LOAD_MIB_S", base.load_mib_s),
        load_delay_s=_number(env, "VLLM_DOUBLE_LOAD_DELAY_S", base.load_delay_s),
        load_hold_file=env.get("VLLM_DOUBLE_LOAD_HOLD_FILE") or None,
        load_alloc_mib=_number(env, "VLLM_DOUBLE_LOAD_ALLOC_MIB", base.load_alloc_mib),
        stall_file=env.get("VLLM_DOUBLE_STALL_FILE") or None,
        crash_file=env.get("VLLM_DOUBLE_CRASH_FILE") or None,
        ttft_base_ms=_number(env, "VLLM_DOUBLE_TTFT_BASE_MS", base.ttft_base_ms),
        ttft_per_1k_ms=_number(env, "VLLM_DOUBLE_TTFT_PER_1K_MS", base.ttft_per_1k_ms),
        itl_ms=_number(env, "VLLM_DOUBLE_ITL_MS", base.itl_ms),
        accept=_probabilities(env, "VLLM_DOUBLE_ACCEPT", base.accept),
        heartbeat_s=_number(env, "VLLM_DOUBLE_HEARTBEAT_S", base.heartbeat_s, positive=True),
        heartbeat_timeout_s=_number(env, "VLLM_DOUBLE_HEARTBEAT_TIMEOUT_S", base.heartbeat_timeout_s, positive=True),
        ready_timeout_s=_number(env, "VLLM_ENGINE_READY_TIMEOUT_S", base.ready_timeout_s, positive=True),
        api_key=env.get("VLLM_API_KEY") or None,
        nccl_net=read_nccl_net(env),
    )
