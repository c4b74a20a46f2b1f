"""The simulated provider's prompt cache: how much of a prompt a prefix it served before lets it
report as read from the cache, or as written to it, so that tests see cached tokens and their
prices end to end. Deterministic: the same requests in the same order report the same counts.

A prompt is a sequence of units, in the order the model reads them: the tools (when there are
any), then each message (Anthropic's `system` first). A unit is known by a fingerprint of every
unit up to and including it (`cache_control` markers left out, so moving a breakpoint keeps the
prefix), and counts the tokens it adds to the prompt, as the simulator estimates them.

- OpenAI (chat completions, Responses): caching is automatic. The longest prefix of whole units
  that the same model served before reports its tokens as cached, in whole blocks of
  `CACHE_BLOCK_TOKENS` and only from `MIN_CACHED_TOKENS` on, as OpenAI documents
  (`prompt_tokens_details.cached_tokens`, `input_tokens_details.cached_tokens`); then every prefix
  of the prompt is cached. Nothing is ever written at a price.
- Anthropic (Messages): caching is explicit. A unit with a block marked `cache_control` (or the
  last unit, when the request's top-level `cache_control` asks for automatic caching) is a
  breakpoint, with its lifetime (`ttl`, "5m" by default, or "1h"). The longest prefix, up to the
  last breakpoint, that was written before is read (`cache_read_input_tokens`); the rest up to
  each breakpoint is written at that breakpoint's lifetime (`cache_creation_input_tokens` and
  `cache_creation`), once the prefix holds at least `MIN_CACHED_TOKENS`; the tokens after the
  last breakpoint are plain input.

Entries never expire within a run (a real cache keeps them minutes to hours) and `reset()` forgets
them; at most `MAX_ENTRIES` are kept, the least recently used going first. Provider batch lines
are answered without the cache.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from tidegate.simulator.content import TOKENS_PER_REPLY, estimate_prompt_tokens, estimate_text_tokens

__all__ = ["CACHE_BLOCK_TOKENS", "MAX_ENTRIES", "MIN_CACHED_TOKENS", "NO_CACHE", "CacheUse", "Piece",
           "PromptCache", "PromptUnit", "Ttl", "message_pieces", "prompt_units", "tools_piece"]

Ttl = Literal["5m", "1h"]
MIN_CACHED_TOKENS: Final = 1024  # the shortest prefix either provider caches
CACHE_BLOCK_TOKENS: Final = 128  # OpenAI counts cache hits in blocks of this many tokens
MAX_ENTRIES: Final = 65_536


@dataclass(frozen=True, slots=True)
class PromptUnit:
    """One unit of a prompt: the fingerprint of the prompt up to and including it, the tokens it
    adds, and the lifetime of the cache entry it ends when it is an Anthropic breakpoint."""

    fingerprint: bytes
    tokens: int
    breakpoint: Ttl | None = None


Piece = tuple[object, int, Ttl | None]
"""What a unit is made of (any JSON value), its tokens, and its breakpoint."""


@dataclass(frozen=True, slots=True)
class CacheUse:
    """The prompt tokens a call read from the cache and wrote to it, by lifetime."""

    read: int = 0
    written_5m: int = 0
    written_1h: int = 0

    @property
    def written(self) -> int:
        """Every token written, whatever its lifetime."""
        return self.written_5m + self.written_1h


NO_CACHE: Final = CacheUse()


def message_pieces(messages: Iterable[dict[str, Any]],
                   breakpoints: Sequence[Ttl | None] | None = None) -> list[Piece]:
    """A piece per chat message, its tokens as `estimate_prompt_tokens` counts them (the reply's
    priming left out: it ends the prompt, and no prefix holds it)."""
    listed = list(messages)
    marks = breakpoints if breakpoints is not None else [None] * len(listed)
    return [(message, estimate_prompt_tokens([message]) - TOKENS_PER_REPLY, mark)
            for message, mark in zip(listed, marks, strict=True)]


def tools_piece(tools: object, breakpoint: Ttl | None = None) -> list[Piece]:
    """The piece of a request's tools (none when it has none): their JSON text, as the prompt
    counts them."""
    return [(tools, estimate_text_tokens(orjson.dumps(tools).decode()), breakpoint)] if tools else []


def prompt_units(family: str, pieces: Iterable[Piece]) -> tuple[PromptUnit, ...]:
    """The units of a prompt of `pieces`, in order; `family` ("openai", "anthropic") keeps the two
    caches apart."""
    digest = hashlib.blake2b(family.encode(), digest_size=16).digest()
    units: list[PromptUnit] = []
    for content, tokens, breakpoint in pieces:
        text = orjson.dumps(_unmarked(content), option=orjson.OPT_SORT_KEYS)
        digest = hashlib.blake2b(digest + text, digest_size=16).digest()
        units.append(PromptUnit(digest, tokens, breakpoint))
    return tuple(units)


def _unmarked(value: object) -> object:
    """`value` without its `cache_control` markers: where a breakpoint sits is no part of the
    prefix."""
    if isinstance(value, dict):
        return {key: _unmarked(item) for key, item in value.items() if key != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(item) for item in value]
    return value


class PromptCache:
    """The prefixes each model has cached (see the module)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._entries: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._max_entries = max_entries

    def reset(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def serve(self, model: str, units: Sequence[PromptUnit], *, explicit: bool) -> CacheUse:
        """What a prompt of `units` sent to `model` reads and writes, and the entries it leaves:
        by Anthropic's breakpoints when `explicit`, else by OpenAI's automatic caching."""
        return self._explicit(model, units) if explicit else self._automatic(model, units)

    def _automatic(self, model: str, units: Sequence[PromptUnit]) -> CacheUse:
        ends = _ends(units)
        hit = self._longest_hit(model, units, len(units))
        read = ends[hit] if hit is not None and ends[hit] >= MIN_CACHED_TOKENS else 0
        self._keep(model, (unit.fingerprint for unit in units))
        return CacheUse(read=read // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS)

    def _explicit(self, model: str, units: Sequence[PromptUnit]) -> CacheUse:
        ends = _ends(units)
        marked = [at for at, unit in enumerate(units) if unit.breakpoint is not None
                  and ends[at] >= MIN_CACHED_TOKENS]
        if not marked:
            return NO_CACHE
        hit = self._longest_hit(model, units, marked[-1] + 1)
        read = ends[hit] if hit is not None else 0
        written: dict[Ttl | None, int] = {"5m": 0, "1h": 0}
        covered = read
        for at in marked:  # each breakpoint writes what the ones before it did not cover
            if ends[at] > covered:
                written[units[at].breakpoint] += ends[at] - covered
                covered = ends[at]
        self._keep(model, (units[at].fingerprint for at in marked))
        return CacheUse(read, written["5m"], written["1h"])

    def _longest_hit(self, model: str, units: Sequence[PromptUnit], within: int) -> int | None:
        """The index of the last of the first `within` units whose prefix is cached, if any."""
        for at in range(within - 1, -1, -1):
            key = (model, units[at].fingerprint)
            if key in self._entries:
                self._entries.move_to_end(key)
                return at
        return None

    def _keep(self, model: str, fingerprints: Iterable[bytes]) -> None:
        for fingerprint in fingerprints:
            self._entries[(model, fingerprint)] = None
            self._entries.move_to_end((model, fingerprint))
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


def _ends(units: Sequence[PromptUnit]) -> list[int]:
    """The prompt's tokens up to and including each unit."""
    ends: list[int] = []
    total = 0
    for unit in units:
        total += unit.tokens
        ends.append(total)
    return ends
