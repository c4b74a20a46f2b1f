"""The OpenAI dialect: chat completions and embeddings (and the legacy completions and moderations)
as OpenAI's API shapes them, the first
dialect the gateway speaks and the one of its job API (an OpenAI SDK pointed at the gateway
works unchanged).

Answers are the provider's own documents, relayed as it gave them; a stream relays the provider's
chunks byte for byte as `data:` events, then `data: [DONE]`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

import orjson
from fastapi.responses import Response

from tidegate.ai import AIRequest, AIResult, Kind, StreamError, StreamPart
from tidegate.contract import ChatRequest, CompletionRequest, RequestBody
from tidegate.gateway.core.dialect import Dialect, StreamRenderer, decoded
from tidegate.gateway.core.errors import ApiError, error_body, openai_error

__all__ = ["OPENAI", "OpenAIDialect"]

DONE: Final = b"data: [DONE]\n\n"

class OpenAIDialect(Dialect):
    """OpenAI's chat completions and embeddings, legacy completions and moderations."""

    name = "openai"

    def request(self, kind: Kind, body: RequestBody) -> AIRequest:
        """The job of a body decoded at the door (tidegate.contract): the fields the client set,
        the rest carried through."""
        return AIRequest(kind=kind, body=body)

    def parse(self, kind: Kind, body: Mapping[str, Any], where: str) -> AIRequest:
        """A body that came inside a job, checked as the OpenAI endpoint would check it."""
        return self.request(kind, decoded(kind, body, where))

    def answer(self, result: AIResult, headers: Mapping[str, str]) -> Response:
        """The provider's document, unchanged."""
        return Response(orjson.dumps(result.response), media_type="application/json", headers=dict(headers))

    def stream(self, request: AIRequest) -> StreamRenderer:
        """The usage chunk is shown only to a client that asked for it (the worker always asks)."""
        body = request.body
        options = body.stream_options if isinstance(body, ChatRequest | CompletionRequest) else None
        return _OpenAIStream(bool((options or {}).get("include_usage")),
                             text_completion=isinstance(body, CompletionRequest))

    def error_body(self, error: ApiError) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`."""
        return openai_error(error)


OPENAI: Final = OpenAIDialect()


def _event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


class _OpenAIStream(StreamRenderer):
    """Relays each chunk as it came; an error chunk gets the API's full error shape."""

    def __init__(self, include_usage: bool, *, text_completion: bool = False) -> None:
        super().__init__()
        self.include_usage = include_usage
        self.text_completion = text_completion  # a legacy completion's stream

    def frame(self, part: StreamPart) -> bytes | None:
        """The chunk's own bytes as one event (None for a usage chunk nobody asked for)."""
        error = part.error
        if error is not None:
            self.failed = True
            return _event(_complete_error(error))
        if part.usage_only and not self.include_usage:
            return None
        if not self.saw_content:
            self.saw_content = bool(part.text)
        return _event(part.raw)

    def error_frame(self, error: ApiError) -> bytes:
        """The same shape as every other error answer, a code always present."""
        self.failed = True
        body = error_body(error)
        body["code"] = body["code"] or "stream_failed"
        return _event(orjson.dumps({"error": body}))

    def end_frame(self) -> bytes:
        """`data: [DONE]`."""
        return DONE

    def whole_answer(self, result: AIResult, job_id: str) -> list[StreamPart]:
        """A stored chat completion as chunks: each choice's content, then its finish (a stored
        text_completion as text_completion chunks)."""
        response = result.response
        if response is None:
            return []
        if self.text_completion:
            return self._whole_text_completion(response, job_id)
        head = {"id": response.get("id", f"chatcmpl-{job_id}"), "object": "chat.completion.chunk",
                "created": response.get("created", int(time.time())), "model": response.get("model")}
        if isinstance(response.get("service_tier"), str):
            head["service_tier"] = response["service_tier"]  # as a streamed answer's chunks say it
        chunks: list[bytes] = []
        for choice in response.get("choices") or []:
            message = choice.get("message") or {}
            delta = {key: value for key, value in message.items() if value is not None}
            index, finish = choice.get("index", 0), choice.get("finish_reason")
            chunks.append(orjson.dumps({**head, "choices": [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}))
            chunks.append(orjson.dumps({**head, "choices": [
                {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}]}))
        if self.include_usage and isinstance(response.get("usage"), dict):
            chunks.append(orjson.dumps({**head, "choices": [], "usage": response["usage"]}))
        return [StreamPart.decode(chunk) for chunk in chunks]

    def _whole_text_completion(self, response: dict[str, Any], job_id: str) -> list[StreamPart]:
        head = {"id": response.get("id", f"cmpl-{job_id}"), "object": "text_completion",
                "created": response.get("created", int(time.time())), "model": response.get("model")}
        chunks: list[bytes] = []
        for choice in response.get("choices") or []:
            index = choice.get("index", 0)
            chunks.append(orjson.dumps({**head, "choices": [
                {"index": index, "text": choice.get("text") or "", "logprobs": choice.get("logprobs"),
                 "finish_reason": None}]}))
            chunks.append(orjson.dumps({**head, "choices": [
                {"index": index, "text": "", "logprobs": None,
                 "finish_reason": choice.get("finish_reason")}]}))
        if self.include_usage and isinstance(response.get("usage"), dict):
            chunks.append(orjson.dumps({**head, "choices": [], "usage": response["usage"]}))
        return [StreamPart.decode(chunk) for chunk in chunks]


def _complete_error(error: StreamError) -> bytes:
    """An error chunk (the worker's, or the provider's own mid-stream error) with every field of
    the API's error shape and a code, so an SDK reading it sees what a non-streamed call would."""
    return orjson.dumps({"error": {"message": error.message or "the stream failed",
                                   "type": error.type or "upstream_error", "param": error.param,
                                   "code": error.code or "stream_failed"}})
