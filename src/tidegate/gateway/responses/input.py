"""A Responses API request as the chat body of its job: what a chat-only upstream is sent.

Every field and item either has a faithful chat counterpart or is refused with a 400 naming it
(code `unsupported_parameter`, `unsupported_input_item`, `unsupported_tool`, …): the upstream must
answer the question that was asked, or the caller must learn that it cannot be. Such a refusal
(one of UNTRANSLATABLE) is lifted when every provider that may serve the request speaks the
Responses API natively: the job is then sent as it is, its chat body only a summary
(`summary_body`) for routing and estimates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from tidegate.contract import items_of
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.responses.schemas import ResponseCreateRequest

__all__ = ["UNTRANSLATABLE", "chat_body", "input_messages", "invalid", "message_of",
           "summary_body"]

UNTRANSLATABLE: Final = frozenset({"unsupported_parameter", "unsupported_input_item", "unsupported_tool",
                                   "unsupported_content", "unsupported_tool_choice"})
"""The codes of refusals that mean "a chat completion cannot carry this", not "this is invalid"."""

# Fields kept with the response (echoed, or read by the gateway) that the upstream is not sent.
_GATEWAY_ONLY: Final = frozenset({"instructions", "input", "previous_response_id", "metadata", "store",
                                  "background", "stream_options", "include", "truncation", "tools",
                                  "tool_choice", "text", "reasoning", "max_output_tokens",
                                  "top_logprobs"})
_ROLES: Final = {"user": "user", "assistant": "assistant", "system": "system",
                 # A developer message is chat's system message (OpenAI's chat API itself treats
                 # them alike, and most OpenAI-compatible upstreams know only "system").
                 "developer": "system"}
_TEXT_PARTS: Final = frozenset({"input_text", "output_text"})
_TOOL_CHOICES: Final = frozenset({"auto", "none", "required"})


def invalid(message: str, code: str, param: str) -> ApiError:
    """A 400 in OpenAI's shape, naming the parameter."""
    return ApiError(400, message, code=code, param=param)


def chat_body(request: ResponseCreateRequest, history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion body: instructions, then `history` (the conversation of the previous
    response), then the input; the sampling, tool and format fields translated."""
    extra = sorted(request.model_extra or {})
    if extra:
        raise invalid(f"{extra[0]!r} is not supported by this gateway's Responses API: it cannot be "
                      "passed to a chat completions upstream", "unsupported_parameter", extra[0])
    if request.include:
        raise invalid("include: nothing extra can be included from a chat completions upstream",
                      "unsupported_parameter", "include")
    if request.top_logprobs is not None:
        raise invalid("top_logprobs: the output's log probabilities are not served from a chat "
                      "completions upstream", "unsupported_parameter", "top_logprobs")
    if request.truncation == "auto":
        raise invalid("truncation: auto is not served by a chat completions upstream",
                      "unsupported_parameter", "truncation")
    given = request.model_dump(exclude_unset=True, exclude_none=True)
    messages: list[dict[str, Any]] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
    messages.extend(history)
    messages.extend(input_messages(items_of(request.input)))
    if not messages:
        raise invalid("input must hold at least one item", "empty_input", "input")
    body = {key: value for key, value in given.items() if key not in _GATEWAY_ONLY}
    body["messages"] = messages
    if request.max_output_tokens is not None:
        body["max_completion_tokens"] = request.max_output_tokens
    if request.tools:
        body["tools"] = [_tool(tool, f"tools[{index}]") for index, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        body["tool_choice"] = _tool_choice(request.tool_choice)
    body.update(_text_format(request.text))
    body.update(_reasoning(request.reasoning))
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def summary_body(request: ResponseCreateRequest) -> dict[str, Any]:
    """The chat body of a request sent natively: what routing, limits and estimates read (the
    model, the text of instructions, input and tools, the output limit, the stream, tidegate's
    priority and the tier), never sent upstream."""
    given = request.model_dump(exclude_unset=True, exclude_none=True)
    text = [request.instructions or "", request.input if isinstance(request.input, str)
            else orjson.dumps(request.input).decode()]
    if request.tools:
        text.append(orjson.dumps(request.tools).decode())
    body: dict[str, Any] = {key: given[key] for key in ("model", "stream", "priority", "service_tier")
                            if key in given}
    body["messages"] = [{"role": "user", "content": "\n".join(part for part in text if part)}]
    if request.max_output_tokens is not None:
        body["max_completion_tokens"] = request.max_output_tokens
    return body


def input_messages(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of input items. Function calls join the assistant message before them (a
    turn that called several tools is one chat message with several tool calls)."""
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(message_of(item, where))
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _text_field(item, "call_id", where),
                             "content": _output_text(item.get("output"), f"{where}.output")})
        else:
            raise invalid(f"{where}: input items of type {kind!r} are not supported (message, "
                          "function_call and function_call_output are)", "unsupported_input_item",
                          f"{where}.type")
    return messages


def message_of(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The chat message of a message item."""
    role = _ROLES.get(str(item.get("role")))
    if role is None:
        raise invalid(f"{where}.role must be one of {', '.join(_ROLES)}, got {item.get('role')!r}",
                      "invalid_value", f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be text or a list of content parts", "invalid_type",
                      f"{where}.content")
    parts = [_part(part, role, f"{where}.content[{index}]") for index, part in enumerate(content)]
    if all(part["type"] == "text" for part in parts):
        # Text alone is sent as one string: every chat upstream reads that, for every role.
        return {"role": role, "content": "".join(part["text"] for part in parts)}
    return {"role": role, "content": parts}


def _part(part: object, role: str, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if isinstance(part, dict) and kind in _TEXT_PARTS:
        return {"type": "text", "text": _text_field(part, "text", where)}
    if isinstance(part, dict) and kind == "input_image" and role == "user":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise invalid(f"{where}: an input_image needs an image_url (file_id is not supported)",
                          "unsupported_content", f"{where}.image_url")
        return {"type": "image_url", "image_url": {"url": url, "detail": part.get("detail") or "auto"}}
    if isinstance(part, dict) and kind == "input_file" and role == "user":
        return _file(part, where)
    raise invalid(f"{where}: content parts of type {kind!r} are not supported here (input_text, "
                  "output_text, and input_image and input_file in user messages, are)",
                  "unsupported_content", f"{where}.type")


def _file(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An input_file as chat's file part. Its `file_id` was replaced by the file's data at the door
    (tidegate.gateway.responses.files); a `file_url` has no chat counterpart."""
    data = part.get("file_data")
    if not isinstance(data, str) or not data or part.get("file_url") is not None:
        raise invalid(f"{where}: an input_file needs file_data or the file_id of an upload with "
                      "purpose user_data (file_url is not supported)", "unsupported_content",
                      f"{where}.file_data")
    file = {"file_data": data}
    if isinstance(part.get("filename"), str):
        file["filename"] = part["filename"]
    return {"type": "file", "file": file}


def _function_call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    return {"id": _text_field(item, "call_id", where), "type": "function",
            "function": {"name": _text_field(item, "name", where),
                         "arguments": _text_field(item, "arguments", where, empty=True)}}


def _output_text(output: object, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(part, dict) and part.get("type") == "input_text"
                                        and isinstance(part.get("text"), str) for part in output):
        return "".join(part["text"] for part in output)
    raise invalid(f"{where} must be text or input_text parts", "unsupported_content", where)


def _text_field(item: Mapping[str, Any], name: str, where: str, *, empty: bool = False) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not (value or empty):
        raise invalid(f"{where}.{name} must be a non-empty string", "invalid_value", f"{where}.{name}")
    return value


def _tool(tool: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A function tool as chat declares it; any other tool type has no chat counterpart."""
    if tool.get("type") != "function":
        raise invalid(f"{where}: tools of type {tool.get('type')!r} are not supported (function "
                      "tools are)", "unsupported_tool", f"{where}.type")
    unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
    if unknown:
        raise invalid(f"{where}: unknown field {unknown[0]!r}", "unsupported_parameter",
                      f"{where}.{unknown[0]}")
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise invalid(f"{where}.parameters must be a JSON schema object", "invalid_type",
                      f"{where}.parameters")
    function: dict[str, Any] = {"name": _text_field(tool, "name", where)}
    for name in ("description", "parameters", "strict"):
        if tool.get(name) is not None:
            function[name] = tool[name]
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str) and choice in _TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and set(choice) == {"type", "name"}:
        return {"type": "function", "function": {"name": _text_field(choice, "name", "tool_choice")}}
    raise invalid("tool_choice must be auto, none, required or {type: function, name}",
                  "unsupported_tool_choice", "tool_choice")


def _text_format(text: Mapping[str, Any] | None) -> dict[str, Any]:
    """`text.format` as chat's `response_format`."""
    if not text:
        return {}
    if set(text) - {"format", "verbosity"} or text.get("verbosity") is not None:
        raise invalid("text: only `format` is supported", "unsupported_parameter", "text")
    given = text.get("format")
    form = given if isinstance(given, dict) else {}
    kind = form.get("type")
    if kind in (None, "text"):
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema" and isinstance(form.get("schema"), dict):
        schema = {key: form[key] for key in ("name", "schema", "description", "strict") if key in form}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise invalid("text.format must be text, json_object or json_schema with a schema",
                  "unsupported_parameter", "text.format")


def _reasoning(reasoning: Mapping[str, Any] | None) -> dict[str, Any]:
    """`reasoning.effort` as chat's `reasoning_effort`; a summary has no chat counterpart."""
    if not reasoning:
        return {}
    if any(reasoning.get(key) is not None for key in set(reasoning) - {"effort"}):
        raise invalid("reasoning: only `effort` is supported", "unsupported_parameter", "reasoning")
    effort = reasoning.get("effort")
    return {} if effort is None else {"reasoning_effort": effort}
