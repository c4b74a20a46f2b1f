"""Request validation of the simulated provider, as strict as a real OpenAI-compatible API: a
client that the simulator accepts should not be refused by the real thing for the request's shape.

Errors are OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from tidegate.simulator.caching import (
    NO_CACHE,
    CacheUse,
    PromptUnit,
    message_pieces,
    prompt_units,
    tools_piece,
)
from tidegate.simulator.content import estimate_prompt_tokens, estimate_text_tokens, tool_arguments

__all__ = [
    "ChatRequest",
    "EmbeddingsRequest",
    "InvalidRequest",
    "ToolCallPlan",
    "check_messages",
    "check_range",
    "check_stop",
    "check_stream",
    "error_body",
    "json_type",
    "model_of",
    "optional_positive_int",
    "parse_chat",
    "parse_embeddings",
    "parse_json_object",
    "plan_tool_call",
    "service_tier_of",
]

ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
SERVICE_TIERS: Final = ("auto", "default", "flex", "priority")
MAX_EMBEDDING_INPUTS: Final = 2048
MAX_STOP_SEQUENCES: Final = 4


class InvalidRequest(Exception):
    """A request the simulator refuses; becomes an OpenAI-shaped error response."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type_

    def body(self) -> bytes:
        """The response body."""
        return error_body(self.message, type_=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    """An OpenAI-shaped error body."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


@dataclass(frozen=True, slots=True)
class ToolCallPlan:
    """The function a simulated answer calls, and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A valid chat completion request, reduced to what the simulator uses."""

    model: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    stop: tuple[str, ...] = ()
    tool_call: ToolCallPlan | None = None
    # The API it came by, and is answered in: "completions" is OpenAI's legacy /v1/completions,
    # "compaction" its /v1/responses/compact.
    wire: Literal["openai", "anthropic", "responses", "completions", "compaction"] = "openai"
    service_tier: str | None = None  # the tier it is served at: what was asked, `auto` as default
    reasons: bool = False  # the answer opens with the model's reasoning (a thinking block, say)
    echo: Mapping[str, Any] | None = None  # what the answer repeats of the request (a Response's)
    prompt_units: tuple[PromptUnit, ...] = ()  # the prompt as its prompt cache sees it (caching.py)
    cache: CacheUse = NO_CACHE  # what serving it read from the prompt cache and wrote to it


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """A valid embeddings request: one key (text or token ids) and token count per input."""

    model: str
    keys: tuple[bytes, ...]
    prompt_tokens: int
    dimensions: int | None
    encoding_format: Literal["float", "base64"]
    service_tier: str | None = None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or InvalidRequest."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
            "using your HTTP library correctly.)"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise InvalidRequest("you must provide a model parameter", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"Invalid type for 'model': expected a string, but got {json_type(model)}.",
                             param="model", code="invalid_type")
    return model


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def optional_positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise InvalidRequest(f"Invalid type for '{name}': expected an integer, but got {json_type(value)}.",
                             param=name, code="invalid_type")
    if value < 1:
        raise InvalidRequest(f"Invalid '{name}': integer below minimum value. Expected a value >= 1, "
                             f"but got {value} instead.", param=name, code="integer_below_min_value")
    return int(value)


def check_range(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if not _is_number(value):
        raise InvalidRequest(f"Invalid type for '{name}': expected a number, but got {json_type(value)}.",
                             param=name, code="invalid_type")
    if not low <= value <= high:
        raise InvalidRequest(f"Invalid '{name}': expected a value between {low:g} and {high:g}, "
                             f"but got {value} instead.", param=name, code="invalid_value")


def service_tier_of(body: dict[str, Any]) -> str | None:
    """The tier a request is served at, as OpenAI answers it: the one asked for, `auto` served
    at `default`; None when the request names none."""
    tier = body.get("service_tier")
    if tier is None:
        return None
    if tier not in SERVICE_TIERS:
        raise InvalidRequest(f"Invalid value for 'service_tier': {tier!r} is not one of "
                             f"{list(SERVICE_TIERS)}.", param="service_tier", code="invalid_value")
    return "default" if tier == "auto" else str(tier)


def check_messages(messages: object, roles: frozenset[str] = ROLES) -> list[dict[str, Any]]:
    """The messages of a conversation: a non-empty array of objects, each of one of `roles`, its
    content text or an array of typed parts."""
    if messages is None:
        raise InvalidRequest("Missing required parameter: 'messages'.", param="messages",
                             code="missing_required_parameter")
    if not isinstance(messages, list):
        raise InvalidRequest(f"Invalid type for 'messages': expected an array, but got "
                             f"{json_type(messages)}.", param="messages", code="invalid_type")
    if not messages:
        raise InvalidRequest("Invalid 'messages': empty array. Expected an array with minimum length 1, "
                             "but got an empty array instead.", param="messages", code="empty_array")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"Invalid type for '{where}': expected an object, but got "
                                 f"{json_type(message)}.", param=where, code="invalid_type")
        role = message.get("role")
        if role not in roles:
            raise InvalidRequest(f"Invalid value for '{where}.role': {role!r} is not one of "
                                 f"{sorted(roles)}.", param=f"{where}.role", code="invalid_value")
        content = message.get("content")
        allowed = isinstance(content, str | list) or (content is None and role == "assistant")
        if not allowed:
            raise InvalidRequest(f"Invalid type for '{where}.content': expected a string or an array, "
                                 f"but got {json_type(content)}.", param=f"{where}.content",
                                 code="invalid_type")
        if isinstance(content, list) and not all(isinstance(p, dict) and "type" in p for p in content):
            raise InvalidRequest(f"Invalid '{where}.content': each part must be an object with a 'type'.",
                                 param=f"{where}.content", code="invalid_value")
    return messages


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """Validate a chat completion request body."""
    model = model_of(body)
    messages = check_messages(body.get("messages"))
    max_tokens = optional_positive_int(body, "max_completion_tokens") or optional_positive_int(
        body, "max_tokens")
    stream, include_usage = check_stream(body)
    n = body.get("n")
    if n is not None and n != 1:
        raise InvalidRequest("The simulator supports only n=1.", param="n", code="invalid_value")
    check_range(body, "temperature", 0.0, 2.0)
    check_range(body, "top_p", 0.0, 1.0)
    prompt_tokens = estimate_prompt_tokens(messages)
    tools = _check_tools(body.get("tools"))
    if tools:
        prompt_tokens += estimate_text_tokens(orjson.dumps(body["tools"]).decode())
    units = prompt_units("openai", [*tools_piece(body["tools"] if tools else None),
                                    *message_pieces(messages)])
    return ChatRequest(model, prompt_tokens, max_tokens, stream, include_usage, check_stop(body.get("stop")),
                       plan_tool_call(tools, body.get("tool_choice"), messages),
                       service_tier=service_tier_of(body), prompt_units=units)


def check_stream(body: dict[str, Any]) -> tuple[bool, bool]:
    """`stream` (a boolean) and `stream_options` (only with it): whether to stream, and whether
    the stream ends with a usage chunk."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest(f"Invalid type for 'stream': expected a boolean, but got {json_type(stream)}.",
                             param="stream", code="invalid_type")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise InvalidRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                                 param="stream_options", code="invalid_value")
        if not isinstance(options, dict):
            raise InvalidRequest("Invalid type for 'stream_options': expected an object, but got "
                                 f"{json_type(options)}.", param="stream_options", code="invalid_type")
    return stream, bool(options.get("include_usage")) if isinstance(options, dict) else False


def check_stop(stop: object) -> tuple[str, ...]:
    """`stop`: a string or up to 4 of them, as OpenAI allows."""
    if stop is None:
        return ()
    sequences = [stop] if isinstance(stop, str) else stop
    if (not isinstance(sequences, list) or len(sequences) > MAX_STOP_SEQUENCES
            or not all(isinstance(item, str) and item for item in sequences)):
        raise InvalidRequest(f"Invalid 'stop': expected a string or an array of at most {MAX_STOP_SEQUENCES} "
                             "non-empty strings.", param="stop", code="invalid_value")
    return tuple(sequences)


def _check_tools(tools: object) -> list[dict[str, Any]]:
    """`tools`: function tools, each with a name (and optionally a JSON Schema of its parameters)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest(f"Invalid type for 'tools': expected an array, but got {json_type(tools)}.",
                             param="tools", code="invalid_type")
    functions: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"Invalid 'tools[{i}]': expected a function tool with a name.",
                                 param=f"tools[{i}]", code="invalid_value")
        functions.append(function)
    return functions


def plan_tool_call(tools: list[dict[str, Any]], choice: object,
               messages: list[dict[str, Any]]) -> ToolCallPlan | None:
    """Which function the simulated model calls, deterministically: the one `tool_choice` names;
    else, unless the choice is "none", the first tool, when the conversation does not end with a
    tool's result (a model that got its result answers in text, unless a call is required)."""
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name")
        chosen = next((tool for tool in tools if tool["name"] == named), None)
        if chosen is None:
            raise InvalidRequest(f"Invalid 'tool_choice': no tool named {named!r}.", param="tool_choice",
                                 code="invalid_value")
    elif choice == "required" or messages[-1].get("role") != "tool":
        chosen = tools[0]
    else:
        return None
    parameters = chosen.get("parameters")
    return ToolCallPlan(chosen["name"], orjson.dumps(
        tool_arguments(parameters if isinstance(parameters, dict) else {})).decode())


def parse_embeddings(body: dict[str, Any]) -> EmbeddingsRequest:
    """Validate an embeddings request body. `input` is a string, an array of strings, an array of
    token ids, or an array of such arrays, as in OpenAI's API."""
    model = model_of(body)
    value = body.get("input")
    if value is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input",
                             code="missing_required_parameter")
    inputs: list[object] = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        inputs = [value]  # one input given as token ids
    if not inputs or len(inputs) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(f"'input' must be a non-empty string or an array of 1 to {MAX_EMBEDDING_INPUTS} "
                             "inputs.", param="input", code="invalid_value")
    keys: list[bytes] = []
    tokens = 0
    for item in inputs:
        if isinstance(item, str) and item:
            keys.append(item.encode())
            tokens += estimate_text_tokens(item)
        elif isinstance(item, list) and item and all(_is_int(v) and v >= 0 for v in item):
            keys.append(orjson.dumps(item))
            tokens += len(item)
        else:
            raise InvalidRequest("Invalid 'input': each input must be a non-empty string or a non-empty "
                                 "array of token ids.", param="input", code="invalid_value")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise InvalidRequest(f"Invalid value for 'encoding_format': {encoding!r} is not 'float' or 'base64'.",
                             param="encoding_format", code="invalid_value")
    dimensions = optional_positive_int(body, "dimensions")
    return EmbeddingsRequest(model, tuple(keys), tokens, dimensions, encoding, service_tier_of(body))
