"""Read the Prometheus text exposition of ``/metrics``: speculative-decoding counters and cache facts.

vLLM (v1) exposes, per engine, the counters ``vllm:spec_decode_num_drafts``,
``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``
and ``vllm:spec_decode_num_accepted_tokens_per_pos`` (label ``position``, from
0), each with the ``_total`` suffix of counters; series of several engines are
summed. Acceptance is computed from the difference of two readings, so only
the requests between them count:

- acceptance length = 1 + accepted / drafts (tokens a decode step yields),
- acceptance rate = accepted / draft tokens,
- acceptance at position i = accepted at i / drafts (the share of steps whose
  draft was accepted up to position i, as seed 000 reports it).

SGLang exposes only the gauge ``sglang:spec_accept_length`` (an average since
start), recorded as it reads after a cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Families = dict[str, list[tuple[dict[str, str], float]]]


def parse_exposition(text: str) -> Families:
    """name -> [(labels, value)] for every sample line; comments and malformed lines are skipped."""
    families: Families = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, _, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        pairs = {key: raw.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                 for key, raw in _LABEL.findall(labels or "")}
        families.setdefault(name, []).append((pairs, number))
    return families


def _series(families: Families, name: str) -> list[tuple[dict[str, str], float]] | None:
    for candidate in (name + "_total", name):
        if candidate in families:
            return families[candidate]
    return None


def _sum(families: Families, name: str) -> float | None:
    series = _series(families, name)
    return None if series is None else sum(value for _, value in series)


@dataclass(frozen=True)
class SpecCounters:
    """One reading of the speculative-decoding counters (or the SGLang gauge)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: tuple[float, ...] = ()
    sglang_accept_length: float | None = None
    source: str = "vllm"

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        width = max(len(self.per_position), len(before.per_position))
        mine = list(self.per_position) + [0.0] * (width - len(self.per_position))
        theirs = list(before.per_position) + [0.0] * (width - len(before.per_position))
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted, tuple(a - b for a, b in zip(mine, theirs, strict=True)),
                            self.sglang_accept_length, self.source)

    def plus(self, other: "SpecCounters") -> "SpecCounters":
        width = max(len(self.per_position), len(other.per_position))
        mine = list(self.per_position) + [0.0] * (width - len(self.per_position))
        theirs = list(other.per_position) + [0.0] * (width - len(other.per_position))
        return SpecCounters(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                            self.accepted + other.accepted, tuple(a + b for a, b in zip(mine, theirs, strict=True)),
                            other.sglang_accept_length if other.sglang_accept_length is not None
                            else self.sglang_accept_length, other.source)

    def summary(self) -> dict[str, Any]:
        """The counts and the acceptance figures (None where nothing was drafted)."""
        out: dict[str, Any] = {"source": self.source, "drafts": self.drafts, "draft_tokens": self.draft_tokens,
                               "accepted_tokens": self.accepted, "accepted_per_position": list(self.per_position)}
        if self.source == "sglang":
            out.update(accept_length=self.sglang_accept_length, accept_rate=None, acceptance_per_position=None,
                       note="sglang:spec_accept_length is a gauge averaged since the server started")
            return out
        drafted = self.drafts > 0
        out["accept_length"] = 1.0 + self.accepted / self.drafts if drafted else None
        out["accept_rate"] = self.accepted / self.draft_tokens if self.draft_tokens > 0 else None
        out["acceptance_per_position"] = [n / self.drafts for n in self.per_position] if drafted else None
        return out


def spec_counters(families: Families) -> SpecCounters | None:
    """The counters of one reading, or None when the server exposes no speculative decoding."""
    drafts = _sum(families, "vllm:spec_decode_num_drafts")
    if drafts is not None:
        per_pos: dict[int, float] = {}
        for labels, value in _series(families, "vllm:spec_decode_num_accepted_tokens_per_pos") or []:
            try:
                position = int(labels.get("position", ""))
            except ValueError:
                continue
            per_pos[position] = per_pos.get(position, 0.0) + value
        width = max(per_pos) + 1 if per_pos else 0
        return SpecCounters(drafts=drafts,
                            draft_tokens=_sum(families, "vllm:spec_decode_num_draft_tokens") or 0.0,
                            accepted=_sum(families, "vllm:spec_decode_num_accepted_tokens") or 0.0,
                            per_position=tuple(per_pos.get(i, 0.0) for i in range(width)))
    gauge = families.get("sglang:spec_accept_length")
    if gauge:
        return SpecCounters(sglang_accept_length=gauge[0][1], source="sglang")
    return None


def server_facts(families: Families) -> dict[str, Any]:
    """What /metrics tells about capacity: KV blocks and block size (vllm:cache_config_info)."""
    facts: dict[str, Any] = {}
    info = families.get("vllm:cache_config_info")
    if info:
        labels = info[0][0]
        try:
            blocks = int(labels["num_gpu_blocks"])
            size = int(labels["block_size"])
            facts.update(kv_blocks=blocks, block_size=size, kv_tokens=blocks * size)
        except (KeyError, ValueError):
            pass
    return facts
