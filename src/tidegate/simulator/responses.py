"""The simulated provider's Responses API (`POST /v1/responses`): request validation, the Response
object it answers and the typed events of its stream, in OpenAI's shapes (enough for the openai
SDK's `responses.create`, `.stream` and its strict models).

A Responses request is read into the same `ChatRequest` a chat completion is (with `wire` set to
"responses"), so all endpoints share the simulator's pacing, limits, faults and generated content;
only what goes on the wire differs. Function tools lead to a function call as on chat; built-in
tools (web search, file search, …) are accepted and not run. `reasoning` makes the answer open
with a reasoning item (its summary when one is asked for). Errors are OpenAI-shaped.

`POST /v1/responses/compact` is read the same way (wire "compaction") and answered as OpenAI
answers it: the input's user messages, then one compaction item whose `encrypted_content` is
opaque (the generated text, base64-encoded); a compaction item given back as input is taken.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from tidegate.simulator.caching import message_pieces, prompt_units, tools_piece
from tidegate.simulator.content import estimate_prompt_tokens, estimate_text_tokens
from tidegate.simulator.requests import (
    ChatRequest,
    InvalidRequest,
    json_type,
    optional_positive_int,
    plan_tool_call,
)

__all__ = ["ResponseEvents", "compaction_body", "parse_compaction", "parse_responses", "response_body"]

ROLES: Final = frozenset({"user", "assistant", "system", "developer"})
SERVICE_TIERS: Final = ("auto", "default", "flex", "priority")
REASONING_SUMMARY: Final = "The question is read, then answered in a few words."
_ITEM_TYPES: Final = frozenset({"message", "function_call", "function_call_output", "reasoning",
                                "web_search_call", "file_search_call", "item_reference", "compaction"})
# What a Response repeats of its request, with the API's defaults.
_ECHOED: Final[Mapping[str, Any]] = {
    "instructions": None, "max_output_tokens": None, "metadata": {}, "parallel_tool_calls": True,
    "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": True,
    "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
    "top_p": 1.0, "truncation": "disabled", "user": None,
}


def parse_responses(body: dict[str, Any]) -> ChatRequest:
    """Validate a Responses request body (model, input, instructions, max_output_tokens, tools,
    tool_choice, reasoning, stream, service_tier and the settings a Response repeats) into the
    simulator's ChatRequest."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model",
                             code="missing_required_parameter")
    messages = _messages(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest(f"Invalid type for 'instructions': expected a string, but got "
                             f"{json_type(instructions)}.", param="instructions", code="invalid_type")
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise InvalidRequest(f"Invalid type for 'stream': expected a boolean, but got {json_type(stream)}.",
                             param="stream", code="invalid_type")
    tools = _tools(body.get("tools"))
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise InvalidRequest(f"Invalid type for 'reasoning': expected an object, but got "
                             f"{json_type(reasoning)}.", param="reasoning", code="invalid_type")
    tier = body.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise InvalidRequest(f"Invalid value for 'service_tier': {tier!r} is not one of "
                             f"{list(SERVICE_TIERS)}.", param="service_tier", code="invalid_value")
    prompt = estimate_prompt_tokens(messages)
    if body.get("tools"):
        prompt += estimate_text_tokens(orjson.dumps(body["tools"]).decode())
    echo = {name: default if body.get(name) is None else body[name] for name, default in _ECHOED.items()}
    served_at = None if tier is None else "default" if tier == "auto" else str(tier)  # as chat's
    units = prompt_units("openai", [*tools_piece(body.get("tools")), *message_pieces(messages)])
    return ChatRequest(model, prompt, optional_positive_int(body, "max_output_tokens"), stream, True, (),
                       plan_tool_call(tools, _tool_choice(body.get("tool_choice")), messages),
                       wire="responses", service_tier=served_at, reasons=bool(reasoning), echo=echo,
                       prompt_units=units)


def parse_compaction(body: dict[str, Any]) -> ChatRequest:
    """Validate a compaction request (model, input, instructions; `previous_response_id` names
    nothing here: the simulator stores no response) into the simulator's ChatRequest, which keeps
    the input's user messages to answer with."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model",
                             code="missing_required_parameter")
    if body.get("previous_response_id") is not None:
        raise InvalidRequest(f"Previous response with id '{body['previous_response_id']}' not found.",
                             param="previous_response_id", code="previous_response_not_found", status=404)
    given = body.get("input")
    messages = _messages(given)
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    items = given if isinstance(given, list) else [{"role": "user", "content": given}]
    retained = [item for item in items
                if item.get("type", "message") == "message" and item.get("role") == "user"]
    return ChatRequest(model, estimate_prompt_tokens(messages), None, False, True, (), None,
                       wire="compaction", echo={"retained": retained})


def compaction_body(identifier: str, model: str, chat: ChatRequest, text: str,
                    output_tokens: int) -> dict[str, Any]:
    """A compacted conversation: the user messages given, then the compaction item."""
    retained = (chat.echo or {}).get("retained") or ()
    output: list[dict[str, Any]] = [
        {"id": f"msg_{identifier}_{index}", "type": "message", "role": "user", "status": "completed",
         "content": ([{"type": "input_text", "text": item["content"]}] if isinstance(item["content"], str)
                     else item["content"])}
        for index, item in enumerate(retained)]
    output.append({"id": f"cmp_{identifier}", "type": "compaction",
                   "encrypted_content": base64.b64encode(text.encode()).decode()})
    return {"id": f"resp_{identifier}", "object": "response.compaction", "created_at": int(time.time()),
            "output": output, "usage": _usage(chat, output_tokens)}


def _messages(given: object) -> list[dict[str, Any]]:
    """The input as chat messages (for the prompt's tokens and the tool plan): text is one user
    message; items are checked for their type and role."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise InvalidRequest("Invalid 'input': expected a string or a non-empty array of items.",
                             param="input", code="invalid_value")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if not isinstance(item, dict) or kind not in _ITEM_TYPES:
            raise InvalidRequest(f"Invalid 'input[{i}]': expected an item of type {sorted(_ITEM_TYPES)}.",
                                 param=f"input[{i}]", code="invalid_value")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise InvalidRequest(f"Invalid value for 'input[{i}].role': {item.get('role')!r}.",
                                     param=f"input[{i}].role", code="invalid_value")
            content = item.get("content")
            text = content if isinstance(content, str) else " ".join(
                str(part.get("text") or "") for part in content or () if isinstance(part, dict))
            messages.append({"role": item["role"], "content": text})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": str(item.get("output") or "")})
        else:
            messages.append({"role": "assistant", "content": orjson.dumps(item).decode()})
    return messages


def _tools(tools: object) -> list[dict[str, Any]]:
    """The function tools (name and parameters) among `tools`; built-in ones only need a type."""
    if tools is None:
        return []
    if not isinstance(tools, list) or not all(isinstance(tool, dict) and isinstance(tool.get("type"), str)
                                              for tool in tools):
        raise InvalidRequest("Invalid 'tools': expected an array of tools, each with a type.", param="tools",
                             code="invalid_value")
    functions = [tool for tool in tools if tool["type"] == "function"]
    if not all(isinstance(tool.get("name"), str) for tool in functions):
        raise InvalidRequest("Invalid 'tools': a function tool needs a name.", param="tools",
                             code="invalid_value")
    return [{"name": tool["name"], "parameters": tool.get("parameters")} for tool in functions]


def _tool_choice(choice: object) -> object:
    """The Responses tool_choice as the chat completion's."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice if isinstance(choice, str) else None


def _usage(chat: ChatRequest, output_tokens: int) -> dict[str, Any]:
    reasoning = estimate_text_tokens(REASONING_SUMMARY) if chat.reasons else 0
    return {"input_tokens": chat.prompt_tokens,
            "input_tokens_details": {"cached_tokens": chat.cache.read, "cache_write_tokens": 0},
            "output_tokens": output_tokens + reasoning,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": chat.prompt_tokens + output_tokens + reasoning}


def _reasoning_item(identifier: str, chat: ChatRequest) -> dict[str, Any]:
    asked = (chat.echo or {}).get("reasoning") or {}
    summary = [{"type": "summary_text", "text": REASONING_SUMMARY}] if asked.get("summary") else []
    return {"id": f"rs_{identifier}", "type": "reasoning", "summary": summary}


def _message_item(identifier: str, text: str, status: str) -> dict[str, Any]:
    return {"id": f"msg_{identifier}", "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(identifier: str, call: Mapping[str, Any], arguments: str) -> dict[str, Any]:
    return {"id": f"fc_{identifier}", "type": "function_call", "status": "completed",
            "call_id": call["id"], "name": call["function"]["name"], "arguments": arguments}


def response_body(identifier: str, model: str, chat: ChatRequest, message: Mapping[str, Any],
                  finish: str, output_tokens: int) -> dict[str, Any]:
    """A whole Response: the reasoning asked for, then the text or the function call."""
    status = "incomplete" if finish == "length" else "completed"
    output = [_reasoning_item(identifier, chat)] if chat.reasons else []
    calls = message.get("tool_calls") or ()
    if calls:
        output += [_call_item(identifier, call, call["function"]["arguments"]) for call in calls]
    else:
        output.append(_message_item(identifier, message.get("content") or "", status))
    return _response(identifier, model, chat, status, output, _usage(chat, output_tokens))


def _response(identifier: str, model: str, chat: ChatRequest, status: str, output: list[dict[str, Any]],
              usage: dict[str, Any] | None) -> dict[str, Any]:
    document: dict[str, Any] = {
        **(chat.echo or _ECHOED), "id": f"resp_{identifier}", "object": "response",
        "created_at": int(time.time()), "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": model, "output": output, "usage": usage}
    if chat.service_tier is not None:
        document["service_tier"] = chat.service_tier
    return document


class ResponseEvents:
    """Encodes the typed events of one streamed Response, numbered in order: `response.created`,
    `response.in_progress`, the reasoning item whole, then the message (its text a delta per
    piece) or the function call (its arguments in pieces), and `response.completed` (or
    `response.incomplete`)."""

    def __init__(self, identifier: str, model: str, chat: ChatRequest) -> None:
        self._identifier = identifier
        self._model = model
        self._chat = chat
        self._sequence = 0
        self._output: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> bytes:
        """One event, numbered."""
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def start(self) -> bytes:
        """The response's start, and its reasoning item whole."""
        opened = _response(self._identifier, self._model, self._chat, "in_progress", [], None)
        frames = self.event("response.created", response=opened) + self.event("response.in_progress",
                                                                               response=opened)
        if self._chat.reasons:
            item = _reasoning_item(self._identifier, self._chat)
            frames += self._added(item) + self._done(item)
        return frames

    def _added(self, item: dict[str, Any]) -> bytes:
        self._output.append(item)
        shown = {**item, "status": "in_progress"} if item["type"] != "reasoning" else item
        if item["type"] == "message":
            shown["content"] = []
        return self.event("response.output_item.added", output_index=len(self._output) - 1, item=shown)

    def _done(self, item: dict[str, Any]) -> bytes:
        return self.event("response.output_item.done", output_index=len(self._output) - 1, item=item)

    def pieces(self, deltas: Sequence[Mapping[str, Any]]) -> tuple[list[bytes], bytes]:
        """The events of the answer's deltas (a word of text each, or the call's head then its
        arguments) and the events that close its item; `end` follows."""
        pieces: list[bytes] = []
        text: list[str] = []
        call: dict[str, Any] | None = None
        for delta in deltas:
            if "content" in delta:
                opening = b""
                if not text:
                    item = _message_item(self._identifier, "", "in_progress")
                    opening = self._added(item) + self.event(
                        "response.content_part.added", item_id=item["id"], output_index=len(self._output) - 1,
                        content_index=0, part={"type": "output_text", "text": "", "annotations": []})
                text.append(delta["content"])
                pieces.append(opening + self.event(
                    "response.output_text.delta", item_id=f"msg_{self._identifier}",
                    output_index=len(self._output) - 1, content_index=0, delta=delta["content"], logprobs=[]))
                continue
            [given] = delta["tool_calls"]
            if "id" in given:
                call = _call_item(self._identifier, given, "")
                pieces.append(self._added(call))
            elif call is not None:
                call["arguments"] += given["function"]["arguments"]
                pieces.append(self.event("response.function_call_arguments.delta", item_id=call["id"],
                                         output_index=len(self._output) - 1,
                                         delta=given["function"]["arguments"]))
        return pieces, self._close(text, call)

    def _close(self, text: list[str], call: dict[str, Any] | None) -> bytes:
        where = {"output_index": len(self._output) - 1}
        if call is not None:
            return self.event("response.function_call_arguments.done", item_id=call["id"], name=call["name"],
                              arguments=call["arguments"], **where) + self._done(call)
        if not text:
            return b""
        whole = "".join(text)
        item = self._output[-1]
        part = {"type": "output_text", "text": whole, "annotations": [], "logprobs": []}
        item["content"] = [part]
        return (self.event("response.output_text.done", item_id=item["id"], content_index=0, text=whole,
                           logprobs=[], **where)
                + self.event("response.content_part.done", item_id=item["id"], content_index=0, part=part,
                             **where))

    def end(self, finish: str, output_tokens: int) -> bytes:
        """The message item done (its status now known) and the whole response."""
        status = "incomplete" if finish == "length" else "completed"
        frames = b""
        last = self._output[-1] if self._output else None
        if last is not None and last["type"] == "message":
            last["status"] = status
            frames = self._done(last)
        response = _response(self._identifier, self._model, self._chat, status, self._output,
                             _usage(self._chat, output_tokens))
        return frames + self.event(f"response.{status}", response=response)
