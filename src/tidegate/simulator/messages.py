"""The simulated provider's Anthropic Messages API (`POST /v1/messages`): request validation, the
Message it answers and the events of its stream, in Anthropic's shapes.

A Messages request is read into the same `ChatRequest` a chat completion is (with `wire` set to
"anthropic"), so both endpoints share the simulator's pacing, limits, faults and generated
content; only what goes on the wire differs. The key may come as `x-api-key` (the chat
endpoint takes only a Bearer token). `top_k` is checked and `thinking` honoured: enabled, the
answer opens with a signed thinking block (streamed as thinking and signature deltas).
`cache_control` markers (on tools, system and message blocks, at most MAX_BREAKPOINTS, or at the
top level) are checked and honoured by the simulator's prompt cache (caching.py): the usage counts
the cache reads and writes apart from `input_tokens`, as Anthropic's does. Errors are
Anthropic-shaped: `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from tidegate.simulator.caching import (
    CacheUse,
    Piece,
    PromptUnit,
    Ttl,
    message_pieces,
    prompt_units,
    tools_piece,
)
from tidegate.simulator.content import estimate_prompt_tokens, estimate_text_tokens
from tidegate.simulator.requests import (
    ChatRequest,
    InvalidRequest,
    check_messages,
    json_type,
    optional_positive_int,
    plan_tool_call,
)

__all__ = ["MAX_BREAKPOINTS", "TTLS", "MessageEvents", "anthropic_error_body", "message_body",
           "message_usage", "parse_messages", "thinking_blocks"]

ROLES: Final = frozenset({"user", "assistant"})
SERVICE_TIERS: Final = frozenset({"auto", "standard_only"})
MIN_THINKING_BUDGET: Final = 1024  # as Anthropic's API requires
MAX_BREAKPOINTS: Final = 4  # blocks marked with cache_control in one request, as Anthropic allows
TTLS: Final[tuple[Ttl, ...]] = ("5m", "1h")
THINKING: Final = "The question is read, then answered in a few words."
SIGNATURE: Final = "c2ltdWxhdGVkLXRoaW5raW5n"  # what a signed thinking block carries, opaque
# The Anthropic error type of each status the simulator answers with.
_ERROR_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    503: "overloaded_error", 529: "overloaded_error",
}
_STOP_REASONS: Final[Mapping[str, str]] = {"stop": "end_turn", "length": "max_tokens",
                                           "tool_calls": "tool_use"}


def anthropic_error_body(status: int, message: str) -> bytes:
    """An Anthropic-shaped error body for `status`."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def parse_messages(body: dict[str, Any]) -> ChatRequest:
    """Validate a Messages request body (model, max_tokens, messages, system, stop_sequences,
    stream, tools, tool_choice, service_tier) into the simulator's ChatRequest."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required" if model is None else "model: Input should be a string",
                             param="model")
    max_tokens = optional_positive_int(body, "max_tokens")
    if max_tokens is None:
        raise InvalidRequest("max_tokens: Field required", param="max_tokens")
    messages = check_messages(body.get("messages"), ROLES)
    system = body.get("system")
    chat = ([{"role": "system", "content": system}] if isinstance(system, str | list) else []) + messages
    stop = body.get("stop_sequences") or []
    if not isinstance(stop, list) or not all(isinstance(item, str) and item for item in stop):
        raise InvalidRequest("stop_sequences: expected an array of non-empty strings", param="stop_sequences")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"stream: expected a boolean, got {json_type(stream)}", param="stream")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(tool, dict) and isinstance(tool.get("name"), str)
                                              for tool in tools):
        raise InvalidRequest("tools: expected an array of tools, each with a name", param="tools")
    functions = [{"name": tool["name"], "parameters": tool.get("input_schema")} for tool in tools]
    last = messages[-1].get("content")
    answered = isinstance(last, list) and any(block.get("type") == "tool_result" for block in last)
    plan = plan_tool_call(functions, _tool_choice(body.get("tool_choice")),
                          [{"role": "tool" if answered else "user"}])
    prompt = estimate_prompt_tokens(chat)
    if tools:
        prompt += estimate_text_tokens(orjson.dumps(tools).decode())
    top_k = body.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0):
        raise InvalidRequest("top_k: Input should be an integer of at least 0", param="top_k")
    return ChatRequest(model, prompt, max_tokens, stream, True, tuple(stop), plan, wire="anthropic",
                       service_tier=_service_tier(body.get("service_tier")),
                       reasons=_thinks(body.get("thinking"), max_tokens),
                       prompt_units=_cache_units(body, tools, chat))


def _cache_units(body: dict[str, Any], tools: list[dict[str, Any]],
                 chat: list[dict[str, Any]]) -> tuple[PromptUnit, ...]:
    """The prompt's units for the prompt cache: the tools, the system prompt and each message of
    `chat` (the system prompt first, as a message), a breakpoint where a block is marked with
    `cache_control` (the last unit too, at the top level's)."""
    leading = len(chat) - len(body["messages"])  # 1 when a system prompt leads
    places = ["system"] * leading + [f"messages.{at}.content" for at in range(len(body["messages"]))]
    marks = [_marks(tools, "tools"),
             *(_marks(message.get("content"), place) for message, place in zip(chat, places, strict=True))]
    found = sum(len(marked) for marked in marks)
    if found > MAX_BREAKPOINTS:
        raise InvalidRequest(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                             f"Found {found}.")
    lifetimes: list[Ttl | None] = [found[-1] if found else None for found in marks]
    automatic = _lifetime(body.get("cache_control"), "cache_control")
    if automatic is not None and lifetimes[-1] is None:
        lifetimes[-1] = automatic
    pieces: list[Piece] = [*tools_piece(tools, lifetimes[0]), *message_pieces(chat, lifetimes[1:])]
    return prompt_units("anthropic", pieces)


def _marks(blocks: object, where: str) -> list[Ttl]:
    """The lifetimes of the blocks of `blocks` (a list of them, or text) marked `cache_control`."""
    listed = blocks if isinstance(blocks, list) else []
    found = (_lifetime(block.get("cache_control"), f"{where}.{at}.cache_control")
             for at, block in enumerate(listed) if isinstance(block, dict))
    return [lifetime for lifetime in found if lifetime is not None]


def _lifetime(marker: object, where: str) -> Ttl | None:
    """A `cache_control` marker's lifetime (None: no marker): `{"type": "ephemeral"}`, with a
    `ttl` of "5m" (the default) or "1h"."""
    if marker is None:
        return None
    if not isinstance(marker, dict) or marker.get("type") != "ephemeral":
        raise InvalidRequest(f"{where}: expected {{type: ephemeral}}", param=where)
    ttl = marker.get("ttl", "5m")
    for known in TTLS:
        if ttl == known:
            return known
    raise InvalidRequest(f"{where}.ttl: Input should be '5m' or '1h'", param=f"{where}.ttl")


def _thinks(thinking: object, max_tokens: int) -> bool:
    """Whether extended thinking is on: `{"type": "enabled", "budget_tokens": n}`, n at least
    MIN_THINKING_BUDGET and below max_tokens (or `{"type": "disabled"}`)."""
    if thinking is None:
        return False
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return False
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    if kind != "enabled" or not isinstance(budget, int) or not MIN_THINKING_BUDGET <= budget < max_tokens:
        raise InvalidRequest(f"thinking: expected {{type: enabled, budget_tokens}} with a budget of at least "
                             f"{MIN_THINKING_BUDGET} and below max_tokens, or {{type: disabled}}",
                             param="thinking")
    return True


def thinking_blocks(chat: ChatRequest) -> list[dict[str, Any]]:
    """The thinking block an answer opens with when thinking is on."""
    return [{"type": "thinking", "thinking": THINKING, "signature": SIGNATURE}] if chat.reasons else []


def _service_tier(asked: object) -> str:
    """The tier a call is served at: standard, as for an organisation without priority capacity
    (with which `auto` would be served at priority)."""
    if asked is not None and asked not in SERVICE_TIERS:
        raise InvalidRequest(f"service_tier: Input should be 'auto' or 'standard_only', got {asked!r}",
                             param="service_tier")
    return "standard"


def _tool_choice(choice: object) -> object:
    """Anthropic's tool_choice as the chat completion's."""
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required", "none": "none"}.get(kind if isinstance(kind, str) else "")


def message_body(identifier: str, model: str, content: list[dict[str, Any]], finish: str,
                 stop: str | None, usage: Mapping[str, Any]) -> dict[str, Any]:
    """A whole Message, with its `usage` (`message_usage`)."""
    reason = "stop_sequence" if stop is not None else _STOP_REASONS.get(finish, "end_turn")
    return {"id": identifier, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": stop, "usage": usage}


def message_usage(chat: ChatRequest, output_tokens: int) -> dict[str, Any]:
    """A Message's usage: the prompt's tokens (the cache's apart from `input_tokens`, as Anthropic
    counts them), the output's and the tier it was served at."""
    cache = chat.cache
    return {**_counts(chat.prompt_tokens, cache), "output_tokens": output_tokens,
            "cache_creation": {"ephemeral_5m_input_tokens": cache.written_5m,
                               "ephemeral_1h_input_tokens": cache.written_1h},
            "service_tier": chat.service_tier}


def _counts(prompt_tokens: int, cache: CacheUse) -> dict[str, int]:
    return {"input_tokens": prompt_tokens - cache.read - cache.written,
            "cache_creation_input_tokens": cache.written, "cache_read_input_tokens": cache.read}


class MessageEvents:
    """Encodes the server-sent events of one streamed Message."""

    def __init__(self, identifier: str, model: str, chat: ChatRequest) -> None:
        self._identifier = identifier
        self._model = model
        self._chat = chat
        self._thinks = chat.reasons
        self._index = 1 if chat.reasons else 0  # the answer's block: after the thinking block

    @staticmethod
    def event(name: str, data: Mapping[str, Any]) -> bytes:
        """One event."""
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"

    def start(self) -> bytes:
        """`message_start`, its content empty and its input tokens known; then the thinking
        block whole, when thinking is on."""
        message = message_body(self._identifier, self._model, [], "", None, message_usage(self._chat, 1))
        message["stop_reason"] = None
        started = self.event("message_start", {"message": message})
        if not self._thinks:
            return started
        return (started
                + self.event("content_block_start", {"index": 0, "content_block": {
                    "type": "thinking", "thinking": "", "signature": ""}})
                + self.event("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta",
                                                                           "thinking": THINKING}})
                + self.event("content_block_delta", {"index": 0, "delta": {"type": "signature_delta",
                                                                           "signature": SIGNATURE}})
                + self.event("content_block_stop", {"index": 0}))

    def block_start(self, block: dict[str, Any]) -> bytes:
        """`content_block_start` of the one block the simulator answers with."""
        return self.event("content_block_start", {"index": self._index, "content_block": block})

    def text(self, text: str) -> bytes:
        """A `text_delta`."""
        return self.event("content_block_delta", {"index": self._index,
                                                  "delta": {"type": "text_delta", "text": text}})

    def json(self, piece: str) -> bytes:
        """An `input_json_delta` of a tool call's input."""
        delta = {"type": "input_json_delta", "partial_json": piece}
        return self.event("content_block_delta", {"index": self._index, "delta": delta})

    def end(self, finish: str, stop: str | None, output_tokens: int, *, opened: bool) -> bytes:
        """`content_block_stop` (when a block was opened), `message_delta` and `message_stop`."""
        reason = "stop_sequence" if stop is not None else _STOP_REASONS.get(finish, "end_turn")
        usage = {**_counts(self._chat.prompt_tokens, self._chat.cache), "output_tokens": output_tokens}
        return ((self.event("content_block_stop", {"index": self._index}) if opened else b"")
                + self.event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": stop},
                                               "usage": usage})
                + self.event("message_stop", {}))
