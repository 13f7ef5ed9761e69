"""Prometheus counters and gauges under vLLM's names, in the text exposition format.

Names and labels follow vLLM v1: every series has ``model_name`` (the first
served name) and ``engine="0"``; counters end in ``_total``; the speculative
decoding series exist only when ``--speculative-config`` is given, with one
``position`` series per draft position, counted from 0.
"""

from __future__ import annotations

import threading

from .generation import Step

FINISH_REASONS = ("stop", "length", "abort")


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join('%s="%s"' % (key, _label_value(value)) for key, value in pairs) + "}"


def _family(name: str, kind: str, help_text: str, samples: list[tuple[list[tuple[str, str]], float]]) -> list[str]:
    lines = ["# HELP %s %s" % (name, help_text), "# TYPE %s %s" % (name, kind)]
    lines += ["%s%s %r" % (name, _labels(labels), float(value)) for labels, value in samples]
    return lines


class Metrics:
    """The engine's counters; every method is thread-safe."""

    def __init__(self, model_name: str, num_speculative_tokens: int) -> None:
        self._base = [("model_name", model_name), ("engine", "0")]
        self._lock = threading.Lock()
        self.k = num_speculative_tokens
        self.running = 0
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = {reason: 0 for reason in FINISH_REASONS}
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_pos = [0] * num_speculative_tokens

    def queued(self, delta: int) -> None:
        with self._lock:
            self.waiting += delta

    def started(self, delta: int) -> None:
        with self._lock:
            self.running += delta

    def prefilled(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens

    def stepped(self, step: Step) -> None:
        with self._lock:
            self.generation_tokens += step.tokens
            if step.drafted:
                self.drafts += 1
                self.draft_tokens += step.drafted
                self.accepted_tokens += step.accepted
                for position in range(min(step.accepted, len(self.accepted_per_pos))):
                    self.accepted_per_pos[position] += 1

    def finished(self, reason: str) -> None:
        with self._lock:
            self.success[reason] = self.success.get(reason, 0) + 1

    def render(self) -> str:
        """The exposition text, as ``GET /metrics`` returns it."""
        with self._lock:
            lines = self._core_lines() + self._spec_lines()
        return "\n".join(lines) + "\n"

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
