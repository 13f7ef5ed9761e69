"""Read the Prometheus text exposition of ``/metrics`` by meaning: speculative-decoding figures and cache facts.

The bench names no engine's metrics: an engine adapter of the collection
(``plugins/module_utils/engines/``) maps each meaning to its engine's metric
name in ``metric_names``, and ``EngineMetrics`` reads a reading through that
mapping. A meaning the engine lacks is absent from it, and what it would give
is absent from the reading. The meanings:

- ``spec_drafts``, ``spec_draft_tokens``, ``spec_accepted_tokens``: counters
  of speculative decoding (draft steps, tokens drafted, drafted tokens
  accepted), read with or without the ``_total`` suffix of counters; series
  of several engine processes are summed;
- ``spec_accepted_per_position``: a counter of accepted tokens per draft
  position, the position (from 0) in the label ``position``;
- ``spec_accept_length``: a gauge of the acceptance length averaged since the
  server started, recorded as it reads after a run (the figure an engine
  without the counters offers);
- ``cache_config_info``: an info metric whose labels ``num_gpu_blocks`` and
  ``block_size`` give the KV cache's capacity.

Acceptance from the counters is computed from the difference of two
readings, so only the requests between them count:

- acceptance length = 1 + accepted / drafts (tokens a decode step yields),
- acceptance rate = accepted / draft tokens,
- acceptance at position i = accepted at i / drafts (the share of steps whose
  draft was accepted up to position i, as seed 000 reports it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Families = dict[str, list[tuple[dict[str, str], float]]]

# The meanings the bench reads; an adapter's metric_names maps (some of) them to its engine's names.
SPEC_DRAFTS = "spec_drafts"
SPEC_DRAFT_TOKENS = "spec_draft_tokens"
SPEC_ACCEPTED_TOKENS = "spec_accepted_tokens"
SPEC_ACCEPTED_PER_POSITION = "spec_accepted_per_position"
SPEC_ACCEPT_LENGTH = "spec_accept_length"
CACHE_CONFIG_INFO = "cache_config_info"
MEANINGS = (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED_TOKENS, SPEC_ACCEPTED_PER_POSITION, SPEC_ACCEPT_LENGTH,
            CACHE_CONFIG_INFO)


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


def _series(families: Families, name: str | None) -> list[tuple[dict[str, str], float]] | None:
    if not name:
        return None
    for candidate in (name + "_total", name):
        if candidate in families:
            return families[candidate]
    return None


def _sum(families: Families, name: str | None) -> float | None:
    series = _series(families, name)
    return None if series is None else sum(value for _, value in series)


def _pad(values: tuple[float, ...], width: int) -> list[float]:
    return list(values) + [0.0] * (width - len(values))


@dataclass(frozen=True)
class SpecCounters:
    """One reading of speculative decoding: the counters where the engine has them, its accept-length gauge."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: tuple[float, ...] = ()
    # The engine's own acceptance length, averaged since it started (as read, never differenced).
    accept_length_gauge: float | None = None
    # The engine whose metric names were read (the adapter's name).
    source: str = ""
    # Whether the draft counters were read (else only the gauge was).
    counted: bool = True

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        width = max(len(self.per_position), len(before.per_position))
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted,
                            tuple(a - b for a, b in zip(_pad(self.per_position, width),
                                                        _pad(before.per_position, width), strict=True)),
                            self.accept_length_gauge, self.source, self.counted)

    def plus(self, other: "SpecCounters") -> "SpecCounters":
        width = max(len(self.per_position), len(other.per_position))
        return SpecCounters(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                            self.accepted + other.accepted,
                            tuple(a + b for a, b in zip(_pad(self.per_position, width),
                                                        _pad(other.per_position, width), strict=True)),
                            other.accept_length_gauge if other.accept_length_gauge is not None
                            else self.accept_length_gauge, other.source, self.counted or other.counted)

    def summary(self) -> dict[str, Any]:
        """The counts and the acceptance figures (None where nothing was drafted or the engine has no counters)."""
        out: dict[str, Any] = {"source": self.source, "drafts": self.drafts, "draft_tokens": self.draft_tokens,
                               "accepted_tokens": self.accepted, "accepted_per_position": list(self.per_position),
                               "accept_length_gauge": self.accept_length_gauge}
        if not self.counted:
            out.update(accept_length=self.accept_length_gauge, accept_rate=None, acceptance_per_position=None,
                       note="accept_length is the engine's gauge, averaged since the server started: %s has no "
                            "draft counters" % (self.source or "the engine"))
            return out
        drafted = self.drafts > 0
        out["accept_length"] = 1.0 + self.accepted / self.drafts if drafted else None
        out["accept_rate"] = self.accepted / self.draft_tokens if self.draft_tokens > 0 else None
        out["acceptance_per_position"] = [n / self.drafts for n in self.per_position] if drafted else None
        return out


@dataclass(frozen=True)
class EngineMetrics:
    """What one engine exposes, by meaning: its name and its adapter's ``metric_names``."""

    engine: str
    names: Mapping[str, str] = field(default_factory=dict)

    def present(self, families: Families) -> list[str]:
        """The meanings of this engine whose metric is in the reading (an empty list: not this engine's)."""
        return [meaning for meaning, name in self.names.items() if _series(families, name) is not None]

    def spec_counters(self, families: Families) -> SpecCounters | None:
        """The speculative decoding of one reading, or None when the server exposes none of it."""
        gauge_series = _series(families, self.names.get(SPEC_ACCEPT_LENGTH))
        gauge = gauge_series[0][1] if gauge_series else None
        drafts = _sum(families, self.names.get(SPEC_DRAFTS))
        if drafts is None:
            return None if gauge is None else SpecCounters(accept_length_gauge=gauge, source=self.engine,
                                                           counted=False)
        per_pos: dict[int, float] = {}
        for labels, value in _series(families, self.names.get(SPEC_ACCEPTED_PER_POSITION)) or []:
            try:
                position = int(labels.get("position", ""))
            except ValueError:
                continue
            per_pos[position] = per_pos.get(position, 0.0) + value
        width = max(per_pos) + 1 if per_pos else 0
        return SpecCounters(drafts=drafts,
                            draft_tokens=_sum(families, self.names.get(SPEC_DRAFT_TOKENS)) or 0.0,
                            accepted=_sum(families, self.names.get(SPEC_ACCEPTED_TOKENS)) or 0.0,
                            per_position=tuple(per_pos.get(i, 0.0) for i in range(width)),
                            accept_length_gauge=gauge, source=self.engine)

    def server_facts(self, families: Families) -> dict[str, Any]:
        """What /metrics tells about capacity: KV blocks and block size (the cache_config_info labels)."""
        facts: dict[str, Any] = {}
        info = _series(families, self.names.get(CACHE_CONFIG_INFO))
        if info:
            labels = info[0][0]
            try:
                blocks = int(labels["num_gpu_blocks"])
                size = int(labels["block_size"])
                facts.update(kv_blocks=blocks, block_size=size, kv_tokens=blocks * size)
            except (KeyError, ValueError):
                pass
        return facts


class AmbiguousEngineError(ValueError):
    """The metrics of several engines are present to the same extent."""

    def __init__(self, engines: list[str]) -> None:
        super().__init__(", ".join(engines))
        self.engines = engines


def detect(families: Families, candidates: Iterable[EngineMetrics]) -> EngineMetrics | None:
    """The candidate whose metrics the reading holds most of; None when it holds none of any.

    AmbiguousEngineError when several hold the same, largest number.
    """
    counted = [(len(c.present(families)), c) for c in candidates]
    most = max((n for n, _ in counted), default=0)
    if most == 0:
        return None
    best = [c for n, c in counted if n == most]
    if len(best) > 1:
        raise AmbiguousEngineError(sorted(c.engine for c in best))
    return best[0]
