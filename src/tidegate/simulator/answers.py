"""What the simulated provider answers, apart from how it admits and serves requests
(tidegate.simulator.server): the reply drawn for a chat (words, or a call of a tool), the body
of a non-streamed answer in each wire format (OpenAI's chat.completion, Anthropic's Message,
OpenAI's Response; embeddings), and the frames of a streamed one.
"""

from __future__ import annotations

import base64
import random
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from tidegate.simulator.content import (
    embedding_vector,
    estimate_text_tokens,
    generate_words,
    sample_lognormal,
    stop_at,
)
from tidegate.simulator.messages import (
    MessageEvents,
    message_body,
    message_usage,
    thinking_blocks,
)
from tidegate.simulator.requests import (
    ChatRequest,
    EmbeddingsRequest,
    InvalidRequest,
    ToolCallPlan,
)
from tidegate.simulator.responses import ResponseEvents, compaction_body, response_body
from tidegate.simulator.settings import (
    ModelBehaviour,
    ServedModel,
)

__all__ = ["FRAMES", "Frames", "Reply", "Wire", "check_dimensions", "completion_body", "completion_id",
           "draw_completion_tokens", "embeddings_body"]

Wire = Literal["openai", "anthropic", "responses", "completions", "compaction"]
"""The API a request came by, and is answered in."""


def draw_completion_tokens(rng: random.Random, behaviour: ModelBehaviour,
                       max_tokens: int | None) -> tuple[int, str]:
    """How many tokens to answer with, and the finish reason ("length" when the cap cut it)."""
    cap = max_tokens or behaviour.max_completion_tokens
    drawn = max(1, round(sample_lognormal(rng, behaviour.completion_tokens, behaviour.completion_tokens_p99)))
    return (cap, "length") if drawn >= cap else (drawn, "stop")


def completion_id(rng: random.Random) -> str:
    return f"chatcmpl-{rng.getrandbits(96):024x}"


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


@dataclass(frozen=True, slots=True)
class Reply:
    """What a chat answer says: words (cut at a stop sequence met, named in `stop`), or a call of
    the function the request's tools lead to; with its finish reason and completion tokens."""

    words: list[str]
    finish: str
    tokens: int
    stop: str | None = None
    call: ToolCallPlan | None = None

    @classmethod
    def draw(cls, rng: random.Random, chat: ChatRequest, completion: int, finish: str) -> Reply:
        if chat.tool_call is not None:
            return cls([], "tool_calls", estimate_text_tokens(chat.tool_call.arguments), call=chat.tool_call)
        words, stop = stop_at(generate_words(rng, completion), chat.stop)
        if stop is None:
            return cls(words, finish, completion)
        return cls(words, "stop", len(words), stop)

    def message(self, rng: random.Random) -> dict[str, Any]:
        """The answer's message, whole."""
        if self.call is None:
            return {"role": "assistant", "content": " ".join(self.words)}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": _call_id(rng), "type": "function",
             "function": {"name": self.call.name, "arguments": self.call.arguments}}]}

    def deltas(self, rng: random.Random) -> list[dict[str, Any]]:
        """The answer as the deltas of a stream: a word each, or the call's name then its
        arguments in two pieces."""
        if self.call is None:
            return [{"content": word if i == 0 else " " + word} for i, word in enumerate(self.words)]
        arguments, half = self.call.arguments, len(self.call.arguments) // 2
        head = {"index": 0, "id": _call_id(rng), "type": "function",
                "function": {"name": self.call.name, "arguments": ""}}
        return [{"tool_calls": [head]},
                *({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                  for piece in (arguments[:half], arguments[half:]) if piece)]


def _call_id(rng: random.Random) -> str:
    return f"call_{rng.getrandbits(96):024x}"


def completion_body(rng: random.Random, model: str, chat: ChatRequest, completion: int,
                     finish: str) -> tuple[dict[str, Any], int]:
    """The whole answer in the request's wire format, and its completion tokens."""
    identifier = completion_id(rng)
    reply = Reply.draw(rng, chat, completion, finish)
    message = reply.message(rng)
    if chat.wire == "compaction":
        return compaction_body(identifier.removeprefix("chatcmpl-"), model, chat,
                               str(message.get("content") or ""), reply.tokens), reply.tokens
    if chat.wire == "responses":
        return response_body(identifier.removeprefix("chatcmpl-"), model, chat, message, reply.finish,
                             reply.tokens), reply.tokens
    if chat.wire == "anthropic":
        return message_body(_message_id(identifier), model, thinking_blocks(chat) + _blocks(message),
                            reply.finish, reply.stop,
                            message_usage(chat, reply.tokens)), reply.tokens
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                              "finish_reason": reply.finish}
    if reply.stop is not None:
        choice["stop_reason"] = reply.stop  # the sequence met, named as vLLM names it
    return {
        "id": identifier, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [choice], "usage": _usage(chat.prompt_tokens, reply.tokens, chat.cache.read),
    }, reply.tokens


def _message_id(completion_id: str) -> str:
    return "msg_" + completion_id.removeprefix("chatcmpl-")


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat message's content as a Message's content blocks."""
    text = message["content"]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or ():
        function = call["function"]
        blocks.append({"type": "tool_use", "id": _tool_use_id(call["id"]),
                       "name": function["name"], "input": orjson.loads(function["arguments"])})
    return blocks


@dataclass(frozen=True, slots=True)
class Frames:
    """A streamed answer's bytes: what opens it, one piece per token (the pacing's unit), what
    closes it, and the torn frame a fault half way sends instead of the rest."""

    head: bytes
    pieces: list[bytes]
    tail: bytes
    broken: bytes


def _chunk_frames(rng: random.Random, model: str, chat: ChatRequest, reply: Reply) -> Frames:
    """OpenAI's chat.completion.chunk events, then `[DONE]`."""
    chunk = _ChunkWriter(completion_id(rng), model, chat.service_tier)
    tail = chunk.event({}, finish_reason=reply.finish, stop_reason=reply.stop)
    if chat.include_usage:
        tail += chunk.usage(chat.prompt_tokens, reply.tokens, chat.cache.read)
    return Frames(chunk.event({"role": "assistant", "content": ""}),
                   [chunk.event(delta) for delta in reply.deltas(rng)], tail + b"data: [DONE]\n\n",
                   b'data: {"id": "chatcmpl-broken", "choi\n\n')


def _message_frames(rng: random.Random, model: str, chat: ChatRequest, reply: Reply) -> Frames:
    """Anthropic's events: message_start, one content block (text, or the tool call), message_delta
    and message_stop."""
    events = MessageEvents(_message_id(completion_id(rng)), model, chat)
    pieces: list[bytes] = []
    for delta in reply.deltas(rng):
        if "content" in delta:
            text = events.text(delta["content"])
            pieces.append(events.block_start({"type": "text", "text": ""}) + text if not pieces else text)
            continue
        [call] = delta["tool_calls"]
        if "id" in call:
            pieces.append(events.block_start({"type": "tool_use", "id": _tool_use_id(call["id"]),
                                              "name": call["function"]["name"], "input": {}}))
        else:
            pieces.append(events.json(call["function"]["arguments"]))
    tail = events.end(reply.finish, reply.stop, reply.tokens, opened=bool(pieces))
    torn = b'event: content_block_delta\ndata: {"type": "content_blo\n\n'
    return Frames(events.start(), pieces, tail, torn)


def _response_frames(rng: random.Random, model: str, chat: ChatRequest, reply: Reply) -> Frames:
    """The Responses API's typed events (see responses.ResponseEvents)."""
    events = ResponseEvents(completion_id(rng).removeprefix("chatcmpl-"), model, chat)
    head = events.start()
    pieces, close = events.pieces(reply.deltas(rng))
    torn = b'event: response.output_text.delta\ndata: {"type": "response.outp\n\n'
    return Frames(head, pieces, close + events.end(reply.finish, reply.tokens), torn)


FRAMES: Final[Mapping[Wire, Callable[[random.Random, str, ChatRequest, Reply], Frames]]] = {
    "openai": _chunk_frames, "anthropic": _message_frames, "responses": _response_frames}


def check_dimensions(embed: EmbeddingsRequest, served: ServedModel) -> None:
    """Like OpenAI: a vector may be shortened, never made longer than the model's own."""
    largest = served.behaviour.embedding_dimensions
    if embed.dimensions is not None and embed.dimensions > largest:
        raise InvalidRequest(f"Invalid 'dimensions': {embed.dimensions} is above the {largest} dimensions "
                             f"of `{served.name}`.", param="dimensions", code="invalid_value")


def embeddings_body(served: ServedModel, embed: EmbeddingsRequest) -> dict[str, Any]:
    dimensions = embed.dimensions or served.behaviour.embedding_dimensions
    data: list[dict[str, Any]] = []
    for index, key in enumerate(embed.keys):
        vector = embedding_vector(key, dimensions)
        encoded: list[float] | str = (vector if embed.encoding_format == "float" else
                                      base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode())
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    return {"object": "list", "data": data, "model": served.name,
            "usage": {"prompt_tokens": embed.prompt_tokens, "total_tokens": embed.prompt_tokens}}


class _ChunkWriter:
    """Encodes the `data:` events of one streamed completion in OpenAI's chunk format."""

    def __init__(self, identifier: str, model: str, service_tier: str | None = None) -> None:
        self._head: dict[str, Any] = {"id": identifier, "object": "chat.completion.chunk",
                                      "created": int(time.time()), "model": model}
        if service_tier is not None:
            self._head["service_tier"] = service_tier

    def event(self, delta: dict[str, Any], *, finish_reason: str | None = None,
              stop_reason: str | None = None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason
        return b"data: " + orjson.dumps({**self._head, "choices": [choice]}) + b"\n\n"

    def usage(self, prompt: int, completion: int, cached: int) -> bytes:
        body = {**self._head, "choices": [], "usage": _usage(prompt, completion, cached)}
        return b"data: " + orjson.dumps(body) + b"\n\n"
