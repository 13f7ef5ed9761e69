"""What a request generates, and when: deterministic words on a timed schedule.

Tokens are whitespace-separated words, both in prompts (``len(text.split())``)
and in the output, where each token is one word with a leading space, so the
completion text splits back into exactly ``completion_tokens`` words. The
words and the natural length of an answer are drawn from a SHA-256 of the
prompt, the temperature and the seed, so the same request always gets the same
text.

The first token is out after the time to first token, ``TTFT_BASE_MS +
TTFT_PER_1K_MS x prompt_tokens / 1000``. Each later decode step takes
``ITL_MS`` and emits one token, or, with speculative decoding of k draft
tokens, one token plus the accepted drafts: draft position i (from 0) is
accepted with probability ``ACCEPT[i]`` (the last value repeats for further
positions) as long as every earlier position was, drawn from a random
generator seeded per request.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from .knobs import Knobs

WORDS: tuple[str, ...] = (
    "the", "engine", "spark", "node", "token", "cache", "model", "weights", "serves", "answers",
    "a", "of", "and", "to", "in", "is", "on", "with", "for", "from",
    "fast", "small", "steady", "lab", "double", "request", "stream", "memory", "fabric", "rank",
    "head", "worker", "joins", "loads", "reads", "shard", "tensor", "block", "layer", "draft",
    "accepts", "decodes", "prompt", "reply", "text", "word", "line", "step", "time", "rate",
    "Paris", "capital", "France", "city", "river", "north", "south", "east", "west", "light",
    "quiet", "clear", "simple", "done",
)
MIN_NATURAL = 4
MAX_NATURAL = 64


def count_tokens(text: str) -> int:
    """Tokens of a prompt: its whitespace-separated words."""
    return len(text.split())


def request_digest(prompt: str, temperature: float, seed: int) -> bytes:
    material = "%s\x00%r\x00%d" % (prompt, temperature, seed)
    return hashlib.sha256(material.encode("utf-8")).digest()


def natural_length(digest: bytes) -> int:
    """Where the answer would end by itself (its end-of-sequence token)."""
    return MIN_NATURAL + int.from_bytes(digest[:4], "big") % (MAX_NATURAL - MIN_NATURAL + 1)


def output_length(digest: bytes, max_tokens: int, ignore_eos: bool) -> tuple[int, str]:
    """Number of tokens and finish reason: max_tokens if ignore_eos, else stop at the natural end."""
    if ignore_eos:
        return max_tokens, "length"
    natural = natural_length(digest)
    if natural <= max_tokens:
        return natural, "stop"
    return max_tokens, "length"


def make_tokens(digest: bytes, count: int) -> list[str]:
    """``count`` tokens, each a word with a leading space."""
    tokens = []
    for index in range(count):
        block = hashlib.sha256(digest + index.to_bytes(4, "big")).digest()
        tokens.append(" " + WORDS[int.from_bytes(block[:2], "big") % len(WORDS)])
    return tokens


@dataclass(frozen=True)
class Step:
    """One engine step of a request: when its tokens are out, how many, and the drafts."""

    at_s: float
    tokens: int
    drafted: int = 0
    accepted: int = 0


def ttft_s(knobs: Knobs, prompt_tokens: int) -> float:
    return (knobs.ttft_base_ms + knobs.ttft_per_1k_ms * prompt_tokens / 1000.0) / 1000.0


def accepted_drafts(rng: random.Random, k: int, accept: tuple[float, ...]) -> int:
    """Accepted draft tokens of one step: the run of accepted positions from position 0."""
    accepted = 0
    for position in range(k):
        probability = accept[position] if position < len(accept) else (accept[-1] if accept else 0.0)
        if rng.random() >= probability:
            break
        accepted += 1
    return accepted


def schedule(total: int, prompt_tokens: int, knobs: Knobs, k: int, digest: bytes) -> list[Step]:
    """The steps producing ``total`` tokens: prefill gives the first, then decode steps."""
    if total <= 0:
        return []
    rng = random.Random(int.from_bytes(digest[8:16], "big"))
    at = ttft_s(knobs, prompt_tokens)
    steps = [Step(at, 1)]
    remaining = total - 1
    while remaining > 0:
        at += knobs.itl_ms / 1000.0
        if k > 0:
            emitted = min(1 + accepted_drafts(rng, k, knobs.accept), remaining)
            steps.append(Step(at, emitted, drafted=k, accepted=emitted - 1))
        else:
            emitted = 1
            steps.append(Step(at, 1))
        remaining -= emitted
    return steps
