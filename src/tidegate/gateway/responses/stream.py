"""A job's chat stream as the Responses API's typed events.

The relayed chunks (chat.completion.chunk parts) are turned into the sequence the openai SDK's
`responses.stream()` accumulates: `response.created`, `response.in_progress`, then per output
item `response.output_item.added` … its deltas … `response.output_item.done` (a message's content
part and text in between; a function call's arguments), and last `response.completed` (or
`response.incomplete`) with the whole response and its usage; every event numbered by
`sequence_number`. A stream that fails after it started ends with `response.failed`.

A stream resumed (GET /v1/responses/{id}?stream=true&starting_after=N) is rendered whole, from the
job's first chunk, and shows only the events numbered after N: the relay keeps every chunk of a
stream from its first, so the events are numbered as they were the first time.

A provider that speaks the Responses API natively streams its own typed events (`StreamPart.event`
names each): they are relayed as they are, the response in them shown as this response
(`native_of`: its id, tidegate's settings), its own `response.completed` ending the stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from tidegate.ai import AIResult, Finish, StreamPart, TextDelta, ToolCallDelta, Usage, UsageReport
from tidegate.gateway.core.dialect import StreamRenderer
from tidegate.gateway.core.errors import ApiError
from tidegate.gateway.responses.output import (
    answered_status,
    assistant_message,
    is_native,
    response_usage,
)

__all__ = ["ResponsesStream"]

ResponseOf = Callable[..., dict[str, Any]]
"""Builds the response object from keyword fields (`response_object` bound to one call)."""
NativeOf = Callable[[dict[str, Any]], dict[str, Any]]
"""Shows a native upstream's Response as this response (`native_response` bound to one call)."""


@dataclass
class _Item:
    """An output item being streamed: the item as the final response shows it."""

    index: int
    body: dict[str, Any]
    text: list[str] = field(default_factory=list)  # a message's text, or a call's arguments


class ResponsesStream(StreamRenderer):
    """Renders one response's stream; `response_of` makes the response object around it."""

    def __init__(self, job_id: str, response_of: ResponseOf, native_of: NativeOf, *,
                 starting_after: int | None = None) -> None:
        super().__init__()
        self._job_id = job_id
        self._shown_after = -1 if starting_after is None else starting_after  # events up to it are not shown
        self._response_of = response_of
        self._native_of = native_of
        self._native = False  # the upstream streams its own events
        self._sequence = 0
        self._started = False
        self._items: list[_Item] = []
        self._message: _Item | None = None
        self._calls: dict[int, _Item] = {}  # the chat tool call's index → its item
        self._open: list[_Item] = []
        self._model: str | None = None
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._tier: str | None = None  # as the chunks name it

    # -- events

    def _event(self, kind: str, **fields: Any) -> bytes:
        number = self._sequence
        self._sequence += 1
        if number <= self._shown_after:
            return b""
        data = {"type": kind, "sequence_number": number, **fields}
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _response(self, status: str, **fields: Any) -> dict[str, Any]:
        return self._response_of(status=status, model=self._model, service_tier=self._tier, **fields)

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        response = self._response("in_progress", output=[], usage=None)
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def _add(self, body: dict[str, Any]) -> tuple[_Item, bytes]:
        item = _Item(len(self._items), body)
        self._items.append(item)
        self._open.append(item)
        return item, self._event("response.output_item.added", output_index=item.index,
                                 item={**body, "status": "in_progress"})

    def _text(self, delta: TextDelta) -> list[bytes]:
        frames: list[bytes] = []
        if self._message is None:
            self._message, added = self._add({"id": f"msg_{self._job_id}", "type": "message",
                                              "role": "assistant", "content": []})
            frames += [added, self._event(
                "response.content_part.added", item_id=self._message.body["id"],
                output_index=self._message.index, content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]
        self._message.text.append(delta.text)
        return [*frames, self._event("response.output_text.delta", item_id=self._message.body["id"],
                                     output_index=self._message.index, content_index=0,
                                     delta=delta.text, logprobs=[])]

    def _call(self, delta: ToolCallDelta) -> list[bytes]:
        frames: list[bytes] = []
        item = self._calls.get(delta.index)
        if item is None:
            item, added = self._add({"id": f"fc_{self._job_id}_{delta.index}", "type": "function_call",
                                     "call_id": delta.id or "", "name": delta.name or "", "arguments": ""})
            self._calls[delta.index] = item
            frames.append(added)
        if delta.arguments:
            item.text.append(delta.arguments)
            frames.append(self._event("response.function_call_arguments.delta", item_id=item.body["id"],
                                      output_index=item.index, delta=delta.arguments))
        return frames

    def _close(self, item: _Item, status: str) -> list[bytes]:
        text = "".join(item.text)
        where = {"item_id": item.body["id"], "output_index": item.index}
        if item.body["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item.body = {**item.body, "content": [part], "status": status}
            frames = [
                self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, content_index=0, part=part)]
        else:
            item.body = {**item.body, "arguments": text, "status": "completed"}
            frames = [self._event("response.function_call_arguments.done", **where, name=item.body["name"],
                                  arguments=text)]
        return [*frames, self._event("response.output_item.done", output_index=item.index, item=item.body)]

    def _close_all(self, status: str) -> list[bytes]:
        frames = [frame for item in self._open for frame in self._close(item, status)]
        self._open = []
        return frames

    # -- the renderer

    def frame(self, part: StreamPart) -> bytes | None:
        """The events of one chunk: the response's start before its first, then its deltas."""
        error = part.error
        if error is not None:
            return self.error_frame(ApiError(502, error.message or "the stream failed",
                                             code=error.code or "stream_failed"))
        if part.event is not None:
            return self._relayed(part) or None
        self._model = part.model or self._model
        self._tier = part.service_tier or self._tier
        frames = self._start()
        for event in part.events:
            if isinstance(event, TextDelta) and event.index == 0:
                self.saw_content = True
                frames += self._text(event)
            elif isinstance(event, ToolCallDelta):
                self.saw_content = True
                frames += self._call(event)
            elif isinstance(event, Finish) and event.index == 0:
                self._finish = event.reason
            elif isinstance(event, UsageReport):
                self._usage = event.usage
        return b"".join(frames) or None

    def _relayed(self, part: StreamPart) -> bytes:
        """A native event as it is, the response in it shown as this one; numbered on from it."""
        self._native = self._started = True
        event = orjson.loads(part.raw)
        if isinstance(event.get("response"), dict):
            event["response"] = self._native_of(event["response"])
        number = event.get("sequence_number")
        if isinstance(number, int):
            self._sequence = number + 1
        if any(isinstance(found, TextDelta) for found in part.events):
            self.saw_content = True
        if isinstance(number, int) and number <= self._shown_after:
            return b""
        return b"event: " + str(part.event).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    def error_frame(self, error: ApiError) -> bytes:
        """`response.failed`, with what is known of the output and the error."""
        self.failed = True
        frames = [*self._start(), *self._close_all("incomplete")]
        code = "rate_limit_exceeded" if error.status == 429 else "server_error"
        response = self._response("failed", output=[item.body for item in self._items], usage=None,
                                  error={"code": code, "message": error.message})
        return b"".join([*frames, self._event("response.failed", response=response)])

    def end_frame(self) -> bytes:
        """Every open item done, then `response.completed` (`response.incomplete` when the
        output was cut at max_output_tokens) with the whole response. A native stream has
        already relayed its own end."""
        if self._native:
            return b""
        status, incomplete = answered_status(self._finish)
        frames = [*self._start(), *self._close_all(status)]
        usage = None if self._usage is None else response_usage(self._usage.to_json())
        response = self._response(status, output=[item.body for item in self._items], usage=usage,
                                  incomplete=incomplete,
                                  completed_at=int(time.time()) if status == "completed" else None)
        return b"".join([*frames, self._event(f"response.{status}", response=response)])

    def whole_answer(self, result: AIResult, job_id: str) -> list[StreamPart]:
        """A stored chat completion as the chunks of a stream: its text, its tool calls, its
        finish and its usage; a native upstream's Response as its own start and end events."""
        if is_native(result.response):
            assert result.response is not None
            started = {**result.response, "status": "in_progress", "output": [], "usage": None}
            ended = "incomplete" if result.response.get("status") == "incomplete" else "completed"
            events = [{"type": "response.created", "sequence_number": 0, "response": started},
                      {"type": f"response.{ended}", "sequence_number": 1, "response": result.response}]
            return [StreamPart.decode(orjson.dumps(event)) for event in events]
        message = assistant_message(result.response)
        # The tier is named in every chunk, as a relayed stream's are.
        head = {"object": "chat.completion.chunk", "model": result.model,
                "service_tier": (result.response or {}).get("service_tier")}
        deltas: list[dict[str, Any]] = []
        if message.get("content"):
            deltas.append({"content": message["content"]})
        for index, call in enumerate(message.get("tool_calls") or ()):
            deltas.append({"tool_calls": [{"index": index, **call}]})
        choices: list[dict[str, Any]] = [{"index": 0, "delta": delta} for delta in deltas]
        choices.append({"index": 0, "delta": {}, "finish_reason": result.finish_reason or "stop"})
        chunks: list[dict[str, Any]] = [{**head, "choices": [choice]} for choice in choices]
        usage = (result.response or {}).get("usage")
        if isinstance(usage, dict):
            chunks.append({**head, "choices": [], "usage": usage})
        return [StreamPart.decode(orjson.dumps(chunk)) for chunk in chunks]
