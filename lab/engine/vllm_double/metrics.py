"""Prometheus counters, gauges and histograms under vLLM's names, in the text exposition format.

Names and labels follow vLLM v1: every series has ``model_name`` (the first
served name) and ``engine="0"``; counters end in ``_total``; the speculative
decoding series exist only when ``--speculative-config`` is given, with one
``position`` series per draft position, counted from 0.

Latencies are seconds of ``time.monotonic()`` as the server reports them:
time to first token (a request's arrival to its first output token, one
observation per request that gets one), inter-token latency (one observation
per step after the first: the gap since the request's previous step) and
end-to-end latency (arrival to finish, one per finished request, aborted ones
included, as ``request_success_total`` counts them). Histograms have
cumulative ``_bucket`` series ending in ``le="+Inf"``, then ``_sum`` and
``_count``.

KV cache: the double admits ``--max-num-seqs`` requests at once, each of at
most ``--max-model-len`` tokens, so its KV capacity is ``max_model_len x
max_num_seqs`` tokens and a running request holds its prompt and the tokens
it has output so far (from its first token until it ends). The usage gauge is
the tokens held over that capacity: 0 when idle, never above 1 (so the double
never preempts: ``vllm:num_preemptions_total`` stays 0).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque

from .generation import Step

FINISH_REASONS = ("stop", "length", "abort")

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)
# Generation throughput (SGLang's gauge): tokens output over the last GEN_WINDOW_S seconds (or since the engine
# last became busy, if later, but at least GEN_SLOT_S), counted in slots of GEN_SLOT_S seconds.
GEN_WINDOW_S = 5.0
GEN_SLOT_S = 0.25

Labels = list[tuple[str, str]]


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(pairs: Labels) -> str:
    return "{" + ",".join('%s="%s"' % (key, _label_value(value)) for key, value in pairs) + "}"


def _family(name: str, kind: str, help_text: str, samples: list[tuple[Labels, float]]) -> list[str]:
    lines = ["# HELP %s %s" % (name, help_text), "# TYPE %s %s" % (name, kind)]
    lines += ["%s%s %r" % (name, _labels(labels), float(value)) for labels, value in samples]
    return lines


class Histogram:
    """Observations counted into buckets (upper bounds, ``le``); the owner serialises access."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * len(bounds)  # per bucket, not cumulative; values above the last bound only in count
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        index = bisect.bisect_left(self.bounds, value)  # the first bound >= value
        if index < len(self.bounds):
            self.buckets[index] += 1

    def lines(self, name: str, help_text: str, labels: Labels) -> list[str]:
        out = ["# HELP %s %s" % (name, help_text), "# TYPE %s histogram" % name]
        cumulative = 0
        for bound, count in zip(self.bounds, self.buckets, strict=True):
            cumulative += count
            out.append("%s_bucket%s %r" % (name, _labels(labels + [("le", repr(float(bound)))]), float(cumulative)))
        out.append("%s_bucket%s %r" % (name, _labels(labels + [("le", "+Inf")]), float(self.count)))
        out.append("%s_sum%s %r" % (name, _labels(labels), float(self.sum)))
        out.append("%s_count%s %r" % (name, _labels(labels), float(self.count)))
        return out


class Metrics:
    """The engine's counters; every method is thread-safe."""

    def __init__(self, model_name: str, num_speculative_tokens: int, kv_capacity_tokens: int = 0) -> None:
        self._base = [("model_name", model_name), ("engine", "0")]
        self._lock = threading.Lock()
        self.k = num_speculative_tokens
        self.kv_capacity_tokens = kv_capacity_tokens  # 0: unknown, the usage reads 0
        self.running = 0
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = {reason: 0 for reason in FINISH_REASONS}
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_pos = [0] * num_speculative_tokens
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.kv_tokens = 0
        self.preemptions = 0  # the double never preempts
        self._busy_since = 0.0
        self._recent: deque[list[int]] = deque()  # [slot number, tokens output in the slot], oldest first

    def queued(self, delta: int) -> None:
        with self._lock:
            self.waiting += delta

    def started(self, delta: int) -> None:
        with self._lock:
            if self.running == 0 and delta > 0:
                self._busy_since = time.monotonic()
                self._recent.clear()
            self.running += delta

    def prefilled(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens

    def stepped(self, step: Step) -> None:
        with self._lock:
            self.generation_tokens += step.tokens
            self._count_recent(step.tokens, time.monotonic())
            if step.drafted:
                self.drafts += 1
                self.draft_tokens += step.drafted
                self.accepted_tokens += step.accepted
                for position in range(min(step.accepted, len(self.accepted_per_pos))):
                    self.accepted_per_pos[position] += 1

    def first_token(self, seconds: float) -> None:
        """A request's time to first token: from its arrival to its first output token."""
        with self._lock:
            self.ttft.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        """A step after a request's first: the gap since its previous step."""
        with self._lock:
            self.itl.observe(seconds)

    def kv_held(self, delta: int) -> None:
        """Tokens a running request takes (positive) or gives back (negative) in the KV cache."""
        with self._lock:
            self.kv_tokens += delta

    def finished(self, reason: str, e2e_s: float | None = None) -> None:
        """A request is done, with its end-to-end latency (arrival to finish) when known."""
        with self._lock:
            self.success[reason] = self.success.get(reason, 0) + 1
            if e2e_s is not None:
                self.e2e.observe(e2e_s)

    def render(self) -> str:
        """The exposition text, as ``GET /metrics`` returns it."""
        with self._lock:
            lines = self._core_lines() + self._spec_lines()
        return "\n".join(lines) + "\n"

    # --- derived values (the lock is held) ---------------------------------------

    def _count_recent(self, tokens: int, now: float) -> None:
        slot = int(now // GEN_SLOT_S)
        if self._recent and self._recent[-1][0] == slot:
            self._recent[-1][1] += tokens
        else:
            self._recent.append([slot, tokens])
        self._prune_recent(now)

    def _prune_recent(self, now: float) -> None:
        while self._recent and (self._recent[0][0] + 1) * GEN_SLOT_S <= now - GEN_WINDOW_S:
            self._recent.popleft()

    def _kv_usage(self) -> float:
        if self.kv_capacity_tokens <= 0:
            return 0.0
        return min(1.0, max(0.0, self.kv_tokens / self.kv_capacity_tokens))

    def _gen_throughput(self) -> float:
        """Tokens per second output over the last GEN_WINDOW_S seconds; 0 when no request runs."""
        if self.running <= 0:
            return 0.0
        now = time.monotonic()
        self._prune_recent(now)
        span = min(GEN_WINDOW_S, max(GEN_SLOT_S, now - self._busy_since))
        return sum(tokens for _, tokens in self._recent) / span

    def _latency_lines(self, prefix: str) -> list[str]:
        base = self._base
        lines = self.ttft.lines(prefix + "time_to_first_token_seconds",
                                "Seconds from a request's arrival to its first output token.", base)
        lines += self.itl.lines(prefix + "inter_token_latency_seconds",
                                "Seconds between consecutive output steps of a request.", base)
        lines += self.e2e.lines(prefix + "e2e_request_latency_seconds",
                                "Seconds from a request's arrival to its finish.", base)
        return lines

    # --- exposition (the lock is held) ---------------------------------------------

    def _core_lines(self) -> list[str]:
        base = self._base
        lines = _family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                        [(base, self.running)])
        lines += _family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                         [(base, self.waiting)])
        lines += _family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                         [(base, self.prompt_tokens)])
        lines += _family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                         [(base, self.generation_tokens)])
        lines += _family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                         [(base + [("finished_reason", r)], n) for r, n in sorted(self.success.items())])
        lines += _family("vllm:kv_cache_usage_perc", "gauge",
                         "Share of the KV cache held by running requests, from 0 to 1.", [(base, self._kv_usage())])
        lines += _family("vllm:num_preemptions_total", "counter", "Number of requests preempted by the engine.",
                         [(base, self.preemptions)])
        lines += self._latency_lines("vllm:")
        return lines

    def _spec_lines(self) -> list[str]:
        if not self.k:
            return []
        base = self._base
        lines = _family("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
                        [(base, self.drafts)])
        lines += _family("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
                         [(base, self.draft_tokens)])
        lines += _family("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
                         [(base, self.accepted_tokens)])
        lines += _family("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                         "Accepted tokens per draft position.",
                         [(base + [("position", str(i))], n) for i, n in enumerate(self.accepted_per_pos)])
        return lines
