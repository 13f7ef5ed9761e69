"""What the benchmark asks: built-in prompt families, context filler, and a unique start per request.

Every measured request starts with a random nonce (12 hex digits), so no two
requests share a first KV block and prefix caching (vLLM's block hashes and
SGLang's radix tree both key on the prefix) cannot serve one request from an
earlier one. A cell marked ``cached`` reuses one prompt on purpose.

A context of N tokens is reached with filler words after the nonce; how many
words make N tokens is measured on the server at the start of a run (see
``Calibration``) because the client has no tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# The coding-peak prompt of seed 000 (llm-inference-bench's headline run).
CODING_PEAK_PROMPT = "Write a Python script that implements the Sieve of Eratosthenes"

FAMILIES: dict[str, tuple[str, ...]] = {
    "code": (
        CODING_PEAK_PROMPT,
        "Write a Python function that merges overlapping intervals, with type hints and three unit tests.",
        "Implement an LRU cache class in Python without functools, and explain its complexity.",
        "Write a Go program that counts word frequencies in a text file and prints the top ten.",
        "Write a Rust function that parses an IPv4 address from a string and returns an error on bad input.",
        "Write a bash script that rotates log files older than seven days into a dated tar archive.",
    ),
    "prose": (
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Describe a walk through a busy market on a rainy morning, in vivid detail.",
        "Write a letter from a retired sailor to a grandchild about the first voyage.",
        "Explain to a curious teenager why the sky changes colour at sunset.",
        "Write an essay on what makes a small town library important to its residents.",
        "Tell the history of a fictional bridge, from its building to its last crossing.",
    ),
    "structured": (
        "List ten European capitals as a JSON array of objects with name, country and population.",
        "Produce a markdown table of the planets with their mass, radius and number of moons.",
        "Write a YAML configuration for a web service with three environments and their settings.",
    ),
    "math": (
        "Solve step by step: a train leaves at 9:40 at 84 km/h; when has it covered 301 km?",
        "Prove that the sum of the first n odd numbers is n squared.",
        "Compute the derivative of x^3 * sin(x) and explain each rule used.",
    ),
}
FAMILIES["mixed"] = tuple(prompt for group in zip(FAMILIES["code"], FAMILIES["prose"],
                                                   FAMILIES["structured"] + FAMILIES["math"], strict=True)
                          for prompt in group)

# Filler for long contexts: plain words, each about one token in common tokenizers.
_FILLER_WORDS = (
    "river", "stone", "window", "garden", "market", "paper", "winter", "harbor", "signal", "lantern",
    "orchard", "valley", "meadow", "kettle", "ladder", "silver", "candle", "forest", "bridge", "pocket",
    "table", "number", "letter", "morning", "evening", "station", "engine", "record", "mirror", "season",
    "planet", "desert", "island", "castle", "pillow", "basket", "button", "carpet", "circle", "copper",
    "dinner", "doctor", "farmer", "flower", "friend", "gentle", "golden", "hammer", "honest", "jacket",
    "little", "minute", "mother", "native", "nature", "office", "orange", "parent", "pencil", "person",
    "rabbit", "reason", "sudden", "summer", "supper", "tennis", "thread", "ticket", "timber", "tunnel",
    "violet", "wander", "weaver", "yellow", "anchor", "barrel", "border", "bottle", "branch", "breeze",
)
FILLER_HEADER = "Background notes, not part of the task:"
HEADER_WORDS = len(FILLER_HEADER.split())


def family_names() -> tuple[str, ...]:
    return tuple(sorted(FAMILIES))


@dataclass(frozen=True)
class Calibration:
    """Tokens per filler word and the fixed tokens of a request (template, nonce), measured per API."""

    tokens_per_word: float
    overhead_tokens: float  # the prompt's tokens besides its words: chat template, the nonce's extra tokens
    source: str  # "usage" (measured from the server's usage) or "assumed"

    def filler_words(self, context: int, task_words: int) -> int:
        """Filler words that bring a prompt of task_words words to about context tokens (0: no filler)."""
        if context <= 0:
            return 0
        words = (context - self.overhead_tokens) / self.tokens_per_word - task_words - HEADER_WORDS
        return max(1, int(round(words)))

    def as_dict(self) -> dict[str, float | str]:
        return {"tokens_per_word": round(self.tokens_per_word, 4), "overhead_tokens": round(self.overhead_tokens, 2),
                "source": self.source}


ASSUMED = Calibration(tokens_per_word=1.3, overhead_tokens=8.0, source="assumed")


class PromptMaker:
    """Prompts of a run: unique nonces from one seeded generator, filler cut from one fixed text."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        filler_rng = random.Random(0x5EED)
        self._filler = [filler_rng.choice(_FILLER_WORDS) for _ in range(4096)]

    def nonce(self) -> str:
        return "[%012x]" % self._rng.getrandbits(48)

    def filler(self, words: int) -> str:
        if words <= 0:
            return ""
        repeats = words // len(self._filler) + 1
        return " ".join((self._filler * repeats)[:words])

    def task(self, family: str | None, literal: str | None, index: int) -> str:
        if literal is not None:
            return literal
        prompts = FAMILIES[family or "mixed"]
        return prompts[index % len(prompts)]

    def build(self, task: str, filler_words: int, nonce: str | None = None) -> str:
        """nonce, then the filler (if any), then the task."""
        head = nonce if nonce is not None else self.nonce()
        if filler_words <= 0:
            return "%s %s" % (head, task)
        return "%s %s %s\n\n%s" % (head, FILLER_HEADER, self.filler(filler_words), task)
