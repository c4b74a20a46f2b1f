"""The simulated provider's Anthropic Messages API (`POST /v1/messages`): request validation, the
Message it answers and the events of its stream, in Anthropic's shapes.

A Messages request is read into the same `ChatRequest` a chat completion is (with `wire` set to
"anthropic"), so both endpoints share the simulator's pacing, limits, faults and generated
content; only what goes on the wire differs. The key may come as `x-api-key` (the chat
endpoint takes only a Bearer token). `top_k` is checked and `thinking` honoured: enabled, the
answer opens with a signed thinking block (streamed as thinking and signature deltas). Errors
are Anthropic-shaped: `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from tidegate.simulator.content import estimate_prompt_tokens, estimate_text_tokens
from tidegate.simulator.requests import (
    ChatRequest,
    InvalidRequest,
    check_messages,
    json_type,
    optional_positive_int,
    plan_tool_call,
)

__all__ = ["MessageEvents", "anthropic_error_body", "message_body", "parse_messages", "thinking_blocks"]

ROLES: Final = frozenset({"user", "assistant"})
SERVICE_TIERS: Final = frozenset({"auto", "standard_only"})
MIN_THINKING_BUDGET: Final = 1024  # as Anthropic's API requires
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
                       reasons=_thinks(body.get("thinking"), max_tokens))


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
                 stop: str | None, usage: tuple[int, int], service_tier: str | None = None) -> dict[str, Any]:
    """A whole Message (its usage naming the tier it was served at)."""
    reason = "stop_sequence" if stop is not None else _STOP_REASONS.get(finish, "end_turn")
    return {"id": identifier, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": stop,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1], "service_tier": service_tier}}


class MessageEvents:
    """Encodes the server-sent events of one streamed Message."""

    def __init__(self, identifier: str, model: str, input_tokens: int,
                 service_tier: str | None = None, *, thinks: bool = False) -> None:
        self._identifier = identifier
        self._model = model
        self._input_tokens = input_tokens
        self._service_tier = service_tier
        self._thinks = thinks
        self._index = 1 if thinks else 0  # the answer's block: after the thinking block

    @staticmethod
    def event(name: str, data: Mapping[str, Any]) -> bytes:
        """One event."""
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"

    def start(self) -> bytes:
        """`message_start`, its content empty and its input tokens known; then the thinking
        block whole, when thinking is on."""
        message = message_body(self._identifier, self._model, [], "", None, (self._input_tokens, 1),
                               self._service_tier)
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
        return ((self.event("content_block_stop", {"index": self._index}) if opened else b"")
                + self.event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": stop},
                                               "usage": {"input_tokens": self._input_tokens,
                                                         "output_tokens": output_tokens}})
                + self.event("message_stop", {}))
