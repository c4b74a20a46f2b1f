"""The adapter of Anthropic Messages upstreams: a chat job is sent as a Messages request
(POST {base}/messages) and its Message, or its stream of events, read back into the job's
chat.completion and chat.completion.chunk forms, so every gateway route works over it.

The request: system (and developer) messages → `system`; user and assistant turns → their
content blocks (text; `image_url` parts → image blocks, data URLs inline; `file` parts →
document blocks, their base64 data inline); an assistant's
`tool_calls` → tool_use blocks; `tool` messages → tool_result blocks of the next user turn (turns
of one role in a row are merged, as the API wants them to alternate); `max_completion_tokens` /
`max_tokens` (the API requires one: tidegate's default output estimate otherwise), `stop` →
`stop_sequences`, `temperature`, `top_p`, `tools`, `tool_choice` (auto/required/none/a named
function; `parallel_tool_calls: false` → `disable_parallel_tool_use`), `user` →
`metadata.user_id`, `service_tier` → Anthropic's (see `_REQUEST_TIERS`). Embeddings: Anthropic has
none, and such a job fails as a client error.

A job made from an Anthropic Messages request (its `origin`) is sent as the client wrote it, and
its Message or events come back as they are (tidegate.providers.adapters.native).

The answer's `usage.service_tier` comes back as the completion's `service_tier` in OpenAI's
names (standard → default, priority → priority, batch → flex), so the job is billed at that tier.
Its token counts come back in OpenAI's shape (`messages_usage`): the prompt tokens count the cache
reads and writes Anthropic counts apart, which `prompt_tokens_details` then names.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from tidegate.ai import AIRequest
from tidegate.contract import ChatMessage, ChatRequest
from tidegate.costs import DEFAULT_MAX_OUTPUT_TOKENS
from tidegate.errors import UpstreamError
from tidegate.providers.adapters.base import Answer, PartSink, ProviderAdapter
from tidegate.providers.adapters.native import call_native, messages_usage, native_origin, refuse_native_only

__all__ = ["AnthropicAdapter", "MessagesDecoder", "answered_tier", "chat_completion", "messages_body"]

MESSAGES_PATH: Final = "/messages"
_FINISH: Final = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}
# OpenAI's tiers as Anthropic's request field, which has two values: `auto` (priority capacity
# when the organisation has some, else standard) and `standard_only`. Priority is only ever
# served through `auto`. Anthropic has no flex tier for a message call (its discounted tier is
# the separate Message Batches API): standard_only is the nearest, as it keeps a call that asked
# to be cheap off the dearer priority capacity.
_REQUEST_TIERS: Final = {"auto": "auto", "priority": "auto", "default": "standard_only",
                         "flex": "standard_only"}
# Anthropic's `usage.service_tier` in OpenAI's names (batch is its discounted tier, as flex is).
_ANSWERED_TIERS: Final = {"standard": "default", "priority": "priority", "batch": "flex"}


class AnthropicAdapter(ProviderAdapter):
    """POST /messages of an Anthropic Messages API, for chat jobs."""

    async def complete(self, request: AIRequest, model: str) -> Answer:
        """The Message of one call, as a chat.completion (as it is, for a Messages request)."""
        origin = native_origin(request, self.client)
        if origin is not None:
            return await call_native(self.client, request, origin, model, None)
        refuse_native_only(request, self.client)
        body = messages_body(_chat(request), model)
        response = await self.client.post(MESSAGES_PATH, body, expect="content")
        document = chat_completion(response.body)
        return Answer(document, messages_usage(response.body.get("usage") or {}), response.latency_ms,
                      response.rate_limit)

    async def stream(self, request: AIRequest, model: str, on_part: PartSink) -> Answer:
        """Each event relayed as the chat chunks it amounts to; the answer is the stream as one
        chat.completion (relayed and kept as they are, for a Messages request)."""
        origin = native_origin(request, self.client)
        if origin is not None:
            return await call_native(self.client, request, origin, model, on_part)
        refuse_native_only(request, self.client)
        body = {**messages_body(_chat(request), model), "stream": True}
        decoder = MessagesDecoder()
        async with self.client.stream(MESSAGES_PATH, body, decoder) as stream:
            async for chunk in stream:
                await on_part(chunk.part)
        summary = stream.summary
        assert summary is not None  # set once message_stop was read, and the loop ends only then
        message: dict[str, Any] = {"role": "assistant", "content": summary.text or None}
        if decoder.tool_calls:
            message["tool_calls"] = decoder.tool_calls
        document = {"id": decoder.id, "object": "chat.completion", "model": decoder.model or model,
                    "choices": [{"index": 0, "message": message, "finish_reason": summary.finish_reason}],
                    "usage": summary.usage.to_json()}
        if decoder.service_tier is not None:
            document["service_tier"] = decoder.service_tier
        return Answer(document, summary.usage, summary.latency_ms, summary.rate_limit, summary.ttft_ms)


def _chat(request: AIRequest) -> ChatRequest:
    if not isinstance(request.body, ChatRequest):
        raise UpstreamError(f"an Anthropic Messages upstream serves chat jobs, not {request.kind}",
                            kind="client", status=400)
    return request.body


# ---------------------------------------------------------------------------- requests


def messages_body(chat: ChatRequest, model: str) -> dict[str, Any]:
    """The Messages request of a chat completion request (see the module's docstring)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in chat.messages:
        role = message.role
        if role in ("system", "developer"):
            system.append(_text(message.content))
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": str(message.tool_call_id or ""),
                      "content": _text(message.content)}
            _add(turns, "user", [result])
        else:
            _add(turns, "assistant" if role == "assistant" else "user", _blocks(message))
    limit = chat.max_completion_tokens or chat.max_tokens or DEFAULT_MAX_OUTPUT_TOKENS
    body: dict[str, Any] = {"model": model, "max_tokens": limit, "messages": turns}
    if system:
        body["system"] = "\n\n".join(system)
    if chat.stop:
        body["stop_sequences"] = [chat.stop] if isinstance(chat.stop, str) else list(chat.stop)
    if chat.temperature is not None:
        body["temperature"] = chat.temperature
    if chat.top_p is not None:
        body["top_p"] = chat.top_p
    if chat.user:
        body["metadata"] = {"user_id": chat.user}
    tier = _REQUEST_TIERS.get(str(chat.service_tier))
    if tier is not None:
        body["service_tier"] = tier
    tools = chat.extra.get("tools")  # carried through: the contract does not name them
    if tools:
        body["tools"] = [_tool(tool.get("function") or {}) for tool in tools]
    choice = _tool_choice(chat.extra.get("tool_choice"), chat.extra.get("parallel_tool_calls"))
    if choice is not None:
        body["tool_choice"] = choice
    return body


def _add(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Append a turn's blocks, merged into the last turn when it has the same role."""
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": blocks})


def _text(content: object) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    content = message.content
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    for part in content if isinstance(content, list) else ():
        if part.get("type") == "image_url":
            blocks.append(_image((part.get("image_url") or {}).get("url") or ""))
        elif part.get("type") == "file":
            blocks.append(_document(part.get("file") or {}))
        elif part.get("type") == "text":
            blocks.append({"type": "text", "text": str(part.get("text") or "")})
    for call in message.tool_calls or ():
        function = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": str(call.get("id") or ""),
                       "name": str(function.get("name")), "input": _arguments(function.get("arguments"))})
    # The API refuses empty text blocks (an assistant turn that only called tools has one).
    return [block for block in blocks if block["type"] != "text" or block["text"]]


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url[5:].partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _document(file: dict[str, Any]) -> dict[str, Any]:
    # A chat file part carries its bytes as a base64 data URL (`file_data`); a document block of
    # another media type than Anthropic reads (PDF, plain text) is refused by the API, not here.
    media_type, _, data = str(file.get("file_data") or "").removeprefix("data:").partition(";base64,")
    block: dict[str, Any] = {"type": "document", "source": {"type": "base64", "media_type": media_type,
                                                             "data": data}}
    if file.get("filename"):
        block["title"] = file["filename"]
    return block


def _arguments(arguments: object) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {}


def _tool(function: dict[str, Any]) -> dict[str, Any]:
    tool = {"name": function.get("name"), "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        tool["description"] = function["description"]
    return tool


def _tool_choice(choice: object, parallel: object) -> dict[str, Any] | None:
    if isinstance(choice, dict):
        picked: dict[str, Any] = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    elif choice in ("auto", "required", "none"):
        picked = {"type": {"auto": "auto", "required": "any", "none": "none"}[str(choice)]}
    elif parallel is False:
        picked = {"type": "auto"}
    else:
        return None
    if parallel is False and picked["type"] != "none":
        picked["disable_parallel_tool_use"] = True
    return picked


# ---------------------------------------------------------------------------- answers


def _completion_id(message_id: object) -> str:
    return "chatcmpl-" + str(message_id or "").removeprefix("msg_")


def chat_completion(message: dict[str, Any]) -> dict[str, Any]:
    """A Message as a chat.completion (the stop sequence met, if any, in the choice's
    `stop_reason`, as vLLM names it)."""
    text = "".join(block.get("text") or "" for block in message.get("content") or ()
                   if block.get("type") == "text")
    calls = [{"id": block.get("id"), "type": "function",
              "function": {"name": block.get("name"),
                           "arguments": orjson.dumps(block.get("input") or {}).decode()}}
             for block in message.get("content") or () if block.get("type") == "tool_use"]
    reply: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        reply["tool_calls"] = calls
    choice: dict[str, Any] = {"index": 0, "message": reply, "logprobs": None,
                              "finish_reason": _FINISH.get(str(message.get("stop_reason")), "stop")}
    if message.get("stop_sequence"):
        choice["stop_reason"] = message["stop_sequence"]
    usage = message.get("usage") or {}
    document = {"id": _completion_id(message.get("id")), "object": "chat.completion",
                "model": message.get("model"), "choices": [choice],
                "usage": messages_usage(usage).to_json()}
    tier = answered_tier(usage)
    if tier is not None:
        document["service_tier"] = tier
    return document


def answered_tier(usage: object) -> str | None:
    """The tier a Message's usage names, in OpenAI's names (None when it names none)."""
    tier = usage.get("service_tier") if isinstance(usage, dict) else None
    return _ANSWERED_TIERS.get(tier) if isinstance(tier, str) else None


class MessagesDecoder:
    """Reads Anthropic's stream events into chat chunks (a `StreamDecoder`): text deltas as
    content, each tool_use block as one tool call (its index the call's), `message_delta` as the
    finish, `message_stop` as the usage chunk that ends the stream, `error` as an error chunk.
    Keeps what the whole answer needs: the id, the model, the tier (`message_start` names it; every
    chunk repeats it, as OpenAI's do) and the tool calls."""

    def __init__(self) -> None:
        self.id = "chatcmpl-unknown"
        self.model: str | None = None
        self.service_tier: str | None = None
        self.tool_calls: list[dict[str, Any]] = []
        self._calls: dict[int, int] = {}  # block index → tool call index
        self._usage: dict[str, Any] = {}  # Anthropic's usage, as the events told it so far

    def __call__(self, data: bytes) -> tuple[list[bytes], bool]:
        """The chunks of one event, and whether it ends the stream."""
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [data], False  # the client refuses it as malformed
        if not isinstance(event, dict):
            return [data], False
        kind = event.get("type")
        if kind == "error":
            return [orjson.dumps({"error": event.get("error") or {}})], False
        if kind == "message_start":
            return self._start(event.get("message") or {}), False
        if kind == "content_block_start":
            return self._block(event), False
        if kind == "content_block_delta":
            return self._delta(event), False
        if kind == "message_delta":
            return self._finish(event), False
        if kind == "message_stop":
            return [self._chunk(None, usage=messages_usage(self._usage).to_json())], True
        return [], False  # ping, content_block_stop

    def _chunk(self, delta: dict[str, Any] | None, *, finish: str | None = None, stop: object = None,
               usage: dict[str, Any] | None = None) -> bytes:
        document: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "model": self.model}
        if self.service_tier is not None:
            document["service_tier"] = self.service_tier
        if delta is None:
            document.update(choices=[], usage=usage)
        else:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            if stop:
                choice["stop_reason"] = stop
            document["choices"] = [choice]
        return orjson.dumps(document)

    def _start(self, message: dict[str, Any]) -> list[bytes]:
        self.id = _completion_id(message.get("id"))
        self.model = message.get("model")
        self.service_tier = answered_tier(message.get("usage"))
        self._count(message.get("usage"))
        return [self._chunk({"role": "assistant", "content": ""})]

    def _block(self, event: dict[str, Any]) -> list[bytes]:
        block = event.get("content_block") or {}
        if block.get("type") != "tool_use":
            return []
        position = self._calls[int(event.get("index") or 0)] = len(self.tool_calls)
        self.tool_calls.append({"id": block.get("id"), "type": "function",
                                "function": {"name": block.get("name"), "arguments": ""}})
        return [self._chunk({"tool_calls": [{"index": position, **self.tool_calls[-1]}]})]

    def _delta(self, event: dict[str, Any]) -> list[bytes]:
        delta = event.get("delta") or {}
        if delta.get("type") == "text_delta":
            return [self._chunk({"content": delta.get("text") or ""})]
        position = self._calls.get(int(event.get("index") or 0))
        if delta.get("type") != "input_json_delta" or position is None:
            return []
        piece = str(delta.get("partial_json") or "")
        self.tool_calls[position]["function"]["arguments"] += piece
        return [self._chunk({"tool_calls": [{"index": position, "function": {"arguments": piece}}]})]

    def _finish(self, event: dict[str, Any]) -> list[bytes]:
        self._count(event.get("usage"))
        delta = event.get("delta") or {}
        reason = _FINISH.get(str(delta.get("stop_reason")), "stop")
        return [self._chunk({}, finish=reason, stop=delta.get("stop_sequence"))]

    def _count(self, usage: object) -> None:
        # message_delta's counts are cumulative: the latest stands, but one it leaves out, or
        # sends as null or 0, keeps message_start's.
        if isinstance(usage, dict):
            self._usage.update((key, value) for key, value in usage.items()
                               if value is not None and (value or key not in self._usage))
