"""The Anthropic dialect: the Messages API, translated to and from the chat completions a job
carries (tidegate.ai), so an Anthropic SDK pointed at the gateway works unchanged and its calls
queue like every other.

Requests: `system` becomes a system message; text and image blocks become content parts (an
image as an `image_url`, inline ones as data URLs); an assistant's `tool_use` blocks become its
`tool_calls`, a user's `tool_result` blocks `tool` messages ahead of the rest of the turn;
`stop_sequences` → `stop`, `tools` → function tools, `tool_choice` auto/any/tool/none →
auto/required/the named function/none (`disable_parallel_tool_use` → `parallel_tool_calls:
false`), `metadata.user_id` → `user`, `service_tier` standard_only → `default` (auto leaves the
tier to the provider's tier policy). What has no counterpart is refused with 400, never dropped:
`top_k`, `thinking` and thinking blocks, an image inside a tool result (a tool message holds only
text). Every request keeps its Messages body as its job's `origin`: a provider that speaks the
Messages API natively is sent it as it is, and its Message (or events) comes back as it is. When
every provider that may serve the request does (`translate(..., native=True)`), what has no
counterpart is accepted too: the job is `native_only`, its chat body a summary (`summary_body`).

Answers: a chat.completion becomes a Message (`msg_…`): the text as a text block, each tool call as
a tool_use block with its parsed input, finish reasons mapped (stop → end_turn, or stop_sequence
when the provider names the sequence it met in the choice's `stop_reason`, as vLLM does; length →
max_tokens; tool_calls → tool_use; content_filter → refusal), usage in Anthropic's names (the
input tokens the prompt cache neither served nor took, cache reads and writes apart, see
`message_usage`) and the tier the call ran at (`usage.service_tier`, see `anthropic_tier`).
Streams become Anthropic's event sequence (see `_MessageStream`).

Errors: `{"type": "error", "error": {"type", "message", "code", "job_id"?}}`, Anthropic's type for
each status (413 request_too_large, 429 rate_limit_error, 503 overloaded_error, 504 timeout_error,
other 5xx api_error), tidegate's code always present.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
from fastapi.responses import Response
from pydantic import BaseModel

from tidegate.ai import (
    AIRequest,
    AIResult,
    Finish,
    Kind,
    StreamError,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageReport,
)
from tidegate.contract import requested_tier
from tidegate.gateway.anthropic.schemas import (
    ContentBlock,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
)
from tidegate.gateway.core.dialect import Dialect, StreamRenderer, decoded, decoded_origin, validated
from tidegate.gateway.core.errors import ApiError

__all__ = ["ANTHROPIC", "AnthropicDialect", "anthropic_tier", "chat_body", "conversation", "json_text",
           "message_usage", "tool_fields"]

# The refusals that mean "a chat completion cannot carry this", not "this is invalid".
_UNTRANSLATABLE: Final = frozenset({"unsupported_parameter", "unsupported_content"})
_ERROR_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    503: "overloaded_error", 504: "timeout_error",
}
# The error types Anthropic's SDKs know; a stream's error of another type is an api_error.
_KNOWN_TYPES: Final = frozenset({*_ERROR_TYPES.values(), "api_error", "billing_error"})
_STOP_REASONS: Final[Mapping[str, str]] = {
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
    "content_filter": "refusal",
}
# The job's (OpenAI's) tiers in Anthropic's words. Flex is the discounted tier that answers when
# capacity allows, which Anthropic sells as batch; every other tier is its standard one.
_ANTHROPIC_TIERS: Final[Mapping[str, str]] = {"priority": "priority", "flex": "batch"}


class AnthropicDialect(Dialect):
    """Anthropic's Messages API over chat-completion jobs."""

    name = "anthropic"

    def request(self, kind: Kind, body: BaseModel) -> AIRequest:
        """The chat job of a validated MessagesRequest (see the module's docstring)."""
        if kind != "chat" or not isinstance(body, MessagesRequest):
            raise ApiError(400, "the Messages API serves chat requests only", code="invalid_request")
        return self.translate(body)

    def translate(self, body: MessagesRequest, *, native: bool = False) -> AIRequest:
        """The chat job of a Messages request, the request kept as its origin. `native`: every
        provider that may serve it speaks the Messages API, so what has no chat translation is
        sent on as it is."""
        given = body.model_dump(exclude_unset=True)
        try:
            chat = chat_body(body)
        except ApiError as refused:
            if not native or refused.code not in _UNTRANSLATABLE:
                raise
            return AIRequest(kind="chat", body=decoded("chat", summary_body(body)),
                             origin=decoded_origin("anthropic", given, native_only=True))
        return AIRequest(kind="chat", body=decoded("chat", chat), origin=decoded_origin("anthropic", given))

    def parse(self, kind: Kind, body: Mapping[str, Any], where: str) -> AIRequest:
        """A Messages body that came inside another document, checked as /v1/messages checks it."""
        return self.request(kind, validated(MessagesRequest, body, where))

    def answer(self, result: AIResult, headers: Mapping[str, str]) -> Response:
        """The job's chat completion as a Message; a native upstream's Message as it is."""
        response = result.response or {}
        message = native_message(response) if is_message(response) else message_of(response)
        return Response(orjson.dumps(message), media_type="application/json", headers=dict(headers))

    def stream(self, request: AIRequest) -> StreamRenderer:
        """Anthropic's event sequence; the worker always asks for the usage chunk, which
        `message_delta` carries."""
        return _MessageStream(requested_tier(request.body))

    def error_body(self, error: ApiError) -> dict[str, Any]:
        """`{"type": "error", "error": {"type", "message", "code"}}` (and `job_id` when a job is
        concerned)."""
        inner: dict[str, Any] = {"type": _error_type(error.status), "message": error.message,
                                 "code": error.code or f"http_{error.status}"}
        if error.job_id is not None:
            inner["job_id"] = error.job_id
        return {"type": "error", "error": inner}


ANTHROPIC: Final = AnthropicDialect()


def _error_type(status: int) -> str:
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


# ---------------------------------------------------------------------------- requests


def chat_body(request: MessagesRequest) -> dict[str, Any]:
    """The chat completion body a Messages request asks for; ApiError 400 for what it cannot carry."""
    if request.top_k is not None:
        raise ApiError(400, "top_k is not supported: the chat completions tidegate queues have no "
                       "top-k sampling and no provider that may serve this model speaks the Messages "
                       "API natively; leave it out, or use top_p", code="unsupported_parameter",
                       param="top_k")
    if request.thinking is not None and request.thinking.type == "enabled":  # disabled: the default
        raise ApiError(400, "thinking is not supported: no provider that may serve this model speaks the "
                       "Messages API natively, and a chat completion has no extended thinking",
                       code="unsupported_parameter", param="thinking")
    body: dict[str, Any] = {"model": request.model,
                            "messages": conversation(request.system, request.messages),
                            "max_tokens": request.max_tokens}
    if request.stop_sequences:
        body["stop"] = list(request.stop_sequences)
    for field in ("temperature", "top_p", "priority"):
        value = getattr(request, field)
        if value is not None:
            body[field] = value
    if request.stream:
        body["stream"] = True
    if request.metadata is not None and request.metadata.user_id is not None:
        body["user"] = request.metadata.user_id
    if request.service_tier == "standard_only":
        body["service_tier"] = "default"
    body.update(tool_fields(request.tools, request.tool_choice))
    return body


def summary_body(request: MessagesRequest) -> dict[str, Any]:
    """The chat body of a request sent natively: what routing, limits and estimates read (the
    model, the conversation's text, the output limit, the stream, tidegate's priority), never sent
    upstream."""
    given = request.model_dump(exclude_unset=True, include={"system", "messages", "tools"})
    body: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens,
                            "messages": [{"role": "user", "content": orjson.dumps(given).decode()}]}
    if request.stream:
        body["stream"] = True
    if request.priority is not None:
        body["priority"] = request.priority
    return body


def conversation(system: str | list[TextBlock] | None, messages: list[InputMessage]) -> list[dict[str, Any]]:
    """The chat messages of a Messages conversation, its system prompt first."""
    chat: list[dict[str, Any]] = []
    if system:
        text = system if isinstance(system, str) else "\n\n".join(block.text for block in system)
        chat.append({"role": "system", "content": text})
    for position, message in enumerate(messages):
        if isinstance(message.content, str):
            chat.append({"role": message.role, "content": message.content})
        elif message.role == "assistant":
            chat.append(_assistant(message.content, f"messages.{position}.content"))
        else:
            chat.extend(_user(message.content, f"messages.{position}.content"))
    return chat


def _assistant(blocks: list[ContentBlock], where: str) -> dict[str, Any]:
    """An assistant turn: its text, and its tool_use blocks as tool calls. A chat assistant message
    holds nothing else."""
    for i, block in enumerate(blocks):
        if isinstance(block, ThinkingBlock | RedactedThinkingBlock):
            raise ApiError(400, f"{where}.{i}: a {block.type} block has no chat counterpart (only a "
                           "provider speaking the Messages API natively takes it)",
                           code="unsupported_content", param=f"{where}.{i}")
        if not isinstance(block, TextBlock | ToolUseBlock):
            raise ApiError(400, f"{where}.{i}: an assistant message holds text and tool_use blocks, "
                           f"not {block.type}", code="invalid_request", param=f"{where}.{i}")
    text = "".join(block.text for block in blocks if isinstance(block, TextBlock))
    calls = [{"id": block.id, "type": "function",
              "function": {"name": block.name, "arguments": json_text(block.input, f"{where}.{i}.input")}}
             for i, block in enumerate(blocks) if isinstance(block, ToolUseBlock)]
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def json_text(value: Any, where: str) -> str:
    """`value` as JSON text; 400 naming `where` for what JSON cannot carry on to the provider (an
    integer beyond 64 bits, a lone surrogate)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        raise ApiError(400, f"{where} is not JSON-serialisable: {exc}", code="invalid_request",
                       param=where) from None


def _user(blocks: list[ContentBlock], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results first (a tool message must follow the call it answers), then
    its other content, if any."""
    results = [_tool_message(block, f"{where}.{i}") for i, block in enumerate(blocks)
               if isinstance(block, ToolResultBlock)]
    parts = [_part(block) for block in blocks if isinstance(block, TextBlock | ImageBlock)]
    if any(isinstance(block, ToolUseBlock | ThinkingBlock | RedactedThinkingBlock) for block in blocks):
        raise ApiError(400, f"{where}: tool_use and thinking blocks belong in assistant messages",
                       code="invalid_request", param=where)
    return results + ([{"role": "user", "content": parts}] if parts else [])


def _part(block: TextBlock | ImageBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    source = block.source
    url = source.url if source.type == "url" else f"data:{source.media_type};base64,{source.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(block: ToolResultBlock, where: str) -> dict[str, Any]:
    content = block.content
    if content is None or isinstance(content, str):
        text = content or ""
    else:
        if any(isinstance(item, ImageBlock) for item in content):
            raise ApiError(400, f"{where}: an image in a tool_result cannot be passed on (a tool "
                           "message holds text only): send it in a text-and-image user turn instead",
                           code="unsupported_content", param=f"{where}.content")
        text = "".join(item.text for item in content if isinstance(item, TextBlock))
    if block.is_error:
        # A chat tool message has no error flag: the model is told in the text itself.
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def tool_fields(tools: list[Any] | None, choice: ToolChoice | None) -> dict[str, Any]:
    """The `tools`, `tool_choice` and `parallel_tool_calls` of the chat body."""
    fields: dict[str, Any] = {}
    if tools:
        fields["tools"] = [{"type": "function", "function": {
            "name": tool.name, "parameters": tool.input_schema,
            **({"description": tool.description} if tool.description is not None else {})}}
            for tool in tools]
    if choice is None:
        return fields
    if choice.type == "tool":
        if not choice.name:
            raise ApiError(400, "tool_choice: type 'tool' needs the tool's name", code="invalid_request",
                           param="tool_choice.name")
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use and tools:
        fields["parallel_tool_calls"] = False
    return fields


# ---------------------------------------------------------------------------- answers


def is_message(response: Mapping[str, Any]) -> bool:
    """Whether a job's answer is a native upstream's Message (not a chat completion)."""
    return response.get("type") == "message"


def native_message(response: Mapping[str, Any]) -> dict[str, Any]:
    """A native upstream's Message as it is (a Message names its tier in its usage: the one a
    worker adds beside it, to bill the job, is left out)."""
    return {key: value for key, value in response.items() if key != "service_tier"}


def message_id(completion_id: object) -> str:
    """A Message id from a chat completion's id."""
    text = str(completion_id or "")
    return "msg_" + (text.removeprefix("chatcmpl-") or "unknown")


def stop_reason(finish: str | None, matched: object) -> tuple[str | None, str | None]:
    """Anthropic's stop_reason (and stop_sequence) for a chat finish reason; `matched` is the
    choice's `stop_reason`, the stop sequence met when the provider names it."""
    if finish is None:
        return None, None
    if finish == "stop" and isinstance(matched, str) and matched:
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish, "end_turn"), None


def anthropic_tier(tier: object) -> str:
    """The tier a call ran at (the job's `service_tier`: OpenAI's names) as Anthropic's
    `usage.service_tier` names it; a call that named none ran at the provider's standard tier."""
    return _ANTHROPIC_TIERS.get(tier if isinstance(tier, str) else "", "standard")


def message_of(completion: Mapping[str, Any]) -> dict[str, Any]:
    """A chat.completion as a Message."""
    choice = _first_choice(completion)
    message = _object(choice.get("message"))
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            content.append({"type": "tool_use", "id": str(call.get("id") or ""),
                            "name": str(function.get("name") or ""),
                            "input": _tool_input(function.get("arguments"))})
    finish = choice.get("finish_reason")
    reason, sequence = stop_reason(finish if isinstance(finish, str) else None, choice.get("stop_reason"))
    usage = message_usage(Usage.from_json(completion.get("usage")))
    return {"id": message_id(completion.get("id")), "type": "message", "role": "assistant",
            "content": content, "model": str(completion.get("model") or ""), "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": {**usage, "service_tier": anthropic_tier(completion.get("service_tier"))}}


def message_usage(usage: Usage) -> dict[str, Any]:
    """A job's usage in a Message's names: Anthropic counts the input tokens read from the prompt
    cache and written to it apart from `input_tokens`, and the reasoning among the output
    tokens as `output_tokens_details.thinking_tokens`."""
    counts: dict[str, Any] = {
        "input_tokens": usage.uncached_input_tokens, "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cached_input_tokens,
        "cache_creation": {"ephemeral_5m_input_tokens": usage.cache_write_5m_tokens,
                           "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens},
        "output_tokens": usage.output_tokens}
    if usage.reasoning_tokens:
        counts["output_tokens_details"] = {"thinking_tokens": usage.reasoning_tokens}
    return counts


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _first_choice(completion: Mapping[str, Any]) -> dict[str, Any]:
    choices = completion.get("choices")
    return _object(choices[0]) if isinstance(choices, list) and choices else {}


def _tool_input(arguments: object) -> dict[str, Any]:
    """A tool call's arguments as the tool_use block's `input` object. Arguments that are not a
    JSON object (a model may write broken JSON) are kept whole under `_raw`, not lost."""
    if not isinstance(arguments, str) or not arguments:
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def _tokens(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# ---------------------------------------------------------------------------- streams


def _event(name: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class _MessageStream(StreamRenderer):
    """Chat chunks as Anthropic's events: `message_start` at the first chunk (its usage not yet
    known: zeros), then per block `content_block_start`, deltas (`text_delta`; `input_json_delta`
    for a tool call's arguments, each call its own block) and `content_block_stop`; at the end
    `message_delta` (stop_reason, and usage once the usage chunk came) and `message_stop`. A
    failure after the start is an `error` event. The tier is told in `message_start` (Anthropic's
    `message_delta` usage has none): the first chunk's, else the one asked for (`asked_tier`)."""

    def __init__(self, asked_tier: object = None) -> None:
        super().__init__()
        self._asked_tier = asked_tier
        self._started = False
        self._block: tuple[str, int] | None = None  # ("text", 0) or ("tool", call index) now open
        self._blocks = 0
        self._reason: tuple[str | None, str | None] = (None, None)
        self._usage: dict[str, Any] | None = None
        self._ended = False
        self._native = False  # the upstream streams its own events, its end among them

    def frame(self, part: StreamPart) -> bytes | None:
        """The events of one chunk (None when it adds nothing Anthropic shows); a native upstream's
        event as it is."""
        error = part.error
        if error is not None:
            return self._error(error)
        if part.event is not None:
            self._native = self._started = True
            self.saw_content = self.saw_content or bool(part.text)
            return b"event: " + part.event.encode() + b"\ndata: " + part.raw + b"\n\n"
        out = b"" if self._started else self._start(part)
        for event in part.events:
            if isinstance(event, TextDelta) and event.index == 0:
                out += self._open(("text", 0), {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": event.text})
                self.saw_content = True
            elif isinstance(event, ToolCallDelta):
                out += self._open(("tool", event.index), {"type": "tool_use", "id": event.id or "",
                                                          "name": event.name or "", "input": {}})
                if event.arguments:
                    out += self._delta({"type": "input_json_delta", "partial_json": event.arguments})
                self.saw_content = True
            elif isinstance(event, Finish) and event.index == 0:
                out += self._close()
                self._reason = stop_reason(event.reason, _matched_stop(part.raw))
            elif isinstance(event, UsageReport):
                # message_delta's usage has no lifetimes of the cache writes (message_start's has).
                self._usage = {key: value for key, value in message_usage(event.usage).items()
                               if key != "cache_creation"}
        return out or None

    def error_frame(self, error: ApiError) -> bytes:
        """An `error` event in the API's error shape."""
        self.failed = True
        return _event("error", ANTHROPIC.error_body(error))

    def end_frame(self) -> bytes:
        """`message_delta` with the stop reason and usage, then `message_stop` (a native stream
        has relayed its own)."""
        if self._native:
            return b""
        out = (b"" if self._started else self._start(StreamPart(b""))) + self._close()
        reason, sequence = self._reason
        usage = self._usage or {"output_tokens": 0}
        out += _event("message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                        "usage": usage})
        return out + _event("message_stop", {"type": "message_stop"})

    def whole_answer(self, result: AIResult, job_id: str) -> list[StreamPart]:
        """A stored chat completion as the chunks that would have streamed it; a native Message as
        its own events, each block whole."""
        response = result.response
        if response is None:
            return []
        if is_message(response):
            events = _message_events(native_message(response))
            return [StreamPart.decode(orjson.dumps(event)) for event in events]
        head = {"id": response.get("id", f"chatcmpl-{job_id}"), "object": "chat.completion.chunk",
                "model": response.get("model"), "service_tier": response.get("service_tier")}
        choice = _first_choice(response)
        delta = {key: value for key, value in _object(choice.get("message")).items() if value is not None}
        for position, call in enumerate(delta.get("tool_calls") or ()):
            if isinstance(call, dict):
                call.setdefault("index", position)
        finish: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason"),
                  "stop_reason": choice.get("stop_reason")}
        chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {**head, "choices": [finish]}]
        if isinstance(response.get("usage"), dict):
            chunks.append({**head, "choices": [], "usage": response["usage"]})
        return [StreamPart.decode(orjson.dumps(chunk)) for chunk in chunks]

    def _start(self, part: StreamPart) -> bytes:
        self._started = True
        try:
            identifier = _object(orjson.loads(part.raw)).get("id") if part.raw else None
        except orjson.JSONDecodeError:
            identifier = None
        message: dict[str, Any] = {
            "id": message_id(identifier), "type": "message", "role": "assistant", "content": [],
            "model": part.model or "", "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0,
                      "service_tier": anthropic_tier(part.service_tier or self._asked_tier)}}
        return _event("message_start", {"type": "message_start", "message": message})

    def _open(self, block: tuple[str, int], start: dict[str, Any]) -> bytes:
        if self._block == block:
            return b""
        out = self._close()
        self._block = block
        return out + _event("content_block_start", {"type": "content_block_start", "index": self._blocks,
                                                    "content_block": start})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self._blocks,
                                              "delta": delta})

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        index, self._blocks = self._blocks, self._blocks + 1
        return _event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _error(self, error: StreamError) -> bytes:
        self.failed = True
        inner = {"type": error.type if error.type in _KNOWN_TYPES else "api_error",
                 "message": error.message or "the stream failed",
                 "code": error.code or "stream_failed"}
        return _event("error", {"type": "error", "error": inner})


def _message_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole Message as the events that stream it."""
    usage = _object(message.get("usage"))
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0}}}]
    for index, block in enumerate(message.get("content") or ()):
        events += [{"type": "content_block_start", "index": index, "content_block": block},
                   {"type": "content_block_stop", "index": index}]
    return [*events, {"type": "message_delta", "delta": {"stop_reason": message.get("stop_reason"),
                                                         "stop_sequence": message.get("stop_sequence")},
                      "usage": {"output_tokens": _tokens(usage.get("output_tokens"))}},
            {"type": "message_stop"}]


def _matched_stop(raw: bytes) -> object:
    """The stop sequence a finishing chunk names in its choice's `stop_reason` (vLLM's field)."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return _first_choice(_object(document)).get("stop_reason")
