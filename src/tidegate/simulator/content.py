"""What the simulated provider says: token estimates, generated text, embedding vectors and
sampled delays. Pure functions of their inputs and of the random generator they are given, so a
seeded simulator repeats itself."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Any, Final

__all__ = [
    "embedding_vector",
    "estimate_prompt_tokens",
    "estimate_text_tokens",
    "generate_words",
    "sample_lognormal",
    "stop_at",
    "tool_arguments",
]

CHARS_PER_TOKEN: Final = 4
# OpenAI's accounting for chat: a few tokens per message for its role and separators, and a few
# to prime the reply; an image part is charged a flat amount at low detail.
TOKENS_PER_MESSAGE: Final = 4
TOKENS_PER_REPLY: Final = 3
TOKENS_PER_IMAGE: Final = 85
_Z99: Final = 2.3263478740408408  # the standard normal's 99th percentile

VOCABULARY: Final = (
    "the", "tide", "gate", "queue", "priority", "model", "token", "request", "worker", "budget",
    "latency", "stream", "provider", "retry", "window", "limit", "cache", "event", "change", "vector",
    "a", "of", "and", "to", "in", "is", "for", "on", "with", "as", "by", "at", "from", "this", "that",
    "fast", "slow", "quiet", "bright", "steady", "careful", "simple", "durable", "shared", "fair",
)


def estimate_text_tokens(text: str) -> int:
    """About one token per four characters, at least one."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def estimate_prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """Prompt tokens of validated chat messages, counted the way OpenAI roughly does."""
    tokens = TOKENS_PER_REPLY
    for message in messages:
        tokens += TOKENS_PER_MESSAGE
        content = message.get("content")
        if isinstance(content, str):
            tokens += estimate_text_tokens(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                tokens += estimate_text_tokens(text) if isinstance(text, str) else TOKENS_PER_IMAGE
    return tokens


def generate_words(rng: random.Random, count: int) -> list[str]:
    """`count` words of the vocabulary, one token each."""
    return rng.choices(VOCABULARY, k=count)


def stop_at(words: list[str], stops: Sequence[str]) -> tuple[list[str], str | None]:
    """The words of an answer (joined by spaces) up to the first stop sequence met, and that
    sequence (None when none is met). A sequence may end mid-word, as a real one may."""
    text = " ".join(words)
    found = [(text.find(stop), stop) for stop in stops if stop in text]
    if not found:
        return words, None
    position, stop = min(found)
    kept = text[:position].rstrip(" ")
    return (kept.split(" ") if kept else []), stop


def tool_arguments(parameters: object) -> dict[str, Any]:
    """Arguments for a function whose parameters are this JSON Schema: each property (the required
    ones, or all when none is) gets its enum's first value, else a fixed value of its type."""
    if not isinstance(parameters, dict):
        return {}
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return {}
    required = parameters.get("required")
    names = [name for name in required if isinstance(name, str) and name in properties] \
        if isinstance(required, list) and required else list(properties)
    return {name: _example(properties[name]) for name in names}


def _example(schema: object) -> Any:
    if not isinstance(schema, dict):
        return "tide"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: a value of the first type that is not null
        kind = next((k for k in kind if k != "null"), "null")
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {},
            "null": None}.get(kind if isinstance(kind, str) else "string", "tide")


def sample_lognormal(rng: random.Random, median: float, p99: float | None) -> float:
    """A draw from the lognormal with that median and 99th percentile; the median itself when
    p99 is None or not above it (a fixed value), 0 when the median is 0."""
    if median <= 0:
        return 0.0
    if p99 is None or p99 <= median:
        return median
    sigma = (math.log(p99) - math.log(median)) / _Z99
    return rng.lognormvariate(math.log(median), sigma)


def embedding_vector(key: bytes, dimensions: int) -> list[float]:
    """A unit vector that depends only on `key` (the input's text or tokens) and the dimension:
    the same input always embeds the same way, in every run and every process."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "big")
    rng = random.Random(seed)
    values = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 7) for v in values]
